//! `priority_groups`: Preble's fair local scheduler — priority by cache hit, quotas by priority.
//!
//! Algorithm: put each waiting request in one of P groups by the cached fraction of its prompt:
//! group g = floor(cached / prompt × P), so 63 cached tokens of 100 with P = 10 go to group 6.
//! 0% cached is group 0 (the lowest priority); 100% cached would be group P, and joins the top
//! group P − 1 (90–100%). Group g has priority g + 1. Each batch takes from the groups in
//! proportion to priority: with 55 requests to take and P = 10, 10 from the top group, 9 from the
//! next, …, 1 from the lowest; FCFS within a group; empty groups are skipped.
//!
//! The host admits a prefix of the returned order (while budget and memory last) and asks again
//! every step, so the quota is encoded in the interleaving and its position carries over: the
//! schedule is a cycle of 55 slots (for P = 10) in P rounds, round k (k = 0 … P − 1) holding one
//! slot for every group of priority at least P − k, highest first. One full cycle therefore takes
//! exactly 10, 9, …, 1 from groups of priority 10, 9, …, 1. Each call lays the waiting requests
//! onto the slots starting where the previous call's admitted prefix ended (the scheduler sees
//! which of its last order's requests have left the queue), so a group-0 request gets its slot
//! within one cycle of admissions even though each step admits only a few requests. Slots of empty
//! groups are skipped; slots repeat until every request is placed.
//! Parameters: `groups` (P, default 10, 1 to 1000).
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
    /// The cycle: group of each slot.
    slots: Vec<u32>,
    /// Slot where the next order starts.
    cursor: usize,
    /// Ids of the last order and the slot each took.
    last_ids: Vec<u64>,
    last_slots: Vec<usize>,
    present: std::collections::HashSet<u64>,
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
        if config.groups == 0 || config.groups > 1000 {
            return Err(format!("groups must be in 1..=1000 (got {}; the quota cycle has P²/2 slots); use e.g. 10", config.groups));
        }
        let p = config.groups;
        let slots = (0..p).flat_map(|round| (p - 1 - round..p).rev()).collect();
        Ok(Self {
            groups: p,
            members: vec![Vec::new(); p as usize],
            next: Vec::new(),
            slots,
            cursor: 0,
            last_ids: Vec::new(),
            last_slots: Vec::new(),
            present: Default::default(),
        })
    }
}

impl SchedulerPolicy for PriorityGroups {
    fn order(&mut self, _now: f64, waiting: &[WaitingRequest], order: &mut Vec<u32>) {
        // Continue the cycle after the prefix of the last order that was admitted since.
        self.present.clear();
        self.present.extend(waiting.iter().map(|w| w.id));
        let admitted = self.last_ids.iter().take_while(|id| !self.present.contains(id)).count();
        if admitted > 0 {
            self.cursor = (self.last_slots[admitted - 1] + 1) % self.slots.len();
        }
        let p = self.groups;
        for m in &mut self.members {
            m.clear();
        }
        for (i, w) in waiting.iter().enumerate() {
            self.members[group_of(w.cached_tokens, w.prompt_tokens, p) as usize].push(i as u32);
        }
        // Next unplaced member of each group (members are in arrival order: FCFS within a group).
        self.next.clear();
        self.next.resize(p as usize, 0);
        self.last_ids.clear();
        self.last_slots.clear();
        let mut slot = self.cursor;
        let cycle = self.slots.len();
        while order.len() < waiting.len() {
            let g = self.slots[slot] as usize;
            if let Some(&i) = self.members[g].get(self.next[g]) {
                order.push(i);
                self.next[g] += 1;
                self.last_ids.push(waiting[i as usize].id);
                self.last_slots.push(slot);
                if self.members[g].len() - self.next[g] == waiting.len() - order.len() && order.len() < waiting.len() {
                    // Only this group is left: its remaining members take its next slots (saves
                    // walking through the empty groups' slots).
                    let mut at = slot;
                    for &i in &self.members[g][self.next[g]..] {
                        at = (at + 1..at + 1 + cycle).map(|s| s % cycle).find(|&s| self.slots[s] as usize == g).expect("every group has a slot");
                        order.push(i);
                        self.last_ids.push(waiting[i as usize].id);
                        self.last_slots.push(at);
                    }
                    break;
                }
            }
            slot = (slot + 1) % cycle;
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
    fn the_cycle_continues_across_steps_so_the_lowest_group_gets_its_slot() {
        // Every step admits just one request; all groups always have waiting members.
        let mut w = waiting(&(0..10).map(|g| (g * 10 + 5, 3)).collect::<Vec<_>>());
        let mut s = PriorityGroups::new(Config::default(), &SchedulerContext { replica: 0, seed: 0, kv_capacity_tokens: 0 }).unwrap();
        let mut per_group = [0u32; 10];
        let mut next_id = w.len() as u64;
        for _ in 0..55 {
            let mut order = Vec::new();
            s.order(0.0, &w, &mut order);
            let taken = w.remove(order[0] as usize);
            per_group[group_of(taken.cached_tokens, 100, 10) as usize] += 1;
            // A new request of the same group arrives, so no group ever runs dry.
            w.push(WaitingRequest { id: next_id, ..taken });
            next_id += 1;
        }
        assert_eq!(per_group, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
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
