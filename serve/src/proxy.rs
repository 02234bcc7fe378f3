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
        (&Method::GET, "/v1/models") => models(&gw).await,
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

/// The first backend that answers `/v1/models` (the backends serve one model).
async fn models(gw: &Gateway) -> Response<OutBody> {
    for i in 0..gw.backends.len() {
        // Nested, not a let-chain: the workspace's rust-version is 1.85.
        let timeout = Duration::from_secs_f64(gw.args.timeout_s);
        if let Ok(resp) = send(gw, i, Method::GET, "/v1/models", Bytes::new(), None, timeout).await {
            if resp.status().is_success() {
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

async fn proxy(gw: Arc<Gateway>, path: String, body: Held, auth: Option<HeaderValue>) -> Response<OutBody> {
    let parsed = match text::parse_request(&body.bytes, path.ends_with("/chat/completions")) {
        Ok(p) => p,
        Err(m) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", m),
    };
    let mut segments = Vec::new();
    text::segments(&parsed.prompt, &mut segments);
    let prompt_tokens = text::tokens_of(&segments);
    let orig =
        Original { path, body, auth, segments, prompt_tokens, max_tokens: parsed.max_tokens, stream: parsed.stream };
    let mut tried = vec![false; gw.backends.len()];
    let mut last_error = String::from("no healthy backend");
    for attempt in 0..=gw.args.retries {
        let sent_at = Instant::now();
        let (d, resp) = match attempt_once(&gw, &orig, &mut tried, attempt, &mut last_error).await {
            Attempt::Sent(d, resp) => (d, resp),
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
            tokio::spawn(relay(gw, d, resp, tx, orig, tried));
            return response;
        }
        // The body of a non-streamed completion: within what is left of the generation timeout.
        let started = Instant::now();
        let left = Duration::from_secs_f64(gw.args.generation_timeout_s).saturating_sub(sent_at.elapsed());
        match gw.buffers.collect(resp.into_body(), MAX_RESPONSE_BYTES, left).await {
            Ok(held) => {
                let (p, cached, out) = usage(&held.bytes).unwrap_or((prompt_tokens, 0, orig.max_tokens));
                gw.completed(&d, started.elapsed().as_secs_f64(), p, cached, out);
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
    Sent(Decision, Response<Incoming>),
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
        Ok(resp) if !resp.status().is_server_error() => return Attempt::Sent(d, resp),
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
fn usage(json: &[u8]) -> Option<(u32, u32, u32)> {
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
    started: Instant,
    delivered: u32,
    ttft_s: Option<f64>,
    usage: Option<(u32, u32, u32)>,
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
) {
    let mut p = Progress { started: Instant::now(), delivered: 0, ttft_s: None, usage: None };
    let mut resumes = 0;
    loop {
        let skip = p.delivered;
        match pump(&gw, resp.into_body(), &tx, &mut p, skip).await {
            Pumped::Done => {
                let (prompt, cached, out) = p.usage.unwrap_or((orig.prompt_tokens, 0, p.delivered));
                gw.completed(&d, p.ttft_s.unwrap_or(0.0), prompt, cached, out);
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
                        Attempt::Sent(d2, r2) if r2.status().is_success() => resumed = Some((d2, r2)),
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
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                if payload.windows(8).any(|w| w == b"\"usage\":") {
                    p.usage = usage(payload).or(p.usage);
                }
                p.delivered += 1;
                p.ttft_s.get_or_insert_with(|| p.started.elapsed().as_secs_f64());
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
    let gw = Arc::new(Gateway::new(args)?);
    super::runtime()?.block_on(async move {
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
    let limits = gw.args.limits;
    let h = move |req| handle(gw.clone(), req);
    let served = super::serve(listener, h, shutdown, Duration::from_secs(30), limits).await;
    scrapes.abort();
    served
}

#[cfg(test)]
mod tests {
    use super::*;

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
