//! `llm_d_predicted_latency`: llm-d's predicted-latency profile — per-endpoint TTFT and TPOT
//! predicted by a model learned online from completions, affinity filters gated on the
//! predicted TTFT, an SLO headroom tier filter, the latency scorer and the weighted random picker.
//!
//! Algorithm (per request; block = `block_tokens` tokens):
//! 1. Features per replica r (upstream's `PredictionRequest`): KV-cache usage, input tokens,
//!    waiting, running (all three scraped), prefix score `matched_r / total` (approximate prefix
//!    index, as [`crate::llm_d`]), prefill tokens in flight (uncached prompt tokens of r's
//!    requests whose first token is not out, as [`crate::llm_d_sticky`]), and — because a linear
//!    model cannot form the product a tree learns — the request's uncached tokens
//!    `input · (1 − prefix)`. With a bias term: 8 numbers, token counts in thousands.
//! 2. Model: two online ridge regressions (recursive least squares, prior `x ↦ 0` with
//!    precision `ridge`), one for TTFT (s), one for TPOT (s/token), on all replicas' samples. A
//!    request's features at dispatch are its training input; `on_complete` gives the targets
//!    (`ttft`; `(completed_at − arrived_at − ttft) / (output_tokens − 1)` when it has ≥ 2
//!    output tokens). Predictions are clamped at 0 and used once `min_samples` TTFT samples
//!    are in; before that the profile runs without predictions, as upstream's does while its
//!    sidecar has no model.
//! 3. Headroom: `slo − predicted` per metric (`ttft_slo_s`, `tpot_slo_s`; a metric without an
//!    SLO: `−predicted`, upstream's "no SLO headers").
//! 4. Filters, in upstream's profile order: strict affinity (prefix score ≥ 0.99), SLO tier
//!    (replicas with both headrooms ≥ 0 when some have them and some do not: those, or with
//!    probability `epsilon_explore_neg` the others), loose affinity (≥ 0.8). Each affinity
//!    filter keeps its sticky replicas unless the best sticky predicted TTFT exceeds the best
//!    other by more than `max_ttft_penalty_s`; a replica without a prediction counts as
//!    f64::MAX, so before the model is ready stickiness always holds (upstream's behaviour).
//! 5. Latency scorer over the kept replicas (upstream `latency-scorer`, strategy `least`):
//!    positive-headroom replicas if any; else idle ones (no request outstanding) if any; else
//!    the best non-empty bucket of TPOT-only / TTFT-only / both negative. In the bucket,
//!    `n = (|h| − min|h|) / range` per metric (0.5 for a flat range, and a flat metric's weight
//!    goes to the other), `c = α · n_ttft + β · n_tpot` (α, β = `ttft_weight`, `tpot_weight`
//!    normalised), score `(⌊(1 − c) · 100⌋ + 1) / 100`; others 0. Without predictions:
//!    composite `round(100 · (kv_free + rel_queue + prefix) / 3) / 100`.
//! 6. Weighted random picker: replica r with probability `score_r / Σ score` (upstream's A-Res
//!    keys `u^(1/score)` with one winner have this distribution; one draw here instead of one
//!    per replica), uniform among all when every score is 0.
//!
//! Parameters (defaults): `ttft_weight` 0.8, `tpot_weight` 0.2, `ttft_slo_s` none, `tpot_slo_s`
//! none, `epsilon_explore_neg` 0.01, `strict_affinity_threshold` 0.99,
//! `loose_affinity_threshold` 0.8, `max_ttft_penalty_s` 5, `min_samples` 32, `ridge` 1,
//! `block_tokens` 16, `max_prefix_blocks` 256, `lru_capacity` auto.
//!
//! Source: llm-d/llm-d-router @ ebab6879 (2026-08-22): `config/charts/routerlib/templates/
//! _config.yaml` (the profile: strict 0.99 and loose 0.80 affinity filters with `ttftSource:
//! latencyPredictor`, 5,000 ms), `pkg/epp/framework/plugins/scheduling/scorer/latency/plugin.go`
//! (buckets, normalisation, weights 0.8/0.2, `wMax` 100, composite fallback),
//! `.../filter/sloheadroomtier/` (ε 0.01), `.../picker/weightedrandom/picker.go` (A-Res keys),
//! `.../requestcontrol/dataproducer/predictedlatency/{training,prediction}.go` (features,
//! `headroom = SLO − predicted`).
//!
//! Replicas coming and going (`on_replica_change`: crashes, autoscaling): as `llm_d` — the
//! prefix LRU and the in-flight token ledger are kept by id (`index::members`), a replica that
//! leaves is forgotten (the EPP's `RemovePod`, see `llm_d`), one that joins starts empty; the
//! features, predictions, filters and scores cover the routable replicas only. The latency
//! models are fleet-wide and keep what they learnt.
//!
//! Deviations, and why:
//! - Upstream trains XGBoost (or quantile) models in a Python sidecar on a sliding window;
//!   here a recursive-least-squares linear model, updated in-process per completion (no
//!   tree-boosting crate: heavy, and a sidecar's retrain period would be a second clock). A
//!   linear model misses interactions a tree finds, so the uncached-token product is given
//!   as a feature; it predicts the mean, not a quantile.
//! - Upstream's default `streamingMode: false` trains end-to-end latency as "TTFT" and
//!   neutralises TPOT; the simulator streams, so this router trains both (streaming mode).
//!   `NumTokensGenerated` (always 0 at routing) and `DecodeTokensInFlight` are left out.
//! - Per-request SLO headers become per-router `ttft_slo_s` / `tpot_slo_s`; the SLO admitter
//!   (rejecting requests) is not modelled. Requests owing their first token are inferred from
//!   `waiting + prefilling` as in [`crate::llm_d_sticky`].
//!
//! Hints (agentic requests): no option, because upstream's profile reads no output-length
//! estimate. Its predictions take the input length, the prefix score, the in-flight prefill
//! tokens and the running count, with the generated-token count fixed at 1
//! (llm-d/llm-d-router @ 4893230f, `pkg/epp/framework/plugins/requestcontrol/dataproducer/
//! predictedlatency/prediction.go`, `generatePredictions`: `generatedTokenCounts[i] = 1`), and
//! it predicts TPOT per token, not a request's whole decode, so an expected output length has
//! nowhere to enter. The request fact `hint.output_tokens` is read by
//! `least_work_left{work: hints}`.

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::block_index::KeyMap;
use crate::index::block_runs::PromptRuns;
use crate::index::lru_runs::LruRuns;
use crate::index::members::{Member, Members};
use crate::llm_d::LruCapacity;

