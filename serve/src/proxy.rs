//! The gateway's request path: parse → route → forward → relay (SSE event by event) → complete.
//!
//! Retries: a refused or reset connection, a timeout, or a 5xx before the response starts sends
//! the request to another backend (at most `--retries` more), then the client gets a 502 with an
//! OpenAI-style error. A 4xx is the client's error and is passed through. Once a stream has
//! started, a failing backend ends it with an SSE error event — or, with `--resume-streams`, the
//! request is re-sent elsewhere and the events the client already has are skipped.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use routelab_policy_api::Segment;
use serde_json::Value;
use tokio::sync::mpsc;

use super::bounded::{Held, Refused};
use super::gateway::{Decision, Gateway};
use super::{OutBody, error, text};

pub async fn handle(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<OutBody> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") => {
            let now = Instant::now();
            if (0..gw.backends.len()).any(|i| gw.healthy(i, now)) {
                super::full(StatusCode::OK, "text/plain", "ok\n")
            } else {
                error(StatusCode::SERVICE_UNAVAILABLE, "server_error", "every backend's circuit is open")
            }
        }
        (&Method::GET, "/metrics") => super::full(StatusCode::OK, "text/plain; version=0.0.4", gw.metrics_text()),
        (&Method::GET, "/v1/models") => {
            let auth = req.headers().get(AUTHORIZATION).cloned();
            models(&gw, auth.as_ref()).await
        }
        (&Method::POST, p @ ("/v1/completions" | "/v1/chat/completions")) => {
            let path = p.to_string();
            let auth = req.headers().get(AUTHORIZATION).cloned();
            let body = match super::read_body(req, &gw.buffers).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            proxy(gw, path, body, auth).await
        }
        (_, p) => super::method_not_allowed(p)
            .unwrap_or_else(|| error(StatusCode::NOT_FOUND, "not_found_error", format!("no route {p}"))),
    }
}

/// The first backend that answers `/v1/models` (the backends serve one model), asked with the
/// client's `Authorization`. A backend's 401 or 403 is the client's answer and is passed through.
async fn models(gw: &Gateway, auth: Option<&HeaderValue>) -> Response<OutBody> {
    for i in 0..gw.backends.len() {
        // Nested, not a let-chain: the workspace's rust-version is 1.85.
        let timeout = Duration::from_secs_f64(gw.args.timeout_s);
        if let Ok(resp) = send(gw, i, Method::GET, "/v1/models", Bytes::new(), auth, timeout).await {
            let status = resp.status();
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                if let Ok(body) = gw.buffers.collect(resp.into_body(), MAX_RESPONSE_BYTES, timeout).await {
                    return super::full(status, "application/json", body.bytes);
                }
            } else if status.is_success() {
                // Bounded: a body that stalls after its headers must not hold the client.
                if let Ok(body) = gw.buffers.collect(resp.into_body(), MAX_RESPONSE_BYTES, timeout).await {
                    return super::full(StatusCode::OK, "application/json", body.bytes);
                }
            }
        }
    }
    error(StatusCode::BAD_GATEWAY, "server_error", "no backend answered /v1/models")
}

/// Largest non-streamed response body relayed.
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// What a retry needs of the original request.
struct Original {
    path: String,
    /// The request body, and its share of the gateway's budget of bodies.
    body: Held,
    auth: Option<HeaderValue>,
    segments: Vec<Segment>,
    prompt_tokens: u32,
    max_tokens: u32,
    stream: bool,
    /// The gateway added `stream_options.include_usage`: the client gets no usage-only event.
    strip_usage: bool,
    /// When the gateway received the request (Unix seconds), for `--record`.
    received_unix_s: f64,
}

impl Original {
    /// The request completed with `output_tokens`: recorded, under `--record`.
    fn record(&self, gw: &Gateway, output_tokens: u32) {
        if let Some(r) = &gw.recorder {
            r.write(self.received_unix_s, &self.body.bytes, output_tokens);
        }
    }
}

