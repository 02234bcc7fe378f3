//! `routelab serve` and `routelab emulate` against hostile clients and failing backends
//! (issue 26), in process and on loopback only: scripted fake backends on raw TCP, a raw TCP
//! client (so a test can stall, half-close or give up exactly where it wants), and every wait
//! bounded in time. The helpers and the backend-side tests are here; the client-side ones are in
//! [`clients`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use routelab_serve::ConnLimits;
use routelab_serve::emulate::{EmulateArgs, HardwareArgs, Prepared};
use routelab_serve::gateway::{Gateway, ServeArgs};

/// What a fake backend does with one request.
pub enum Reply {
    /// Writes these bytes, then closes.
    Bytes(Vec<u8>),
    /// Writes each chunk after its pause; then closes, or with `hang` holds the connection open.
    Chunks { chunks: Vec<(Duration, Vec<u8>)>, hang: bool },
    /// Never answers (the connection stays open until the runtime stops).
    Hang,
}

/// (method, path, body) → what to do.
pub type Script = Arc<dyn Fn(&str, &str, &[u8]) -> Reply + Send + Sync>;
/// (method, path, the request head, body) → what to do: for scripts that read headers.
pub type HeadScript = Arc<dyn Fn(&str, &str, &str, &[u8]) -> Reply + Send + Sync>;

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A response with `status`, `content_type` and `body`, closing the connection.
pub fn response(status: u16, content_type: &str, body: &str) -> Reply {
    Reply::Bytes(
        format!(
            "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

pub const METRICS: &str = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n";
pub const COMPLETION: &str = r#"{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;

/// The usual answers: `/metrics` with vLLM's gauges, a completion to every POST.
pub fn healthy(method: &str, path: &str, _body: &[u8]) -> Reply {
    match (method, path) {
        ("GET", "/metrics") => response(200, "text/plain", METRICS),
        ("GET", "/v1/models") => response(200, "application/json", r#"{"object":"list","data":[]}"#),
        _ => response(200, "application/json", COMPLETION),
    }
}

/// Starts a fake backend on 127.0.0.1 that answers every request by `script`; its base URL.
pub async fn backend(script: Script) -> String {
    backend_with_head(Arc::new(move |m, p, _head, b| script(m, p, b))).await
}

/// As [`backend`], the script seeing the request's head (its headers) too.
pub async fn backend_with_head(script: HeadScript) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let script = script.clone();
            tokio::spawn(async move {
                let Some((method, path, head, body)) = read_request(&mut s).await else { return };
                match script(&method, &path, &head, &body) {
                    Reply::Bytes(b) => {
                        let _ = s.write_all(&b).await;
                    }
                    Reply::Chunks { chunks, hang } => {
                        for (pause, c) in chunks {
                            tokio::time::sleep(pause).await;
                            if s.write_all(&c).await.is_err() {
                                return;
                            }
                        }
                        if hang {
                            std::future::pending::<()>().await;
                        }
                    }
                    Reply::Hang => std::future::pending::<()>().await,
                }
            });
        }
    });
    url
}

/// One request's method, path, head and body (Content-Length framing, as hyper's client sends).
async fn read_request(s: &mut TcpStream) -> Option<(String, String, String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 1 << 20 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut words = head.split_whitespace();
    let (method, path) = (words.next()?.to_string(), words.next()?.to_string());
    let len = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>()))
        .and_then(Result::ok)
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf[head_end..head_end + len].to_vec();
    Some((method, path, head, body))
}

/// The gateway's arguments for `backends` (round_robin, short timeouts for tests).
pub fn serve_args(backends: &[String]) -> ServeArgs {
    let mut a = ServeArgs::with_backends(backends);
    a.listen = "127.0.0.1:0".parse().unwrap();
    a.policy = "round_robin".into();
    a.scrape_interval_s = 0.05;
    a.timeout_s = 5.0;
    a.generation_timeout_s = 30.0;
    a
}

mod clients;

fn hardware() -> HardwareArgs {
    HardwareArgs { gpu: "a6000".into(), model: "mistral-7b".into(), tp: 1, memory_fraction: 0.9 }
}

/// Starts a gateway in this runtime; its address.
pub async fn gateway(args: ServeArgs) -> SocketAddr {
    let gw = Arc::new(Gateway::new(args).unwrap());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(routelab_serve::proxy::run(gw, l, std::future::pending()));
    addr
}

/// The emulator's arguments (ten times faster than the modelled GPU).
pub fn emulate_args() -> EmulateArgs {
    EmulateArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        hardware: hardware(),
        chunk_tokens: 512,
        max_step_tokens: 32_768,
        max_batch_requests: 256,
        scheduler: "fcfs".into(),
        time_scale: 0.1,
        served_model_name: None,
        tokenizer: None,
        kv_events: None,
        limits: ConnLimits::default(),
    }
}

