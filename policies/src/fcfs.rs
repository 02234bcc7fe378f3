//! `fcfs`: first come, first served — the local scheduler of vLLM.
//!
//! Algorithm: admit waiting requests in arrival order. The host hands the waiting queue over in
//! arrival order (a request preempted for recompute returns to its arrival position), so the order
//! is the identity.
//! Parameters: none.
//! Source: vLLM's default scheduling policy (`--scheduling-policy fcfs`).

use routelab_policy_api::*;

pub struct Fcfs;

impl Policy for Fcfs {
    const NAME: &'static str = "fcfs";
    const DESCRIPTION: &'static str = "scheduler: arrival order (vLLM)";
    type Config = crate::NoConfig;
    type Context = SchedulerContext;
    fn new(_: Self::Config, _: &SchedulerContext) -> Result<Self, String> {
        Ok(Fcfs)
    }
}

impl SchedulerPolicy for Fcfs {
    fn order(&mut self, _now: f64, waiting: &Waiting<'_>, order: &mut Vec<u32>) {
        order.extend(0..waiting.len() as u32);
    }
}
