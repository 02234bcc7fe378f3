//! A bounded soak of `routelab serve` (issue 26): 1,600 requests, 32 at a time, half streamed,
//! through an in-process gateway in front of four loopback backends — one healthy, one that
//! answers 500, one that hangs, one that closes mid-response until the soak's end and then
//! comes back. Every request is bounded by the client (20 s); the run ends by itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::plugins;
use crate::serve_faults::*;

const REQUESTS: usize = 1600;
const CONCURRENCY: usize = 32;

/// A streamed answer of three events (`broken`: the connection closes after the first).
fn stream(broken: bool) -> Reply {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let ev = "data: {\"choices\":[{\"index\":0,\"text\":\"t\"}]}\n\n";
    let body = if broken { ev.to_string() } else { format!("{ev}{ev}{ev}data: [DONE]\n\n") };
    Reply::Bytes(format!("{head}{body}").into_bytes())
}

fn answer(body: &[u8], broken: bool) -> Reply {
    let streamed = String::from_utf8_lossy(body).contains("\"stream\":true");
    match (streamed, broken) {
        (true, b) => stream(b),
        (false, false) => response(200, "application/json", COMPLETION),
        // Headers promise a body that never comes whole.
        (false, true) => Reply::Bytes(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{\"id\":".to_vec(),
        ),
    }
}

/// Resident memory of this process, in bytes (Linux).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn serve_under_failing_backends_loses_no_request_and_returns_to_zero() {
    runtime().block_on(async {
        let broken = Arc::new(AtomicBool::new(true));
        let flaky = broken.clone();
        let scripts: [Script; 4] = [
            Arc::new(|m, p, b| if m == "POST" { answer(b, false) } else { healthy(m, p, b) }),
            Arc::new(|m, p, b| if m == "POST" { response(500, "application/json", "{}") } else { healthy(m, p, b) }),
            Arc::new(|m, p, b| if m == "POST" { Reply::Hang } else { healthy(m, p, b) }),
            Arc::new(move |m, p, b| {
                if m != "POST" {
                    return healthy(m, p, b);
                }
                answer(b, flaky.load(Ordering::Relaxed))
            }),
        ];
        let mut backends = Vec::new();
        for s in scripts {
            backends.push(backend(s).await);
        }
        let mut args = serve_args(&backends);
        // A router that counts for itself what it heard dispatched and not yet ended.
        args.policy = format!("{}:counts_in_flight", plugins().faulty.display());
        args.timeout_s = 0.3;
        args.generation_timeout_s = 0.5;
        args.breaker_open_s = 0.5;
        args.resume_streams = true;
        let gw = gateway(args).await;
        let before = rss_bytes();

        let next = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..CONCURRENCY {
            let next = next.clone();
            workers.push(tokio::spawn(async move {
                let mut outcomes = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= REQUESTS {
                        return outcomes;
                    }
                    let body = format!(r#"{{"prompt":"request {i}","max_tokens":3,"stream":{}}}"#, i % 2 == 0);
                    let r = exchange(gw, &post("/v1/completions", &body), Duration::from_secs(20)).await;
                    outcomes.push((i, r));
                }
            }));
        }
        let mut outcomes = Vec::new();
        for w in workers {
            outcomes.extend(w.await.unwrap());
        }
        assert_eq!(outcomes.len(), REQUESTS);
        let mut ok = 0;
        for (i, r) in &outcomes {
            let r = r.as_ref().unwrap_or_else(|e| panic!("request {i} lost: {e}"));
            match status(r) {
                // A stream ends with [DONE] or with an error event, never cut silently.
                200 if i % 2 == 0 => {
                    assert!(r.contains("[DONE]") || r.contains("\"error\""), "request {i}: {r}");
                    ok += r.contains("[DONE]") as usize;
                }
                200 => ok += 1,
                502..=504 => assert!(r.contains("\"error\""), "request {i}: {r}"),
                s => panic!("request {i}: status {s}: {r}"),
            }
        }
        eprintln!("soak: {ok} of {REQUESTS} served");
        assert!(ok >= REQUESTS / 2, "only {ok} of {REQUESTS} served with a healthy backend in the pool");

        // Every dispatched request was released.
        let left = metric_becomes(gw, "routelab_gateway_in_flight", 0.0, Duration::from_secs(10)).await;
        assert_eq!(left, 0.0, "requests still counted in flight after the soak");
        // And the router's own count: every dispatch it heard ended in on_complete or on_abandon
        // (failures, retries elsewhere, hung backends timed out), none twice.
        let own = r#"routelab_gateway_policy_stat{name="router.in_flight"}"#;
        let text = exchange(gw, &get("/metrics"), Duration::from_secs(10)).await.unwrap();
        assert!(text.contains(own), "the gateway does not show the router's figure:\n{text}");
        let left = metric_becomes(gw, own, 0.0, Duration::from_secs(10)).await;
        assert_eq!(left, 0.0, "the router's own in-flight count drifted");
        // The broken backend comes back: after its circuit's cool-down it serves again.
        broken.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(600)).await;
        for i in 0..50 {
            let body = format!(r#"{{"prompt":"after {i}","max_tokens":3}}"#);
            let r = exchange(gw, &post("/v1/completions", &body), Duration::from_secs(20)).await;
            assert!(r.is_ok(), "request after {i} lost: {r:?}");
        }
        let back = format!("routelab_gateway_requests_ok_total{{backend=\"{}\"}}", backends[3]);
        assert!(metric(gw, &back).await >= 1.0, "the backend that came back never served again");
        // The outage and the recovery leave every count where it started: the gateway's and the
        // router's own in-flight figures are back at 0 once the last request has ended.
        let left = metric_becomes(gw, "routelab_gateway_in_flight", 0.0, Duration::from_secs(10)).await;
        assert_eq!(left, 0.0, "requests still counted in flight after the recovery");
        let left = metric_becomes(gw, own, 0.0, Duration::from_secs(10)).await;
        assert_eq!(left, 0.0, "the router's own in-flight count drifted through the recovery");
        // Memory: a few thousand requests of a few hundred bytes leave no lasting growth.
        if let (Some(b), Some(a)) = (before, rss_bytes()) {
            assert!(a < b + (256 << 20), "resident memory grew from {b} to {a} bytes");
        }
    });
}
