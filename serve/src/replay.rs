//! `routelab replay`: a bounded load generator. It generates a cluster workload's request stream
//! (the first seed's, exactly the stream `routelab run W P --seeds 1` simulates), writes each
//! prompt out as text with the same prefix structure ([`text::prompt_text`]), and sends every
//! request as a streamed `/v1/completions` at its arrival time × `time_scale` (open loop), with
//! `max_tokens` = its output tokens, `ignore_eos` (so a real model generates them all) and
//! `stream_options.include_usage` (so the engine says how many it generated). Times are reported in model seconds (wall ÷ time_scale).
//! Every request is bounded by `max_wall_s` from the start.
//! Agent sessions (`generator.session`, or a trace with session fields) run closed-loop, as the
//! simulator runs them: a call that waits for others is sent when the last of them has finished
//! streaming, plus its tool pause × time_scale; a call whose parent failed is not sent (it fails
//! too, "a call it waits for failed").
//!
//! `routelab gateway-bench`: the gateway's overhead — closed-loop requests to a trivial
//! in-process backend, directly and through an in-process gateway with `least_requests`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

use super::{prom, text};
use routelab_core::workload::generate::RequestStream;
use routelab_core::workload::{self, InputError};

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(4096).build(c)
}

#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// A cluster workload: a file or a built-in name (e.g. tool_use).
    pub workload: PathBuf,
    /// Base URL of the server (gateway or engine): http://host:port.
    #[arg(long)]
    pub url: String,
    /// Override a workload field, as in `routelab sweep` but one value (repeatable):
    /// `--set requests=300 --set arrivals.poisson.rate=20`.
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Wall-clock seconds per model second (give the engines' --time-scale).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Engines whose /metrics give the prefix-cache hit rate of this replay (repeatable).
    #[arg(long = "engine")]
    pub engines: Vec<String>,
    /// Give up on requests still unfinished this many wall seconds after the start.
    #[arg(long, default_value_t = 600.0)]
    pub max_wall_s: f64,
}

/// What one replay measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReplayReport {
    pub requests: usize,
    /// Streams that ended with `[DONE]` having generated exactly `max_tokens` tokens (the
    /// engine's `usage.completion_tokens`, or without it the events that carry text).
    pub complete: usize,
    pub failed: usize,
    pub first_error: Option<String>,
    pub ttft_mean_s: f64,
    pub ttft_p50_s: f64,
    pub latency_mean_s: f64,
    pub latency_p50_s: f64,
    pub latency_p99_s: f64,
    /// Prefix-cache hits ÷ queries (tokens) over the engines, during the replay (vLLM's, SGLang's
    /// or llama.cpp's counters, [`prom::prefix_cache`]); NaN (null in JSON) without engines.
    /// Times are NaN (null) too when no request completed.
    pub hit_rate: f64,
}

/// Reads `--set`s into the workload at `file` and generates its first seed's stream.
pub fn load_stream(file: &std::path::Path, sets: &[String]) -> Result<RequestStream> {
    let file = &routelab_core::builtin::resolve(file)?;
    let doc: serde_norway::Value =
        serde_norway::from_str(&workload::load_text(file)?).with_context(|| format!("parsing {}", file.display()))?;
    let mut pairs = Vec::new();
    for set in sets {
        pairs.push(set.split_once('=').ok_or_else(|| {
            InputError::new("--set", format!("`{set}` has no `=`"), "write --set field.path=value").in_field(set)
        })?);
    }
    // The file's own errors name its lines; what is wrong only after the sets names them.
    let mut w = workload::load(file)?;
    if !pairs.is_empty() {
        w = routelab_core::runner::parse_with_sets(&doc, file, &pairs)?;
    }
    if w.cluster.is_none() {
        return Err(InputError::new(
            file,
            "replay needs a cluster workload",
            "give a workload with a `cluster:` section (e.g. tool_use)",
        )
        .into());
    }
    let prepared = routelab_core::runner::prepare(w, file)?;
    let inputs = prepared.seed_inputs()?;
    Ok(inputs[0].stream().expect("cluster world").clone())
}