/// A streamed request's body with `stream_options.include_usage: true`, or `None` when the
/// client asked for usage itself (or the body is not an object: the request was parsed already).
fn ask_for_usage(body: &[u8]) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    let opts = obj.entry("stream_options").or_insert_with(|| serde_json::json!({}));
    if !opts.is_object() {
        *opts = serde_json::json!({});
    }
    let opts = opts.as_object_mut()?;
    if opts.get("include_usage") == Some(&Value::Bool(true)) {
        return None;
    }
    opts.insert("include_usage".into(), Value::Bool(true));
    Some(Bytes::from(v.to_string()))
}

async fn send(
    gw: &Gateway,
    backend: usize,
    method: Method,
    path: &str,
    body: Bytes,
    auth: Option<&HeaderValue>,
    timeout: Duration,
) -> Result<Response<Incoming>, Sent> {
    let b = &gw.backends[backend];
    let mut req = Request::builder().method(method).uri(format!("{}{path}", b.url));
    req = req.header(CONTENT_TYPE, "application/json");
    if let Some(a) = auth {
        req = req.header(AUTHORIZATION, a);
    }
    let req = req.body(Full::new(body)).map_err(|e| Sent::Failed(e.to_string()))?;
    match tokio::time::timeout(timeout, gw.client.request(req)).await {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => Err(Sent::Failed(format!("{}: {e}", b.url))),
        Err(_) => Err(Sent::TimedOut(format!("{}: no response within {} s", b.url, timeout.as_secs_f64()))),
    }
}

/// Why a request to a backend got no response.
enum Sent {
    /// Refused, reset, or not a valid response.
    Failed(String),
    /// No response headers within the timeout.
    TimedOut(String),
}

impl Sent {
    fn message(self) -> String {
        match self {
            Sent::Failed(m) | Sent::TimedOut(m) => m,
        }
    }
}

async fn proxy(gw: Arc<Gateway>, path: String, mut body: Held, auth: Option<HeaderValue>) -> Response<OutBody> {
    let received_unix_s =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let parsed = match text::parse_request(&body.bytes, path.ends_with("/chat/completions")) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", e.0),
    };
    let mut segments = Vec::new();
    gw.tokenizer.segments(&parsed.prompt, &mut segments);
    let prompt_tokens = text::tokens_of(&segments);
    // A stream's cached and output tokens reach the policy only in its `usage`: ask for it, and
    // strip the usage-only event again for a client that did not.
    let mut strip_usage = false;
    if parsed.stream {
        if let Some(with_usage) = ask_for_usage(&body.bytes) {
            body.bytes = with_usage;
            strip_usage = true;
        }
    }
    let orig = Original {
        path,
        body,
        auth,
        segments,
        prompt_tokens,
        // Without max_tokens an engine may generate to the end of its context: booked as such.
        max_tokens: if parsed.max_tokens_given {
            parsed.max_tokens
        } else {
            (gw.kv_capacity_tokens.saturating_sub(prompt_tokens as u64)).clamp(1, u32::MAX as u64) as u32
        },
        stream: parsed.stream,
        strip_usage,
        received_unix_s,
    };
    let mut tried = vec![false; gw.backends.len()];
    let mut last_error = String::from("no healthy backend");
    for attempt in 0..=gw.args.retries {
        let sent_at = Instant::now();
        let (d, resp) = match attempt_once(&gw, &orig, &mut tried, attempt, &mut last_error).await {
            Attempt::Sent(d, resp) => (d, *resp),
            Attempt::Failed => continue,
            Attempt::NoBackend => break,
            Attempt::GenerationTimeout => return generation_timeout(&gw),
        };
        if !resp.status().is_success() {
            // The client's error (4xx): passed through as the backend wrote it, if it arrives in
            // time (a body that stalls after its headers must not hold the client).
            drop(d);
            let status = resp.status();
            let timeout = Duration::from_secs_f64(gw.args.timeout_s);
            return match gw.buffers.collect(resp.into_body(), MAX_RESPONSE_BYTES, timeout).await {
                Ok(body) => super::full(status, "application/json", body.bytes),
                Err(e) => error(StatusCode::BAD_GATEWAY, "server_error", format!("the backend answered {status}; {e}")),
            };
        }
        if parsed.stream {
            let (tx, response) = super::sse();
            tokio::spawn(relay(gw, d, resp, tx, orig, tried, sent_at));
            return response;
        }
        // The body of a non-streamed completion: within what is left of the generation timeout.
        let left = Duration::from_secs_f64(gw.args.generation_timeout_s).saturating_sub(sent_at.elapsed());
        match gw.buffers.collect(resp.into_body(), MAX_RESPONSE_BYTES, left).await {
            Ok(held) => {
                let (p, cached, out) = usage(&held.bytes).unwrap_or((prompt_tokens, 0, orig.max_tokens));
                // No first token is seen before the whole answer: no TTFT (the policy is told the
                // latency from dispatch, when the client got its first token).
                gw.completed(&d, None, p, cached, out);
                orig.record(&gw, out);
                drop(d);
                return super::full(StatusCode::OK, "application/json", held.bytes);
            }
            Err(Refused::Failed(e)) => last_error = format!("{}: {e}", gw.backends[d.backend].url),
            Err(Refused::TimedOut(_)) => {
                gw.failure(d.backend);
                return generation_timeout(&gw);
            }
            Err(e @ (Refused::TooLarge(_) | Refused::OverBudget(_))) => {
                return error(StatusCode::SERVICE_UNAVAILABLE, "server_error", format!("the response: {e}"));
            }
        }
        gw.failure(d.backend);
        drop(d);
    }
    error(
        StatusCode::BAD_GATEWAY,
        "server_error",
        format!("no backend could serve the request; last error: {last_error}"),
    )
}

