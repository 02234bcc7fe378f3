//! llm-d's LoRA load-state scorer (`lora-load-state-scorer`), used by [`crate::llm_d`] with
//! `lora_state_weight` > 0.
//!
//! Algorithm (per request, per replica; scores in [0, 1] before the scorer's weight):
//! 1. A request on an adapter is placed in a residency tier on each replica: `resident` (1.0)
//!    when the adapter is loaded there (`lora.resident`); else `free_slot` (0.6) when the
//!    replica's batch uses fewer distinct adapters than its `max_loras`
//!    (`lora.running_adapters` < `lora.max_adapters`: a slot is free, or holds an adapter no
//!    request uses); else `saturated` (0.0): every slot serves a busy adapter.
//! 2. The tier is scaled by `1 − placement_bonus − headroom_bonus`, so the bonuses reorder
//!    replicas within a tier and never across one:
//!    - placement: the one replica a rendezvous hash of (adapter, replica) ranks highest gets
//!      `placement_bonus` while the adapter is not loaded there, so an adapter's first misses all
//!      go to one home instead of scattering by load;
//!    - headroom: `headroom_bonus × (max_loras − busy) / max_loras`, the share of slots not
//!      serving an adapter (the full bonus without a limit).
//! 3. A request on the base model scores `(max_loras − busy) / max_loras` (× the scale), so base
//!    traffic drifts away from replicas batching adapters; no bonus.
//!
//! Parameters (defaults, upstream's): `resident` 1.0, `free_slot` 0.6, `saturated` 0.0,
//! `placement_bonus` 0.03, `headroom_bonus` 0.03. Each in [0, 1], `resident ≥ free_slot ≥
//! saturated`, and the two bonuses must fit under every non-zero gap between tiers after scaling
//! (`gap · (1 − bonuses) > bonuses`).
//!
//! Source: llm-d/llm-d-router @ 0bcc84e1 (PR #2792, open),
//! `pkg/epp/framework/plugins/scheduling/scorer/loraloadstate/lora_load_state.go` (tiers 1.0 /
//! 0.7 / 0.6 / 0.3 / 0.0, bonuses 0.03 + 0.03, `budget`, `valid`, `rendezvous`,
//! `baseModelHeadroom`) and its `lora_load_state_test.go`, whose cases the tests below pin.
//!
//! Deviations, and why:
//! - Upstream reads vLLM's residency gauges (`vllm:lora_adapter_loaded{level=gpu|cpu}`) and tells
//!   GPU-resident (1.0) from host-cache-resident (0.7) adapters, and, with every GPU slot taken,
//!   an idle resident it can evict (0.3) from none (0.0). routelab's replicas load an adapter into
//!   their LRU of `max_cpu_loras` and run it at no further cost (`core/src/sim/cluster/lora.rs`),
//!   so a loaded adapter is servable at once (the GPU tier), and a batch slot not serving a busy
//!   adapter is as good as a free one: the host-cache and evictable tiers do not arise. The
//!   engine signals count busy adapters (`lora.running_adapters`), not loaded ones, so "loaded"
//!   for the headroom bonus is the busy count — what a later revision of the PR counts for base
//!   requests (`lora.BusyGPUAdapters`).
//! - Upstream's optional `loadHorizonSeconds` (pricing misses by reported load times) is not
//!   modelled: every cold load here costs the same `size_mb / load_gb_per_s`.
//! - The rendezvous hash is routelab's 64-bit mix of (adapter index, replica index) rather than
//!   FNV-1a of (adapter name, pod name); an invalid parameter set is a configuration error here
//!   (upstream logs it and uses the defaults).

use routelab_policy_api::mix64;
use serde::{Deserialize, Serialize};

/// The tier scores and bonuses.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Scores {
    pub resident: f64,
    pub free_slot: f64,
    pub saturated: f64,
    pub placement_bonus: f64,
    pub headroom_bonus: f64,
}

impl Default for Scores {
    fn default() -> Self {
        Self { resident: 1.0, free_slot: 0.6, saturated: 0.0, placement_bonus: 0.03, headroom_bonus: 0.03 }
    }
}