pub fn main(args: ReplayArgs) -> Result<i32> {
    if !(args.time_scale > 0.0 && args.time_scale <= 1000.0) {
        return Err(InputError::command_line("--time-scale", "out of range", "give a number in (0, 1000]").into());
    }
    if !(args.max_wall_s > 0.0 && args.max_wall_s <= 86_400.0) {
        return Err(InputError::command_line("--max-wall-s", "out of range", "give seconds in (0, 86400]").into());
    }
    let stream = load_stream(&args.workload, &args.set)?;
    let report = super::runtime()?.block_on(replay(
        &args.url,
        &stream,
        args.time_scale,
        &args.engines,
        Duration::from_secs_f64(args.max_wall_s),
    ));
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(if report.failed == 0 { 0 } else { 1 })
}

/// Sum of prefix-cache (hits, queries) in tokens over `engines`' /metrics (vLLM's, SGLang's or
/// llama.cpp's counters).
pub async fn cache_counters(client: &HttpClient, engines: &[String]) -> (f64, f64) {
    let (mut hits, mut queries) = (0.0, 0.0);
    for e in engines {
        if let Ok(t) = get_text(client, &format!("{}/metrics", e.trim_end_matches('/'))).await {
            let c = prom::prefix_cache(&t).unwrap_or_default();
            hits += c.hit_tokens;
            queries += c.query_tokens;
        }
    }
    (hits, queries)
}

/// The body of a GET of `url` as text (10 s at most).
pub async fn get_text(client: &HttpClient, url: &str) -> Result<String> {
    let req = Request::get(url).body(Full::new(Bytes::new()))?;
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .map_err(|_| anyhow::anyhow!("timed out"))??;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8(body.to_vec())?)
}

struct Outcome {
    ttft_s: f64,
    latency_s: f64,
    error: Option<String>,
}

/// When one request was sent and when its stream ended, in wall seconds from the replay's
/// start (`sent_s` NaN when it was never sent; `done_s` NaN when it did not complete).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub sent_s: f64,
    pub done_s: f64,
}

/// What a finished call tells the calls waiting for it: when it ended, or that it failed.
type Finished = Option<Result<Instant, ()>>;

/// Replays `stream` against `url` (see the module doc).
pub async fn replay(
    url: &str,
    stream: &RequestStream,
    time_scale: f64,
    engines: &[String],
    max_wall: Duration,
) -> ReplayReport {
    replay_timed(url, stream, time_scale, engines, max_wall).await.0
}

/// [`replay`], with every request's [`Timing`] (by request id).
pub async fn replay_timed(
    url: &str,
    stream: &RequestStream,
    time_scale: f64,
    engines: &[String],
    max_wall: Duration,
) -> (ReplayReport, Vec<Timing>) {
    let client = client();
    let before = cache_counters(&client, engines).await;
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + max_wall);
    let endpoint = format!("{}/v1/completions", url.trim_end_matches('/'));
    let mut tasks = Vec::with_capacity(stream.requests.len());
    // One channel per request, written once when it ends; the calls waiting for it watch it.
    let finished: Vec<tokio::sync::watch::Sender<Finished>> =
        stream.requests.iter().map(|_| tokio::sync::watch::Sender::new(None)).collect();
    for (i, r) in stream.requests.iter().enumerate() {
        let at = start + Duration::from_secs_f64(routelab_core::time::seconds(r.arrived_at) * time_scale);
        let (parents, pause) = match &stream.sessions {
            Some(s) => (
                s.parents(i).iter().map(|&p| finished[p as usize].subscribe()).collect::<Vec<_>>(),
                Duration::from_secs_f64(routelab_core::time::seconds(s.pause[i]) * time_scale),
            ),
            None => (Vec::new(), Duration::ZERO),
        };
        let done = finished[i].clone();
        let body = json!({
            "model": "routelab", "prompt": text::prompt_text(stream, i), "max_tokens": r.output_tokens,
            "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
        });
        let (client, endpoint, want) = (client.clone(), endpoint.clone(), r.output_tokens);
        tasks.push(tokio::spawn(async move {
            let unfinished =
                || Outcome { ttft_s: 0.0, latency_s: 0.0, error: Some("unfinished at --max-wall-s".into()) };
            let never = Timing { sent_s: f64::NAN, done_s: f64::NAN };
            let send_at = match tokio::time::timeout_at(deadline, after_parents(parents, at, pause)).await {
                Ok(Some(t)) => t,
                Ok(None) => {
                    done.send_replace(Some(Err(())));
                    let e = Some("a call it waits for failed".to_string());
                    return (Outcome { ttft_s: 0.0, latency_s: 0.0, error: e }, never);
                }
                Err(_) => {
                    done.send_replace(Some(Err(())));
                    return (unfinished(), never);
                }
            };
            tokio::time::sleep_until(send_at.into()).await;
            let sent = Instant::now();
            let run = one_stream(&client, &endpoint, body.to_string(), want, sent);
            let o = tokio::time::timeout_at(deadline, run).await.unwrap_or_else(|_| unfinished());
            let ended = Instant::now();
            done.send_replace(Some(if o.error.is_none() { Ok(ended) } else { Err(()) }));
            let since = |t: Instant| t.duration_since(start).as_secs_f64();
            let done_s = if o.error.is_none() { since(ended) } else { f64::NAN };
            (o, Timing { sent_s: since(sent), done_s })
        }));
    }
    let mut outcomes = Vec::new();
    let mut timings = Vec::new();
    for t in tasks {
        let (o, timing) = t.await.unwrap_or((
            Outcome { ttft_s: 0.0, latency_s: 0.0, error: Some("task panicked".into()) },
            Timing { sent_s: f64::NAN, done_s: f64::NAN },
        ));
        outcomes.push(o);
        timings.push(timing);
    }
    let after = cache_counters(&client, engines).await;
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
    let mut ttft: Vec<f64> = ok.iter().map(|o| o.ttft_s / time_scale).collect();
    let mut lat: Vec<f64> = ok.iter().map(|o| o.latency_s / time_scale).collect();
    ttft.sort_by(f64::total_cmp);
    lat.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    let report = ReplayReport {
        requests: outcomes.len(),
        complete: ok.len(),
        failed: outcomes.len() - ok.len(),
        first_error: outcomes.iter().find_map(|o| o.error.clone()),
        ttft_mean_s: mean(&ttft),
        ttft_p50_s: quantile(&ttft, 0.5),
        latency_mean_s: mean(&lat),
        latency_p50_s: quantile(&lat, 0.5),
        latency_p99_s: quantile(&lat, 0.99),
        hit_rate: if engines.is_empty() { f64::NAN } else { (after.0 - before.0) / (after.1 - before.1) },
    };
    (report, timings)
}