/// A non-streamed completion that did not finish within `--generation-timeout-s`: the backend
/// may just be slow, so the request is not re-run elsewhere (that would multiply the load).
fn generation_timeout(gw: &Gateway) -> Response<OutBody> {
    error(
        StatusCode::GATEWAY_TIMEOUT,
        "server_error",
        format!("the completion did not finish within --generation-timeout-s {} s", gw.args.generation_timeout_s),
    )
}

enum Attempt {
    Sent(Decision, Box<Response<Incoming>>),
    /// A non-streamed request got no response within the generation timeout.
    GenerationTimeout,
    /// Refused, reset, timed out or a 5xx: recorded, and `last_error` says which.
    Failed,
    /// Every backend was tried or has its circuit open.
    NoBackend,
}

/// Routes (avoiding `tried`) and sends once.
async fn attempt_once(
    gw: &Arc<Gateway>,
    orig: &Original,
    tried: &mut [bool],
    attempt: u32,
    last_error: &mut String,
) -> Attempt {
    if attempt > 0 {
        gw.retries.fetch_add(1, Ordering::Relaxed);
    }
    let Some(d) = gw.route(&orig.segments, orig.prompt_tokens, orig.max_tokens, tried) else {
        return Attempt::NoBackend;
    };
    tried[d.backend] = true;
    let timeout = Duration::from_secs_f64(if orig.stream { gw.args.timeout_s } else { gw.args.generation_timeout_s });
    match send(gw, d.backend, Method::POST, &orig.path, orig.body.bytes.clone(), orig.auth.as_ref(), timeout).await {
        Ok(resp) if !resp.status().is_server_error() => return Attempt::Sent(d, Box::new(resp)),
        Ok(resp) => *last_error = format!("{} answered {}", gw.backends[d.backend].url, resp.status()),
        Err(Sent::TimedOut(_)) if !orig.stream => {
            gw.failure(d.backend);
            return Attempt::GenerationTimeout;
        }
        Err(e) => *last_error = e.message(),
    }
    gw.failure(d.backend);
    drop(d);
    Attempt::Failed
}

