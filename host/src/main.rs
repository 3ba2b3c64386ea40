//! The `lmhost` command line.

mod commands;

use std::error::Error as _;
use std::process::ExitCode;

use clap::Parser;

use commands::Cli;

fn main() -> ExitCode {
    tune_thread_env();
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

/// Sets, where unset, what candle 0.11's CPU thread pools read from the environment (the
/// candle plugin's `tune_thread_env`, which the host cannot call: plugins load at run time).
/// `RAYON_NUM_THREADS` to rayon's own default (the available parallelism): candle reads it on
/// every f32 matrix product and, when it is missing, counts the physical cores from
/// `/proc/cpuinfo` and sysfs each time, about a fifth of a decode step on SmolLM2.
/// `CANDLE_BARRIER_POOL_SPIN_LIMIT=0`: candle's own pool for large elementwise ops otherwise
/// spins after each, on the cores the next matrix product needs (128-token prefill 10-24%
/// slower). Done first, while the process has one thread, so no other thread reads the
/// environment as it changes.
fn tune_thread_env() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "0");
    }
}
