//! `routelab serve` in front of a real engine: llama.cpp's `llama-server` on CPU serving
//! SmolLM2-135M-Instruct, built by `testing/llama/ensure.sh` into a cache outside the repository
//! (`.ci/run` runs it first). Two engines and the gateway on loopback; every request is bounded
//! (small `max_tokens`, a wall limit) and the engines are killed when a test ends.
//!
//! The tests take the cores alone (`common::cores_alone`): two engines busy a 2-core machine, and
//! the tests that assume a quick child process must not wait behind them.
//!
//! Where the engine had not been built when the tests were built, each test is `#[ignore]`d with
//! the reason (host/build.rs looks), so the summary counts it as ignored — unless
//! ROUTELAB_REQUIRE_LLAMA=1 (as in `.ci/run`), where a missing engine fails the test. An engine
//! removed after the tests were built: each test prints `skipped: …` on stderr and returns.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use routelab_serve::replay::{self, HttpClient};

/// The cache directory ensure.sh reports.
fn llama_dir() -> PathBuf {
    let script = repo().join("testing/llama/ensure.sh");
    let dir = Command::new("bash").arg(&script).arg("--dir").output().expect("run ensure.sh --dir");
    PathBuf::from(String::from_utf8_lossy(&dir.stdout).trim())
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where ensure.sh put llama-server and the model, or `None` (after saying why) to skip.
fn llama() -> Option<(PathBuf, PathBuf)> {
    let dir = llama_dir();
    let (server, model) = (dir.join("bin/llama-server"), dir.join("SmolLM2-135M-Instruct.Q4_1.gguf"));
    if server.is_file() && model.is_file() && dir.join("complete").is_file() {
        return Some((server, model));
    }
    let why = format!(
        "skipped: llama-server is not built in {} (run testing/llama/ensure.sh, as .ci/run does: ~6 min once)",
        dir.display()
    );
    if std::env::var("ROUTELAB_REQUIRE_LLAMA").is_ok_and(|v| v == "1") {
        panic!("ROUTELAB_REQUIRE_LLAMA=1 but {why}");
    }
    // Straight to stderr: the test harness captures eprintln! of a passing test.
    let _ = writeln!(std::io::stderr(), "{why}");
    None
}

/// Child processes killed when dropped (a failed assertion must not leave servers running).
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        // The gateway (started last) first, so it does not see its engines go.
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routelab-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Starts `llama-server` on a free loopback port (its stderr to a log file) and waits, at most
/// 120 s, until its `/health` answers 200 (the model is loaded). Its base URL.
fn engine(procs: &mut Procs, (server, model): &(PathBuf, PathBuf), extra: &[&str]) -> String {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let log = scratch(&format!("llama-{port}.log"));
    let child = Command::new(server)
        .args(["-m", &model.to_string_lossy(), "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-t", "1", "-c", "8192", "-np", "2", "--metrics", "--cache-ram", "256", "--no-webui"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn llama-server");
    procs.0.push(child);
    let url = format!("http://127.0.0.1:{port}");
    let client = replay::client();
    let rt = runtime();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, _) = rt.block_on(request(&client, "GET", &format!("{url}/health"), None, None));
        if status == 200 {
            return url;
        }
        let exited = procs.0.last_mut().unwrap().try_wait().unwrap();
        if exited.is_some() || Instant::now() > deadline {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("llama-server on {url} did not become healthy ({exited:?}); its log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts `routelab serve` in front of `backends`; its URL (from its `listening on` line).
fn gateway(procs: &mut Procs, backends: &[String], policy: &str, extra: &[&str]) -> String {
    use std::io::{BufRead, BufReader};
    // No --kv-capacity-tokens: the gateway reads it from the engines' /props.
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--policy", policy];
    for b in backends {
        args.extend(["--backend", b.as_str()]);
    }
    args.extend(extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn routelab serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    procs.0.push(child);
    line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}")).to_string()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// One HTTP exchange, bounded at 120 s: the status and the whole body.
async fn request(
    client: &HttpClient,
    method: &str,
    url: &str,
    body: Option<&Value>,
    auth: Option<&str>,
) -> (u16, String) {
    let mut req = hyper::Request::builder().method(method).uri(url).header("content-type", "application/json");
    if let Some(a) = auth {
        req = req.header("authorization", format!("Bearer {a}"));
    }
    let req = req.body(Full::new(body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string())))).unwrap();
    let run = async {
        let Ok(resp) = client.request(req).await else { return (0, String::new()) };
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(120), run).await.unwrap_or((0, "no answer within 120 s".into()))
}

/// The data payloads of the complete events of an SSE body, `[DONE]` included.
fn events(body: &str) -> Vec<Value> {
    let complete = &body[..body.rfind("\n\n").map_or(0, |i| i + 2)];
    complete
        .split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data:"))
        .map(|d| d.trim())
        .map(
            |d| {
                if d == "[DONE]" { Value::String(d.into()) } else { serde_json::from_str(d).expect("an event is JSON") }
            },
        )
        .collect()
}

/// The gateway's (or an engine's) metric `name`, summed over label sets matching `labels`.
async fn metric(client: &HttpClient, url: &str, name: &str, labels: &str) -> f64 {
    let text = replay::get_text(client, &format!("{url}/metrics")).await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
#[cfg_attr(
    routelab_no_llama,
    ignore = "llama-server not built when the tests were built: run testing/llama/ensure.sh (~6 min once, as .ci/run does)"
)]
fn llama_server_behind_the_gateway_serves_completions_and_chat_streamed_or_not() {
    let Some(bin) = llama() else { return };
    let _alone = crate::common::cores_alone();
    let mut procs = Procs(Vec::new());
    let engines = [engine(&mut procs, &bin, &[]), engine(&mut procs, &bin, &[])];
    let gw = gateway(&mut procs, &engines, "round_robin", &[]);
    let client = replay::client();
    runtime().block_on(async {
        // Defect 9: the KV capacity is the engine's own (-c 8192 -np 2: n_ctx 4096 per slot × 2).
        let kv = metric(&client, &gw, "routelab_gateway_kv_capacity_tokens", "/props: n_ctx 4096 × 2 slots").await;
        assert_eq!(kv, 8192.0, "the KV capacity read from llama-server's /props");
        let chat = |stream: bool, usage: bool| {
            let mut b = json!({"model": "smollm2", "max_tokens": 8, "temperature": 0, "stream": stream,
                               "messages": [{"role": "system", "content": "You are terse."},
                                            {"role": "user", "content": "Name a colour."}]});
            if usage {
                b["stream_options"] = json!({"include_usage": true});
            }
            b
        };
        let completion = |stream: bool| {
            json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8,
                   "temperature": 0, "stream": stream, "ignore_eos": true})
        };
        // Non-streamed: the engine's whole answer, with its usage.
        let (s, body) = request(&client, "POST", &format!("{gw}/v1/completions"), Some(&completion(false)), None).await;
        assert_eq!(s, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(!v["choices"][0]["text"].as_str().unwrap().is_empty(), "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 8, "ignore_eos: all 8 tokens, {v}");
        let (s, body) =
            request(&client, "POST", &format!("{gw}/v1/chat/completions"), Some(&chat(false, false)), None).await;
        assert_eq!(s, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["choices"][0]["message"]["role"], "assistant", "{v}");

        // Streamed, the client not asking for usage: the gateway asked for it (to tell the
        // policy) and strips the usage-only event again.
        let (s, body) =
            request(&client, "POST", &format!("{gw}/v1/chat/completions"), Some(&chat(true, false)), None).await;
        assert_eq!(s, 200, "{body}");
        let ev = events(&body);
        assert_eq!(ev.last(), Some(&Value::String("[DONE]".into())), "{body}");
        assert!(
            ev.iter().all(|e| e.get("choices").and_then(Value::as_array).is_none_or(|c| !c.is_empty())),
            "a usage-only event reached a client that did not ask: {body}"
        );
        let text: String =
            ev.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
        assert!(!text.is_empty(), "{body}");
        // Asking for it, the client gets it (with the engine's cached tokens).
        let (s, body) =
            request(&client, "POST", &format!("{gw}/v1/chat/completions"), Some(&chat(true, true)), None).await;
        assert_eq!(s, 200, "{body}");
        let ev = events(&body);
        let usage = ev.iter().find(|e| e["usage"].is_object()).unwrap_or_else(|| panic!("no usage event: {body}"));
        assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64(), "{usage}");
        let (s, body) = request(&client, "POST", &format!("{gw}/v1/completions"), Some(&completion(true)), None).await;
        assert_eq!(s, 200, "{body}");
        let ev = events(&body);
        let texts = ev.iter().filter(|e| e["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty())).count();
        assert!((1..=8).contains(&texts), "{texts} text events for 8 tokens: {body}");

        let (s, body) = request(&client, "GET", &format!("{gw}/v1/models"), None, None).await;
        assert_eq!(s, 200, "{body}");

        // The scrapes read llama.cpp's gauges: no scrape failed, whatever the reason.
        for e in &engines {
            let failed =
                metric(&client, &gw, "routelab_gateway_scrape_failures_total", &format!("backend=\"{e}\"")).await;
            assert_eq!(failed, 0.0, "scrapes of {e} failed");
        }
        assert_eq!(metric(&client, &gw, "routelab_gateway_requests_ok_total", "").await, 5.0);
        assert_eq!(metric(&client, &gw, "routelab_gateway_in_flight", "").await, 0.0);
        assert_eq!(metric(&client, &gw, "routelab_gateway_circuit_open", "").await, 0.0);
        assert_eq!(metric(&client, &gw, "routelab_gateway_rerouted_total", "").await, 0.0);
        // Non-streamed responses have no TTFT: only the 3 streams are in the histogram.
        assert_eq!(metric(&client, &gw, "routelab_gateway_ttft_seconds_count", "").await, 3.0);
    });
}

/// 12 requests, each one of 3 shared contexts (64 tokens of the byte-level fallback: 256 random
/// letters, ~150 of SmolLM2's tokens) plus a short suffix, 2 output tokens, one every 2 s.
const SHARED_PROMPTS: &str = "\
name: llama_shared_prompts
seed: 3
seeds: 1
cluster:
  replicas: 2
  generator:
    system_prompt_tokens: 16
    contexts: {count: 3, tokens: 64, popularity: uniform}
    suffix_tokens: 4
    output_tokens: 2
  arrivals:
    poisson: {rate: 0.5}
  requests: 12
";

fn replay_on_fresh_engines(bin: &(PathBuf, PathBuf), policy: &str) -> replay::ReplayReport {
    let mut procs = Procs(Vec::new());
    let engines = vec![engine(&mut procs, bin, &[]), engine(&mut procs, bin, &[])];
    let gw = gateway(&mut procs, &engines, policy, &[]);
    let file = scratch("shared_prompts.yaml");
    std::fs::write(&file, SHARED_PROMPTS).unwrap();
    let stream = replay::load_stream(&file, &[]).unwrap();
    let client = replay::client();
    runtime().block_on(async {
        let r = replay::replay(&gw, &stream, 1.0, &engines, Duration::from_secs(300)).await;
        assert_eq!(metric(&client, &gw, "routelab_gateway_in_flight", "").await, 0.0, "{policy}");
        assert_eq!(metric(&client, &gw, "routelab_gateway_scrape_failures_total", "").await, 0.0, "{policy}");
        r
    })
}

#[test]
#[cfg_attr(
    routelab_no_llama,
    ignore = "llama-server not built when the tests were built: run testing/llama/ensure.sh (~6 min once, as .ci/run does)"
)]
fn on_llama_server_prefix_aware_routing_beats_round_robin_on_the_engines_cache_counters() {
    let Some(bin) = llama() else { return };
    let _alone = crate::common::cores_alone();
    let rr = replay_on_fresh_engines(&bin, "round_robin");
    let ca = replay_on_fresh_engines(&bin, "sglang_cache_aware{below_threshold: smallest_tree}");
    let _ = writeln!(
        std::io::stderr(),
        "llama.cpp, 12 requests over 3 shared prompts:\nround_robin {rr:?}\ncache_aware {ca:?}"
    );
    for (name, r) in [("round_robin", &rr), ("cache_aware", &ca)] {
        // `replay` sends ignore_eos and reads usage.completion_tokens: every stream is complete.
        assert_eq!((r.requests, r.complete), (12, 12), "{name}: {:?}", r.first_error);
        assert!(r.hit_rate.is_finite() && r.hit_rate > 0.0, "{name}: llama.cpp's counters read: {r:?}");
        assert!(r.ttft_p50_s > 0.0 && r.latency_p50_s >= r.ttft_p50_s, "{name}: {r:?}");
    }
    assert!(ca.hit_rate > rr.hit_rate, "cache-aware {} vs round robin {}", ca.hit_rate, rr.hit_rate);
}

/// Reads a streamed completion through the gateway; after its first text event, `on_first` runs
/// (once). The whole SSE body.
async fn stream_with(client: &HttpClient, url: &str, body: &Value, mut on_first: impl FnMut()) -> String {
    let req = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let run = async {
        let resp = client.request(req).await.expect("the gateway answers");
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let (mut all, mut fired) = (String::new(), false);
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(d) = frame.into_data() {
                all.push_str(&String::from_utf8_lossy(&d));
            }
            if !fired && !stream_text(&all).is_empty() {
                fired = true;
                on_first();
            }
        }
        all
    };
    tokio::time::timeout(Duration::from_secs(120), run).await.expect("the stream ends within 120 s")
}

fn stream_text(body: &str) -> String {
    events(body).iter().filter_map(|e| e["choices"][0]["text"].as_str()).collect::<Vec<_>>().concat()
}

#[test]
#[cfg_attr(
    routelab_no_llama,
    ignore = "llama-server not built when the tests were built: run testing/llama/ensure.sh (~6 min once, as .ci/run does)"
)]
fn a_llama_server_killed_mid_stream_is_resumed_on_the_other_byte_for_byte() {
    let Some(bin) = llama() else { return };
    let _alone = crate::common::cores_alone();
    let mut procs = Procs(Vec::new());
    let engines = [engine(&mut procs, &bin, &[]), engine(&mut procs, &bin, &[])];
    let gw = gateway(&mut procs, &engines, "round_robin", &["--resume-streams"]);
    let client = replay::client();
    let rt = runtime();
    let body = json!({"model": "smollm2", "prompt": "Once upon a time, in a small village,", "max_tokens": 96,
                      "temperature": 0, "stream": true, "ignore_eos": true});
    // Which engine the gateway's first request goes to: the one that will be killed.
    let first = rt.block_on(async {
        let r = stream_with(&client, &format!("{gw}/v1/completions"), &body, || {}).await;
        let on0 = metric(&client, &gw, "routelab_gateway_routed_total", &format!("backend=\"{}\"", engines[0])).await;
        (r, if on0 == 1.0 { 0 } else { 1 })
    });
    let (reference, served_first) = first;
    // Round robin: the next request goes to the other engine; kill that one mid-stream.
    let victim = 1 - served_first;
    let mut victim_proc = Some(procs.0.remove(victim));
    let spliced = rt.block_on(stream_with(&client, &format!("{gw}/v1/completions"), &body, || {
        if let Some(mut c) = victim_proc.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }));
    assert!(victim_proc.is_none(), "no text event arrived before the end: {spliced}");
    assert!(spliced.trim_end().ends_with("data: [DONE]"), "{spliced}");
    assert!(!spliced.contains("\"error\""), "{spliced}");
    assert_eq!(stream_text(&spliced), stream_text(&reference), "greedy decoding on identical engines splices exactly");
    rt.block_on(async {
        assert_eq!(metric(&client, &gw, "routelab_gateway_resumed_streams_total", "").await, 1.0);
        // The dead engine is avoided from now on.
        for _ in 0..3 {
            let b = json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 4, "temperature": 0});
            let (s, body) = request(&client, "POST", &format!("{gw}/v1/completions"), Some(&b), None).await;
            assert_eq!(s, 200, "{body}");
        }
        assert_eq!(metric(&client, &gw, "routelab_gateway_in_flight", "").await, 0.0);
    });
}

