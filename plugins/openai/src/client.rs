//! Blocking HTTP to the server: bearer auth, a concurrency limit, retries and error mapping.
//!
//! Blocking on purpose: the plugin API is blocking and the host runs calls on its own threads,
//! so no async runtime lives in (or crosses into) the plugin. Retries use exponential backoff
//! with full jitter, honour `Retry-After`, and happen only where a retry can help: a refused or
//! reset connection, `429` and `5xx`. A `4xx` is the request's fault and is returned at once.
//! The API key is sent in a header and never formatted into a log line or an error.

use std::sync::{Condvar, Mutex};
use std::thread::sleep;
use std::time::Duration;

use lmhost_plugin_api::serde_json::Value;
use lmhost_plugin_api::{Logger, PluginError};
use ureq::http::Response;
use ureq::{Agent, Body};

/// How the client talks to one server.
pub struct ClientConfig {
    /// e.g. `http://127.0.0.1:8000/v1`, without a trailing slash.
    pub base_url: String,
    pub api_key: Option<String>,
    pub timeout: Duration,
    pub max_retries: u32,
    pub concurrency: usize,
    /// First backoff delay; doubles per retry.
    pub backoff: Duration,
}

pub struct Client {
    agent: Agent,
    config: ClientConfig,
    slots: Semaphore,
    logger: Logger,
}

/// Longest an aliveness probe waits.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest wait between two tries, whatever `Retry-After` says.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

impl Client {
    pub fn new(config: ClientConfig, logger: Logger) -> Self {
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(config.timeout))
            .build()
            .into();
        Client {
            agent,
            slots: Semaphore::new(config.concurrency.max(1)),
            config,
            logger,
        }
    }

    /// Most requests in flight at once.
    pub fn concurrency(&self) -> usize {
        self.config.concurrency.max(1)
    }

    pub fn base_url(&self) -> &str {
        &self.config.base_url
    }

    /// The server root: `base_url` without its trailing `/v1`.
    pub fn root_url(&self) -> &str {
        let base = self.config.base_url.as_str();
        base.strip_suffix("/v1").unwrap_or(base)
    }

    /// `POST {base_url}{path}` with a JSON body; the JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> Result<Value, PluginError> {
        let url = format!("{}{path}", self.config.base_url);
        self.send(&url, || {
            self.authorize(self.agent.post(&url)).send_json(body)
        })
    }

    /// `POST {root}{path}`, for servers' native endpoints such as SGLang's `/generate`.
    pub fn post_root(&self, path: &str, body: &Value) -> Result<Value, PluginError> {
        let url = format!("{}{path}", self.root_url());
        self.send(&url, || {
            self.authorize(self.agent.post(&url)).send_json(body)
        })
    }

    /// `POST {base_url}{path}` asking for server-sent events: each event's JSON goes to
    /// `event` as it arrives, until `[DONE]` or `event` answers `false` (then the connection is
    /// dropped, which makes the server stop). Retries as [`Client::post`] until the events
    /// start; a stream cut off midway is an error.
    pub fn post_events(
        &self,
        path: &str,
        body: &Value,
        mut event: impl FnMut(&Value) -> bool,
    ) -> Result<(), PluginError> {
        let url = format!("{}{path}", self.config.base_url);
        let _slot = self.slots.acquire();
        let mut attempt = 0;
        let response = loop {
            let failure = match self.authorize(self.agent.post(&url)).send_json(body) {
                Ok(response) if response.status().is_success() => break response,
                Ok(response) => refused(&url, response),
                Err(error) => transport_failure(&url, error, self.config.timeout),
            };
            if !failure.retryable || attempt >= self.config.max_retries {
                return Err(failure.error);
            }
            sleep(backoff(self.config.backoff, attempt, failure.retry_after));
            attempt += 1;
        };
        let lines =
            std::io::BufRead::lines(std::io::BufReader::new(response.into_body().into_reader()));
        for line in lines {
            let line = line.map_err(|e| {
                PluginError::unavailable(format!("the event stream of {url} broke off: {e}"))
            })?;
            let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                continue;
            };
            if data == "[DONE]" {
                return Ok(());
            }
            let value: Value = lmhost_plugin_api::serde_json::from_str(data).map_err(|e| {
                PluginError::unavailable(format!(
                    "{url} sent an event that is not JSON ({e}): {}",
                    excerpt(data)
                ))
            })?;
            if let Some(message) = value.pointer("/error/message") {
                return Err(PluginError::unavailable(format!(
                    "{url} failed midway through its stream: {message}"
                )));
            }
            if !event(&value) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Whether the server answers `GET /models` now (one try, within [`PROBE_TIMEOUT`]): how
    /// a server that went away is told from one whose answer was the failure.
    pub fn alive(&self) -> bool {
        let url = format!("{}/models", self.config.base_url);
        let request = (self.authorize(self.agent.get(&url)).config())
            .timeout_global(Some(PROBE_TIMEOUT))
            .build();
        request.call().is_ok_and(|r| r.status().is_success())
    }

    /// `GET` of a full URL; the JSON answer.
    pub fn get(&self, url: &str) -> Result<Value, PluginError> {
        self.send(url, || self.authorize(self.agent.get(url)).call())
    }

    fn authorize<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.config.api_key {
            Some(key) => request.header("Authorization", format!("Bearer {key}")),
            None => request,
        }
    }

    fn send(
        &self,
        url: &str,
        attempt_once: impl Fn() -> Result<Response<Body>, ureq::Error>,
    ) -> Result<Value, PluginError> {
        let _slot = self.slots.acquire();
        let mut attempt = 0;
        loop {
            let failure = match attempt_once() {
                Ok(response) => match read(url, response) {
                    Ok(value) => return Ok(value),
                    Err(failure) => failure,
                },
                Err(error) => transport_failure(url, error, self.config.timeout),
            };
            if !failure.retryable || attempt >= self.config.max_retries {
                return Err(failure.error);
            }
            let delay = backoff(self.config.backoff, attempt, failure.retry_after);
            self.logger.warn(&format!(
                "{} (try {} of {}); retrying in {} ms",
                failure.error.message,
                attempt + 1,
                self.config.max_retries + 1,
                delay.as_millis()
            ));
            sleep(delay);
            attempt += 1;
        }
    }
}

