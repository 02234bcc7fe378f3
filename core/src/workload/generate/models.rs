//! Which model each request of a stream asks for (`cluster.models`, `workload/cluster/models.rs`).
//!
//! As adapters are drawn (`lora.rs`), by [`keyed_draws`]: a session draws one model by a hash
//! of the run seed and its key, so nothing else in the stream moves and a session's requests
//! agree. Models run on disjoint replicas, so their prompts never meet in one cache and need no
//! re-keying. A trace that gives models keeps them.

use super::{RequestStream, keyed_draws};
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
    let models = keyed_draws(stream, seed).map(|u| mix_of.pick(u) as u16).collect();
    stream.models = models;
}