#[test]
#[cfg_attr(
    routelab_no_llama,
    ignore = "llama-server not built when the tests were built: run testing/llama/ensure.sh (~6 min once, as .ci/run does)"
)]
fn a_llama_server_behind_an_api_key_is_scraped_with_the_scrape_key() {
    let Some(bin) = llama() else { return };
    let _alone = crate::common::cores_alone();
    let mut procs = Procs(Vec::new());
    let e = engine(&mut procs, &bin, &["--api-key", "sesame"]);
    let gw = gateway(&mut procs, std::slice::from_ref(&e), "least_requests", &["--scrape-api-key", "sesame"]);
    let client = replay::client();
    runtime().block_on(async {
        let b = json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 4});
        let (s, body) = request(&client, "POST", &format!("{gw}/v1/completions"), Some(&b), None).await;
        assert_eq!(s, 401, "the engine's refusal is passed through: {body}");
        let (s, body) = request(&client, "POST", &format!("{gw}/v1/completions"), Some(&b), Some("sesame")).await;
        assert_eq!(s, 200, "{body}");
        let (s, body) = request(&client, "GET", &format!("{gw}/v1/models"), None, Some("sesame")).await;
        assert_eq!(s, 200, "the client's key reaches /v1/models: {body}");
        assert_eq!(metric(&client, &gw, "routelab_gateway_scrape_failures_total", "").await, 0.0);
        assert_eq!(metric(&client, &gw, "routelab_gateway_circuit_open", "").await, 0.0);
    });
}

