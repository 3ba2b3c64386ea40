//! `lmhost tokenize` and `lmhost detokenize`: what the model reads, as its backend's tokenizer
//! sees it.

use lmhost::{Config, Error, Host, Result};
use serde_json::json;

use super::input::{open, print_json, PromptArgs};
use super::ConfigArg;

#[derive(clap::Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    config: ConfigArg,

    #[command(flatten)]
    input: PromptArgs,

    /// Leave out the tokens the tokenizer adds on its own (BOS); generate and score add them.
    #[arg(long)]
    no_special: bool,

    /// Print ids and pieces as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    #[command(flatten)]
    config: ConfigArg,

    /// Token ids, separated by spaces or commas.
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,

    /// Print the text as JSON.
    #[arg(long)]
    json: bool,
}

pub fn tokenize(args: &TokenizeArgs) -> Result<()> {
    let (_, snapshot, backend) = open(&args.config, &args.input)?;
    let record = backend.tokenize(&snapshot, !args.no_special)?;
    if args.json {
        let mut document = json!({
            "count": record.token_ids.len(),
            "token_ids": record.token_ids,
            "pieces": record.pieces,
        });
        if !record.images.is_empty() {
            document["mm_token_type_ids"] = json!(record.mm_token_type_ids);
            document["images"] = json!(record.images);
        }
        return print_json(&document);
    }
    let ids: Vec<String> = record.token_ids.iter().map(u32::to_string).collect();
    println!("{}", ids.join(" "));
    Ok(())
}

pub fn detokenize(args: &DetokenizeArgs) -> Result<()> {
    let ids = parse_ids(&args.ids)?;
    let config = Config::load(&args.config.config)?;
    let backend = Host::new().open(&config)?;
    let text = backend.detokenize(&ids)?;
    if args.json {
        print_json(&json!({ "text": text }))
    } else {
        println!("{text}");
        Ok(())
    }
}

/// Ids given as separate arguments, comma-separated, or both.
fn parse_ids(args: &[String]) -> Result<Vec<u32>> {
    args.iter()
        .flat_map(|a| a.split([',', ' ']))
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>().map_err(|_| {
                Error::Invalid(format!(
                    "token id `{s}` is not a non-negative integer below 2^32"
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_split_on_commas_and_spaces() {
        let args = ["1,2".to_string(), "3 4".to_string(), "5".to_string()];
        assert_eq!(parse_ids(&args).unwrap(), [1, 2, 3, 4, 5]);
        let err = parse_ids(&["7,x".to_string()]).unwrap_err();
        assert!(err.to_string().contains("`x`"), "{err}");
    }
}
