//! `lmhost explain`: which parts of a conversation made the model answer as it did.

use std::path::{Path, PathBuf};

use lmhost::config::ExplanationConfig;
use lmhost::explain::{
    AbsenceKind, AudioPlayers, Estimand, EstimatorKind, Fill, Granularity, ImagePlayers,
    InteractionIndex, Interactions, Normalizer, ValueKind,
};
use lmhost::explain_run::reanalyze;
use lmhost::explain_run::{self, RunOptions};
use lmhost::report::{html, json, table};
use lmhost::{conversation, Config, Error, Host, Result};
use lmhost_plugin_api::Role;

use super::ConfigArg;

/// Every flag overrides the `[explanation]` key of the same name.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,

    /// The conversation to explain (JSON; see the README).
    #[arg(long, value_name = "FILE.json")]
    conversation: PathBuf,

    /// Explain this answer instead of generating one.
    #[arg(long, value_name = "TEXT")]
    reply: Option<String>,

    /// Players: messages, sentences, words, or auto (messages, then the strongest refined
    /// level by level).
    #[arg(long, value_name = "KIND")]
    players: Option<Granularity>,

    /// With --players auto: players refined at each level (1 to 4).
    #[arg(long, value_name = "K")]
    refine_top: Option<usize>,

    /// With --players auto: the finest level, sentences or words.
    #[arg(long, value_name = "KIND")]
    refine_to: Option<Granularity>,

    /// Only messages of these roles hold players (comma-separated: system,user,assistant,tool,document).
    #[arg(long, value_name = "ROLES", value_delimiter = ',', value_parser = parse_role)]
    roles: Option<Vec<Role>>,

    /// Only these turns hold players (comma-separated; 0 first, -1 last).
    #[arg(
        long,
        value_name = "TURNS",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    turns: Option<Vec<i64>>,

    /// Absent players: delete, pad, neutral (the placeholder character over their width), or
    /// hide (from the last message and the answer; answer_logprob only).
    #[arg(long, value_name = "HOW")]
    absence: Option<AbsenceKind>,

    /// What replaces an absent player with --absence pad; with neutral, one character.
    #[arg(long, value_name = "TEXT")]
    placeholder: Option<String>,

    /// Image players: whole (with its message), grid (--grid cells) or regions (the boxes the
    /// conversation gives each image).
    #[arg(long, value_name = "KIND")]
    image_players: Option<ImagePlayers>,

    /// With --image-players grid: ROWSxCOLUMNS, e.g. 4x4.
    #[arg(long, value_name = "RxC", value_parser = parse_grid)]
    grid: Option<[u32; 2]>,

    /// What an absent image region is painted with: gray, mean or blur.
    #[arg(long, value_name = "FILL")]
    fill: Option<Fill>,

    /// Audio players: whole (with its message), windows (--audio-window seconds) or pauses.
    #[arg(long, value_name = "KIND")]
    audio_players: Option<AudioPlayers>,

    /// With --audio-players windows: each window's length in seconds.
    #[arg(long, value_name = "SECONDS")]
    audio_window: Option<f64>,

    /// answer_logprob, generated_logprob, embedding_cosine or tfidf_cosine.
    #[arg(long, value_name = "VALUE")]
    value: Option<ValueKind>,

    /// Logprob values per token instead of summed.
    #[arg(long)]
    value_mean: bool,

    /// exact, permutation, antithetic, msr, loo, kernel or lasso.
    #[arg(long, value_name = "ESTIMATOR")]
    estimator: Option<EstimatorKind>,

    /// shapley or banzhaf.
    #[arg(long, value_name = "ESTIMAND")]
    estimand: Option<Estimand>,

    /// Coalition evaluations a sampling estimator may plan.
    #[arg(long, value_name = "N")]
    budget: Option<usize>,

    /// Seed of the sampling estimators.
    #[arg(long, value_name = "N")]
    seed: Option<u64>,

    /// Random coalitions a sampled run also evaluates to score its attribution (0: off).
    #[arg(long, value_name = "N")]
    holdout: Option<usize>,

    /// End a sampled run early, in rounds of doubling budget, once every standard error is at
    /// most this.
    #[arg(long, value_name = "SE")]
    target_se: Option<f64>,

    /// End a sampled run early once the top K players keep their order between two rounds.
    #[arg(long, value_name = "K")]
    settle_top: Option<usize>,

    /// `exact` refuses more players than this.
    #[arg(long, value_name = "N")]
    max_exact_players: Option<usize>,

    /// Interactions from the same values: none, pairs (exact, or lasso's surrogate with pairs)
    /// or all (every subset; exact).
    #[arg(long, value_name = "WHICH")]
    interactions: Option<Interactions>,

    /// How an interaction is measured: k-sii, sii or moebius.
    #[arg(long, value_name = "INDEX")]
    interaction_index: Option<InteractionIndex>,

    /// How the reports show the values: identity, abs_sum, min_max or power_shift (nlp-shap's
    /// normalizers; the JSON's `value`s stay as computed).
    #[arg(long, value_name = "HOW")]
    normalize: Option<Normalizer>,

    /// power_shift's exponent (> 0).
    #[arg(long, value_name = "P")]
    normalize_power: Option<f64>,

    /// Run with the backend's prefix cache off.
    #[arg(long)]
    no_kv_cache: bool,

    /// Evaluate prompts in the estimator's order instead of sorting them for prefix sharing.
    #[arg(long)]
    no_sort: bool,

    /// Prompts per backend call (one packed pass on candle); 1 sends them one at a time.
    #[arg(long, value_name = "N")]
    batch_size: Option<usize>,

    /// Persist every coalition value in DIR and resume from it.
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,

    /// Recompute the attribution from the values in --run-dir alone, calling no model; fails
    /// naming how many coalitions the estimator needs that the directory lacks.
    #[arg(long, requires = "run_dir")]
    reanalyze: bool,

    /// Write the result as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// Write a self-contained HTML page.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

