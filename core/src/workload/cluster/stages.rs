//! `arrivals: {stages: [{rate, duration_s}, …]}`: Poisson arrivals whose rate steps over the run,
//! one constant rate per stage, stages back to back from t = 0; the stream ends with the last stage.
//!
//! This is the load inference-perf runs for `load: {type: poisson, stages: [{rate, duration}, …]}`,
//! the QPS ramp behind llm-d's published router comparisons (3 → 60 QPS on Qwen3-32B in
//! llm-d/llm-d `guides/inference-scheduling/README.md`, commit
//! 086f217d643a6932b261a60f8f337b2ca2629d80). inference-perf reports per stage; routelab reports
//! the whole run (`routelab run --json` keeps every request's arrival for per-stage cuts).
//!
//! Generation is a time change of a unit-rate Poisson process: with Λ(t) = ∫₀ᵗ λ(u) du the
//! cumulative rate (piecewise linear here), unit-rate arrivals s₁ < s₂ < … map to Λ⁻¹(s₁) < Λ⁻¹(s₂)
//! < …, a Poisson process of rate λ(t). One exponential draw per arrival, as for `poisson`.

use serde::{Deserialize, Serialize};

use super::super::FieldError;
use super::super::limits::fits_clock;

/// One stage of a stepped arrival rate.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Requests per second during this stage, ≥ 0 (0 is a pause).
    pub rate: f64,
    /// How long the stage lasts, seconds, > 0.
    pub duration_s: f64,
}

/// Requests the stages hold on average, counting only the first `horizon_s` seconds.
pub fn expected_requests(stages: &[Stage], horizon_s: Option<f64>) -> f64 {
    let mut left = horizon_s.unwrap_or(f64::INFINITY);
    let mut n = 0.0;
    for s in stages {
        n += s.rate * s.duration_s.min(left);
        left -= s.duration_s.min(left);
    }
    n
}

pub fn validate(stages: &[Stage]) -> Result<(), FieldError> {
    let fix = "use e.g. [{rate: 3, duration_s: 20}, {rate: 10, duration_s: 20}]";
    if stages.iter().all(|s| s.rate <= 0.0) {
        return Err(FieldError::new("stages", "needs at least one stage with a positive rate", fix));
    }
    let mut total = 0.0;
    for (i, s) in stages.iter().enumerate() {
        if !(s.rate >= 0.0 && s.rate.is_finite()) {
            return Err(FieldError::new(&format!("stages[{i}].rate"), format!("must be ≥ 0 (got {:?})", s.rate), fix));
        }
        if !(s.duration_s > 0.0 && s.duration_s.is_finite()) {
            let m = format!("must be positive (got {:?})", s.duration_s);
            return Err(FieldError::new(&format!("stages[{i}].duration_s"), m, fix));
        }
        total += s.duration_s;
        fits_clock(&format!("stages[{i}].duration_s"), total, "shorten the stages")?;
    }
    Ok(())
}

/// Λ⁻¹ for the stages' rate times `scale` (groups per request): feed it non-decreasing unit-rate
/// times.
pub struct StageClock<'a> {
    stages: &'a [Stage],
    scale: f64,
    /// The stage `at` last answered in, with its start in clock time and in unit-rate time.
    i: usize,
    start_t: f64,
    start_s: f64,
}

impl<'a> StageClock<'a> {
    pub fn new(stages: &'a [Stage], scale: f64) -> Self {
        StageClock { stages, scale, i: 0, start_t: 0.0, start_s: 0.0 }
    }

