//! Which model each request of a stream asks for (`cluster.models`, `workload/cluster/models.rs`).
//!
//! As adapters are drawn (`lora.rs`): a session draws one model — its key is the session index
//! for agent sessions, else the first unique segment of the prompt (a group's turns and fan-out
//! share it), else the request itself — by a hash of the run seed and the key, so nothing else
//! in the stream moves and a session's requests agree. Models run on disjoint replicas, so their
//! prompts never meet in one cache and need no re-keying. A trace that gives models keeps them.

use super::{FIRST_UNIQUE_ID, RequestStream};
use crate::seeds::mix;
use crate::workload::cluster::ClusterSpec;
use crate::workload::cluster::classes::Mix;

/// Fills `stream.models` as `spec.models` asks — unless a trace gave them (kept as they are).
/// Nothing with one model (every request's model is then 0).
pub fn apply_models(spec: &ClusterSpec, stream: &mut RequestStream, run_seed: u64) {
    if spec.models.len() < 2 || (stream.models.len() == stream.requests.len() && !stream.requests.is_empty()) {
        return;
    }
    let mix_of = Mix::new(spec.models.iter().map(|m| m.share));
    let seed = mix(run_seed ^ 0x6d6f_6465_6c73_u64.rotate_left(24));
    let n = stream.requests.len();
    let mut models = Vec::with_capacity(n);
    for i in 0..n {
        let key = match &stream.sessions {
            Some(s) => s.session[i] as u64,
            None => stream
                .prompt(i)
                .iter()
                .find(|s| s.id >= FIRST_UNIQUE_ID && s.id < crate::workload::mooncake::HASH_ID_BASE)
                .map_or(u64::MAX - i as u64, |s| s.id),
        };
        let u = (mix(seed ^ mix(key)) >> 11) as f64 / (1u64 << 53) as f64;
        models.push(mix_of.pick(u) as u16);
    }
    stream.models = models;
}
