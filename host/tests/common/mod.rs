//! Test helpers: `lmhost serve` over mock on a free loopback port, an HTTP client, and a
//! scripted HTTP server for failure cases a real server will not produce on demand.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use lmhost::serve::{self, ServeOptions};
use lmhost::{Backend, Config, Host};
use serde_json::Value;

pub const MODEL: &str = "mock-model";

/// The repository's root, where `models/`, `configs/` and `examples/` lie.
pub fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `path` under the repository's root, which the script `setup` puts in place; a test that
/// finds it missing fails saying so.
pub fn require(path: &str, setup: &str) -> std::path::PathBuf {
    let path = repo().join(path);
    assert!(
        path.exists(),
        "{} is missing: run scripts/{setup}",
        path.display()
    );
    path
}

/// Runs `lmhost -q explain --json <json> <args>` from the repository's root, checks that it
/// succeeds, and returns the JSON document.
pub fn explain_json<S: AsRef<std::ffi::OsStr>>(json: &Path, args: &[S]) -> Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .current_dir(repo())
        .args(["-q", "explain", "--json"])
        .arg(json)
        .args(args)
        .output()
        .expect("lmhost runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "lmhost explain failed: {stderr}");
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// Each player's value, in the report's order.
pub fn values(report: &Value) -> Vec<f64> {
    report["players"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["value"].as_f64().unwrap())
        .collect()
}

/// A host with mock linked in. Other plugins load from their libraries, found next to the test
/// executable (`target/*/deps`): the `openai` plugin's library crate is a dev-dependency so
/// that cargo builds it there.
pub fn host() -> Host {
    let mut host = Host::new();
    host.register(lmhost::root_module::<lmhost_mock::Mock>());
    host
}

pub fn open(config: &str) -> Backend {
    let config = Config::parse(config, Path::new("test.toml")).expect("test config parses");
    host().open(&config).expect("backend opens")
}

pub fn mock_config(latency_ms: u64) -> String {
    format!(
        "[backend]\nkind = \"mock\"\nmodel_id = \"{MODEL}\"\n\
         [backend.options]\nreply_words = 6\nlatency_ms = {latency_ms}\n"
    )
}

/// `lmhost serve` in a thread of its own, over mock; stopped (gracefully) on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    pub fn mock(latency_ms: u64, configure: impl FnOnce(&mut ServeOptions)) -> TestServer {
        Self::start(&mock_config(latency_ms), configure)
    }

    /// A server over the backend `config` (TOML text) names.
    pub fn start(config: &str, configure: impl FnOnce(&mut ServeOptions)) -> TestServer {
        let config = Config::parse(config, Path::new("test.toml")).unwrap();
        let backend = Arc::new(host().open(&config).unwrap());
        let mut options = ServeOptions::new(MODEL);
        configure(&mut options);
        let app = serve::router(backend, config.generation.clone(), options);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let shutdown = async {
                    let _ = stopped.await;
                };
                serve::serve(listener, app, shutdown).await;
            });
        });
        TestServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Starts a graceful shutdown and waits until the server has finished.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// An HTTP answer: status, headers we look at, body.
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub content_type: String,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    let mut response = response.expect("the server answers");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let retry_after = header("retry-after");
    let content_type = header("content-type").unwrap_or_default();
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().unwrap();
    Answer {
        status,
        retry_after,
        content_type,
        body,
    }
}

pub fn post(url: &str, body: &str) -> Answer {
    post_with(url, body, None)
}