impl Scores {
    /// The score range the bonuses take; tiers are scaled into the rest.
    fn budget(&self) -> f64 {
        self.placement_bonus + self.headroom_bonus
    }

    /// Upstream's `valid`, as an error naming what is wrong.
    pub fn check(&self) -> Result<(), String> {
        let all = [
            ("resident", self.resident),
            ("free_slot", self.free_slot),
            ("saturated", self.saturated),
            ("placement_bonus", self.placement_bonus),
            ("headroom_bonus", self.headroom_bonus),
        ];
        for (name, v) in all {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("lora_state.{name} must be in [0, 1] (got {v})"));
            }
        }
        if self.budget() >= 1.0 {
            return Err(format!("lora_state's bonuses must sum below 1 (got {})", self.budget()));
        }
        let tiers = [self.resident, self.free_slot, self.saturated];
        for w in tiers.windows(2) {
            let gap = w[0] - w[1];
            if gap < 0.0 {
                return Err(format!(
                    "lora_state tiers must be ordered resident ≥ free_slot ≥ saturated (got {} / {} / {})",
                    self.resident, self.free_slot, self.saturated
                ));
            }
            if gap > 0.0 && gap * (1.0 - self.budget()) <= self.budget() {
                return Err(format!(
                    "lora_state's bonuses ({}) must fit under every gap between tiers (a gap of {gap} leaves {})",
                    self.budget(),
                    gap * (1.0 - self.budget())
                ));
            }
        }
        Ok(())
    }
}

/// What the scorer reads of one replica (the `lora.*` signals).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replica {
    /// The request's adapter is loaded there.
    pub resident: bool,
    /// Distinct adapters its running requests use.
    pub busy: f64,
    /// Most distinct adapters one batch may use (infinity: no limit).
    pub slots: f64,
}

impl Replica {
    /// Share of slots not serving an adapter (1 without a limit).
    fn headroom(&self) -> f64 {
        if self.slots.is_finite() && self.slots > 0.0 { ((self.slots - self.busy) / self.slots).max(0.0) } else { 1.0 }
    }
}

/// The replica a rendezvous hash prefers for `adapter` among `replicas` (upstream's
/// `rendezvous`: stable, and only an adapter whose home left moves).
pub fn home(adapter: u32, replicas: usize) -> usize {
    let h = |r: usize| mix64(mix64(adapter as u64 ^ 0x6c6f_7261) ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..replicas).max_by_key(|&r| h(r)).unwrap_or(0)
}

