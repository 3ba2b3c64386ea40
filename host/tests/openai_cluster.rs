//! The `openai` plugin over several `lmhost serve` endpoints (`base_urls`) on loopback, each
//! running mock: the same values as one endpoint, prompts spread by shared prefix, a server
//! shut down midway leaving its prompts to the others, `lmhost explain` over three server
//! processes one of which is SIGKILLed, and the settings a cluster refuses.

mod common;

use common::{open, TestServer, MODEL};
use lmhost::{Config, ConversationSnapshot, ScoreRecord};
use lmhost_plugin_api::{Message, Role};

/// `lmhost serve` publishes no template; scoring renders chat with this one.
const LINES_TEMPLATE: &str = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:\n{% endif %}";

fn config(urls: &[String], dir: &tempfile::TempDir, options: &str) -> String {
    let template = dir.path().join("lines.jinja");
    std::fs::write(&template, LINES_TEMPLATE).unwrap();
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    format!(
        "[backend]\nkind = \"openai\"\nmodel_id = \"{MODEL}\"\n[backend.options]\n\
         base_urls = [{}]\nbackoff_ms = 1\nmax_retries = 1\nconcurrency = 2\n\
         chat_template = \"{}\"\n{options}\n",
        urls.join(", "),
        template.display()
    )
}

/// Coalitions of a five-message conversation: 32 prompts, sorted as explain sorts them.
fn coalitions() -> Vec<ConversationSnapshot> {
    let texts = [
        "red green",
        "blue red",
        "green blue",
        "red red",
        "blue green",
    ];
    let mut prompts: Vec<ConversationSnapshot> = (0u32..32)
        .map(|mask| {
            let messages = (0..5)
                .filter(|k| mask >> k & 1 == 1)
                .map(|k| Message::text(Role::User, texts[k]));
            let mut messages: Vec<Message> = messages.collect();
            messages.insert(0, Message::text(Role::System, "Answer with colours."));
            ConversationSnapshot::new(lmhost::conversation::group_turns(messages)).unwrap()
        })
        .collect();
    prompts.sort_by_key(lmhost::explain::schedule::content_key);
    prompts
}

fn logprobs(records: &[ScoreRecord]) -> Vec<Vec<f32>> {
    records.iter().map(|r| r.logprobs.to_vec()).collect()
}

/// Prompts an endpoint scored: `/generate` twice each (the prompt's length, then its score).
fn scored(server: &TestServer) -> f64 {
    common::answered(&server.url(""), "/generate") / 2.0
}

#[test]
fn a_cluster_scores_as_one_endpoint_and_spreads_whole_runs() {
    let dir = tempfile::tempdir().unwrap();
    let servers = [TestServer::mock(0, |_| {}), TestServer::mock(0, |_| {})];
    let urls: Vec<String> = servers.iter().map(|s| s.url("/v1")).collect();
    let prompts = coalitions();
    let one = open(&config(&urls[..1], &dir, "")).score_batch(&prompts, "red blue");
    let one = one.unwrap();
    let cluster = open(&config(&urls, &dir, ""));
    let before = [scored(&servers[0]), scored(&servers[1])];
    let both = cluster.score_batch(&prompts, "red blue").unwrap();
    assert_eq!(
        logprobs(&both),
        logprobs(&one),
        "same values through two endpoints"
    );
    // Each endpoint took some of the prompts.
    let a = scored(&servers[0]) - before[0];
    let b = scored(&servers[1]) - before[1];
    assert_eq!(a + b, prompts.len() as f64);
    assert!(a > 0.0 && b > 0.0, "{a} and {b}");
    // Without affinity, as a load balancer spreads them: the same values.
    let spread = open(&config(&urls, &dir, "affinity = false"));
    let spread = spread.score_batch(&prompts, "red blue").unwrap();
    assert_eq!(logprobs(&spread), logprobs(&one));
}

#[test]
fn a_server_shut_down_midway_leaves_its_prompts_to_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers: Vec<TestServer> = (0..3).map(|_| TestServer::mock(30, |_| {})).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url("/v1")).collect();
    let prompts = coalitions();
    let want = open(&config(&urls[..1], &dir, ""))
        .score_batch(&prompts, "red blue")
        .unwrap();
    let cluster = open(&config(&urls, &dir, ""));
    let victim = servers.remove(1);
    let got = std::thread::scope(|scope| {
        let run = scope.spawn(|| cluster.score_batch(&prompts, "red blue"));
        // Once it has scored a prompt.
        let started = std::time::Instant::now();
        while scored(&victim) < 1.0 && started.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let taken = scored(&victim).floor();
        drop(victim); // shuts the server down: it finishes what it has, then refuses
        (run.join().unwrap(), taken)
    });
    let (got, taken) = got;
    assert!(taken >= 1.0, "the victim had scored prompts: {taken}");
    assert!(taken < prompts.len() as f64, "and had more to do: {taken}");
    let got = got.expect("the other endpoints finish the run");
    assert_eq!(logprobs(&got), logprobs(&want), "no value lost or changed");
}

