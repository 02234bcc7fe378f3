//! `max_affinity`: pure prefix affinity — every request goes to the replica with the longest
//! prefix match, ties by load.
//!
//! Algorithm: the host fills each replica's `matched_tokens` (its cache plus requests already
//! dispatched there and not yet computed); pick the largest, then the least outstanding work, then
//! the lowest index. With no match anywhere it is least-work-left.
//! Parameters: none.
//! Source: the cautionary baseline of the routing lecture (docs/experiments.md): a 13-token system prompt
//! shared by every request is enough to pull all traffic onto the first replica that served
//! anyone — the cluster's compute becomes one replica's.

use routelab_policy_api::*;

#[derive(Default)]
pub struct MaxAffinity {
    affinity: u64,
    load: u64,
}

impl Policy for MaxAffinity {
    const NAME: &'static str = "max_affinity";
    const DESCRIPTION: &'static str = "longest prefix match (cached + in flight), ties by load";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, _: &RouterContext) -> Result<Self, String> {
        Ok(Self::default())
    }
}

/// Index of the longest match, then least outstanding work, then lowest index.
pub(crate) fn best_match(replicas: &[ReplicaView]) -> usize {
    let mut best = 0;
    for (i, r) in replicas.iter().enumerate().skip(1) {
        let b = &replicas[best];
        if r.matched_tokens > b.matched_tokens
            || (r.matched_tokens == b.matched_tokens && r.outstanding_work < b.outstanding_work)
        {
            best = i;
        }
    }
    best
}

impl RouterPolicy for MaxAffinity {
    fn capabilities(&self) -> Capabilities {
        Capabilities::NEEDS_EXACT_MATCH | Capabilities::NEEDS_OUTSTANDING_WORK
    }

    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let i = best_match(replicas);
        if replicas[i].matched_tokens > 0 {
            self.affinity += 1
        } else {
            self.load += 1
        }
        i
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![("affinity_decisions".into(), self.affinity as f64), ("load_decisions".into(), self.load as f64)]
    }
}
