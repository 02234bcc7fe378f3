//! `priority_groups`: Preble's fair local scheduler — priority by cache hit, quotas by priority.
//!
//! Algorithm: put each waiting request in one of P groups by the cached fraction of its prompt:
//! group g = floor(cached / prompt × P), so 63 cached tokens of 100 with P = 10 go to group 6.
//! 0% cached is group 0 (the lowest priority); 100% cached would be group P, and joins the top
//! group P − 1 (90–100%). Group g has priority g + 1. Each batch takes from the groups in
//! proportion to priority: with 55 requests to take and P = 10, 10 from the top group, 9 from the
//! next, …, 1 from the lowest; FCFS within a group; empty groups are skipped.
//!
//! The host admits in the returned order while budget and memory last, so the quota is encoded in
//! the interleaving: the order is a sequence of cycles of P rounds; round k (k = 0 … P − 1) takes
//! one request from every non-empty group whose priority is at least P − k, highest first. One
//! full cycle takes exactly 10, 9, …, 1 from groups of priority 10, 9, …, 1 (55 when all have
//! enough), and any prefix of the order is close to those proportions. When a group runs out its
//! share is skipped; the cycles continue until every request is placed.
//! Parameters: `groups` (P, default 10, at least 1).
//! Source: Preble (Srivatsa et al., "Preble: Efficient Distributed Prompt Scheduling for LLM
//! Serving", ICLR 2025, §4.2: local scheduler with priority-based fairness).

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Number of priority groups P.
    pub groups: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self { groups: 10 }
    }
}

pub struct PriorityGroups {
    groups: u32,
    /// Indices into `waiting` per group (reused between steps).
    members: Vec<Vec<u32>>,
    next: Vec<usize>,
}

/// The group of a request with `cached` of `prompt` tokens cached, among `groups`.
pub fn group_of(cached: u32, prompt: u32, groups: u32) -> u32 {
    if prompt == 0 {
        return 0;
    }
    ((cached as u64 * groups as u64 / prompt as u64) as u32).min(groups - 1)
}

impl Policy for PriorityGroups {
    const NAME: &'static str = "priority_groups";
    const DESCRIPTION: &'static str = "scheduler: P groups by cached fraction, quotas by priority (Preble)";
    type Config = Config;
    type Context = SchedulerContext;
    fn new(config: Config, _: &SchedulerContext) -> Result<Self, String> {
        if config.groups == 0 {
            return Err("groups must be at least 1 (got 0); use e.g. 10".into());
        }
        Ok(Self { groups: config.groups, members: vec![Vec::new(); config.groups as usize], next: Vec::new() })
    }
}

impl SchedulerPolicy for PriorityGroups {
    fn order(&mut self, _now: f64, waiting: &[WaitingRequest], order: &mut Vec<u32>) {
        let p = self.groups;
        for m in &mut self.members {
            m.clear();
        }
        for (i, w) in waiting.iter().enumerate() {
            self.members[group_of(w.cached_tokens, w.prompt_tokens, p) as usize].push(i as u32);
        }
        // Next unplaced member of each group (members are in arrival order: FCFS within a group).
        let next = &mut self.next;
        next.clear();
        next.resize(p as usize, 0);
        while order.len() < waiting.len() {
            let mut left = (0..p as usize).filter(|&g| next[g] < self.members[g].len());
            if let (Some(only), None) = (left.next(), left.next()) {
                // One group left: the rest of it, in order (saves empty rounds).
                order.extend_from_slice(&self.members[only][next[only]..]);
                break;
            }
            for round in 0..p {
                // Groups with priority ≥ P − round, i.e. g ≥ P − 1 − round, top first.
                for g in (p - 1 - round..p).rev() {
                    let g = g as usize;
                    if let Some(&i) = self.members[g].get(next[g]) {
                        order.push(i);
                        next[g] += 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(fractions_per_group: &[(u32, usize)]) -> Vec<WaitingRequest> {
        let mut v = Vec::new();
        for &(cached, count) in fractions_per_group {
            for _ in 0..count {
                let id = v.len() as u64;
                v.push(WaitingRequest { id, arrived_at: id as f64, prompt_tokens: 100, cached_tokens: cached, remaining_prefill_tokens: 100 - cached });
            }
        }
        v
    }

    #[test]
    fn the_papers_example_group() {
        assert_eq!(group_of(63, 100, 10), 6);
        assert_eq!(group_of(0, 100, 10), 0);
        assert_eq!(group_of(100, 100, 10), 9);
        assert_eq!(group_of(99, 100, 10), 9);
        assert_eq!(group_of(9, 100, 10), 0);
    }

    #[test]
    fn fifty_five_taken_are_ten_nine_down_to_one() {
        // 20 requests in every group: cached 5, 15, …, 95 of 100.
        let w = waiting(&(0..10).map(|g| (g * 10 + 5, 20)).collect::<Vec<_>>());
        let mut s = PriorityGroups::new(Config::default(), &SchedulerContext { replica: 0, seed: 0, kv_capacity_tokens: 0 }).unwrap();
        let mut order = Vec::new();
        s.order(0.0, &w, &mut order);
        assert_eq!(order.len(), 200);
        let mut per_group = [0u32; 10];
        for &i in &order[..55] {
            per_group[group_of(w[i as usize].cached_tokens, 100, 10) as usize] += 1;
        }
        assert_eq!(per_group, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        // FCFS within a group: the top group's members appear in arrival order.
        let top: Vec<u32> = order.iter().copied().filter(|&i| i >= 180).collect();
        assert!(top.windows(2).all(|p| p[0] < p[1]));
    }

    #[test]
    fn empty_groups_are_skipped_and_everyone_is_placed() {
        let w = waiting(&[(0, 3), (95, 2)]);
        let mut s = PriorityGroups::new(Config::default(), &SchedulerContext { replica: 0, seed: 0, kv_capacity_tokens: 0 }).unwrap();
        let mut order = Vec::new();
        s.order(0.0, &w, &mut order);
        assert_eq!(order, vec![3, 4, 0, 1, 2]);
    }
}
