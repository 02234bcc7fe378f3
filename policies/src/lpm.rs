//! `lpm`: longest prefix match first — SGLang's cache-aware local scheduler.
//!
//! Algorithm: sort the waiting requests by the number of prompt tokens this replica's cache
//! holds, most first; ties in arrival order (a stable sort of the arrival-ordered queue). Requests
//! that reuse the cache are admitted while their prefix is still resident, which raises the hit
//! rate; requests with no match can starve under sustained load.
//! Parameters: none.
//! Source: SGLang (Zheng et al., "SGLang: Efficient Execution of Structured Language Model
//! Programs", 2024, §3: cache-aware scheduling, `--schedule-policy lpm`).

use routelab_policy_api::*;

pub struct Lpm;

impl Policy for Lpm {
    const NAME: &'static str = "lpm";
    const DESCRIPTION: &'static str = "scheduler: longest cached prefix first (SGLang)";
    type Config = crate::NoConfig;
    type Context = SchedulerContext;
    fn new(_: Self::Config, _: &SchedulerContext) -> Result<Self, String> {
        Ok(Lpm)
    }
}

impl SchedulerPolicy for Lpm {
    fn order(&mut self, _now: f64, waiting: &Waiting<'_>, order: &mut Vec<u32>) {
        order.extend(0..waiting.len() as u32);
        order.sort_by_key(|&i| std::cmp::Reverse(waiting[i as usize].cached_tokens));
    }
}