pub fn post_with(url: &str, body: &str, bearer: Option<&str>) -> Answer {
    let mut request = agent().post(url).header("Content-Type", "application/json");
    if let Some(key) = bearer {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    answer(request.send(body))
}

/// A POST whose body is read as it arrives: server-sent events one at a time.
pub struct EventStream {
    reader: BufReader<Box<dyn Read + Send>>,
}

impl EventStream {
    pub fn open(url: &str, body: &str) -> EventStream {
        let response = agent()
            .post(url)
            .header("Content-Type", "application/json")
            .send(body)
            .expect("the server answers");
        assert_eq!(response.status().as_u16(), 200);
        let reader: Box<dyn Read + Send> = Box::new(response.into_body().into_reader());
        EventStream {
            reader: BufReader::new(reader),
        }
    }

    /// The next event's data, or `None` at the end of the stream.
    pub fn next_event(&mut self) -> Option<String> {
        let mut data = String::new();
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).unwrap_or(0) == 0 {
                return (!data.is_empty()).then_some(data);
            }
            match line.trim_end_matches(['\r', '\n']) {
                "" if !data.is_empty() => return Some(data),
                "" => {}
                line => data.push_str(line.strip_prefix("data: ").unwrap_or(line)),
            }
        }
    }
}

/// The value of an unlabelled metric in `/metrics`.
pub fn metric(server: &TestServer, name: &str) -> f64 {
    let text = get(&server.url("/metrics")).body;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no `{name}` in\n{text}"))
}

/// How many requests to `route` the server at `root` answered with 200 (0 before the first).
pub fn answered(root: &str, route: &str) -> f64 {
    let name = format!("lmhost_requests_total{{route=\"{route}\",status=\"200\"}} ");
    let text = get(&format!("{root}/metrics")).body;
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix(&name)?.parse().ok());
    count.unwrap_or(0.0)
}

/// Waits (polling) until no request is in flight: the worker slots are free again.
pub fn wait_until_idle(server: &TestServer) {
    for _ in 0..1000 {
        if metric(server, "lmhost_queue_in_flight") == 0.0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("requests still in flight after 10 s");
}

pub fn get(url: &str) -> Answer {
    get_with(url, None)
}

pub fn get_with(url: &str, bearer: Option<&str>) -> Answer {
    let mut request = agent().get(url);
    if let Some(key) = bearer {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    answer(request.call())
}

/// A server that answers each request with the next scripted `(status, body)` (the last one
/// repeats), or never answers when the status is 0; it records each request's head and body.
pub struct ScriptServer {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<String>>>,
}

impl ScriptServer {
    pub fn start(script: Vec<(u16, String)>) -> ScriptServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for (i, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { return };
                let (status, body) = script[i.min(script.len() - 1)].clone();
                let seen = seen.clone();
                std::thread::spawn(move || respond(stream, status, &body, &seen));
            }
        });
        ScriptServer { addr, requests }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

fn respond(stream: TcpStream, status: u16, body: &str, seen: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let mut payload = vec![0; length];
    let _ = reader.read_exact(&mut payload);
    head.push_str(&String::from_utf8_lossy(&payload));
    seen.lock().unwrap().push(head);
    if status == 0 {
        // Hold the connection open without answering until the client gives up.
        let _ = reader.read_to_end(&mut Vec::new());
        return;
    }
    let mut stream = reader.into_inner();
    let reply = format!(
        "HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(reply.as_bytes());
}

/// A minimal chat completion answer.
pub fn chat_answer(text: &str) -> String {
    serde_json::json!({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    })
    .to_string()
}

/// Two explanations' values order every pair of players alike wherever the pair's gap exceeds
/// `tolerance`, the difference the two computations make by design: a closer pair is a tie that
/// rounding decides, differently on other CPUs.
pub fn assert_same_order(a: &[f64], b: &[f64], tolerance: f64) {
    assert_eq!(a.len(), b.len());
    for i in 0..a.len() {
        for j in i + 1..a.len() {
            let decided = (a[i] - a[j]).abs() > tolerance || (b[i] - b[j]).abs() > tolerance;
            if decided {
                assert_eq!(
                    a[i] > a[j],
                    b[i] > b[j],
                    "players {i} and {j} are ordered apart: {a:?} / {b:?}"
                );
            }
        }
    }
}

/// Headless Chromium (Debian's `chromium`, which `scripts/setup-system` installs) on `url` with
/// `args` (`--dump-dom`: the page's DOM after its scripts ran; `--screenshot=FILE`); its stdout.
pub fn chromium(url: &str, args: &[&str]) -> String {
    let output = std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs: install it with scripts/setup-system");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
