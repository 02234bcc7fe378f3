//! `priority_groups`: Preble's fair local scheduler — priority by cache hit, quotas by priority.
//!
//! Algorithm (as Preble's code does it): put each waiting request in one of P groups by the cached
//! fraction h of its prompt: group 0 when nothing is cached, else group ceil(h × P) − 1, so 63
//! cached tokens of 100 with P = 10 go to group 6, 20 of 100 (a cold video behind a cached system
//! prompt) to group 1, and 100% cached to group P − 1. Each admission step serves ONE group: the
//! groups take turns from the top (P − 1, P − 2, …, 0, P − 1, …), empty groups skipped, and the
//! served group may admit up to (g + 1) × k of its requests, oldest first, while the batch's token
//! budget and memory last. Nothing from the other groups is admitted in that step. So the high-hit
//! groups get larger batches (their prefills are cheap), but every non-empty group gets a step in
//! every round: a cold request waits at most one round of steps, never behind an endless stream of
//! hits.
//!
//! The host asks for an order only when it can admit (budget left, a batch slot free), as Preble
//! calls its group scheduler only then, so one call is one turn of the rotation. Groups are
//! recomputed from the current cached fractions at every call (Preble assigns a request to a group
//! once, when it leaves the intake queue; a request whose prefix gets cached while it waits moves
//! up here, not there).
//! Parameters: `groups` (P, default 10, 1 to 1000), `k` (requests per unit of priority per step,
//! default 10, at least 1).
//! Source: Preble (Srivatsa et al., "Preble: Efficient Distributed Prompt Scheduling for LLM
//! Serving", ICLR 2025, §4.2), code: WukLab/preble @ 8e7906a3b76693c9003d1c7115b8011296c867e1,
//! `python/sglang/srt/managers/router/model_rpc.py` (`fcfs-mpq`: the group of `hit_ratio`,
//! `get_schedule_group`, `max_schedule_allowed = (schedule_group_idx + 1) * k`). An earlier
//! version here read §4.2 as one cycle of 55 slots shared by all groups (10 for the top group … 1
//! for group 0 within each cycle) and grouped by floor(h × P); the cold video requests then sat in
//! group 2 and were admitted beside the hot ones in the same steps.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Number of priority groups P.
    pub groups: u32,
    /// Requests group g may admit per step: (g + 1) × k.
    pub k: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self { groups: 10, k: 10 }
    }
}

pub struct PriorityGroups {
    groups: u32,
    k: u32,
    /// Indices into `waiting` per group (reused between steps).
    members: Vec<Vec<u32>>,
    /// The group whose turn is next (before skipping empty ones).
    turn: u32,
}

/// The group of a request with `cached` of `prompt` tokens cached, among `groups`: 0 when nothing
/// is cached, else ceil(cached / prompt × groups) − 1.
pub fn group_of(cached: u32, prompt: u32, groups: u32) -> u32 {
    if prompt == 0 || cached == 0 {
        return 0;
    }
    let scaled = cached.min(prompt) as u64 * groups as u64;
    (scaled.div_ceil(prompt as u64) as u32 - 1).min(groups - 1)
}

impl Policy for PriorityGroups {
    const NAME: &'static str = "priority_groups";
    const DESCRIPTION: &'static str =
        "scheduler: P groups by cached fraction, one group per step, quota (g+1)·k (Preble)";
    type Config = Config;
    type Context = SchedulerContext;
    fn new(config: Config, _: &SchedulerContext) -> Result<Self, String> {
        if config.groups == 0 || config.groups > 1000 {
            return Err(format!("groups must be in 1..=1000 (got {}); use e.g. 10", config.groups));
        }
        if config.k == 0 {
            return Err("k must be at least 1 (got 0); use e.g. 10".into());
        }
        let p = config.groups;
        Ok(Self { groups: p, k: config.k, members: vec![Vec::new(); p as usize], turn: p - 1 })
    }
}

