//! `routelab emulate --kv-events`: the emulated engine publishes its prefix cache as KV-cache
//! events, the way vLLM and SGLang do, so `routelab serve --kv-events` can be run against it.
//!
//! Sockets, as vLLM's `ZmqEventPublisher` (`vllm/distributed/kv_events.py`
//! @0181ea3173e53eea8cf04a86891488e3dc89bb34; SGLang's copy in
//! `python/sglang/srt/disaggregation/kv_events.py` @006d053f182f9b488d2bd841afa06d5f9120a258
//! is the same): a PUB socket sends multipart `[topic, seq, payload]` (`seq` an 8-byte
//! big-endian counter from 0, `payload` one msgpack batch); a ROUTER socket (`replay=`) answers
//! `[identity, "", start_seq]` with every buffered batch from `start_seq` on, each
//! `[identity, "", seq, payload]`, then `[identity, "", -1, ""]`. The replay buffer keeps the
//! last `buffer=` batches (vLLM's `buffer_steps`, 10,000) and at most [`MAX_BUFFER_BYTES`].
//!
//! What is published ([`mirror`]): after each engine step, the difference between the full
//! 16-token blocks the cache holds computed and what was published before — `BlockStored`
//! (parents before children, with their token ids), `BlockRemoved` for evicted blocks, and
//! `AllBlocksCleared` when the cache is reset. The payload's shape is `format=` ([`encode`]):
//! vLLM's (the default) or SGLang's.
//!
//! Never blocking the engine: the engine hands a batch over with `try_send` into a bounded
//! queue ([`LIVE_QUEUE`] batches) read by the PUB task, after putting it in the replay buffer.
//! A full queue (a subscriber that does not read stalls the PUB socket's sends) drops the live
//! copy only: subscribers see a gap and replay it. A replay request is answered by its own task,
//! one at a time, one second per send at most.

pub mod encode;
pub mod mirror;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use routelab_core::workload::InputError;
use tokio::sync::mpsc;
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _};

pub use encode::{Event, Format};

/// Most bytes of batches the replay buffer holds.
pub const MAX_BUFFER_BYTES: usize = 64 << 20;
/// Batches waiting for the PUB socket; past it the live copy is dropped (the replay keeps it).
pub const LIVE_QUEUE: usize = 1024;
const REPLAY_SEND: Duration = Duration::from_secs(1);

/// `--kv-events` of `routelab emulate`.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Where the PUB socket binds, `tcp://host:port` (port 0: any free port).
    pub endpoint: String,
    /// Where the replay ROUTER socket binds, if any.
    pub replay: Option<String>,
    pub topic: String,
    pub format: Format,
    /// Batches kept for replays.
    pub buffer: usize,
}

fn error(message: String) -> InputError {
    InputError::command_line(
        "--kv-events",
        message,
        "give tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T][,format=vllm|sglang][,page=N][,buffer=N] \
         (page: SGLang's --page-size, 1, 2, 4, 8 or 16; buffer: batches kept for replays, 1 to 1000000)",
    )
}

/// Parses `tcp://HOST:PORT[,replay=…][,topic=…][,format=vllm|sglang][,page=N][,buffer=N]`; a
/// host `*` (vLLM's `tcp://*:5557`) binds every interface.
pub fn parse(raw: &str) -> Result<Spec, InputError> {
    let tcp = |s: &str| -> Result<String, InputError> {
        let rest = s.strip_prefix("tcp://").ok_or_else(|| error(format!("'{s}' is not tcp://")))?;
        match rest.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                let host = if host == "*" { "0.0.0.0" } else { host };
                Ok(format!("tcp://{host}:{port}"))
            }
            _ => Err(error(format!("'{s}' has no host:port"))),
        }
    };
    let mut parts = raw.split(',');
    let endpoint = tcp(parts.next().unwrap_or_default())?;
    let mut spec = Spec { endpoint, replay: None, topic: String::new(), format: Format::Vllm, buffer: 10_000 };
    let mut page = None;
    for p in parts {
        match p.split_once('=') {
            Some(("replay", v)) => spec.replay = Some(tcp(v)?),
            Some(("topic", v)) => spec.topic = v.to_string(),
            Some(("format", "vllm")) => spec.format = Format::Vllm,
            Some(("format", "sglang")) => spec.format = Format::Sglang { page: 1 },
            Some(("page", v)) => match v.parse::<u32>() {
                Ok(n) if [1, 2, 4, 8, 16].contains(&n) => page = Some(n),
                _ => return Err(error(format!("page={v} is not 1, 2, 4, 8 or 16"))),
            },
            Some(("buffer", v)) => match v.parse::<usize>() {
                Ok(n) if (1..=1_000_000).contains(&n) => spec.buffer = n,
                _ => return Err(error(format!("buffer={v} is out of range"))),
            },
            _ => return Err(error(format!("'{p}' in '{raw}' is not one of replay=, topic=, format=, page=, buffer="))),
        }
    }
    match (&mut spec.format, page) {
        (Format::Sglang { page: p }, Some(n)) => *p = n,
        (Format::Vllm, Some(_)) => return Err(error("page= goes with format=sglang (vLLM's blocks are 16)".into())),
        _ => {}
    }
    Ok(spec)
}

