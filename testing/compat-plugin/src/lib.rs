//! `compat_least_requests`: the built-in `least_requests` (fewest outstanding requests; among
//! ties the k-th in index order for one uniform draw k), plus a count of the requests it placed
//! that have not come back (`in_flight`, reported). The compatibility test builds it against
//! policy-api relabelled as 0.5.0 — before `Router::on_abandon` was appended — loads it into the
//! current host and checks that it decides bit for bit like the built-in, and that an abandoned
//! request reaches it through the appended method's default (as a completion: `in_flight` drops).

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Default, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {}

pub struct CompatLeastRequests {
    rng: PolicyRng,
    in_flight: u64,
}

impl Policy for CompatLeastRequests {
    const NAME: &'static str = "compat_least_requests";
    const DESCRIPTION: &'static str = "least_requests, built against an earlier patch of policy-api 0.5";
    type Config = Config;
    type Context = RouterContext;
    fn new(_: Config, ctx: &RouterContext) -> Result<Self, String> {
        Ok(Self { rng: policy_rng(ctx.seed), in_flight: 0 })
    }
}

impl RouterPolicy for CompatLeastRequests {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let min = replicas.iter().map(|v| v.outstanding_requests).min().expect("at least one replica");
        let ties = replicas.iter().filter(|v| v.outstanding_requests == min).count() as u32;
        let k = if ties > 1 { self.rng.random_range(0..ties) } else { 0 };
        (0..replicas.len()).filter(|&i| replicas[i].outstanding_requests == min).nth(k as usize).unwrap()
    }
    fn on_dispatch(&mut self, _: &Request<'_>, _: usize) {
        self.in_flight += 1;
    }
    fn on_complete(&mut self, _: &Completion) {
        self.in_flight -= 1;
    }
    fn report(&self) -> Vec<(String, f64)> {
        vec![("in_flight".into(), self.in_flight as f64)]
    }
}

fn registry() -> Vec<Entry> {
    vec![router::<CompatLeastRequests>()]
}

export_policies!(registry);
