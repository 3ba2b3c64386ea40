//! The `lmhost` command line.

mod commands;

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
            let mut lines = chain(&err).into_iter();
            if let Some(first) = lines.next() {
                eprintln!("error: {first}");
            }
            for cause in lines {
                eprintln!("  caused by: {cause}");
            }
            if let (true, lmhost::Error::IncompatiblePlugin(refused)) = (cli.verbose > 0, &err) {
                eprintln!("\nabi_stable layout report:\n{}", refused.report);
            }
            ExitCode::FAILURE
        }
    }
}

/// The messages of `err` and its causes, each only where the ones before do not already say it
/// (a backend error carries its plugin error's message).
fn chain(err: &dyn std::error::Error) -> Vec<String> {
    let mut lines: Vec<String> = vec![err.to_string()];
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !lines.iter().any(|line| line.contains(&text)) {
            lines.push(text);
        }
        source = cause.source();
    }
    lines
}

/// Sets, where unset, what candle 0.11's CPU thread pools read from the environment (the
/// candle plugin's `tune_thread_env`, which the host cannot call: plugins load at run time).
/// `RAYON_NUM_THREADS` to rayon's own default (the available parallelism): candle reads it on
/// every f32 matrix product and, when it is missing, counts the physical cores from
/// `/proc/cpuinfo` and sysfs each time, a large part of a small model's decode step.
/// `CANDLE_BARRIER_POOL_SPIN_LIMIT=0`: candle's own pool for large elementwise ops otherwise
/// spins after each, on the cores the next matrix product needs. Done first, while the process has one thread, so no other thread reads the
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