#[test]
#[cfg_attr(
    routelab_no_llama,
    ignore = "llama-server not built when the tests were built: run testing/llama/ensure.sh (~6 min once, as .ci/run does)"
)]
fn the_official_openai_python_client_talks_to_llama_server_through_the_gateway() {
    let Some(bin) = llama() else { return };
    let _alone = crate::common::cores_alone();
    let python = llama_dir().join("client/bin/python");
    if !python.is_file() {
        // ensure.sh installs it with the engine; an engine cache from before it lacks it.
        let why = format!("skipped: no OpenAI client in {} (run testing/llama/ensure.sh)", python.display());
        if std::env::var("ROUTELAB_REQUIRE_LLAMA").is_ok_and(|v| v == "1") {
            panic!("ROUTELAB_REQUIRE_LLAMA=1 but {why}");
        }
        let _ = writeln!(std::io::stderr(), "{why}");
        return;
    }
    let mut procs = Procs(Vec::new());
    let engines = [engine(&mut procs, &bin, &[]), engine(&mut procs, &bin, &[])];
    let gw = gateway(&mut procs, &engines, "sglang_cache_aware", &[]);
    let out = Command::new(&python)
        .arg(repo().join("testing/llama/openai_client.py"))
        .arg(format!("{gw}/v1"))
        .output()
        .expect("run the OpenAI client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the client failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(v["models"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(!v["completion"]["text"].as_str().unwrap_or_default().is_empty(), "{v}");
    // Greedy: the stream says what the whole response said.
    assert_eq!(v["completion_stream"]["text"], v["completion"]["text"], "{v}");
    assert_eq!(v["chat"]["role"], "assistant", "{v}");
    assert!(!v["chat_stream"]["text"].as_str().unwrap_or_default().is_empty(), "{v}");
    assert!(v["chat_stream"]["usage"]["completion_tokens"].as_u64().is_some_and(|n| (1..=8).contains(&n)), "{v}");
    assert_eq!(v["chat_stream"]["usage_only_events"], 1, "{v}");
}
