//! `priority`: class priority first, then arrival — vLLM's `--scheduling-policy priority`.
//!
//! Algorithm: admit waiting requests by their class priority, most important first (routelab's
//! priority is the Gateway API Inference Extension's: higher is more important), and among equal
//! priorities in arrival order. The host hands the waiting queue over in arrival order, so a
//! stable sort on priority alone gives vLLM's (priority, arrival_time) key. The host still stops
//! at the first request that does not fit (as vLLM's waiting loop does); preempting running
//! requests of lower priority is the engine's part: `cluster.preemption: priority`.
//! Parameters: none. The scheduler reads the request fact `priority` (0 for every request of a
//! workload without `classes:`, where this is FCFS).
//! Source: vLLM v1, `vllm/v1/core/sched/request_queue.py` (`PriorityRequestQueue`: a heap on
//! `(priority, arrival_time)`) and `vllm/v1/core/sched/scheduler.py` @
//! 00024d314514900f361ad072af6931e403b7f589 (`create_request_queue(self.policy)`; vLLM's lower
//! value is more important, so its key is this order with the sign turned).

use routelab_policy_api::*;

pub struct Priority {
    /// Reused sort keys: (negated priority, row).
    keys: Vec<(f64, u32)>,
}

impl Policy for Priority {
    const NAME: &'static str = "priority";
    const DESCRIPTION: &'static str = "scheduler: class priority, then arrival (vLLM's priority policy)";
    type Config = crate::NoConfig;
    type Context = SchedulerContext;
    fn new(_: Self::Config, _: &SchedulerContext) -> Result<Self, String> {
        Ok(Priority { keys: Vec::new() })
    }
}

impl SchedulerPolicy for Priority {
    fn request_facts(&self) -> Vec<String> {
        vec![facts::request::PRIORITY.into()]
    }

    fn order(&mut self, _now: f64, waiting: &Waiting<'_>, order: &mut Vec<u32>) {
        self.keys.clear();
        self.keys.extend((0..waiting.len()).map(|i| (-waiting.fact(i, 0), i as u32)));
        // Rows are in arrival order: the row breaks ties, so equal priorities stay FCFS.
        self.keys.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        order.extend(self.keys.iter().map(|&(_, i)| i));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn higher_priority_first_and_arrival_order_within_a_priority() {
        let mut p = Priority::new(crate::NoConfig {}, &SchedulerContext::new(0, 0, 1000)).unwrap();
        let row = |id| WaitingRequest {
            id,
            arrived_at: id as f64,
            prompt_tokens: 1,
            cached_tokens: 0,
            remaining_prefill_tokens: 1,
        };
        let rows: Vec<_> = (0..5).map(row).collect();
        // Priorities by row (arrival order): batch, critical, standard, critical, sheddable.
        let facts = [0.0, 2.0, 1.0, 2.0, -1.0];
        let mut order = Vec::new();
        p.order(0.0, &Waiting::with_facts(&rows, &facts, 1), &mut order);
        assert_eq!(order, [1, 3, 2, 0, 4]);
    }
}