/// The score of replica `r` (whose figures are `f`) for a request on `adapter` (`None`: the base
/// model), `preferred` the adapter's rendezvous home.
pub fn score(s: &Scores, adapter: Option<u32>, f: Replica, r: usize, preferred: usize) -> f64 {
    let scale = 1.0 - s.budget();
    if adapter.is_none() {
        return f.headroom() * scale;
    }
    let tier = if f.resident {
        s.resident
    } else if f.busy < f.slots {
        s.free_slot
    } else {
        s.saturated
    };
    let mut score = tier * scale;
    if r == preferred && !f.resident {
        score += s.placement_bonus;
    }
    if f.busy < f.slots {
        score += s.headroom_bonus * f.headroom();
    }
    score
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(resident: bool, busy: f64, slots: f64) -> Replica {
        Replica { resident, busy, slots }
    }

    fn no_bonus() -> Scores {
        Scores { placement_bonus: 0.0, headroom_bonus: 0.0, ..Scores::default() }
    }

    /// Upstream `TestTiers`, the cases this model has: resident 1.0, a free slot 0.6, every slot
    /// busy 0.0, residency unknown but capacity known (nothing busy) 0.6.
    #[test]
    fn tiers() {
        let s = no_bonus();
        let cases = [
            (rep(true, 2.0, 2.0), 1.0),
            (rep(false, 1.0, 2.0), 0.6),
            (rep(false, 2.0, 2.0), 0.0),
            (rep(false, 0.0, 2.0), 0.6),
        ];
        for (f, want) in cases {
            assert!((score(&s, Some(7), f, 0, 1) - want).abs() < 1e-4, "{f:?}");
        }
    }

    /// Upstream `TestPlacementBonusDoesNotApplyToResidentEndpoint` and
    /// `TestHeadroomBonusPrefersRoomAmongEquals`: resident with full slots is exactly 0.94 whether
    /// or not it is the home; resident with 1 of 4 slots busy adds 0.03 · 0.75.
    #[test]
    fn bonuses_within_the_resident_tier() {
        let s = Scores::default();
        for preferred in [0, 1] {
            assert!((score(&s, Some(3), rep(true, 2.0, 2.0), 0, preferred) - 0.94).abs() < 1e-4);
        }
        assert!((score(&s, Some(3), rep(true, 1.0, 4.0), 0, 1) - (0.94 + 0.03 * 0.75)).abs() < 1e-4);
    }

    /// Upstream `TestPlacementBonusPicksOneHomeAmongEquals`: among saturated replicas exactly one
    /// scores above 0 — the home, at 0.03 — stably, and adapters spread over homes.
    #[test]
    fn one_home_among_equals() {
        let s = Scores::default();
        let scores = |adapter: u32| -> Vec<f64> {
            let h = home(adapter, 4);
            (0..4).map(|r| score(&s, Some(adapter), rep(false, 2.0, 2.0), r, h)).collect()
        };
        let first = scores(11);
        assert_eq!(first.iter().filter(|&&x| x > 0.0).count(), 1);
        assert!(first.iter().any(|&x| (x - 0.03).abs() < 1e-9));
        assert_eq!(scores(11), first);
        let homes: std::collections::BTreeSet<usize> = (0..64).map(|a| home(a, 8)).collect();
        assert!(homes.len() >= 6, "64 adapters use most of 8 homes: {homes:?}");
        // A replica added at the end takes only the adapters it now ranks first for.
        let moved = (0..1000).filter(|&a| home(a, 8) != home(a, 9)).count();
        assert!((0..1000).all(|a| home(a, 9) == home(a, 8) || home(a, 9) == 8));
        assert!(moved > 50 && moved < 200, "about 1/9 of the adapters move: {moved}");
    }

    /// Upstream `TestBonusesNeverCrossATier`: a free slot with both bonuses whole stays below the
    /// resident tier with none.
    #[test]
    fn bonuses_never_cross_a_tier() {
        let s = Scores::default();
        let free = score(&s, Some(1), rep(false, 0.0, 8.0), 0, 0);
        let resident = score(&s, Some(1), rep(true, 2.0, 2.0), 0, 1);
        assert!((free - (0.6 * 0.94 + 0.06)).abs() < 1e-9);
        assert!(resident > free);
    }

    /// Upstream `TestBaseModelRequestPrefersAdapterFreeEndpoints`: the share of slots not busy.
    #[test]
    fn base_model_requests_prefer_free_slots() {
        let s = no_bonus();
        let base = |f| score(&s, None, f, 0, 0);
        assert_eq!([base(rep(true, 0.0, 2.0)), base(rep(true, 1.0, 2.0)), base(rep(true, 2.0, 2.0))], [1.0, 0.5, 0.0]);
        assert_eq!(base(rep(true, 5.0, f64::INFINITY)), 1.0);
    }

    /// Upstream `TestParameters`: a valid override is kept; out of range, out of order, or
    /// bonuses wider than a gap are refused (upstream falls back to the defaults).
    #[test]
    fn parameters() {
        assert!(Scores::default().check().is_ok());
        let big = Scores {
            free_slot: 0.15,
            saturated: 0.0,
            placement_bonus: 0.02,
            headroom_bonus: 0.02,
            ..Scores::default()
        };
        assert!(big.check().is_ok());
        assert!(Scores { free_slot: 0.0, ..Scores::default() }.check().is_ok(), "equal tiers are allowed");
        for bad in [
            Scores { resident: 1.5, ..Scores::default() },
            Scores { free_slot: 0.5, resident: 0.4, ..Scores::default() },
            Scores { free_slot: 0.05, ..Scores::default() },
            Scores { placement_bonus: 0.3, headroom_bonus: 0.3, ..Scores::default() },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
