//! Hostile clients: silent, stalled and idle connections are closed, connections past the limit
//! wait, event streams are relayed as framed, and a stalled body does not hold the client.

use super::*;

/// Reads until the server closes `s` (what it wrote before), for at most 10 s.
async fn until_closed(s: &mut TcpStream) -> Result<String, String> {
    let mut out = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await {
        Ok(_) => Ok(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => Err(format!("still open after 10 s, having sent {:?}", String::from_utf8_lossy(&out))),
    }
}

#[test]
fn silent_stalled_and_idle_clients_are_disconnected() {
    runtime().block_on(async {
        let limits = ConnLimits { header_timeout_s: 0.3, body_timeout_s: 0.3, ..ConnLimits::default() };
        for (name, addr) in both_servers(limits).await {
            // Connected, and silent.
            let mut silent = TcpStream::connect(addr).await.unwrap();
            until_closed(&mut silent).await.unwrap_or_else(|e| panic!("{name}, silent client: {e}"));
            // Half a request head.
            let mut half = TcpStream::connect(addr).await.unwrap();
            half.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: t\r\n").await.unwrap();
            until_closed(&mut half).await.unwrap_or_else(|e| panic!("{name}, half a head: {e}"));
            // A body that stops: a 408.
            let mut stalled = TcpStream::connect(addr).await.unwrap();
            let head = "POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n{\"prompt\":";
            stalled.write_all(head.as_bytes()).await.unwrap();
            let r = until_closed(&mut stalled).await.unwrap_or_else(|e| panic!("{name}, stalled body: {e}"));
            assert_eq!(status(&r), 408, "{name}: {r}");
            // Idle after a keep-alive exchange.
            let mut idle = TcpStream::connect(addr).await.unwrap();
            idle.write_all(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
            let r = until_closed(&mut idle).await.unwrap_or_else(|e| panic!("{name}, idle keep-alive: {e}"));
            assert_eq!(status(&r), 200, "{name}: {r}");
        }
    });
}

#[test]
fn connections_past_the_limit_wait_for_a_free_one() {
    runtime().block_on(async {
        let limits = ConnLimits { max_connections: 4, ..ConnLimits::default() };
        for (name, addr) in both_servers(limits).await {
            let mut held = Vec::new();
            for _ in 0..4 {
                held.push(TcpStream::connect(addr).await.unwrap());
            }
            // Give the server time to take all four, then a fifth client waits in the backlog.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let fifth = tokio::spawn(async move { exchange(addr, &get("/health"), Duration::from_secs(20)).await });
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!fifth.is_finished(), "{name}: a fifth connection was served past --max-connections 4");
            held.pop();
            let r = fifth.await.unwrap().unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(status(&r), 200, "{name}: {r}");
        }
    });
}

/// A streamed completion as an engine would send it, `eol` ending every line, one event per
/// chunk, split mid-event too.
fn sse_reply(eol: &str) -> Reply {
    let ev = |t: &str| format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{t}\"}}]}}{eol}{eol}");
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_string();
    let (a, b) = (ev("a"), ev("b"));
    let pause = Duration::from_millis(20);
    let chunks = vec![
        (Duration::ZERO, head.into_bytes()),
        (pause, a.into_bytes()),
        (pause, b.as_bytes()[..10].to_vec()),
        (pause, b.as_bytes()[10..].to_vec()),
        (pause, format!("{}data: [DONE]{eol}{eol}", ev("c")).into_bytes()),
    ];
    Reply::Chunks { chunks, hang: false }
}

#[test]
fn sse_framed_with_crlf_is_relayed_event_by_event() {
    runtime().block_on(async {
        for eol in ["\r\n", "\n"] {
            let script: Script = Arc::new(move |m, p, b| if m == "POST" { sse_reply(eol) } else { healthy(m, p, b) });
            let gw = gateway(serve_args(&[backend(script).await])).await;
            let body = r#"{"prompt":"hello","stream":true}"#;
            let r = exchange(gw, &post("/v1/completions", body), Duration::from_secs(10)).await.unwrap();
            assert_eq!(status(&r), 200, "{eol:?}: {r}");
            for t in ["\"a\"", "\"b\"", "\"c\"", "[DONE]"] {
                assert!(r.contains(t), "{eol:?}: {t} not relayed: {r}");
            }
            assert!(!r.contains("error"), "{eol:?}: {r}");
            assert_eq!(metric(gw, "routelab_gateway_requests_ok_total").await, 1.0, "{eol:?}");
        }
    });
}

#[test]
fn a_4xx_or_models_body_that_stalls_after_its_headers_does_not_hold_the_client() {
    runtime().block_on(async {
        let stall = |status: u16| Reply::Chunks {
            chunks: vec![(
                Duration::ZERO,
                format!("HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"err")
                    .into_bytes(),
            )],
            hang: true,
        };
        let script: Script = Arc::new(move |m, p, b| match (m, p) {
            ("POST", _) | ("GET", "/v1/models") => stall(if m == "POST" { 400 } else { 200 }),
            _ => healthy(m, p, b),
        });
        let mut args = serve_args(&[backend(script).await]);
        args.timeout_s = 0.5;
        let gw = gateway(args).await;
        for req in [post("/v1/completions", r#"{"prompt":"hello"}"#), get("/v1/models")] {
            let r = exchange(gw, &req, Duration::from_secs(10)).await;
            assert_eq!(status(&r.clone().unwrap_or_default()), 502, "{req}: {r:?}");
        }
    });
}
