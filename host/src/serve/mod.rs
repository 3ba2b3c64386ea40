//! `lmhost serve`: an OpenAI-compatible HTTP server over any configured backend.
//!
//! The plugin API is blocking, so the server is a thin async shell: handlers validate and
//! translate requests (`wire`, `body`), hand the backend call to the bounded fair `queue`
//! (which runs it on tokio's blocking threads), and translate the record back. Streaming
//! responses relay the token deltas the backend sends as it generates (`stream`), so a client
//! sees each token as it is made.
//!
//! Architecture invariant: no tokio type crosses the plugin boundary; backends only ever see
//! blocking calls from blocking threads.

pub mod body;
mod echo;
pub mod error;
mod generate;
mod messages;
pub mod metrics;
mod openapi;
pub mod queue;
mod routes;
mod score;
mod state;
mod stream;
mod tokens;
pub mod wire;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use lmhost_plugin_api::GenerationConfig;

use crate::Backend;

/// How the server runs; the defaults suit one local user.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The name clients must send as `model`.
    pub model_name: String,
    /// Backend calls that may run at once.
    pub workers: usize,
    /// Requests that may wait for a worker before new ones get `503`.
    pub queue_depth: usize,
    /// Longest a request may wait and run.
    pub request_timeout: Duration,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// When set, every route but `/health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// What one request may ask for.
    pub limits: Limits,
    /// Stops every running generation at its next token when set (the end of a shutdown's
    /// grace period).
    pub stop: StopFlag,
}

/// Per-request bounds; a request beyond one gets a 400 naming it.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most tokens one reply may ask for (`max_tokens`); the config's default is capped too.
    pub max_tokens: u32,
    /// Most inputs in one `/v1/embeddings` request.
    pub max_embedding_inputs: usize,
    /// Most bytes of text in one `/v1/embeddings` request.
    pub max_embedding_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tokens: 4096,
            max_embedding_inputs: 256,
            max_embedding_bytes: 1 << 20,
        }
    }
}

/// A flag shared by the server and whoever shuts it down.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    pub fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl ServeOptions {
    pub fn new(model_name: impl Into<String>) -> Self {
        ServeOptions {
            model_name: model_name.into(),
            workers: 4,
            queue_depth: 64,
            request_timeout: Duration::from_secs(300),
            body_limit: 32 << 20,
            api_key: None,
            limits: Limits::default(),
            stop: StopFlag::default(),
        }
    }
}

/// The application: routes, auth, body limit and metrics, over `backend`.
/// `defaults` are the config's `[generation]` settings that requests override.
pub fn router(backend: Arc<Backend>, defaults: GenerationConfig, options: ServeOptions) -> Router {
    let state = Arc::new(state::AppState {
        backend,
        defaults,
        model: options.model_name,
        queue: queue::Queue::new(
            options.workers,
            options.queue_depth,
            options.request_timeout,
        ),
        metrics: metrics::Metrics::default(),
        api_key: options.api_key,
        next_id: AtomicU64::new(0),
        limits: options.limits,
        stop: options.stop,
    });
    routes::build(state, options.body_limit)
}

/// How long a client may take to send a request's head; then its connection is closed, so a
/// client that trickles its headers (slowloris) holds a connection for no longer.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `shutdown` resolves, then finishes in-flight requests.
/// Accept errors are logged and retried, so serving never fails once listening.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    serve_with(listener, app, shutdown, HEAD_TIMEOUT).await;
}

/// hyper's connection loop, as `axum::serve` runs it, with a timer and so a deadline for each
/// request's head, which `axum::serve` does not set.
async fn serve_with(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()>,
    head_timeout: Duration,
) {
    use axum::serve::Listener;
    let mut listener = unbuffered(listener);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(head_timeout);
    let connections = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    loop {
        // Accept errors (a full file table) are logged and retried by axum's `Listener`.
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let connection = connections.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("a connection ended with an error: {e}");
            }
        });
    }
    connections.shutdown().await;
}

/// `listener` with Nagle's algorithm off on every connection (`TCP_NODELAY`), so each small
/// write goes out at once: a stream's token chunks had waited for the client's delayed
/// acknowledgment of the one before (40 ms on Linux), ten times a token's time.
fn unbuffered(
    listener: tokio::net::TcpListener,
) -> axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("a connection keeps Nagle's algorithm: {e}");
        }
    })
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

#[cfg(test)]
mod tests {
    use axum::serve::Listener;

    /// A client that sends part of a request's head and then nothing is cut off once the
    /// head's time is up, while other clients are served.
    #[tokio::test]
    async fn a_trickled_request_head_is_cut_off() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let timeout = std::time::Duration::from_millis(300);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(super::serve_with(
            listener,
            app,
            async {
                let _ = stopped.await;
            },
            timeout,
        ));
        let mut slow = tokio::net::TcpStream::connect(at).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut quick = tokio::net::TcpStream::connect(at).await.unwrap();
        quick
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        quick.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(timeout * 10, slow.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the trickling client was never cut off");
        assert!(started.elapsed() < timeout * 10);
        stop.send(()).unwrap();
        server.await.unwrap();
    }

    /// Accepted connections have Nagle's algorithm off.
    #[tokio::test]
    async fn connections_send_each_write_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let client = tokio::spawn(tokio::net::TcpStream::connect(at));
        let (io, _) = super::unbuffered(listener).accept().await;
        assert!(io.nodelay().unwrap());
        client.await.unwrap().unwrap();
    }
}