fn parse_grid(s: &str) -> std::result::Result<[u32; 2], String> {
    let parsed = s
        .split_once('x')
        .and_then(|(r, c)| Some([r.trim().parse().ok()?, c.trim().parse().ok()?]));
    parsed.ok_or_else(|| format!("`{s}` is not a grid; expected ROWSxCOLUMNS, e.g. 4x4"))
}

fn parse_role(s: &str) -> std::result::Result<Role, String> {
    match s {
        "system" => Ok(Role::System),
        "user" => Ok(Role::User),
        "assistant" => Ok(Role::Assistant),
        "tool" => Ok(Role::Tool),
        "document" => Ok(Role::Document),
        "raw" => Ok(Role::Raw),
        _ => Err(format!(
            "unknown role `{s}`; expected system, user, assistant, tool, document or raw"
        )),
    }
}

impl Args {
    /// The config's `[explanation]` with the flags given applied over it.
    fn apply(&self, e: &mut ExplanationConfig) -> Result<()> {
        macro_rules! set {
            ($($field:ident),*) => {$( if let Some(v) = &self.$field { e.$field = v.clone(); } )*};
        }
        set!(
            players,
            refine_top,
            refine_to,
            roles,
            turns,
            absence,
            placeholder,
            image_players,
            grid,
            fill,
            audio_players,
            audio_window,
            value,
            estimator,
            estimand,
            budget,
            seed,
            holdout,
            settle_top,
            max_exact_players,
            interactions,
            interaction_index,
            batch_size,
            normalize,
            normalize_power
        );
        if self.target_se.is_some() {
            e.target_se = self.target_se;
        }
        e.value_mean |= self.value_mean;
        e.kv_cache &= !self.no_kv_cache;
        e.sort_prompts &= !self.no_sort;
        e.validate()
            .map_err(|message| Error::Invalid(format!("{message} (after applying the flags)")))
    }
}

pub fn run(args: &Args, quiet: bool) -> Result<()> {
    let mut config = Config::load(&args.config.config)?;
    args.apply(&mut config.explanation)?;
    let (conversation, regions) = conversation::load_with_regions(&args.conversation)?;
    config.explanation.regions = regions;
    let outcome = match (&args.run_dir, args.reanalyze) {
        (Some(run_dir), true) => reanalyze::run(
            &Host::new(),
            &config,
            &conversation,
            run_dir,
            args.reply.as_deref(),
        )?,
        _ => {
            let backend = Host::new().open(&config)?;
            let options = RunOptions {
                reply: args.reply.clone(),
                run_dir: args.run_dir.clone(),
                progress: !quiet,
                ..RunOptions::default()
            };
            explain_run::run(&config, &backend, &conversation, &options)?
        }
    };
    if let Some(path) = &args.json {
        write(path, &json::render(&outcome))?;
    }
    if let Some(path) = &args.html {
        write(path, &html::render(&outcome))?;
    }
    print!("{}", table::render(&outcome));
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}
