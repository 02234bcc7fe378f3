//! Holding the simulator against measured runs: a run bundle (what a real engine did, request by
//! request) replayed exactly, and the signed error of every latency figure.
//!
//! A bundle is a folder:
//! - `requests.jsonl`: one line per request as vLLM's request stats give it — `request_id`,
//!   `input_toks`, `output_toks`, `arrival_time` (client clock, s), `queued_ts`,
//!   `first_token_ts`, `last_token_ts` (engine clock, s). Measured figures use LLMServingSim's
//!   definitions: TTFT = first − queued, TPOT = (last − first) / (output − 1), latency = last −
//!   queued.
//! - `stream.jsonl` (or `--stream FILE`): line i is request i's `arrival_time_ns`, `input_toks`,
//!   `output_toks` and `hash_ids`, one per full 16-token block of its prompt, equal for equal
//!   prefixes (chained).
//! - `meta.json`: `model` (a Hugging Face name), `engine_kwargs` (`tensor_parallel_size`,
//!   `data_parallel_size`, `max_num_seqs`, `max_num_batched_tokens`), and the device as `device`
//!   or in `llmservingsim_cluster_config.json` beside it (`hardware`).
//!
//! The replay ([`replay`]) runs the cluster world with the engine as vLLM's v1 scheduler runs it
//! (see [`replay::engine_spec`]) at the times the requests reached the engine (their client send
//! times on the engine's clock), timing each from when the engine took it in, as vLLM's
//! `queued_ts` does (`sim/cluster/replica/async_sched.rs`).

mod bundle;
pub mod replay;
pub mod splitwise;
pub mod vidur;

pub use bundle::{Bundle, Measured, Meta, load};

/// The figures compared, in order: (key, what).
pub const METRICS: [&str; 12] = [
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "latency_mean_s",
    "latency_p50_s",
    "latency_p90_s",
    "latency_p99_s",
];

/// Mean, P50, P90 and P99 (nearest rank, as the run metrics) of each figure of a set of requests:
/// per request (TTFT, TPOT, latency) in seconds; TPOT only for requests with 2+ output tokens.
pub fn figures(per_request: &[(f64, Option<f64>, f64)]) -> Vec<(&'static str, f64)> {
    let mut ttft: Vec<f64> = per_request.iter().map(|r| r.0).collect();
    let mut tpot: Vec<f64> = per_request.iter().filter_map(|r| r.1).collect();
    let mut latency: Vec<f64> = per_request.iter().map(|r| r.2).collect();
    let mut out = Vec::with_capacity(METRICS.len());
    let mut keys = METRICS.iter();
    for xs in [&mut ttft, &mut tpot, &mut latency] {
        let mean = if xs.is_empty() { f64::NAN } else { xs.iter().sum::<f64>() / xs.len() as f64 };
        out.push((*keys.next().expect("12 keys"), mean));
        for q in [0.5, 0.9, 0.99] {
            let v = if xs.is_empty() { f64::NAN } else { crate::metrics::quantile(xs, q) };
            out.push((*keys.next().expect("12 keys"), v));
        }
    }
    out
}

/// One figure of one run: measured, simulated, and the signed relative error (sim − real) / real.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Compared {
    pub real: f64,
    pub sim: f64,
    pub error: f64,
}

impl Compared {
    pub fn new(real: f64, sim: f64) -> Self {
        Self { real, sim, error: (sim - real) / real }
    }
}