/// Features per (request, replica), with the bias.
pub const FEATURES: usize = 8;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub ttft_weight: f64,
    pub tpot_weight: f64,
    pub ttft_slo_s: Option<f64>,
    pub tpot_slo_s: Option<f64>,
    pub epsilon_explore_neg: f64,
    pub strict_affinity_threshold: f64,
    pub loose_affinity_threshold: f64,
    pub max_ttft_penalty_s: f64,
    pub min_samples: u32,
    pub ridge: f64,
    pub block_tokens: u32,
    pub max_prefix_blocks: u32,
    pub lru_capacity: LruCapacity,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            ttft_weight: 0.8,
            tpot_weight: 0.2,
            ttft_slo_s: None,
            tpot_slo_s: None,
            epsilon_explore_neg: 0.01,
            strict_affinity_threshold: 0.99,
            loose_affinity_threshold: 0.8,
            max_ttft_penalty_s: 5.0,
            min_samples: 32,
            ridge: 1.0,
            block_tokens: 16,
            max_prefix_blocks: 256,
            lru_capacity: LruCapacity::Auto,
        }
    }
}

/// Online ridge regression by recursive least squares: `w` minimises
/// `Σ (y − w·x)² + ridge · |w|²` over the samples seen, updated in O(d²) per sample.
#[derive(Clone, Debug)]
pub struct OnlineRidge {
    w: [f64; FEATURES],
    /// Inverse of `ridge · I + Σ x xᵀ`.
    p: [[f64; FEATURES]; FEATURES],
    samples: u64,
}

impl OnlineRidge {
    pub fn new(ridge: f64) -> Self {
        let mut p = [[0.0; FEATURES]; FEATURES];
        for (i, row) in p.iter_mut().enumerate() {
            row[i] = 1.0 / ridge;
        }
        Self { w: [0.0; FEATURES], p, samples: 0 }
    }