/// One failed try, and whether another may succeed.
struct Failure {
    error: PluginError,
    retryable: bool,
    retry_after: Option<Duration>,
}

fn read(url: &str, mut response: Response<Body>) -> Result<Value, Failure> {
    let status = response.status().as_u16();
    if !(200..300).contains(&status) {
        return Err(refused(url, response));
    }
    let text = body_text(url, &mut response)?;
    lmhost_plugin_api::serde_json::from_str(&text).map_err(|e| Failure {
        error: PluginError::unavailable(format!(
            "{url} answered {status} with a body that is not JSON ({e}): {}",
            excerpt(&text)
        )),
        retryable: false,
        retry_after: None,
    })
}

/// A non-2xx answer as a failure: its status mapped to an error kind (with the server's own
/// words), worth retrying on `429` and `5xx`, after `Retry-After` if the server says.
fn refused(url: &str, mut response: Response<Body>) -> Failure {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    match body_text(url, &mut response) {
        Ok(text) => Failure {
            error: status_error(url, status, &text),
            retryable: status == 429 || status >= 500,
            retry_after,
        },
        Err(failure) => failure,
    }
}

fn body_text(url: &str, response: &mut Response<Body>) -> Result<String, Failure> {
    response.body_mut().read_to_string().map_err(|e| Failure {
        error: PluginError::unavailable(format!("reading the answer of {url} failed: {e}")),
        retryable: false,
        retry_after: None,
    })
}