/// `usage` of a completion body (or of the SSE event carrying it): prompt, cached and
/// completion tokens.
pub(crate) fn usage(json: &[u8]) -> Option<(u32, u32, u32)> {
    let v: Value = serde_json::from_slice(json).ok()?;
    let u = v.get("usage")?;
    let n = |x: Option<&Value>| x.and_then(Value::as_u64).map(|n| n.min(u32::MAX as u64) as u32);
    Some((
        n(u.get("prompt_tokens"))?,
        n(u.pointer("/prompt_tokens_details/cached_tokens")).unwrap_or(0),
        n(u.get("completion_tokens"))?,
    ))
}

enum Pumped {
    Done,
    ClientGone,
    Failed(String),
}

/// Where a stream is: what the client has been sent.
struct Progress {
    /// When the request was sent (TTFT is counted from there, not from the response headers).
    started: Instant,
    /// Data events sent to the client (what a resumed stream skips).
    delivered: u32,
    /// Of those, the events that carry generated text (not the role-only or finish events).
    text_events: u32,
    /// At the first text event.
    ttft_s: Option<f64>,
    usage: Option<(u32, u32, u32)>,
    strip_usage: bool,
}

/// Relays `resp`'s SSE events to the client, one event per frame; on a backend failure, resumes
/// elsewhere (with `--resume-streams`) or ends the stream with an error event.
async fn relay(
    gw: Arc<Gateway>,
    mut d: Decision,
    mut resp: Response<Incoming>,
    tx: mpsc::Sender<Bytes>,
    orig: Original,
    mut tried: Vec<bool>,
    sent_at: Instant,
) {
    let mut p = Progress {
        started: sent_at,
        delivered: 0,
        text_events: 0,
        ttft_s: None,
        usage: None,
        strip_usage: orig.strip_usage,
    };
    let mut resumes = 0;
    loop {
        let skip = p.delivered;
        match pump(&gw, resp.into_body(), &tx, &mut p, skip).await {
            Pumped::Done => {
                let (prompt, cached, out) = p.usage.unwrap_or((orig.prompt_tokens, 0, p.text_events));
                let ttft = p.ttft_s.unwrap_or_else(|| p.started.elapsed().as_secs_f64());
                gw.completed(&d, Some(ttft), prompt, cached, out);
                orig.record(&gw, out);
                return;
            }
            Pumped::ClientGone => return,
            Pumped::Failed(e) => {
                gw.failure(d.backend);
                let mut last_error = e;
                let mut resumed = None;
                while gw.args.resume_streams && resumed.is_none() && resumes < gw.args.retries {
                    resumes += 1;
                    match attempt_once(&gw, &orig, &mut tried, 1, &mut last_error).await {
                        Attempt::Sent(d2, r2) if r2.status().is_success() => resumed = Some((d2, *r2)),
                        Attempt::Sent(d2, r2) => {
                            last_error = format!("{} answered {}", gw.backends[d2.backend].url, r2.status());
                        }
                        Attempt::Failed => {}
                        Attempt::NoBackend | Attempt::GenerationTimeout => break,
                    }
                }
                if let Some(next) = resumed {
                    gw.resumed.fetch_add(1, Ordering::Relaxed);
                    (d, resp) = next;
                    continue;
                }
                let e = serde_json::json!({"error": {"message": format!("the backend failed mid-stream: {last_error}"), "type": "server_error"}});
                let _ = tx.send(Bytes::from(format!("data: {e}\n\n"))).await;
                return;
            }
        }
    }
}