    pub fn predict(&self, x: &[f64; FEATURES]) -> f64 {
        self.w.iter().zip(x).map(|(w, x)| w * x).sum()
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Adds sample (x, y) (Sherman–Morrison).
    pub fn update(&mut self, x: &[f64; FEATURES], y: f64) {
        let mut px = [0.0; FEATURES];
        for (i, row) in self.p.iter().enumerate() {
            px[i] = row.iter().zip(x).map(|(p, x)| p * x).sum();
        }
        let denom = 1.0 + x.iter().zip(&px).map(|(x, p)| x * p).sum::<f64>();
        let err = y - self.predict(x);
        for (w, p) in self.w.iter_mut().zip(&px) {
            *w += p * err / denom;
        }
        for (row, pi) in self.p.iter_mut().zip(&px) {
            for (v, pj) in row.iter_mut().zip(&px) {
                *v -= pi * pj / denom;
            }
        }
        self.samples += 1;
    }
}

pub struct LlmDPredictedLatency {
    cfg: Config,
    rng: PolicyRng,
    prompt: PromptRuns,
    prompt_for: Option<u64>,
    /// By id (`index::members`), as `matched_ids` and `uncached_cum`; the rest by routable index.
    lru: LruRuns,
    members: Members,
    matched_ids: Vec<u32>,
    matched: Vec<u32>,
    uncached_cum: Vec<Vec<u64>>,
    features: Vec<[f64; FEATURES]>,
    ttft: OnlineRidge,
    tpot: OnlineRidge,
    /// Predicted (TTFT, TPOT) per replica, when the model is ready.
    predicted: Vec<Option<(f64, f64)>>,
    kept: Vec<bool>,
    scores: Vec<f64>,
    /// Features at dispatch of each request in flight.
    in_flight: KeyMap<[f64; FEATURES]>,
}

impl Policy for LlmDPredictedLatency {
    const NAME: &'static str = "llm_d_predicted_latency";
    const DESCRIPTION: &'static str = "llm-d predicted-latency routing: online TTFT/TPOT regression from completions, affinity and SLO-tier filters, latency scorer, weighted random";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        for (name, v) in [("ttft_weight", cfg.ttft_weight), ("tpot_weight", cfg.tpot_weight)] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(format!("{name} must be a finite number ≥ 0 (got {v})"));
            }
        }
        for (name, v) in [("ttft_slo_s", cfg.ttft_slo_s), ("tpot_slo_s", cfg.tpot_slo_s)] {
            if let Some(v) = v.filter(|v| !(*v > 0.0 && v.is_finite())) {
                return Err(format!("{name} must be positive seconds, or left out for no SLO (got {v})"));
            }
        }
        for (name, v) in [
            ("epsilon_explore_neg", cfg.epsilon_explore_neg),
            ("strict_affinity_threshold", cfg.strict_affinity_threshold),
            ("loose_affinity_threshold", cfg.loose_affinity_threshold),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be in [0, 1] (got {v})"));
            }
        }
        if !(cfg.max_ttft_penalty_s >= 0.0 && cfg.max_ttft_penalty_s.is_finite()) {
            return Err(format!("max_ttft_penalty_s must be a finite number ≥ 0 (got {})", cfg.max_ttft_penalty_s));
        }
        if !(cfg.ridge > 0.0 && cfg.ridge.is_finite()) {
            return Err(format!("ridge must be positive (got {})", cfg.ridge));
        }
        if cfg.block_tokens == 0 {
            return Err("block_tokens must be at least 1 (vLLM's default KV block is 16)".into());
        }
        if cfg.max_prefix_blocks == 0 {
            return Err("max_prefix_blocks must be at least 1 (upstream default 256)".into());
        }
        let capacity = cfg.lru_capacity.blocks(ctx, cfg.block_tokens)?;
        let n = ctx.replica_count();
        Ok(Self {
            prompt: PromptRuns::new(cfg.block_tokens),
            rng: policy_rng(ctx.seed),
            prompt_for: None,
            lru: LruRuns::new(n, capacity),
            members: Members::new(n),
            matched_ids: vec![0; n],
            matched: vec![0; n],
            uncached_cum: vec![vec![0]; n],
            features: vec![[0.0; FEATURES]; n],
            ttft: OnlineRidge::new(cfg.ridge),
            tpot: OnlineRidge::new(cfg.ridge),
            predicted: vec![None; n],
            kept: vec![true; n],
            scores: vec![0.0; n],
            in_flight: KeyMap::default(),
            cfg,
        })
    }
}