#[test]
fn settings_a_cluster_cannot_work_with_are_refused_naming_the_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::mock(0, |_| {});
    let other = TestServer::mock(0, |options| options.model_name = "another-model".into());
    let url = server.url("/v1");
    let refused = |text: String| -> String {
        let config = Config::parse(&text, std::path::Path::new("c.toml")).unwrap();
        match common::host().open(&config) {
            Ok(_) => panic!("{text} opened"),
            Err(e) => e.to_string(),
        }
    };
    let cases = [
        (config(&[], &dir, ""), "option `base_urls` is empty"),
        (
            config(&[url.clone(), "ftp://10.0.0.1/v1".into()], &dir, ""),
            "endpoint `ftp://10.0.0.1/v1` is not an http:// or https:// URL",
        ),
        (
            config(
                std::slice::from_ref(&url),
                &dir,
                &format!("base_url = {url:?}"),
            ),
            "give `base_url` (one server) or `base_urls` (several), not both",
        ),
        (
            config(&[url.clone(), other.url("/v1")], &dir, ""),
            &format!(
                "endpoint {} does not serve model `{MODEL}`",
                other.url("/v1")
            ),
        ),
    ];
    // Nothing listens on a port just freed.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1", listener.local_addr().unwrap())
    };
    let down = format!("cannot reach {dead}/models");
    let cases = cases.into_iter().chain([(
        config(&[url.clone(), dead.clone()], &dir, ""),
        down.as_str(),
    )]);
    for (text, says) in cases {
        let err = refused(text);
        assert!(err.contains(says), "{err} should say {says}");
        assert!(
            !says.starts_with("cannot reach") || err.contains("start the server"),
            "{err}"
        );
    }
}

/// An `lmhost serve` process on a free port, killed when dropped.
struct ServeProcess {
    child: std::process::Child,
    url: String,
}

impl ServeProcess {
    fn start(config: &std::path::Path) -> ServeProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_lmhost"))
            .args(["-q", "serve", "--config"])
            .arg(config)
            .args(["--port", &port.to_string(), "--workers", "4"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let started = std::time::Instant::now();
        while ureq::get(&format!("{url}/health")).call().is_err() {
            assert!(started.elapsed().as_secs() < 30, "{url} did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        ServeProcess { child, url }
    }

    fn scored(&self) -> f64 {
        common::answered(&self.url, "/generate") / 2.0
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `lmhost explain` over three `lmhost serve` processes, one SIGKILLed midway: the run
/// completes with the values one endpoint gives, and its log names the endpoint that went down.
#[test]
fn explain_survives_an_endpoint_killed_midway_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let mock = dir.path().join("mock.toml");
    std::fs::write(&mock, common::mock_config(60)).unwrap();
    let servers: Vec<ServeProcess> = (0..3).map(|_| ServeProcess::start(&mock)).collect();
    let urls: Vec<String> = servers.iter().map(|s| format!("{}/v1", s.url)).collect();
    let conversation = dir.path().join("conversation.json");
    let messages: Vec<serde_json::Value> = [
        "red green",
        "blue red",
        "green blue",
        "red red",
        "blue green",
    ]
    .iter()
    .map(|text| serde_json::json!({"role": "user", "content": text}))
    .collect();
    std::fs::write(
        &conversation,
        serde_json::json!({ "messages": messages }).to_string(),
    )
    .unwrap();
    let explain = |urls: &[String], name: &str| {
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, self::config(urls, &dir, "")).unwrap();
        let json = dir.path().join(format!("{name}.json"));
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_lmhost"))
            .args([
                "explain",
                "--estimator",
                "exact",
                "--reply",
                "red blue",
                "--json",
            ])
            .arg(&json)
            .arg("--config")
            .arg(&config)
            .arg("--conversation")
            .arg(&conversation)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        (child, json)
    };
    let (alone, json) = explain(&urls[..1], "alone");
    let output = alone.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let want =
        common::values(&serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap());

    let before = servers[1].scored();
    let (run, json) = explain(&urls, "cluster");
    let started = std::time::Instant::now();
    while servers[1].scored() < before + 1.0 && started.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let mut servers = servers;
    let mut victim = servers.remove(1);
    victim.child.kill().unwrap(); // SIGKILL: in-flight requests die with it
    let output = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let got =
        common::values(&serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap());
    assert_eq!(got, want, "no value lost or changed");
    assert!(
        stderr.contains(&format!("endpoint {}/v1 is down", victim.url)),
        "{stderr}"
    );
}
