//! Which LoRA adapter each request of a stream uses (`cluster.lora`, `workload/cluster/lora.rs`).
//!
//! A session draws one adapter ([`keyed_draws`]: a hash of the run seed and the session's key,
//! so it depends on nothing else: the stream's arrivals and sizes do not move, and a session's
//! requests agree whatever their order). A request on adapter `a` has its
//! prompt's (and its kept output's) segment ids re-keyed by `a`: the same text under another
//! adapter is another KV (vLLM puts the adapter in every block's hash), so only requests on one
//! adapter share cached prefixes.

use routelab_policy_api::Segment;

use super::{Popular, RequestStream, keyed_draws};
use crate::seeds::mix;
use crate::workload::cluster::ClusterSpec;

/// A request on the base model (a trace's `"adapter": null`).
pub use crate::workload::mooncake::NO_ADAPTER;

/// Fills `stream.adapters` as `spec.lora` asks — unless a trace gave them (kept as they are) —
/// and re-keys the segments of requests on an adapter. Nothing without `lora:`.
pub fn apply_lora(spec: &ClusterSpec, stream: &mut RequestStream, run_seed: u64) {
    let Some(l) = &spec.lora else { return };
    if stream.adapters.len() == stream.requests.len() && !stream.requests.is_empty() {
        let adapters = std::mem::take(&mut stream.adapters);
        rekey_all(stream, &adapters);
        stream.adapters = adapters;
        return;
    }
    let popular = Popular::new(l.adapters, &l.popularity);
    let cdf_seed = mix(run_seed ^ 0x6c6f_7261_u64.rotate_left(40));
    let adapters: Vec<u32> = keyed_draws(stream, cdf_seed)
        .map(|u| {
            if u < l.base_share {
                NO_ADAPTER
            } else {
                // Rescale the rest of the unit interval onto the popularity's.
                popular.pick((u - l.base_share) / (1.0 - l.base_share)) as u32
            }
        })
        .collect();
    rekey_all(stream, &adapters);
    stream.adapters = adapters;
}

/// Re-keys the segments of every request on an adapter.
fn rekey_all(stream: &mut RequestStream, adapters: &[u32]) {
    for (i, &a) in adapters.iter().enumerate() {
        if a == NO_ADAPTER {
            continue;
        }
        let r = stream.requests[i].segments.clone();
        for s in &mut stream.segments[r.start as usize..r.end as usize] {
            *s = rekey(*s, a);
        }
        if let Some(o) = stream.requests[i].output_segment.as_mut() {
            *o = rekey(*o, a);
        }
    }
}

/// Segment `s` as cached under adapter `a`.
fn rekey(s: Segment, a: u32) -> Segment {
    // Above every id the generator or a trace gives (ids stay below 2^63).
    Segment { id: mix(s.id ^ mix(a as u64 + 1)) | (1 << 63), ..s }
}