const W_MAX: f64 = 100.0;
const EPS: f64 = 1e-9;

impl LlmDPredictedLatency {
    /// Scraped (waiting, running, KV usage) of replica `i`; the live view without a signal table.
    fn scraped(replicas: &Replicas<'_>, i: usize) -> (f64, f64, f64) {
        if replicas.signal_columns >= 4 {
            return (replicas.signal(i, 0), replicas.signal(i, 1), replicas.signal(i, 2));
        }
        let v = &replicas[i];
        let kv = if v.kv_capacity_tokens == 0 { 0.0 } else { v.kv_used_tokens as f64 / v.kv_capacity_tokens as f64 };
        (v.waiting as f64, v.running as f64, kv)
    }

    /// Requests on replica `i` whose first token is not out (live `waiting` + `prefilling`).
    fn pending(replicas: &Replicas<'_>, i: usize) -> usize {
        let prefilling = if replicas.signal_columns >= 4 { replicas.signal(i, 3) as usize } else { 0 };
        replicas[i].waiting as usize + prefilling
    }

    fn hash_prompt(&mut self, request: &Request<'_>) {
        if self.prompt_for == Some(request.id) {
            return;
        }
        self.prompt_for = Some(request.id);
        self.prompt.cut_limited(request.segments(), self.cfg.max_prefix_blocks as usize, true);
        self.lru.matched(&self.prompt.runs, &mut self.matched_ids);
        let (members, ids) = (&self.members, &self.matched_ids);
        for (i, m) in self.matched.iter_mut().enumerate().take(members.routable()) {
            *m = ids[members.id(i)];
        }
    }

    fn prefix_score(&self, r: usize) -> f64 {
        match self.prompt.blocks {
            0 => 0.0,
            t => self.matched[r] as f64 / t as f64,
        }
    }

    /// Whether the model has seen enough completions to predict.
    pub fn ready(&self) -> bool {
        self.ttft.samples() >= self.cfg.min_samples as u64
    }

    /// The two models (TTFT, TPOT).
    pub fn models(&self) -> (&OnlineRidge, &OnlineRidge) {
        (&self.ttft, &self.tpot)
    }

