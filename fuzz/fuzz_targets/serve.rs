//! An arbitrary request body to each POST route of `serve`, over the mock backend in-process:
//! an answer or a 4xx naming the problem, never a 5xx, a crash or a request that never ends.
#![no_main]

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use lmhost::serve::{router, ServeOptions};
use lmhost::{Config, Host};
use tower::ServiceExt;

const ROUTES: [&str; 5] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/tokenize",
    "/detokenize",
];

fn app() -> &'static (tokio::runtime::Runtime, axum::Router) {
    static APP: OnceLock<(tokio::runtime::Runtime, axum::Router)> = OnceLock::new();
    APP.get_or_init(|| {
        let toml = "[backend]\nkind = \"mock\"\nmodel_id = \"mock-model\"\n";
        let config = Config::parse(toml, std::path::Path::new("fuzz.toml")).expect("config");
        let backend = Arc::new(Host::new().open(&config).expect("the mock opens"));
        let app = router(backend, config.generation.clone(), ServeOptions::new("mock-model"));
        // Timers on, as `lmhost serve` runs: a request waits in its queue with a timeout.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        (runtime, app)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&route, body)) = data.split_first() else {
        return;
    };
    let (runtime, app) = app();
    let path = ROUTES[route as usize % ROUTES.len()];
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a request");
    let status = runtime.block_on(async {
        let response = app.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        // Read the whole answer, a stream included.
        let _ = axum::body::to_bytes(response.into_body(), 64 << 20).await;
        status
    });
    assert!(!status.is_server_error(), "{path} answered {status}");
});
