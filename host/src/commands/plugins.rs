//! `lmhost plugins`: every plugin found, where, and its options.

use std::path::PathBuf;

use lmhost::{plugins, Config, Host, Origin, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Also search this config's `plugin_dirs`.
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<()> {
    let config_dirs = match &args.config {
        Some(path) => Config::load(path)?.plugin_dirs,
        None => Vec::new(),
    };
    let dirs = plugins::search_dirs(&config_dirs);
    let host = Host::new();
    let (found, errors) = host.registry().discover(&dirs);
    if found.is_empty() {
        let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        println!("no plugins found; searched: {}", searched.join(", "));
    }
    for (plugin, origin) in &found {
        let origin = match origin {
            Origin::Library(path) => path.display().to_string(),
            Origin::InProcess => "built in".to_string(),
        };
        println!(
            "{} {} (api {})  {origin}",
            plugin.name(),
            plugin.version(),
            plugin.api_version()
        );
        for spec in plugin.options() {
            println!(
                "    {:<22} {} (default {})\n    {:<22} {}",
                spec.key,
                spec.expected(),
                spec.default,
                "",
                spec.help
            );
        }
    }
    for error in errors {
        eprintln!("skipped: {error}");
    }
    Ok(())
}