/// When a call may be sent: at `at` when it waits for nothing, else `pause` after the last of
/// `parents` ended; `None` when one of them failed.
async fn after_parents(
    parents: Vec<tokio::sync::watch::Receiver<Finished>>,
    at: Instant,
    pause: Duration,
) -> Option<Instant> {
    if parents.is_empty() {
        return Some(at);
    }
    let mut last: Option<Instant> = None;
    for mut p in parents {
        let ended = match p.wait_for(|f| f.is_some()).await {
            Ok(f) => (*f)?.ok()?,
            Err(_) => return None, // its task is gone without a word
        };
        last = Some(last.map_or(ended, |l| l.max(ended)));
    }
    last.map(|l| l + pause)
}

pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// Sends one streamed completion and reads it to the end; complete = `[DONE]` after exactly
/// `want` generated tokens (the engine's `usage.completion_tokens`, else the events that carry
/// text: role-only and finish events are not tokens). Events end at a blank line of LF or CRLF.
async fn one_stream(client: &HttpClient, endpoint: &str, body: String, want: u32, sent: Instant) -> Outcome {
    use super::proxy::{classify, event_end, sse_data};
    let fail = |e: String| Outcome { ttft_s: 0.0, latency_s: 0.0, error: Some(e) };
    let req =
        match Request::post(endpoint).header("content-type", "application/json").body(Full::new(Bytes::from(body))) {
            Ok(r) => r,
            Err(e) => return fail(e.to_string()),
        };
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => return fail(format!("request: {e}")),
    };
    if resp.status() != StatusCode::OK {
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        return fail(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    let mut body = resp.into_body();
    let (mut buf, mut text_events, mut generated, mut ttft) = (Vec::new(), 0u32, None, None);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { return fail("the stream broke".into()) };
        let Ok(data) = frame.into_data() else { continue };
        buf.extend_from_slice(&data);
        while let Some(end) = event_end(&buf, 0) {
            let event: Vec<u8> = buf.drain(..end).collect();
            let payload = sse_data(&event);
            if payload.starts_with(b"[DONE]") {
                let got = generated.unwrap_or(text_events);
                if got != want {
                    return fail(format!("{got} tokens generated, {want} expected"));
                }
                let latency_s = sent.elapsed().as_secs_f64();
                return Outcome { ttft_s: ttft.unwrap_or(latency_s), latency_s, error: None };
            }
            if payload.windows(8).any(|w| w == b"\"error\":") {
                return fail(String::from_utf8_lossy(&event).trim().to_string());
            }
            let kind = classify(payload);
            if let Some((_, _, completion)) = kind.usage {
                generated = Some(completion);
            }
            if kind.text {
                text_events += 1;
                ttft.get_or_insert_with(|| sent.elapsed().as_secs_f64());
            }
        }
        if buf.len() > 1 << 20 {
            return fail("an event longer than 1 MiB".into());
        }
    }
    fail("the stream ended before [DONE]".into())
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Requests per measurement.
    #[arg(long, default_value_t = 20_000)]
    pub requests: usize,
    /// Requests in flight at once (closed loop).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
}