/// Forwards the events of one backend response, skipping its first `skip` data events (already
/// delivered by a backend that failed).
async fn pump(gw: &Gateway, mut body: Incoming, tx: &mpsc::Sender<Bytes>, p: &mut Progress, mut skip: u32) -> Pumped {
    let timeout = Duration::from_secs_f64(gw.args.timeout_s);
    let mut buf = BytesMut::new();
    // Bytes of `buf` already searched for an event's end (each byte is looked at about once).
    let mut scanned = 0;
    loop {
        let frame = match tokio::time::timeout(timeout, body.frame()).await {
            Err(_) => return Pumped::Failed(format!("no event within {} s", gw.args.timeout_s)),
            Ok(None) => return Pumped::Failed("the stream ended before [DONE]".into()),
            Ok(Some(Err(e))) => return Pumped::Failed(e.to_string()),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else { continue };
        buf.extend_from_slice(&data);
        while let Some(end) = event_end(&buf, scanned) {
            scanned = 0;
            let event = buf.split_to(end).freeze();
            let payload = sse_data(&event);
            let done = payload.starts_with(b"[DONE]");
            if !done {
                let kind = classify(payload);
                if let Some(u) = kind.usage {
                    p.usage = Some(u);
                }
                if kind.usage_only && p.strip_usage {
                    // The gateway asked for it; the client did not.
                    continue;
                }
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                p.delivered += 1;
                if kind.text {
                    p.text_events += 1;
                    p.ttft_s.get_or_insert_with(|| p.started.elapsed().as_secs_f64());
                }
            }
            if tx.send(event).await.is_err() {
                return Pumped::ClientGone;
            }
            if done {
                return Pumped::Done;
            }
        }
        scanned = buf.len();
        if buf.len() > MAX_EVENT_BYTES {
            return Pumped::Failed(format!("an event longer than {MAX_EVENT_BYTES} bytes"));
        }
    }
}

/// What the gateway reads of one SSE data payload.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct EventKind {
    /// It carries generated text (`choices[].text` or `choices[].delta.content`,
    /// `reasoning_content` or `tool_calls`); role-only and finish events do not.
    pub text: bool,
    /// Its `usage`: prompt, cached and completion tokens.
    pub usage: Option<(u32, u32, u32)>,
    /// It carries usage and no choice (the event `stream_options.include_usage` adds).
    pub usage_only: bool,
}

pub(crate) fn classify(payload: &[u8]) -> EventKind {
    let Ok(v) = serde_json::from_slice::<Value>(payload) else { return EventKind::default() };
    let choices = v.get("choices").and_then(Value::as_array);
    let non_empty = |x: Option<&Value>| match x {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        _ => false,
    };
    let text = choices.is_some_and(|cs| {
        cs.iter().any(|c| {
            non_empty(c.get("text"))
                || c.get("delta").is_some_and(|d| {
                    non_empty(d.get("content"))
                        || non_empty(d.get("reasoning_content"))
                        || non_empty(d.get("tool_calls"))
                })
        })
    });
    let usage = v.get("usage").filter(|u| u.is_object()).and_then(|_| usage(payload));
    EventKind { text, usage, usage_only: usage.is_some() && choices.is_none_or(|c| c.is_empty()) }
}

/// Longest SSE event relayed (a token's event is a few hundred bytes).
const MAX_EVENT_BYTES: usize = 1 << 20;

/// Where the first SSE event of `buf` ends (just past its blank line), searching from `from`
/// (bytes before it were searched already). Lines end in LF or CRLF, as the SSE format allows.
/// Public for the fuzz target (fuzz/fuzz_targets/http_front.rs).
pub fn event_end(buf: &[u8], from: usize) -> Option<usize> {
    // Back up over a line end that a previous search may have seen only half of.
    let start = from.saturating_sub(3);
    let mut i = start;
    while let Some(k) = buf[i..].iter().position(|&b| b == b'\n') {
        let lf = i + k;
        // This line ended at `lf`; the next line is blank if it is "\n" or "\r\n".
        match &buf[lf + 1..] {
            [b'\n', ..] => return Some(lf + 2),
            [b'\r', b'\n', ..] => return Some(lf + 3),
            _ => i = lf + 1,
        }
    }
    None
}

/// The payload of an event's `data:` field (without the optional space and the line end).
pub fn sse_data(event: &[u8]) -> &[u8] {
    let Some(rest) = event.strip_prefix(b"data:") else { return &[] };
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    let end = rest.iter().position(|&b| b == b'\r' || b == b'\n').unwrap_or(rest.len());
    &rest[..end]
}

