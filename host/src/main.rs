//! The `lmhost` command line.

mod commands;

use std::error::Error as _;
use std::process::ExitCode;

use clap::Parser;

use commands::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    lmhost::logging::init(cli.verbose, cli.quiet);
    match commands::run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            let mut source = err.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            if let (true, lmhost::Error::IncompatiblePlugin(refused)) = (cli.verbose > 0, &err) {
                eprintln!("\nabi_stable layout report:\n{}", refused.report);
            }
            ExitCode::FAILURE
        }
    }
}