impl SchedulerPolicy for PriorityGroups {
    fn order(&mut self, _now: f64, waiting: &Waiting<'_>, order: &mut Vec<u32>) {
        let p = self.groups;
        for m in &mut self.members {
            m.clear();
        }
        for (i, w) in waiting.iter().enumerate() {
            self.members[group_of(w.cached_tokens, w.prompt_tokens, p) as usize].push(i as u32);
        }
        // The next non-empty group from `turn` downwards (wrapping); the turn then passes on.
        let Some(g) = (0..p).map(|d| (self.turn + p - d) % p).find(|&g| !self.members[g as usize].is_empty()) else {
            return;
        };
        self.turn = (g + p - 1) % p;
        let members = &mut self.members[g as usize];
        // Oldest first (the host's queue is in arrival order but a preempted request re-enters it).
        members.sort_by(|&a, &b| {
            waiting[a as usize].arrived_at.total_cmp(&waiting[b as usize].arrived_at).then(a.cmp(&b))
        });
        let quota = ((g as u64 + 1) * self.k as u64).min(members.len() as u64) as usize;
        order.extend_from_slice(&members[..quota]);
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
                v.push(WaitingRequest {
                    id,
                    arrived_at: id as f64,
                    prompt_tokens: 100,
                    cached_tokens: cached,
                    remaining_prefill_tokens: 100 - cached,
                });
            }
        }
        v
    }

    fn scheduler() -> PriorityGroups {
        PriorityGroups::new(
            Config::default(),
            &SchedulerContext { replica: 0, seed: 0, kv_capacity_tokens: 0, facts: Default::default() },
        )
        .unwrap()
    }

    #[test]
    fn groups_as_prebles_code_computes_them() {
        // hit_ratio == 0 → 0, else ceil(hit_ratio × 10) − 1 (model_rpc.py, fcfs-mpq).
        assert_eq!(group_of(63, 100, 10), 6);
        assert_eq!(group_of(0, 100, 10), 0);
        assert_eq!(group_of(1, 100, 10), 0);
        assert_eq!(group_of(10, 100, 10), 0);
        assert_eq!(group_of(11, 100, 10), 1);
        assert_eq!(group_of(100, 100, 10), 9);
        // A cold video: the 2,000-token system prompt cached of 2,000 + 7,600 + 300 → h ≈ 0.20.
        assert_eq!(group_of(2000, 9900, 10), 2); // ceil(2.02) − 1 = 2
        assert_eq!(group_of(2000, 10000, 10), 1); // exactly 0.2 → ceil(2) − 1 = 1
    }

    #[test]
    fn one_group_per_step_from_the_top_with_quota_g_plus_one_times_k() {
        // Hand-computed: 30 waiting in group 9, 30 in group 2 (two empty groups between), 5 in group 0.
        // Step 1 serves group 9: min(30, 10 × 10) = 30, oldest first. Step 2: group 2, quota 30.
        // Step 3: group 0, quota 10 → its 5. Step 4: the rotation wraps to group 9.
        let mut w = waiting(&[(95, 30), (25, 30), (5, 5)]);
        let mut s = scheduler();
        let mut order = Vec::new();
        s.order(0.0, &Waiting::new(&w), &mut order);
        assert_eq!(order, (0..30).collect::<Vec<u32>>());
        order.clear();
        s.order(0.0, &Waiting::new(&w), &mut order);
        assert_eq!(order, (30..60).collect::<Vec<u32>>());
        // Nothing was admitted in step 2 (the host took none); step 3 is group 0's turn regardless.
        order.clear();
        s.order(0.0, &Waiting::new(&w), &mut order);
        assert_eq!(order, (60..65).collect::<Vec<u32>>());
        // 45 more group-2 requests: the quota caps a step at (2 + 1) × 10 = 30.
        w.truncate(30);
        w.extend(waiting(&[(25, 45)]).into_iter().map(|r| WaitingRequest {
            id: r.id + 100,
            arrived_at: r.arrived_at + 100.0,
            ..r
        }));
        order.clear();
        s.order(0.0, &Waiting::new(&w), &mut order);
        assert_eq!(order.len(), 30, "the wrap serves group 9 first");
        order.clear();
        s.order(0.0, &Waiting::new(&w), &mut order);
        assert_eq!(order, (30..60).collect::<Vec<u32>>());
    }

    #[test]
    fn oldest_first_within_the_group() {
        let mut w = waiting(&[(95, 3)]);
        w[0].arrived_at = 10.0; // a preempted request re-entered the queue behind younger ones
        let mut order = Vec::new();
        scheduler().order(0.0, &Waiting::new(&w), &mut order);
        assert_eq!(order, vec![1, 2, 0]);
    }

    #[test]
    fn nothing_waiting_returns_nothing() {
        let mut order = Vec::new();
        scheduler().order(0.0, &Waiting::new(&[]), &mut order);
        assert!(order.is_empty());
    }
}