/// Maps an HTTP error status to a stable kind, with the status and the server's message.
pub fn status_error(url: &str, status: u16, body: &str) -> PluginError {
    let message = format!("{url} answered HTTP {status}: {}", server_message(body));
    match status {
        401 | 403 => PluginError::config(format!(
            "{message} (check the key in the variable named by `api_key_env`)"
        )),
        404 => PluginError::config(format!("{message} (check `base_url` and `model`)")),
        400..=499 if status != 429 => PluginError::invalid_input(message),
        _ => PluginError::unavailable(message),
    }
}

/// The server's own words: OpenAI's `{"error": {"message"}}`, FastAPI's `detail`, or the text.
fn server_message(body: &str) -> String {
    let json: Option<Value> = lmhost_plugin_api::serde_json::from_str(body).ok();
    let found = json.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .or_else(|| v.get("error"))
            .map(|m| match m {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
    });
    found.unwrap_or_else(|| excerpt(body))
}

fn excerpt(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None if text.is_empty() => "(empty body)".to_string(),
        None => text.to_string(),
    }
}

fn transport_failure(url: &str, error: ureq::Error, timeout: Duration) -> Failure {
    let connect = match &error {
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => true,
        ureq::Error::Io(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::NotConnected
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    };
    let message = match &error {
        ureq::Error::Timeout(_) => format!(
            "{url} did not answer within {} s (raise `timeout_s`)",
            timeout.as_secs_f64()
        ),
        other => format!("cannot reach {url}: {other}"),
    };
    Failure {
        error: PluginError::unavailable(message),
        retryable: connect,
        retry_after: None,
    }
}

/// `base * 2^attempt` with full jitter (uniform in [delay/2, delay]), or the server's
/// `Retry-After` when it gave one; never more than [`MAX_BACKOFF`].
fn backoff(base: Duration, attempt: u32, retry_after: Option<Duration>) -> Duration {
    if let Some(wait) = retry_after {
        return wait.min(MAX_BACKOFF);
    }
    let delay = base
        .saturating_mul(1u32 << attempt.min(16))
        .min(MAX_BACKOFF);
    delay.mul_f64(0.5 + fastrand::f64() / 2.0)
}

/// A counting semaphore: at most `n` requests in flight to the server.
struct Semaphore {
    free: Mutex<usize>,
    changed: Condvar,
}

struct Slot<'a>(&'a Semaphore);

impl Semaphore {
    fn new(n: usize) -> Self {
        Semaphore {
            free: Mutex::new(n),
            changed: Condvar::new(),
        }
    }

    fn acquire(&self) -> Slot<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.changed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut free = self.0.free.lock().unwrap_or_else(|e| e.into_inner());
        *free += 1;
        self.0.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmhost_plugin_api::ErrorKind;

    #[test]
    fn statuses_map_to_kinds_with_the_servers_message() {
        let body =
            r#"{"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}}"#;
        let err = status_error("http://x/v1/chat/completions", 400, body);
        assert_eq!(err.kind, ErrorKind::InvalidInput);
        assert!(err.message.contains("HTTP 400"), "{err}");
        assert!(err.message.contains("max_tokens is too large"), "{err}");
        assert_eq!(status_error("u", 401, "").kind, ErrorKind::Config);
        assert_eq!(
            status_error("u", 404, "{\"detail\": \"nope\"}").kind,
            ErrorKind::Config
        );
        assert_eq!(
            status_error("u", 429, "").kind,
            ErrorKind::BackendUnavailable
        );
        assert_eq!(
            status_error("u", 503, "busy").kind,
            ErrorKind::BackendUnavailable
        );
    }

    #[test]
    fn backoff_grows_stays_bounded_and_honours_retry_after() {
        let base = Duration::from_millis(100);
        for attempt in 0..40 {
            let d = backoff(base, attempt, None);
            let full = base
                .saturating_mul(1u32 << attempt.min(16))
                .min(MAX_BACKOFF);
            assert!(d >= full / 2 && d <= full, "{attempt}: {d:?}");
        }
        assert_eq!(
            backoff(base, 0, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(backoff(base, 0, Some(Duration::from_secs(99))), MAX_BACKOFF);
    }
}
