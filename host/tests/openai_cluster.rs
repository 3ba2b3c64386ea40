//! The `openai` plugin over several `lmhost serve` endpoints (`base_urls`) on loopback, each
//! running mock: the same values as one endpoint, prompts spread by shared prefix, a server
//! shut down midway leaving its prompts to the others, and the settings a cluster refuses.

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
    let name = "lmhost_requests_total{route=\"/generate\",status=\"200\"} ";
    let text = common::get(&server.url("/metrics")).body;
    let count = text.lines().find_map(|l| l.strip_prefix(name)?.parse().ok());
    count.unwrap_or(0.0) / 2.0
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
    for (text, says) in cases {
        let err = refused(text);
        assert!(err.contains(says), "{err} should say {says}");
    }
}
