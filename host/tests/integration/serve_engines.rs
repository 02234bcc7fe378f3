//! The gateway in front of engines as they really answer (issue 25), with scripted loopback
//! backends speaking llama.cpp's dialect: its metric names, a missing /metrics, an API key,
//! role-only and finish events, the usage-only event, CRLF framing. One test per defect found in
//! front of a real llama-server; `llama.rs` runs the real one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::serve_faults::{
    HeadScript, Reply, Script, backend, backend_with_head, exchange, gateway, get, healthy, metric, post, response,
    runtime, serve_args, status,
};

/// llama.cpp's `/metrics` (llama-server --metrics) with `deferred` requests waiting.
fn llama_metrics(deferred: u32) -> String {
    format!(
        "# HELP llamacpp:prompt_tokens_total x\n# TYPE llamacpp:prompt_tokens_total counter\n\
         llamacpp:prompt_tokens_total 10\nllamacpp:prompt_tokens_cached_total 0\n\
         llamacpp:requests_processing 1\nllamacpp:requests_deferred {deferred}\n"
    )
}

fn llama_like(deferred: u32) -> Script {
    Arc::new(move |m, p, b| match p {
        "/metrics" => response(200, "text/plain", &llama_metrics(deferred)),
        "/health" => response(200, "application/json", r#"{"status":"ok"}"#),
        _ => healthy(m, p, b),
    })
}

const REASONS: [&str; 6] = ["no_answer", "no_metrics", "not_ready", "status", "unrecognised", "unreadable"];

/// The gateway's scrape failures by reason (in [`REASONS`]' order), over backends.
async fn scrape_failures(gw: std::net::SocketAddr) -> [f64; 6] {
    let text = exchange(gw, &get("/metrics"), Duration::from_secs(10)).await.unwrap();
    REASONS.map(|reason| {
        text.lines()
            .filter(|l| l.starts_with("routelab_gateway_scrape_failures_total{"))
            .filter(|l| l.contains(&format!("reason=\"{reason}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    })
}

#[test]
fn llama_cpps_queue_gauge_reaches_the_policy() {
    // Defects 1 and 4: llama.cpp's names were unknown, so its engines looked idle (or failed).
    // llm_d with only its queue scorer sends every request to the engine with fewer deferred.
    runtime().block_on(async {
        let backends = vec![backend(llama_like(40)).await, backend(llama_like(0)).await];
        let mut args = serve_args(&backends);
        args.policy = "llm_d{queue_weight: 1, kv_cache_weight: 0, prefix_weight: 0}".into();
        let gw = gateway(args).await;
        tokio::time::sleep(Duration::from_millis(300)).await; // scraped
        for _ in 0..6 {
            let r = exchange(gw, &post("/v1/completions", r#"{"prompt":"hello"}"#), Duration::from_secs(10)).await;
            assert_eq!(status(&r.clone().unwrap()), 200, "{r:?}");
        }
        let routed = |b: &str| format!("routelab_gateway_routed_total{{backend=\"{b}\"}}");
        assert_eq!(metric(gw, &routed(&backends[0])).await, 0.0, "the engine with 40 deferred was chosen");
        assert_eq!(metric(gw, &routed(&backends[1])).await, 6.0);
        assert_eq!(scrape_failures(gw).await, [0.0; 6], "{REASONS:?}");
    });
}

#[test]
fn scrape_failures_are_counted_by_reason_and_only_no_answer_or_not_ready_take_a_backend_out() {
    // Defects 1 and 2: a 200 with unknown names, a missing /metrics (llama.cpp without
    // --metrics answers 501) with a live /health, and a 401 are live backends of unknown load,
    // counted by reason; a 501 with /health 503 (a model still loading) takes the backend out.
    runtime().block_on(async {
        let cases: [(&str, Script, u16); 4] = [
            (
                "unrecognised",
                Arc::new(
                    |m, p, b| if p == "/metrics" { response(200, "text/plain", "other 1\n") } else { healthy(m, p, b) },
                ),
                200,
            ),
            (
                "no_metrics",
                Arc::new(|m, p, b| match p {
                    "/metrics" => {
                        response(501, "application/json", r#"{"error":{"message":"start it with --metrics"}}"#)
                    }
                    "/health" => response(200, "application/json", r#"{"status":"ok"}"#),
                    _ => healthy(m, p, b),
                }),
                200,
            ),
            (
                "status",
                Arc::new(
                    |m, p, b| if p == "/metrics" { response(401, "application/json", "{}") } else { healthy(m, p, b) },
                ),
                200,
            ),
            (
                "not_ready",
                Arc::new(|m, p, b| match p {
                    "/metrics" => response(501, "application/json", "{}"),
                    "/health" => response(503, "application/json", r#"{"error":{"message":"Loading model"}}"#),
                    _ => healthy(m, p, b),
                }),
                503,
            ),
        ];
        for (reason, script, health) in cases {
            let gw = gateway(serve_args(&[backend(script).await])).await;
            tokio::time::sleep(Duration::from_millis(400)).await; // several scrapes
            let counted = scrape_failures(gw).await;
            for (r, n) in REASONS.iter().zip(counted) {
                if *r == reason {
                    assert!(n >= 3.0, "{reason}: not counted: {counted:?}");
                } else {
                    assert_eq!(n, 0.0, "{reason}: counted as {r}: {counted:?}");
                }
            }
            let h = exchange(gw, &get("/health"), Duration::from_secs(10)).await.unwrap();
            assert_eq!(status(&h), health, "{reason}: {h}");
        }
    });
}

/// A script that answers /metrics only with `Authorization: Bearer key`, and records whether
/// /v1/models was asked with it.
fn keyed(models_auth: Arc<Mutex<Vec<bool>>>) -> HeadScript {
    Arc::new(move |m, p, head, b| {
        let authorised = head.lines().any(|l| l.eq_ignore_ascii_case("authorization: Bearer key"));
        match p {
            "/metrics" if authorised => response(200, "text/plain", &llama_metrics(0)),
            "/metrics" => response(401, "application/json", r#"{"error":{"message":"Invalid API Key"}}"#),
            "/v1/models" => {
                models_auth.lock().unwrap().push(authorised);
                if authorised {
                    healthy(m, p, b)
                } else {
                    response(401, "application/json", r#"{"error":{"message":"Invalid API Key"}}"#)
                }
            }
            _ => healthy(m, p, b),
        }
    })
}

#[test]
fn an_engine_behind_an_api_key_is_scraped_with_the_scrape_key_and_models_pass_the_clients_key() {
    // Defects 1 (a scrape credential) and 7 (`GET /v1/models` dropped `Authorization`).
    runtime().block_on(async {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let b = backend_with_head(keyed(asked.clone())).await;
        let mut args = serve_args(&[b]);
        args.scrape_api_key = Some("key".into());
        let gw = gateway(args).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(scrape_failures(gw).await, [0.0; 6], "the scrape key was not sent");
        let with_key = "GET /v1/models HTTP/1.1\r\nhost: t\r\nauthorization: Bearer key\r\nconnection: close\r\n\r\n";
        let r = exchange(gw, with_key, Duration::from_secs(10)).await.unwrap();
        assert_eq!(status(&r), 200, "{r}");
        let r = exchange(gw, &get("/v1/models"), Duration::from_secs(10)).await.unwrap();
        assert_eq!(status(&r), 401, "the engine's refusal is the client's answer: {r}");
        assert_eq!(*asked.lock().unwrap(), vec![true, false]);
    });
}

#[test]
fn a_refused_request_is_a_retry_not_a_reroute() {
    // Defect 3: the policy sending a retry back to the only backend counted as "rerouted".
    runtime().block_on(async {
        let refusing: Script =
            Arc::new(|m, p, b| if m == "POST" { response(500, "application/json", "{}") } else { healthy(m, p, b) });
        let gw = gateway(serve_args(&[backend(refusing).await])).await;
        let r = exchange(gw, &post("/v1/completions", r#"{"prompt":"hello"}"#), Duration::from_secs(10)).await;
        assert_eq!(status(&r.unwrap()), 502);
        // One retry, which found no other backend to try.
        assert_eq!(metric(gw, "routelab_gateway_retries_total").await, 1.0);
        assert_eq!(metric(gw, "routelab_gateway_rerouted_total").await, 0.0);
    });
}

/// A chat stream as llama.cpp sends it, CRLF-framed when `crlf`: a role-only event at once,
/// text events after `pause`, a finish event, and — when the request asked for it — the
/// usage-only event.
fn llama_stream(request: &[u8], pause: Duration, crlf: bool) -> Reply {
    let eol = if crlf { "\r\n" } else { "\n" };
    let wants_usage = serde_json::from_slice::<serde_json::Value>(request)
        .is_ok_and(|v| v["stream_options"]["include_usage"] == serde_json::Value::Bool(true));
    let ev = |json: &str| format!("data: {json}{eol}{eol}").into_bytes();
    let mut chunks = vec![
        (Duration::ZERO, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_vec()),
        (
            Duration::ZERO,
            ev(r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}]}"#),
        ),
    ];
    for t in ["Red", ".", " Blue"] {
        chunks.push((
            pause,
            ev(&format!(r#"{{"choices":[{{"finish_reason":null,"index":0,"delta":{{"content":"{t}"}}}}]}}"#)),
        ));
    }
    chunks.push((Duration::ZERO, ev(r#"{"choices":[{"finish_reason":"stop","index":0,"delta":{}}]}"#)));
    if wants_usage {
        chunks.push((
            Duration::ZERO,
            ev(r#"{"choices":[],"usage":{"completion_tokens":4,"prompt_tokens":20,"total_tokens":24,"prompt_tokens_details":{"cached_tokens":16}}}"#),
        ));
    }
    chunks.push((Duration::ZERO, ev("[DONE]")));
    Reply::Chunks { chunks, hang: false }
}

#[test]
fn streams_ask_the_engine_for_usage_and_strip_it_for_clients_that_did_not() {
    // Defect 6: cached and output tokens reach the policy only through usage.
    runtime().block_on(async {
        let bodies = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let seen = bodies.clone();
        let script: Script = Arc::new(move |m, p, b| {
            if m == "POST" {
                seen.lock().unwrap().push(b.to_vec());
                llama_stream(b, Duration::ZERO, false)
            } else {
                healthy(m, p, b)
            }
        });
        let gw = gateway(serve_args(&[backend(script).await])).await;
        let plain = r#"{"messages":[{"role":"user","content":"colours?"}],"stream":true}"#;
        let r = exchange(gw, &post("/v1/chat/completions", plain), Duration::from_secs(10)).await.unwrap();
        assert_eq!(status(&r), 200, "{r}");
        assert!(r.contains(" Blue") && r.contains("[DONE]"), "{r}");
        assert!(!r.contains("\"usage\":{"), "the client did not ask for usage: {r}");
        let asked = r#"{"messages":[{"role":"user","content":"colours?"}],"stream":true,"stream_options":{"include_usage":true}}"#;
        let r = exchange(gw, &post("/v1/chat/completions", asked), Duration::from_secs(10)).await.unwrap();
        assert!(r.contains("\"cached_tokens\":16"), "the client asked for usage: {r}");
        for b in bodies.lock().unwrap().iter() {
            let v: serde_json::Value = serde_json::from_slice(b).unwrap();
            assert_eq!(v["stream_options"]["include_usage"], serde_json::Value::Bool(true), "{v}");
        }
        assert_eq!(metric(gw, "routelab_gateway_requests_ok_total").await, 2.0);
    });
}

#[test]
fn ttft_is_the_first_text_event_of_a_stream_and_not_counted_for_whole_responses() {
    // Defect 5: a non-streamed response's "TTFT" was ~0 (timed from its headers); and 6: a
    // role-only first event is not a token. The engine sends its text 300 ms after the role
    // event, so the stream's TTFT is at least that (a lower bound: it cannot flake).
    runtime().block_on(async {
        let script: Script = Arc::new(|m, p, b| {
            if m == "POST" && p == "/v1/chat/completions" {
                llama_stream(b, Duration::from_millis(300), true)
            } else {
                healthy(m, p, b)
            }
        });
        let gw = gateway(serve_args(&[backend(script).await])).await;
        let r = exchange(gw, &post("/v1/completions", r#"{"prompt":"hello"}"#), Duration::from_secs(10)).await;
        assert_eq!(status(&r.unwrap()), 200);
        assert_eq!(metric(gw, "routelab_gateway_ttft_seconds_count").await, 0.0, "a whole response has no TTFT");
        assert_eq!(metric(gw, "routelab_gateway_latency_seconds_count").await, 1.0);
        let body = r#"{"messages":[{"role":"user","content":"colours?"}],"stream":true}"#;
        let r = exchange(gw, &post("/v1/chat/completions", body), Duration::from_secs(10)).await.unwrap();
        assert!(r.contains(" Blue"), "{r}");
        assert_eq!(metric(gw, "routelab_gateway_ttft_seconds_count").await, 1.0);
        let ttft = metric(gw, "routelab_gateway_ttft_seconds_sum").await;
        assert!(ttft >= 0.3, "TTFT {ttft} s: timed from the role-only event");
    });
}

#[test]
fn replay_measures_an_engine_that_frames_with_crlf_and_sends_role_finish_and_usage_events() {
    // Defects 8 and 11: replay expected exactly max_tokens events split on "\n\n"; a real
    // engine sends role-only and finish events (and its tokens need not be one event each), and
    // sse-starlette frames with CRLF. It must send ignore_eos and read usage.completion_tokens.
    let bodies = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let seen = bodies.clone();
    let report = runtime().block_on(async move {
        let script: Script = Arc::new(move |m, p, b| {
            if m == "POST" {
                seen.lock().unwrap().push(b.to_vec());
                let want = serde_json::from_slice::<serde_json::Value>(b).unwrap()["max_tokens"].as_u64().unwrap();
                completions_stream(want, true)
            } else {
                healthy(m, p, b)
            }
        });
        let url = backend(script).await;
        let dir = std::env::temp_dir().join(format!("routelab-serve-engines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("six.yaml");
        let w = "name: six\nseed: 1\nseeds: 1\ncluster:\n  replicas: 1\n  generator:\n    output_tokens: {uniform: {min: 3, max: 9}}\n  arrivals:\n    poisson: {rate: 100.0}\n  requests: 6\n";
        std::fs::write(&file, w).unwrap();
        let stream = routelab_serve::replay::load_stream(&file, &[]).unwrap();
        routelab_serve::replay::replay(&url, &stream, 0.01, &[], Duration::from_secs(60)).await
    });
    assert_eq!((report.requests, report.complete), (6, 6), "{report:?}");
    assert!(report.ttft_p50_s.is_finite() && report.ttft_p50_s >= 0.0, "{report:?}");
    for b in bodies.lock().unwrap().iter() {
        let v: serde_json::Value = serde_json::from_slice(b).unwrap();
        assert_eq!(
            (v["ignore_eos"].as_bool(), v["stream_options"]["include_usage"].as_bool()),
            (Some(true), Some(true))
        );
    }
}

/// A completions stream of `tokens` tokens as llama.cpp sends one: two tokens per text event
/// (as when a multi-byte character spans tokens), an empty-text final event with the finish
/// reason and usage.
fn completions_stream(tokens: u64, crlf: bool) -> Reply {
    let eol = if crlf { "\r\n" } else { "\n" };
    let ev = |json: String| (Duration::ZERO, format!("data: {json}{eol}{eol}").into_bytes());
    let mut chunks = vec![(
        Duration::ZERO,
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_vec(),
    )];
    for _ in 0..tokens.div_ceil(2) {
        chunks.push(ev(r#"{"choices":[{"text":"ab","index":0,"finish_reason":null}]}"#.into()));
    }
    chunks.push(ev(format!(
        r#"{{"choices":[{{"text":"","index":0,"finish_reason":"length"}}],"usage":{{"completion_tokens":{tokens},"prompt_tokens":9}}}}"#
    )));
    chunks.push(ev("[DONE]".into()));
    Reply::Chunks { chunks, hang: false }
}

#[test]
fn a_bad_kv_capacity_or_scrape_key_is_refused() {
    // Defect 9: --kv-capacity-tokens describes an engine the catalogue does not know.
    let mut args = serve_args(&["http://127.0.0.1:9".into()]);
    args.kv_capacity_tokens = Some(0);
    let e = routelab_serve::gateway::Gateway::new(args).err().expect("refused").to_string();
    assert!(e.contains("--kv-capacity-tokens"), "{e}");
    let mut args = serve_args(&["http://127.0.0.1:9".into()]);
    args.scrape_api_key = Some("bad\nkey".into());
    let e = routelab_serve::gateway::Gateway::new(args).err().expect("refused").to_string();
    assert!(e.contains("--scrape-api-key"), "{e}");
}

#[test]
fn a_request_without_max_tokens_is_booked_to_the_end_of_the_context() {
    // Defect 10: it was booked as 16 output tokens; engines generate until EOS or the context's
    // end. Two requests hang at the backend while the booking is read.
    runtime().block_on(async {
        let hang: Script = Arc::new(|m, p, b| if m == "POST" { Reply::Hang } else { healthy(m, p, b) });
        let mut args = serve_args(&[backend(hang).await]);
        args.kv_capacity_tokens = Some(5000);
        let gw = gateway(args).await;
        let work = "routelab_gateway_outstanding_work_tokens";
        // "hello" is 2 tokens of the byte-level fallback.
        let send = |body: &'static str| {
            tokio::spawn(async move { exchange(gw, &post("/v1/completions", body), Duration::from_secs(30)).await })
        };
        let unbounded = send(r#"{"prompt":"hello"}"#);
        assert_eq!(crate::serve_faults::metric_becomes(gw, work, 5000.0, Duration::from_secs(10)).await, 5000.0);
        let bounded = send(r#"{"prompt":"hello","max_tokens":7}"#);
        assert_eq!(crate::serve_faults::metric_becomes(gw, work, 5009.0, Duration::from_secs(10)).await, 5009.0);
        unbounded.abort();
        bounded.abort();
    });
}

#[test]
fn without_kv_capacity_tokens_the_engines_state_it() {
    // Defect 9, read from the engine: llama.cpp's /props (n_ctx per slot × slots), vLLM's
    // cache_config_info, or vLLM's max_model_len; the smallest stated wins; none stated or the
    // flag given leaves the catalogue's or the flag's value.
    runtime().block_on(async {
        let props = |n_ctx: u32, slots: u32| -> Script {
            let body = format!(r#"{{"default_generation_settings":{{"n_ctx":{n_ctx}}},"total_slots":{slots}}}"#);
            Arc::new(
                move |m, p, b| if p == "/props" { response(200, "application/json", &body) } else { healthy(m, p, b) },
            )
        };
        let cache_config: Script = Arc::new(|m, p, b| match p {
            "/props" => response(404, "text/plain", "no"),
            "/metrics" => response(
                200,
                "text/plain",
                "vllm:num_requests_waiting 0\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1.0\n",
            ),
            _ => healthy(m, p, b),
        });
        let max_model_len: Script = Arc::new(|m, p, b| match p {
            "/v1/models" => response(200, "application/json", r#"{"data":[{"id":"m","max_model_len":12000}]}"#),
            _ => healthy(m, p, b),
        });
        let kv = |gw: &routelab_serve::gateway::Gateway| (gw.kv_capacity_tokens, gw.kv_capacity_source.clone());
        let start = |backends: Vec<String>| async move {
            routelab_serve::gateway::Gateway::start(serve_args(&backends)).await.expect("starts")
        };

        let llama = vec![backend(props(4096, 2)).await, backend(props(4096, 4)).await];
        let (tokens, source) = kv(&start(llama.clone()).await);
        assert_eq!(tokens, 8192, "the smaller of 4096 × 2 and 4096 × 4");
        assert!(source.starts_with(&llama[0]) && source.contains("/props"), "{source}");

        let (tokens, source) = kv(&start(vec![backend(cache_config).await]).await);
        assert_eq!(tokens, 16_000, "{source}");
        let (tokens, source) = kv(&start(vec![backend(max_model_len).await]).await);
        assert_eq!(tokens, 12_000, "{source}");

        // Nothing stated (a 200 that is no /props body): the catalogue's, as without asking.
        let silent = vec![backend(Arc::new(healthy)).await];
        let catalogue = routelab_serve::gateway::Gateway::new(serve_args(&silent)).unwrap().kv_capacity_tokens;
        let (tokens, source) = kv(&start(silent).await);
        assert_eq!((tokens, source.starts_with("the catalogue")), (catalogue, true), "{source}");
        assert_ne!(catalogue, 8192);

        // The flag wins and the engines are not asked.
        let mut args = serve_args(&llama);
        args.kv_capacity_tokens = Some(777);
        let gw = routelab_serve::gateway::Gateway::start(args).await.unwrap();
        assert_eq!(kv(&gw), (777, "--kv-capacity-tokens".to_string()));
    });
}