/// Starts an emulated engine in this runtime; its address.
pub async fn emulator(args: EmulateArgs) -> SocketAddr {
    let prepared = Prepared::new(&args).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(prepared.run(l, std::future::pending()));
    addr
}

/// A POST of a JSON body, closing the connection after the response.
pub fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

pub fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
}

/// Sends `raw` and reads the whole response (until the server closes), within `within`.
pub async fn exchange(addr: SocketAddr, raw: &str, within: Duration) -> Result<String, String> {
    let run = async {
        let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        s.write_all(raw.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(within, run).await.map_err(|_| format!("no complete response within {within:?}"))?
}

/// The status code of a raw response (0 when there is none).
pub fn status(resp: &str) -> u16 {
    resp.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The gateway's metric `name` summed over its label sets (0 when absent).
pub async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let text = exchange(addr, &get("/metrics"), Duration::from_secs(10)).await.unwrap_or_default();
    routelab_serve::prom::sum(&text, name).unwrap_or(0.0)
}

/// Polls `metric(name)` every 20 ms until it equals `want`, for at most `within`; the last value.
pub async fn metric_becomes(addr: SocketAddr, name: &str, want: f64, within: Duration) -> f64 {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let v = metric(addr, name).await;
        if v == want || tokio::time::Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A gateway (in front of a healthy fake backend) and an emulated engine, both with `limits`.
async fn both_servers(limits: ConnLimits) -> [(&'static str, SocketAddr); 2] {
    let mut args = serve_args(&[backend(Arc::new(healthy)).await]);
    args.limits = limits;
    let mut e = emulate_args();
    e.limits = limits;
    [("serve", gateway(args).await), ("emulate", emulator(e).await)]
}

const IN_FLIGHT: &str = "routelab_gateway_in_flight";

#[test]
fn a_client_that_gives_up_on_a_non_streamed_request_releases_its_backend() {
    runtime().block_on(async {
        let hang: Script = Arc::new(|m, p, b| if m == "POST" { Reply::Hang } else { healthy(m, p, b) });
        let backends = vec![backend(hang.clone()).await, backend(hang).await];
        let gw = gateway(serve_args(&backends)).await;
        for _ in 0..3 {
            let mut client = TcpStream::connect(gw).await.unwrap();
            client.write_all(post("/v1/completions", r#"{"prompt":"hello","max_tokens":4}"#).as_bytes()).await.unwrap();
            let held = metric_becomes(gw, IN_FLIGHT, 1.0, Duration::from_secs(10)).await;
            assert_eq!(held, 1.0, "the request never reached a backend");
            drop(client); // the impatient client
            let left = metric_becomes(gw, IN_FLIGHT, 0.0, Duration::from_secs(10)).await;
            assert_eq!(left, 0.0, "a request the client abandoned is still counted in flight");
        }
    });
}

#[test]
fn an_empty_prompt_is_refused_and_cannot_wedge_the_emulator() {
    runtime().block_on(async {
        let mut args = emulate_args();
        args.max_batch_requests = 2;
        let engine = emulator(args).await;
        let second = Duration::from_secs(5);
        for (path, body) in [
            ("/v1/completions", r#"{"prompt":""}"#),
            ("/v1/completions", r#"{"prompt":[""]}"#),
            ("/v1/chat/completions", r#"{"messages":[]}"#),
            ("/v1/completions", r#"{"prompt":"","stream":true}"#),
        ] {
            let r = exchange(engine, &post(path, body), second).await;
            let r = r.unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(status(&r), 400, "{body}: {r}");
            assert!(r.contains("empty"), "{body}: {r}");
        }
        // The batch slots are free: a real request is served.
        let r = exchange(engine, &post("/v1/completions", r#"{"prompt":"hello","max_tokens":3}"#), second).await;
        assert_eq!(status(&r.clone().unwrap()), 200, "{r:?}");
    });
}

/// Counts the POSTs a script sees.
fn counting(script: Script) -> (Script, Arc<std::sync::atomic::AtomicUsize>) {
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let m = n.clone();
    let counted: Script = Arc::new(move |method, path, body| {
        if method == "POST" {
            m.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        script(method, path, body)
    });
    (counted, n)
}

#[test]
fn a_slow_non_streamed_completion_is_not_a_failed_backend() {
    runtime().block_on(async {
        // Engines send a non-streamed completion's headers only when it is done: 1.5 s here.
        let slow: Script = Arc::new(|m, p, b| {
            if m != "POST" {
                return healthy(m, p, b);
            }
            let whole = match response(200, "application/json", COMPLETION) {
                Reply::Bytes(b) => b,
                _ => unreachable!(),
            };
            Reply::Chunks { chunks: vec![(Duration::from_millis(1500), whole)], hang: false }
        });
        let (slow, sent) = counting(slow);
        let backends = vec![backend(slow.clone()).await, backend(slow).await];
        let mut args = serve_args(&backends);
        args.timeout_s = 0.5; // headers of streams, not generation time
        let gw = gateway(args).await;
        let r = exchange(gw, &post("/v1/completions", r#"{"prompt":"hello"}"#), Duration::from_secs(20)).await.unwrap();
        assert_eq!(status(&r), 200, "{r}");
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 1, "re-run on another backend");
        assert_eq!(metric(gw, "routelab_gateway_backend_failures_total").await, 0.0);

        // Past --generation-timeout-s: a 504, and still sent once.
        let (hang, sent) = counting(Arc::new(|m, p, b| if m == "POST" { Reply::Hang } else { healthy(m, p, b) }));
        let backends = vec![backend(hang.clone()).await, backend(hang).await];
        let mut args = serve_args(&backends);
        args.generation_timeout_s = 0.5;
        let gw = gateway(args).await;
        let r = exchange(gw, &post("/v1/completions", r#"{"prompt":"hello"}"#), Duration::from_secs(20)).await.unwrap();
        assert_eq!(status(&r), 504, "{r}");
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 1, "a slow generation re-run elsewhere");
    });
}

#[test]
fn request_failures_open_the_circuit_whatever_the_scrapes_say() {
    runtime().block_on(async {
        let failing: Script = Arc::new(|m, p, b| {
            if m == "POST" { response(500, "application/json", r#"{"error":"boom"}"#) } else { healthy(m, p, b) }
        });
        let backends = vec![backend(failing).await, backend(Arc::new(healthy)).await];
        let gw = gateway(serve_args(&backends)).await;
        for _ in 0..8 {
            let r = exchange(gw, &post("/v1/completions", r#"{"prompt":"hello"}"#), Duration::from_secs(10)).await;
            assert_eq!(status(&r.clone().unwrap()), 200, "the retry on the healthy backend: {r:?}");
        }
        // Many good scrapes later (every 50 ms), the failing backend's circuit is still open.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let open = format!("routelab_gateway_circuit_open{{backend=\"{}\"}}", backends[0]);
        assert_eq!(metric(gw, &open).await, 1.0, "scrapes closed the circuit of a backend whose completions fail");
    });
}

#[test]
fn a_backend_with_bad_metrics_but_good_completions_is_used() {
    runtime().block_on(async {
        let bad_metrics: [(&str, Script); 3] = [
            (
                "404",
                Arc::new(|m, p, b| if p == "/metrics" { response(404, "text/plain", "no") } else { healthy(m, p, b) }),
            ),
            (
                "non-UTF-8",
                Arc::new(|m, p, b| {
                    if p == "/metrics" {
                        let mut r = b"HTTP/1.1 200 OK\r\ncontent-length: 29\r\nconnection: close\r\n\r\n".to_vec();
                        r.extend_from_slice(b"vllm:num_requests_waiting 0\n\xff");
                        Reply::Bytes(r)
                    } else {
                        healthy(m, p, b)
                    }
                }),
            ),
            (
                "no gauge",
                Arc::new(
                    |m, p, b| if p == "/metrics" { response(200, "text/plain", "other 1\n") } else { healthy(m, p, b) },
                ),
            ),
        ];
        for (what, script) in bad_metrics {
            let gw = gateway(serve_args(&[backend(script).await])).await;
            tokio::time::sleep(Duration::from_millis(400)).await; // several scrapes
            let health = exchange(gw, &get("/health"), Duration::from_secs(10)).await.unwrap();
            assert_eq!(status(&health), 200, "{what}: {health}");
            let r = exchange(gw, &post("/v1/completions", r#"{"prompt":"hello"}"#), Duration::from_secs(10)).await;
            assert_eq!(status(&r.clone().unwrap()), 200, "{what}: {r:?}");
        }
    });
}

#[test]
fn request_bodies_share_one_memory_budget() {
    runtime().block_on(async {
        let mut args = serve_args(&[backend(Arc::new(healthy)).await]);
        args.limits.max_buffered_mb = 8;
        args.limits.body_timeout_s = 60.0;
        let gw = gateway(args).await;
        // Three clients each send 3 MiB of a 30 MiB body, then stall: 9 MiB > 8 MiB.
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(tokio::spawn(async move {
                let mut s = TcpStream::connect(gw).await.unwrap();
                let head = format!("POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n", 30 << 20);
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&vec![b' '; 3 << 20]).await;
                let mut out = Vec::new();
                match tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await {
                    Err(_) => None,                                            // still held
                    Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()), // answered or reset
                }
            }));
        }
        let mut ended = Vec::new();
        for c in clients {
            ended.extend(c.await.unwrap());
        }
        assert!(!ended.is_empty(), "every 3 MiB body was held past the 8 MiB budget");
        for r in &ended {
            assert!(r.is_empty() || status(r) == 503, "{r}");
        }
        let health = exchange(gw, &get("/health"), Duration::from_secs(10)).await.unwrap();
        assert_eq!(status(&health), 200, "{health}");
    });
}

#[test]
fn impossible_emulate_and_serve_arguments_are_refused() {
    let refused = |mutate: &dyn Fn(&mut EmulateArgs), flag: &str| {
        let mut a = emulate_args();
        mutate(&mut a);
        let e = Prepared::new(&a).err().unwrap_or_else(|| panic!("{flag}: accepted")).to_string();
        assert!(e.contains(flag), "{flag}: {e}");
    };
    refused(&|a| a.hardware.memory_fraction = f64::NAN, "--memory-fraction");
    refused(&|a| a.hardware.memory_fraction = 2.0, "--memory-fraction");
    refused(&|a| a.hardware.tp = 3, "--tp");
    refused(
        &|a| {
            a.chunk_tokens = 0;
            a.max_step_tokens = 0;
        },
        "--max-step-tokens",
    );
    let missing = std::path::PathBuf::from("/nonexistent/tokenizer.json");
    refused(&|a| a.tokenizer = Some(missing.clone()), "--tokenizer");
    // KV events carry token ids: without --tokenizer, refused (and a malformed value in any case).
    refused(&|a| a.kv_events = Some("tcp://127.0.0.1:0".into()), "needs --tokenizer");
    refused(&|a| a.kv_events = Some("tcp://127.0.0.1:0,format=trt".into()), "--kv-events");
    let mut s = serve_args(&["http://127.0.0.1:9".into()]);
    s.tokenizer = Some(missing.clone());
    let e = Gateway::new(s).err().expect("a missing tokenizer.json was accepted").to_string();
    assert!(e.contains("--tokenizer") && e.contains("/nonexistent/tokenizer.json"), "{e}");
    let mut s = serve_args(&["http://127.0.0.1:9".into()]);
    s.scrape_interval_s = 1e-10;
    let e = Gateway::new(s).err().expect("a 1e-10 s scrape interval was accepted").to_string();
    assert!(e.contains("--scrape-interval-s"), "{e}");
}

#[test]
fn a_wrong_method_on_a_known_path_is_405_not_404() {
    runtime().block_on(async {
        for (name, addr) in both_servers(ConnLimits::default()).await {
            for (req, allow) in [(get("/v1/completions"), "POST"), (post("/health", "{}"), "GET")] {
                let r = exchange(addr, &req, Duration::from_secs(10)).await.unwrap();
                assert_eq!(status(&r), 405, "{name}: {r}");
                assert!(
                    r.to_ascii_lowercase().contains(&format!("allow: {}", allow.to_ascii_lowercase())),
                    "{name}: {r}"
                );
            }
            let r = exchange(addr, &get("/nowhere"), Duration::from_secs(10)).await.unwrap();
            assert_eq!(status(&r), 404, "{name}: {r}");
        }
    });
}

/// The emulator reports KV use as vLLM's `kv_cache_usage_perc` counts it: after a request ends
/// its prompt stays cached (the same prompt again hits it), yet usage reads 0 — cached blocks no
/// running request references are free, as in vLLM's block pool.
#[test]
fn the_emulators_kv_usage_counts_only_blocks_running_requests_hold() {
    runtime().block_on(async {
        let addr = emulator(emulate_args()).await;
        let body = format!(r#"{{"model": "m", "prompt": "{}", "max_tokens": 4}}"#, "word ".repeat(2000));
        let mut cached = Vec::new();
        for _ in 0..2 {
            let r = exchange(addr, &post("/v1/completions", &body), Duration::from_secs(30)).await.unwrap();
            assert_eq!(status(&r), 200, "{r}");
            let json = &r[r.find('{').unwrap()..=r.rfind('}').unwrap()];
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            cached.push(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0));
        }
        assert!(cached[0] == 0 && cached[1] > 1000, "the second request hits the first's cache: {cached:?}");
        let m = exchange(addr, &get("/metrics"), Duration::from_secs(10)).await.unwrap();
        let usage = routelab_serve::prom::first(&m, &["vllm:kv_cache_usage_perc"]);
        assert_eq!(usage, Some(0.0), "{m}");
    });
}