    /// Fills features, predictions, the filters' `kept` and the scores; returns the scores.
    pub fn scores(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> &[f64] {
        self.hash_prompt(request);
        let n = replicas.len();
        let b = self.cfg.block_tokens as u64;
        let input = request.prompt_tokens as f64;
        let ready = self.ready();
        // Per routable index from here on.
        self.features.resize(n, [0.0; FEATURES]);
        self.predicted.resize(n, None);
        self.kept.resize(n, true);
        self.scores.resize(n, 0.0);
        for r in 0..n {
            let cum = &self.uncached_cum[self.members.id(r)];
            let last = cum.len() - 1;
            let k = Self::pending(replicas, r).min(last);
            let inflight = (cum[last] - cum[last - k]) as f64;
            let (waiting, running, kv) = Self::scraped(replicas, r);
            let prefix = self.prefix_score(r);
            let total = self.prompt.blocks;
            let uncached = total.saturating_sub(self.matched[r] as u64) * b
                + (request.prompt_tokens as u64).saturating_sub(total * b);
            let x = [1.0, kv, input / 1e3, waiting, running, prefix, inflight / 1e3, uncached as f64 / 1e3];
            self.features[r] = x;
            self.predicted[r] = ready.then(|| (self.ttft.predict(&x).max(0.0), self.tpot.predict(&x).max(0.0)));
        }
        self.kept.fill(true);
        self.affinity_filter(self.cfg.strict_affinity_threshold);
        self.tier_filter();
        self.affinity_filter(self.cfg.loose_affinity_threshold);
        self.score(replicas);
        &self.scores
    }

    fn headroom(&self, r: usize) -> Option<(f64, f64)> {
        let (ttft, tpot) = self.predicted[r]?;
        Some((self.cfg.ttft_slo_s.unwrap_or(0.0) - ttft, self.cfg.tpot_slo_s.unwrap_or(0.0) - tpot))
    }

    /// `prefix-cache-affinity-filter` with `ttftSource: latencyPredictor` over the kept replicas.
    fn affinity_filter(&mut self, threshold: f64) {
        let n = self.kept.len();
        if self.kept.iter().filter(|&&k| k).count() <= 1 || threshold <= 0.0 {
            return;
        }
        let (mut best_sticky, mut best_other, mut sticky, mut others) = (f64::MAX, f64::MAX, 0, 0);
        for r in (0..n).filter(|&r| self.kept[r]) {
            let ttft = self.predicted[r].map_or(f64::MAX, |p| p.0);
            if self.prefix_score(r) >= threshold {
                sticky += 1;
                best_sticky = best_sticky.min(ttft);
            } else {
                others += 1;
                best_other = best_other.min(ttft);
            }
        }
        if sticky == 0 {
            return;
        }
        if self.cfg.max_ttft_penalty_s > 0.0 && others > 0 && best_sticky - best_other > self.cfg.max_ttft_penalty_s {
            return;
        }
        for r in 0..n {
            if self.kept[r] && self.prefix_score(r) < threshold {
                self.kept[r] = false;
            }
        }
    }

    /// `slo-headroom-tier-filter` over the kept replicas.
    fn tier_filter(&mut self) {
        let (mut pos, mut neg) = (0, 0);
        for r in 0..self.kept.len() {
            if !self.kept[r] {
                continue;
            }
            match self.headroom(r) {
                Some((a, b)) if a >= 0.0 && b >= 0.0 => pos += 1,
                _ => neg += 1,
            }
        }
        if pos == 0 || neg == 0 {
            return;
        }
        let keep_positive = self.rng.random::<f64>() >= self.cfg.epsilon_explore_neg;
        for r in 0..self.kept.len() {
            if self.kept[r] {
                let positive = matches!(self.headroom(r), Some((a, b)) if a >= 0.0 && b >= 0.0);
                self.kept[r] = positive == keep_positive;
            }
        }
    }

    /// `latency-scorer` (strategy `least`) over the kept replicas; 0 elsewhere.
    fn score(&mut self, replicas: &Replicas<'_>) {
        self.scores.fill(0.0);
        let n = self.kept.len();
        if !(0..n).any(|r| self.kept[r] && self.predicted[r].is_some()) {
            // Composite fallback: KV free, relative queue, prefix, equal weights.
            let max_q = (0..n).filter(|&r| self.kept[r]).map(|r| Self::scraped(replicas, r).0).fold(0.0, f64::max);
            for r in (0..n).filter(|&r| self.kept[r]) {
                let (q, _, kv) = Self::scraped(replicas, r);
                let rel_queue = if max_q > 0.0 { (max_q - q) / max_q } else { 1.0 };
                let composite = ((1.0 - kv) + rel_queue + self.prefix_score(r)) / 3.0;
                self.scores[r] = (W_MAX * composite).round() / W_MAX;
            }
            return;
        }
        let mut scores = std::mem::take(&mut self.scores);
        // Bucket classes, best first: 0 positive, 1 idle, 2 TPOT-only negative, 3 TTFT-only
        // negative, 4 both negative (or no prediction). The scorer takes the best class present
        // (idle only counts once nobody is positive, as upstream).
        let class = |r: usize| -> u8 {
            match self.headroom(r) {
                Some((a, b)) if a >= 0.0 && b >= 0.0 => 0,
                _ if replicas[r].outstanding_requests == 0 => 1,
                Some((a, b)) if a >= 0.0 && b < 0.0 => 2,
                Some((a, b)) if a < 0.0 && b >= 0.0 => 3,
                _ => 4,
            }
        };
        let Some(best) = (0..n).filter(|&r| self.kept[r]).map(class).min() else {
            self.scores = scores;
            return;
        };
        let in_bucket = |r: usize| self.kept[r] && class(r) == best;
        let abs = |r: usize| self.headroom(r).map_or((0.0, 0.0), |(a, b)| (a.abs(), b.abs()));
        let (mut lo, mut hi) = ((f64::MAX, f64::MAX), (f64::MIN, f64::MIN));
        for r in (0..n).filter(|&r| in_bucket(r)) {
            let (a, b) = abs(r);
            lo = (lo.0.min(a), lo.1.min(b));
            hi = (hi.0.max(a), hi.1.max(b));
        }
        let (rt, rp) = (hi.0 - lo.0, hi.1 - lo.1);
        let sum = self.cfg.ttft_weight + self.cfg.tpot_weight;
        let (mut alpha, mut beta) =
            if sum <= 0.0 { (1.0, 0.0) } else { (self.cfg.ttft_weight / sum, self.cfg.tpot_weight / sum) };
        if rt <= EPS && rp > EPS {
            (alpha, beta) = (0.0, 1.0);
        } else if rp <= EPS && rt > EPS {
            (alpha, beta) = (1.0, 0.0);
        }
        for (r, score) in scores.iter_mut().enumerate() {
            if !in_bucket(r) {
                continue;
            }
            let (a, b) = abs(r);
            let nt = if rt > EPS { (a - lo.0) / rt } else { 0.5 };
            let np = if rp > EPS { (b - lo.1) / rp } else { 0.5 };
            let combined = alpha * nt + beta * np;
            *score = (((1.0 - combined) * W_MAX) as i64 + 1) as f64 / W_MAX;
        }
        self.scores = scores;
    }

    /// Weighted random picker. Upstream keeps the largest key `u_r^(1/score_r)` over one draw
    /// per replica (A-Res); with one winner that picks r with probability `score_r / Σ score`,
    /// which this draws at once from one uniform (same distribution, not the same draws).
    /// Uniform when no score is positive.
    fn pick(&mut self) -> usize {
        let n = self.scores.len();
        let total: f64 = self.scores.iter().filter(|&&s| s > 0.0).sum();
        if total <= 0.0 {
            return self.rng.random_range(0..n);
        }
        let mut target = self.rng.random::<f64>() * total;
        let mut last = 0;
        for (r, &s) in self.scores.iter().enumerate() {
            if s > 0.0 {
                last = r;
                if target < s {
                    return r;
                }
                target -= s;
            }
        }
        last
    }
}

impl RouterPolicy for LlmDPredictedLatency {
    /// The scraped metrics upstream's predictor reads, and which requests owe their first token.
    fn signals(&self) -> Vec<String> {
        vec![
            signals::SCRAPED_WAITING.into(),
            signals::SCRAPED_RUNNING.into(),
            signals::SCRAPED_KV_UTILISATION.into(),
            signals::PREFILLING.into(),
        ]
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.scores(request, replicas);
        self.pick()
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        if self.features.len() <= r {
            self.features.resize(r + 1, [0.0; FEATURES]);
        }
        if self.prompt_for != Some(request.id) {
            // Dispatched without a route call: features from what the router knows.
            self.hash_prompt(request);
            self.features[r] = [1.0, 0.0, request.prompt_tokens as f64 / 1e3, 0.0, 0.0, 0.0, 0.0, 0.0];
        }
        let b = self.cfg.block_tokens as u64;
        let total = self.prompt.blocks;
        let uncached =
            total.saturating_sub(self.matched[r] as u64) * b + (request.prompt_tokens as u64).saturating_sub(total * b);
        let id = self.members.id(r);
        let cum = &mut self.uncached_cum[id];
        cum.push(cum.last().copied().unwrap_or(0) + uncached);
        self.lru.record(&self.prompt.runs, id);
        self.in_flight.insert(mix64(request.id), self.features[r]);
        self.prompt_for = None;
    }

    fn on_complete(&mut self, c: &Completion) {
        let Some(x) = self.in_flight.remove(&mix64(c.request_id)) else { return };
        self.ttft.update(&x, c.ttft);
        if c.output_tokens >= 2 {
            let tpot = (c.completed_at - c.arrived_at - c.ttft) / (c.output_tokens - 1) as f64;
            self.tpot.update(&x, tpot);
        }
    }

    /// A request given up trains nothing (its TTFT may be censored).
    fn on_abandon(&mut self, a: &Completion) {
        self.in_flight.remove(&mix64(a.request_id));
    }

    /// A replica that leaves is forgotten: its blocks and its in-flight tokens.
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            self.lru.forget(id);
            self.uncached_cum[id] = vec![0];
            self.prompt_for = None;
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![("router_model_samples".into(), self.ttft.samples() as f64)]
    }
}
