//! `lmhost serve`: the configured backend behind an OpenAI-compatible HTTP server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use lmhost::serve::{self, Limits, ServeOptions, StopFlag};
use lmhost::{Config, Error, Host, Result};

use super::ConfigArg;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,

    /// Address to bind; loopback unless told otherwise.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    host: IpAddr,

    #[arg(long, default_value_t = 8000)]
    port: u16,

    /// Name of the environment variable holding the bearer token clients must send.
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,

    /// The model name clients send (default: the config's model_id, else the backend's).
    #[arg(long)]
    model_name: Option<String>,

    /// Backend calls that may run at once.
    #[arg(long, default_value_t = 4)]
    workers: usize,

    /// Requests that may wait for a worker; more get 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue_depth: usize,

    /// Longest a request may wait and run, in seconds.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,

    /// Largest request body, in bytes: room for a photo or two sent inline as base64.
    #[arg(long, default_value_t = 32 << 20)]
    body_limit: usize,

    /// Most tokens one reply may ask for (`max_tokens`); more gets a 400.
    #[arg(long, default_value_t = 4096)]
    max_tokens: u32,

    /// Most texts one /v1/embeddings request may hold.
    #[arg(long, default_value_t = 256)]
    max_embedding_inputs: usize,

    /// Most bytes of text one /v1/embeddings request may hold.
    #[arg(long, default_value_t = 1 << 20)]
    max_embedding_bytes: usize,

    /// After SIGINT/SIGTERM, seconds to let running requests finish before their generations
    /// are stopped (they then end early, as `length`).
    #[arg(long, default_value_t = 30)]
    grace_s: u64,
}

pub fn run(args: &Args) -> Result<()> {
    let config = Config::load(&args.config.config)?;
    let api_key = match &args.api_key_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            Error::Invalid(format!(
                "--api-key-env names `{var}`, but that environment variable is not set"
            ))
        })?),
        None => None,
    };
    let backend = Arc::new(Host::new().open(&config)?);
    // A model that cannot load (a wrong path, a corrupt file, an unreachable hub) stops `serve`
    // here with the backend's error, rather than answering every request 503; and the first
    // request does not wait for the load.
    backend.load()?;
    let model_name = args
        .model_name
        .clone()
        .or_else(|| Some(config.backend.model_id.clone()).filter(|m| !m.is_empty()))
        .unwrap_or_else(|| backend.model_id());
    let options = ServeOptions {
        model_name,
        workers: args.workers,
        queue_depth: args.queue_depth,
        request_timeout: Duration::from_secs(args.timeout_s),
        body_limit: args.body_limit,
        api_key,
        limits: Limits {
            max_tokens: args.max_tokens,
            max_embedding_inputs: args.max_embedding_inputs,
            max_embedding_bytes: args.max_embedding_bytes,
        },
        stop: StopFlag::default(),
    };
    let (stop, grace) = (options.stop.clone(), Duration::from_secs(args.grace_s));
    let addr = SocketAddr::new(args.host, args.port);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Invalid(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Invalid(format!("cannot listen on {addr}: {e}")))?;
        let addr = listener.local_addr().unwrap_or(addr);
        eprintln!(
            "lmhost serve: `{}` (backend `{}`) on http://{addr}/v1",
            options.model_name,
            backend.plugin()
        );
        let app = serve::router(backend, config.generation.clone(), options);
        let shutdown = async move {
            serve::shutdown_signal().await;
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                stop.stop();
                tracing::warn!("grace period over: stopped the generations still running");
            });
        };
        serve::serve(listener, app, shutdown).await;
        Ok(())
    })
}