/// The last batches, for replays.
#[derive(Debug, Default)]
struct Buffer {
    batches: VecDeque<(i64, Bytes)>,
    bytes: usize,
    max: usize,
}

impl Buffer {
    fn push(&mut self, seq: i64, payload: Bytes) {
        self.bytes += payload.len();
        self.batches.push_back((seq, payload));
        while self.batches.len() > self.max || self.bytes > MAX_BUFFER_BYTES {
            let Some((_, p)) = self.batches.pop_front() else { break };
            self.bytes -= p.len();
        }
    }
}

/// The engine's side: numbers, encodes, buffers and hands over batches (never waits).
pub struct Publisher {
    seq: i64,
    format: Format,
    buffer: Arc<Mutex<Buffer>>,
    live: mpsc::Sender<(i64, Bytes)>,
    /// Live copies dropped because the PUB socket was behind.
    pub dropped: u64,
}

/// Where the sockets were bound (with the ports chosen for port 0).
#[derive(Debug, Clone)]
pub struct Bound {
    pub endpoint: String,
    pub replay: Option<String>,
}

impl Publisher {
    /// Binds the sockets and starts their tasks on the current runtime.
    pub async fn bind(spec: &Spec) -> std::io::Result<(Self, Bound)> {
        let io = |e: zeromq::ZmqError| std::io::Error::other(format!("--kv-events: {e}"));
        let mut pub_socket = zeromq::PubSocket::new();
        let endpoint = pub_socket.bind(&spec.endpoint).await.map_err(io)?.to_string();
        let buffer = Arc::new(Mutex::new(Buffer { max: spec.buffer, ..Buffer::default() }));
        let replay = match &spec.replay {
            Some(r) => {
                let mut router = zeromq::RouterSocket::new();
                let at = router.bind(r).await.map_err(io)?.to_string();
                tokio::spawn(serve_replays(router, buffer.clone()));
                Some(at)
            }
            None => None,
        };
        let (live, mut rx) = mpsc::channel::<(i64, Bytes)>(LIVE_QUEUE);
        let topic = Bytes::from(spec.topic.clone().into_bytes());
        tokio::spawn(async move {
            while let Some((seq, payload)) = rx.recv().await {
                let frames = vec![topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
                let Ok(msg) = zeromq::ZmqMessage::try_from(frames) else { continue };
                // An error concerns one subscriber (the socket drops it); keep publishing.
                let _ = pub_socket.send(msg).await;
            }
        });
        Ok((Self { seq: 0, format: spec.format, buffer, live, dropped: 0 }, Bound { endpoint, replay }))
    }

    /// Publishes one batch (nothing when `events` is empty).
    pub fn publish(&mut self, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let payload = Bytes::from(encode::batch(self.format, ts, events));
        let seq = self.seq;
        self.seq += 1;
        self.buffer.lock().expect("replay buffer").push(seq, payload.clone());
        if self.live.try_send((seq, payload)).is_err() {
            self.dropped += 1;
        }
    }
}

/// vLLM's `_service_replay`, one request at a time; a malformed request is ignored, a requester
/// that does not read is given up on after a second.
async fn serve_replays(mut router: zeromq::RouterSocket, buffer: Arc<Mutex<Buffer>>) {
    while let Ok(msg) = router.recv().await {
        let frames = msg.into_vec();
        let [identity, _, start] = frames.as_slice() else { continue };
        let Ok(start) = <[u8; 8]>::try_from(&start[..]).map(i64::from_be_bytes) else { continue };
        let held: Vec<(i64, Bytes)> =
            buffer.lock().expect("replay buffer").batches.iter().filter(|(s, _)| *s >= start).cloned().collect();
        for (seq, payload) in held.into_iter().chain([(-1, Bytes::new())]) {
            let reply = vec![identity.clone(), Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
            let Ok(reply) = zeromq::ZmqMessage::try_from(reply) else { break };
            match tokio::time::timeout(REPLAY_SEND, router.send(reply)).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
    }
}