    /// The clock time at which the cumulative rate reaches `s`; None once past the last stage.
    pub fn at(&mut self, s: f64) -> Option<f64> {
        while let Some(stage) = self.stages.get(self.i) {
            let rate = stage.rate * self.scale;
            let end_s = self.start_s + rate * stage.duration_s;
            if s < end_s {
                return Some((self.start_t + (s - self.start_s) / rate).min(self.start_t + stage.duration_s));
            }
            self.start_s = end_s;
            self.start_t += stage.duration_s;
            self.i += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(pairs: &[(f64, f64)]) -> Vec<Stage> {
        pairs.iter().map(|&(rate, duration_s)| Stage { rate, duration_s }).collect()
    }

    /// Λ⁻¹ by hand: rate 2 for 10 s (Λ = 20 at t = 10), a pause, then rate 5 for 4 s.
    #[test]
    fn the_clock_inverts_the_cumulative_rate_across_stages_and_pauses() {
        let s = st(&[(2.0, 10.0), (0.0, 3.0), (5.0, 4.0)]);
        let mut c = StageClock::new(&s, 1.0);
        assert_eq!(c.at(1.0), Some(0.5));
        assert_eq!(c.at(19.0), Some(9.5));
        // Past the first stage: the pause takes no unit time, the third starts at t = 13.
        assert_eq!(c.at(25.0), Some(14.0));
        assert_eq!(c.at(40.0), None, "the stream ends with the last stage (Λ = 40 there)");
        let mut half = StageClock::new(&s, 0.5);
        assert_eq!(half.at(5.0), Some(5.0), "groups of 2 requests start at half the rate");
        assert_eq!(expected_requests(&s, None), 40.0);
        assert_eq!(expected_requests(&s, Some(14.0)), 25.0);
    }

    /// The generated stream follows the steps: each stage's count is its rate × duration within
    /// 5 standard deviations (Poisson: √n), none arrive in the pause, and the stream ends with the
    /// last stage. Turns of 2 (groups at half the rate) keep the request rate.
    #[test]
    fn a_generated_stream_steps_its_rate_stage_by_stage() {
        use crate::time::seconds;
        use crate::workload::generate::generate;
        let spec: super::super::ClusterSpec = serde_norway::from_str(
            "replicas: 4\n\
             generator: {system_prompt_tokens: 8, suffix_tokens: 16, output_tokens: 4, turns: 2, think_time_s: 0.5}\n\
             arrivals: {stages: [{rate: 5, duration_s: 200}, {rate: 20, duration_s: 100}, {rate: 0, duration_s: 50}, \
             {rate: 60, duration_s: 50}]}\n",
        )
        .unwrap();
        spec.validate().unwrap();
        let stream = generate(&spec, None, 3).unwrap();
        let bounds: [(f64, f64, f64); 4] =
            [(0.0, 200.0, 1000.0), (200.0, 300.0, 2000.0), (300.0, 350.0, 0.0), (350.0, 400.0, 3000.0)];
        // A group's second turn lands a think time (mean 0.5 s) after its first, so a few
        // requests spill across a boundary: allow 30 of them beyond the Poisson noise.
        for (lo, hi, want) in bounds {
            let n = stream.requests.iter().filter(|r| (lo..hi).contains(&seconds(r.arrived_at))).count() as f64;
            let spill = if want == 0.0 { 30.0 } else { 5.0 * want.sqrt() + 30.0 };
            assert!((n - want).abs() <= spill, "[{lo}, {hi}) s: {n} requests, expected about {want}");
        }
        let last = stream.requests.last().map(|r| seconds(r.arrived_at)).unwrap();
        assert!(last < 400.0 + 10.0, "the last group starts before 400 s (its second turn may follow): {last}");
        assert!((spec.expected_requests() - 6000.0).abs() < 1e-9);
    }

    #[test]
    fn bad_stages_name_the_stage_and_field() {
        let e = validate(&st(&[(1.0, 5.0), (2.0, -1.0)])).unwrap_err();
        assert_eq!(e.path, "stages[1].duration_s");
        let e = validate(&st(&[(1.0, 5.0), (f64::NAN, 1.0)])).unwrap_err();
        assert_eq!(e.path, "stages[1].rate");
        assert_eq!(validate(&st(&[(0.0, 5.0)])).unwrap_err().path, "stages");
        assert_eq!(validate(&[]).unwrap_err().path, "stages");
        assert!(validate(&st(&[(0.0, 5.0), (3.0, 20.0)])).is_ok());
    }
}