/// Overhead of the gateway: see the module doc. Prints a small table.
pub fn bench(args: BenchArgs) -> Result<i32> {
    let requests = args.requests.clamp(1, 1_000_000);
    let concurrency = args.concurrency.clamp(1, 4096);
    super::runtime()?.block_on(async move {
        let backend = super::bind("127.0.0.1:0".parse()?).await?;
        let backend_url = format!("http://{}", backend.local_addr()?);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        tokio::spawn(super::serve(backend, |_req| async { trivial() }, stopped(stop_rx.clone()), Duration::from_secs(1), super::ConnLimits::default()));
        let mut gw_args = super::gateway::ServeArgs::with_backends(std::slice::from_ref(&backend_url));
        gw_args.listen = "127.0.0.1:0".parse()?;
        gw_args.policy = "least_requests".into();
        gw_args.scrape_interval_s = 1.0;
        let gw = Arc::new(super::gateway::Gateway::new(gw_args)?);
        let gw_listener = super::bind("127.0.0.1:0".parse()?).await?;
        let gw_url = format!("http://{}", gw_listener.local_addr()?);
        let g = gw.clone();
        tokio::spawn(async move { g.scrape_loop().await });
        let handle = move |req| super::proxy::handle(gw.clone(), req);
        tokio::spawn(super::serve(gw_listener, handle, stopped(stop_rx), Duration::from_secs(1), super::ConnLimits::default()));
        // Warm-up of both paths (connections, allocator), then the measured runs.
        closed_loop(&backend_url, requests / 10 + 1, concurrency).await;
        closed_loop(&gw_url, requests / 10 + 1, concurrency).await;
        let direct = closed_loop(&backend_url, requests, concurrency).await;
        let through = closed_loop(&gw_url, requests, concurrency).await;
        let _ = stop_tx.send(true);
        println!("gateway overhead, {requests} non-streamed requests, {concurrency} in flight, least_requests, one trivial backend");
        println!("{:<16} {:>10} {:>10} {:>12}", "path", "p50 µs", "p99 µs", "requests/s");
        for (name, m) in [("direct", &direct), ("via gateway", &through)] {
            println!("{name:<16} {:>10.0} {:>10.0} {:>12.0}", m.p50_s * 1e6, m.p99_s * 1e6, m.per_s);
        }
        println!("added p50: {:.0} µs", (through.p50_s - direct.p50_s) * 1e6);
        Ok(0)
    })
}

fn trivial() -> hyper::Response<super::OutBody> {
    let body = r#"{"id":"cmpl-0","object":"text_completion","created":0,"model":"trivial","choices":[{"index":0,"text":"ok","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}"#;
    super::full(StatusCode::OK, "application/json", body)
}

pub struct Measured {
    pub p50_s: f64,
    pub p99_s: f64,
    pub per_s: f64,
}

/// `requests` non-streamed completions, `concurrency` at a time; every one must succeed.
pub async fn closed_loop(url: &str, requests: usize, concurrency: usize) -> Measured {
    let client = client();
    let next = Arc::new(AtomicUsize::new(0));
    let endpoint = format!("{url}/v1/completions");
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, next, endpoint) = (client.clone(), next.clone(), endpoint.clone());
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                let body = Bytes::from_static(br#"{"model":"m","prompt":"hello there","max_tokens":1}"#);
                let req =
                    Request::post(endpoint.as_str()).header("content-type", "application/json").body(Full::new(body));
                let t = Instant::now();
                let resp = client.request(req.expect("request")).await.expect("loopback request");
                assert!(resp.status().is_success(), "{}", resp.status());
                resp.into_body().collect().await.expect("body");
                lat.push(t.elapsed().as_secs_f64());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.expect("worker"));
    }
    let wall = start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    Measured { p50_s: quantile(&all, 0.5), p99_s: quantile(&all, 0.99), per_s: all.len() as f64 / wall }
}
