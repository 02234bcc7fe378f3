//! End to end on loopback: two emulated engines publish their caches as KV events (one in vLLM's
//! format, one in SGLang's with 1-token pages), a gateway subscribes to both, and its decisions
//! follow what the engines' caches hold, as they store and as they evict.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::emulate::{EmulateArgs, Prepared};

pub(super) fn emulate_args(argv: &[String]) -> EmulateArgs {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: EmulateArgs,
    }
    Cli::try_parse_from(std::iter::once("emulate".to_string()).chain(argv.iter().cloned())).expect("parses").args
}

/// POSTs `body` to `path` and returns the response's body.
pub(super) async fn post(addr: SocketAddr, path: &str, body: &str) -> String {
    let raw = format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(raw.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    };
    let out = tokio::time::timeout(Duration::from_secs(30), exchange).await.expect("an answer within 30 s");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

fn cached_tokens(body: &str) -> u64 {
    // The JSON object inside the body (which may come in chunked framing).
    let json = &body[body.find('{').expect("JSON")..=body.rfind('}').expect("JSON")];
    let v: serde_json::Value = serde_json::from_str(json).expect("JSON");
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_follows_two_emulated_engines_caches_through_their_kv_events() {
    let words: Vec<String> = (0..300).map(|i| format!("w{i}")).collect();
    let refs: Vec<&str> = words.iter().map(String::as_str).collect();
    let tok = std::env::temp_dir().join(format!("routelab-kv-emulated-tokenizer-{}.json", std::process::id()));
    std::fs::write(&tok, crate::text::tests::word_level(&refs)).unwrap();
    let text = |from: usize, n: usize| words[from..from + n].join(" ");

    // Engine 0 publishes vLLM's format, engine 1 SGLang's (one event per token).
    let mut engines = Vec::new();
    let mut subscriptions = Vec::new();
    // Engine 1 has room for ≈3,000 tokens of KV (0.31 of an A6000 after Mistral-7B's weights).
    for (format, memory) in [("format=vllm", "0.9"), ("format=sglang,page=1", "0.31")] {
        let args = emulate_args(&[
            "--memory-fraction".into(),
            memory.into(),
            "--time-scale".into(),
            "0.01".into(),
            "--tokenizer".into(),
            tok.display().to_string(),
            "--kv-events".into(),
            format!("tcp://127.0.0.1:0,replay=tcp://127.0.0.1:0,{format}"),
        ]);
        let mut prepared = Prepared::new(&args).expect("starts");
        let bound = prepared.bind_kv_events().await.unwrap().expect("bound");
        subscriptions.push(format!("{},replay={}", bound.endpoint, bound.replay.unwrap()));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        engines.push(l.local_addr().unwrap());
        tokio::spawn(prepared.run(l, std::future::pending()));
    }
    let urls: Vec<String> = engines.iter().map(|a| format!("http://{a}")).collect();
    let mut args = ServeArgs::with_backends(&urls);
    args.policy = "max_affinity".into();
    args.tokenizer = Some(tok.clone());
    args.kv_events = subscriptions;
    let gw = Arc::new(Gateway::new(args).expect("starts"));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = l.local_addr().unwrap();
    tokio::spawn(crate::proxy::run(gw.clone(), l, std::future::pending()));

    // A PUB socket drops what it sends before a subscription arrives: warm each engine up with
    // prompts of its own until the gateway has applied one of its batches.
    for (i, &engine) in engines.iter().enumerate() {
        let mut k = 0;
        while gw.kv_stats[i].count(Outcome::Applied) == 0 {
            assert!(k < 200, "engine {i}'s events never reached the gateway");
            let body = format!(r#"{{"prompt": "{}", "max_tokens": 1}}"#, text(200 + (k % 5) * 16, 16));
            post(engine, "/v1/completions", &body).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            k += 1;
        }
    }
    let _ = std::fs::remove_file(&tok);

    // P (64 tokens) is sent straight to engine 1; R's first half to engine 1 and R whole to
    // engine 0. The gateway routed none of them: only the engines' events tell where they are.
    let (p, r) = (text(0, 64), text(64, 64));
    let mut segs = (Vec::new(), Vec::new());
    gw.tokenizer.segments(&p, &mut segs.0);
    gw.tokenizer.segments(&r, &mut segs.1);
    let route = |s: &[Segment]| gw.route(s, 64, 1, &[false, false]).expect("routed").backend;
    assert_eq!((route(&segs.0), route(&segs.1)), (0, 0), "nothing cached: ties go to backend 0");
    let complete = |prompt: &str| format!(r#"{{"prompt": "{prompt}", "max_tokens": 2}}"#);
    post(engines[1], "/v1/completions", &complete(&text(64, 32))).await;
    post(engines[1], "/v1/completions", &complete(&p)).await;
    let mut k = 0;
    while route(&segs.0) != 1 {
        assert!(k < 1000, "the gateway never saw engine 1's BlockStored (SGLang's form) for P");
        tokio::time::sleep(Duration::from_millis(10)).await;
        k += 1;
    }
    assert_eq!(route(&segs.1), 1, "engine 1 holds R's first half, engine 0 nothing yet");
    post(engines[0], "/v1/completions", &complete(&r)).await;
    let mut k = 0;
    while route(&segs.1) != 0 {
        assert!(k < 1000, "the gateway never saw engine 0's BlockStored (vLLM's form) for R");
        tokio::time::sleep(Duration::from_millis(10)).await;
        k += 1;
    }

    // Through the gateway, P goes where it is cached and hits there.
    let dispatched = || gw.backends[1].dispatched.load(Ordering::Relaxed);
    let before = dispatched();
    let body = post(gateway, "/v1/completions", &complete(&p)).await;
    assert_eq!(dispatched(), before + 1, "P went to engine 1");
    assert!(cached_tokens(&body) >= 48, "and hit its cache there: {body}");

    // Engine 1 evicts P to make room for other prompts: its BlockRemoved events take P out of
    // the gateway's view, and P goes back to the tie's backend.
    let holds_p =
        || {
            let r = gw.routing.lock().unwrap();
            r.kv[1].as_ref().unwrap().index.holds(
                segs.0.iter().fold(0, |h, s| routelab_core::sim::cluster::prefix_cache::extend_path_hash(h, s.id)),
            )
        };
    assert!(holds_p());
    let mut k = 0;
    while holds_p() {
        assert!(k < 150, "engine 1 never evicted P (or the gateway never heard)");
        post(engines[1], "/v1/completions", &complete(&text(130 + k % 100, 64))).await;
        k += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(k > 30, "P went only once ≈3,000 tokens of other prompts came ({k} prompts of 64)");
    assert_eq!(route(&segs.0), 0, "P is no longer cached anywhere");
    for i in 0..2 {
        let stats = &gw.kv_stats[i];
        assert_eq!(
            (stats.count(Outcome::Malformed), stats.count(Outcome::GapLost), stats.count(Outcome::Overflow)),
            (0, 0, 0),
            "engine {i}: every batch read"
        );
    }
}