/// `routelab serve`: runs the gateway until Ctrl-C / SIGTERM, then drains open streams.
pub fn main(args: super::gateway::ServeArgs) -> anyhow::Result<i32> {
    use anyhow::Context as _;
    super::runtime()?.block_on(async move {
        let gw = Arc::new(Gateway::start(args).await?);
        let listener = super::bind(gw.args.listen).await.with_context(|| format!("listening on {}", gw.args.listen))?;
        run(gw, listener, super::shutdown_signal()).await?;
        Ok(0)
    })
}

/// Serves the gateway on `listener` (scrapes included) until `shutdown` resolves, then drains.
pub async fn run(
    gw: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let g = gw.clone();
    let scrapes = tokio::spawn(async move { g.scrape_loop().await });
    let events: Vec<_> = (gw.kv_specs.iter().enumerate())
        .filter_map(|(i, s)| Some(tokio::spawn(gw.clone().kv_events_loop(i, s.clone()?))))
        .collect();
    let limits = gw.args.limits;
    let h = move |req| handle(gw.clone(), req);
    let served = super::serve(listener, h, shutdown, Duration::from_secs(30), limits).await;
    scrapes.abort();
    events.iter().for_each(|e| e.abort());
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_role_finish_and_usage_events_are_told_apart() {
        // As llama.cpp's llama-server streams a chat completion with include_usage.
        let role = br#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}]}"#;
        let text = br#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" Hi"}}]}"#;
        let finish = br#"{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"usage":null}"#;
        let usage_only = br#"{"choices":[],"usage":{"completion_tokens":8,"prompt_tokens":30,"total_tokens":38,"prompt_tokens_details":{"cached_tokens":16}}}"#;
        // A completions stream's last event: text, finish and usage together (kept for the client).
        let last = br#"{"choices":[{"text":"","index":0,"finish_reason":"length"}],"usage":{"completion_tokens":8,"prompt_tokens":30}}"#;
        assert_eq!(classify(role), EventKind::default());
        assert_eq!(classify(text), EventKind { text: true, ..EventKind::default() });
        assert_eq!(classify(finish), EventKind::default());
        assert_eq!(classify(usage_only), EventKind { text: false, usage: Some((30, 16, 8)), usage_only: true });
        assert_eq!(classify(last), EventKind { text: false, usage: Some((30, 0, 8)), usage_only: false });
        assert_eq!(classify(b"not json"), EventKind::default());
    }

    #[test]
    fn streams_ask_for_usage_unless_the_client_did() {
        let asked = ask_for_usage(br#"{"prompt":"x","stream":true}"#).expect("added");
        let v: Value = serde_json::from_slice(&asked).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], Value::Bool(true));
        assert_eq!(v["prompt"], "x");
        let kept = ask_for_usage(br#"{"prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":true}}"#)
            .expect("added");
        let v: Value = serde_json::from_slice(&kept).unwrap();
        assert_eq!(v["stream_options"], serde_json::json!({"continuous_usage_stats": true, "include_usage": true}));
        assert_eq!(ask_for_usage(br#"{"stream":true,"stream_options":{"include_usage":true}}"#), None);
    }

    #[test]
    fn events_end_at_a_blank_line_of_lf_or_crlf() {
        assert_eq!(event_end(b"data: a\n\ndata: b", 0), Some(9));
        assert_eq!(event_end(b"data: a\r\n\r\ndata: b", 0), Some(11));
        assert_eq!(event_end(b"data: a\r\n\n", 0), Some(10));
        assert_eq!(event_end(b"data: a\r\n", 0), None);
        // Resumed where the last search stopped, mid line end.
        assert_eq!(event_end(b"data: a\r\n\r\n", 9), Some(11));
        assert_eq!(sse_data(b"data:[DONE]\r\n\r\n"), b"[DONE]");
        assert_eq!(sse_data(b"data: {}\n\n"), b"{}");
    }
}
