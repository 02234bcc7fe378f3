//! The loopback tests: a vLLM-like publisher, a gateway with a tokenizer.json.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _};

use super::*;

/// Batches a publisher keeps for replays, by sequence number.
type Buffer = Arc<Mutex<Vec<(i64, Vec<u8>)>>>;

/// A vLLM-like publisher on loopback: PUB for batches, ROUTER for replays of its buffer.
struct Publisher {
    pub_socket: zeromq::PubSocket,
    buffer: Buffer,
    seq: i64,
}

impl Publisher {
    /// Sends the next batch (and keeps it for replays).
    async fn send(&mut self, payload: Vec<u8>) {
        self.buffer.lock().unwrap().push((self.seq, payload.clone()));
        self.send_raw(vec![Bytes::new(), Bytes::copy_from_slice(&self.seq.to_be_bytes()), payload.into()]).await;
        self.seq += 1;
    }
    async fn send_raw(&mut self, frames: Vec<Bytes>) {
        self.pub_socket.send(zeromq::ZmqMessage::try_from(frames).unwrap()).await.unwrap();
    }
    /// Skips a sequence number: the batch is lost on the PUB socket, kept for replay or not.
    fn lose(&mut self, payload: Vec<u8>, replayable: bool) {
        if replayable {
            self.buffer.lock().unwrap().push((self.seq, payload));
        }
        self.seq += 1;
    }
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 10 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_on_loopback_flip_the_routers_choice_and_losses_degrade_it() {
    let mut pub_socket = zeromq::PubSocket::new();
    let pub_at = pub_socket.bind("tcp://127.0.0.1:0").await.unwrap();
    let mut router = zeromq::RouterSocket::new();
    let replay_at = router.bind("tcp://127.0.0.1:0").await.unwrap();
    let buffer: Buffer = Arc::default();
    let buf = buffer.clone();
    // vLLM's `_service_replay`: [identity, "", start] → every buffered batch ≥ start, then -1.
    let replays = tokio::spawn(async move {
        while let Ok(msg) = router.recv().await {
            let frames = msg.into_vec();
            let start = i64::from_be_bytes(frames[2][..].try_into().unwrap());
            let held: Vec<_> = buf.lock().unwrap().iter().filter(|(s, _)| *s >= start).cloned().collect();
            for (s, p) in held.into_iter().chain([(-1, Vec::new())]) {
                let reply = vec![frames[0].clone(), Bytes::new(), Bytes::copy_from_slice(&s.to_be_bytes()), p.into()];
                router.send(zeromq::ZmqMessage::try_from(reply).unwrap()).await.unwrap();
            }
        }
    });
    let words: Vec<String> = (0..64).map(|i| format!("w{i}")).collect();
    let refs: Vec<&str> = words.iter().map(String::as_str).collect();
    let tok = std::env::temp_dir().join(format!("routelab-kv-events-tokenizer-{}.json", std::process::id()));
    std::fs::write(&tok, crate::text::tests::word_level(&refs)).unwrap();
    let mut args = ServeArgs::with_backends(&["http://127.0.0.1:9".into(), "http://127.0.0.1:9".into()]);
    args.policy = "max_affinity".into();
    args.tokenizer = Some(tok.clone());
    args.kv_events = vec!["tcp://127.0.0.1:1".into(), format!("{pub_at},replay={replay_at}")];
    let gw = Arc::new(Gateway::new(args).expect("starts"));
    let _ = std::fs::remove_file(&tok);
    let spec = gw.kv_specs[1].clone().unwrap();
    let task = tokio::spawn(gw.clone().kv_events_loop(1, spec));
    let mut p = Publisher { pub_socket, buffer, seq: 0 };
    // PUB drops batches until the subscription arrives: empty batches until one is applied.
    let stats = |o| gw.kv_stats[1].count(o);
    for _ in 0..500 {
        p.send(batch(vec![])).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        if stats(Outcome::Applied) > 0 {
            break;
        }
    }
    assert!(stats(Outcome::Applied) > 0, "the subscriber never received a batch");
    let applied = |n: u64| move || stats(Outcome::Applied) >= n;

    // Prompts as token ids: P = ids 0..32 (two blocks), Q = ids 32..48.
    let pid: Vec<u32> = (1..33).collect();
    let qid: Vec<u32> = (33..49).collect();
    let (ps, qs) = (segments(&pid), segments(&qid));
    let (pt, qt) = (32, 16);
    let route = |s: &[Segment], t| gw.route(s, t, 1, &[false, false]).expect("routed").backend;
    assert_eq!(route(&ps, pt), 0, "no match anywhere: ties go to backend 0");

    // BlockStored on backend 1: the same prompt now goes there.
    let mut n = stats(Outcome::Applied);
    p.send(batch(vec![stored(&[h(1), h(2)], None, &pid, Some("GPU"))])).await;
    n += 1;
    until("stored", applied(n)).await;
    assert_eq!(route(&ps, pt), 1, "backend 1's engine holds P");
    // A CPU-tier copy does not count.
    p.send(batch(vec![stored(&[h(3)], None, &qid, Some("CPU"))])).await;
    n += 1;
    until("cpu", applied(n)).await;
    assert_eq!(route(&qs, qt), 0);

    // BlockRemoved of P's first block: the match is gone, back to 0.
    p.send(batch(vec![removed(&[h(1)])])).await;
    n += 1;
    until("removed", applied(n)).await;
    assert_eq!(route(&ps, pt), 0, "backend 1 evicted P's first block");

    // A gap the replay socket fills: the lost batch (P stored again) is applied.
    p.lose(batch(vec![stored(&[h(1), h(2)], None, &pid, None)]), true);
    p.send(batch(vec![stored(&[h(4)], None, &qid, None)])).await;
    n += 2;
    until("gap filled", applied(n)).await;
    assert_eq!((stats(Outcome::GapFilled), stats(Outcome::GapLost)), (1, 0));
    assert_eq!(route(&ps, pt), 1, "the replayed batch stored P");

    // A batch that does not decode: the view degrades to the guess (P was routed to 1; Q, held
    // only by the events, was not).
    p.send_raw(vec![Bytes::new(), Bytes::copy_from_slice(&p.seq.to_be_bytes()), Bytes::from_static(b"\xc1garbage")])
        .await;
    p.seq += 1;
    // And messages that are not [topic, seq, payload]: dropped.
    p.send_raw(vec![Bytes::from_static(b"only a topic")]).await;
    p.send_raw(vec![Bytes::new(), Bytes::from_static(b"short"), Bytes::new()]).await;
    until("malformed", || stats(Outcome::Malformed) >= 3).await;
    assert!(!gw.routing.lock().unwrap().kv[1].as_ref().unwrap().live);
    assert_eq!(route(&qs, qt), 0, "degraded: Q's events were dropped");
    assert_eq!(route(&ps, pt), 1, "degraded: the gateway's guess still sends P to 1");

    // AllBlocksCleared: live again, empty.
    p.send(batch(vec![cleared(), stored(&[h(5)], None, &qid, None)])).await;
    n += 1;
    until("cleared", applied(n)).await;
    assert!(gw.routing.lock().unwrap().kv[1].as_ref().unwrap().live);
    assert_eq!(route(&qs, qt), 1, "live again: Q stored after the clear");

    // A gap the replay cannot fill: counted, degraded.
    p.lose(batch(vec![removed(&[h(5)])]), false);
    p.send(batch(vec![])).await;
    n += 1;
    until("gap lost", applied(n)).await;
    assert_eq!(stats(Outcome::GapLost), 1);
    assert!(!gw.routing.lock().unwrap().kv[1].as_ref().unwrap().live);

    // The engine restarts: its sequence starts again at 0, its cache empty, the view live.
    p.seq = 0;
    p.send(batch(vec![])).await;
    n += 1;
    until("restart", applied(n)).await;
    assert_eq!(stats(Outcome::Restart), 1);
    assert!(gw.routing.lock().unwrap().kv[1].as_ref().unwrap().live);
    let text = gw.metrics_text();
    assert!(
        text.contains("routelab_gateway_kv_events_total{backend=\"http://127.0.0.1:9\",outcome=\"gap_filled\"} 1"),
        "{text}"
    );
    assert!(text.contains("routelab_gateway_kv_events_connected{backend=\"http://127.0.0.1:9\"} 1"), "{text}");
    task.abort();
    replays.abort();
}

#[test]
fn removed_blocks_reach_a_router_that_wants_evictions() {
    let tok = std::env::temp_dir().join(format!("routelab-kv-evict-tokenizer-{}.json", std::process::id()));
    std::fs::write(&tok, crate::text::tests::word_level(&["a", "b"])).unwrap();
    let mut args = ServeArgs::with_backends(&["http://127.0.0.1:9".into(), "http://127.0.0.1:9".into()]);
    args.policy = "dynamo_kv{prefix_state: events}".into();
    args.tokenizer = Some(tok.clone());
    args.kv_events = vec!["tcp://127.0.0.1:1".into(), "tcp://127.0.0.1:2".into()];
    let gw = Gateway::new(args).expect("starts");
    let _ = std::fs::remove_file(&tok);
    let gw = Arc::new(gw);
    let held = || {
        let r = gw.routing.lock().unwrap();
        let stats = r.router.report().unwrap();
        stats
            .iter()
            .find(|(k, _)| k == "router.router_cached_blocks_mean" || k == "router_cached_blocks_mean")
            .unwrap()
            .1
    };
    let pid: Vec<u32> = (1..49).collect();
    let b = gw.route(&segments(&pid), 48, 1, &[false, false]).expect("routed").backend;
    let before = held();
    assert!(before > 0.0, "the router learnt the prompt's blocks from its dispatch");
    let apply = |events| gw.apply(b, &wire::decode(&batch(events)).unwrap());
    apply(vec![stored(&[h(1), h(2), h(3)], None, &pid, None)]);
    assert_eq!(held(), before, "a store changes nothing the router did not already know");
    // The engine evicts the prompt's last block: the router hears it.
    apply(vec![removed(&[h(3)])]);
    let after = held();
    assert!(after < before, "{before} → {after}");
    // A clear evicts every chain.
    apply(vec![cleared()]);
    assert_eq!(held(), 0.0);
}
