//! The `dispatch:` section: N FCFS servers, arrivals at utilisation ρ, a service distribution
//! with mean 1, fresh or stale load information, or balls-into-bins.

use rand::RngExt;
use rand_distr::{Distribution, Exp1, LogNormal};
use serde::{Deserialize, Serialize};

use super::FieldError;
use super::limits::{self, MAX_CV, at_most, fits_clock};
use crate::seeds::SimRng;

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DispatchSpec {
    /// Number of servers (bins in balls-into-bins mode).
    pub servers: u32,
    /// Requests per seed (balls in balls-into-bins mode).
    pub requests: u64,
    /// Target utilisation ρ in (0, 1): the arrival rate is ρ·N (mean service time 1).
    #[serde(default = "default_rho")]
    pub utilisation: f64,
    /// Fraction of leading requests left out of the statistics, in [0, 1).
    #[serde(default)]
    pub warmup: f64,
    /// How requests arrive: `poisson` or `{trace: {path}}`.
    #[serde(default, with = "serde_norway::with::singleton_map")]
    #[schemars(with = "Arrivals")]
    pub arrivals: Arrivals,
    /// The service-time distribution, rescaled to mean 1 (`validate` prints the factor).
    #[serde(default, with = "serde_norway::with::singleton_map")]
    #[schemars(with = "Service")]
    pub service: Service,
    /// What the router sees of the servers: `fresh` or `{stale: {refresh_interval}}`.
    #[serde(default, with = "serde_norway::with::singleton_map")]
    #[schemars(with = "Information")]
    pub information: Information,
    /// `queueing` (FCFS with departures) or `balls_into_bins` (no departures; metric `max_load`).
    #[serde(default)]
    pub mode: Mode,
}

fn default_rho() -> f64 {
    0.9
}

/// How requests arrive.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Arrivals {
    /// Poisson with rate ρ·N.
    #[default]
    Poisson,
    /// Timestamps from a CSV trace (first column a number of seconds, or an Azure-trace
    /// `TIMESTAMP`), rescaled so the mean rate is ρ·N; `requests` caps how many are used.
    Trace { path: String },
}

/// Service-time distribution, scaled to mean 1.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Service {
    /// Exponential with mean 1.
    #[default]
    Exponential,
    /// Every job takes exactly 1.
    Deterministic,
    /// Lognormal with coefficient of variation `cv`.
    Lognormal { cv: f64 },
    /// Pareto with shape `alpha` truncated to [min, max], then rescaled to mean 1.
    BoundedPareto { alpha: f64, min: f64, max: f64 },
    /// `large` with probability `p_large`, else `small`; rescaled to mean 1.
    Bimodal { p_large: f64, small: f64, large: f64 },
    /// Uniform choice among `values`, rescaled to mean 1.
    Empirical { values: Vec<f64> },
}

/// What the router sees of the servers.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Information {
    /// True queue lengths and remaining work at every arrival.
    #[default]
    Fresh,
    /// A snapshot of every server refreshed every `refresh_interval` mean service times
    /// (Mitzenmacher's bulletin board).
    Stale { refresh_interval: f64 },
}

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// FCFS queues with departures.
    #[default]
    Queueing,
    /// `requests` balls into `servers` bins, no departures; the metric is the maximum load.
    BallsIntoBins,
}

/// Shortest stale refresh interval, in mean service times.
pub const MIN_REFRESH_INTERVAL: f64 = 1e-3;

/// Largest service size after rescaling to mean 1 (in mean service times), and largest ratio of
/// sizes: beyond them one job outlasts any run, or the sizes lose their resolution in ticks.
pub const MAX_SCALED_SIZE: f64 = 1e8;

impl DispatchSpec {
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.servers == 0 {
            return Err(FieldError::new("servers", "must be at least 1 (got 0)", "set `servers: 16`, say"));
        }
        if self.requests == 0 {
            return Err(FieldError::new("requests", "must be at least 1 (got 0)", "set `requests: 100000`, say"));
        }
        at_most("servers", self.servers, limits::MAX_SERVERS, "use at most a million servers")?;
        at_most("requests", self.requests, limits::MAX_DISPATCH_REQUESTS, "use e.g. 1000000 requests and more seeds")?;
        if self.mode == Mode::Queueing && !(self.utilisation > 0.0 && self.utilisation < 1.0) {
            return Err(FieldError::new(
                "utilisation",
                format!("must be in (0, 1) for a stable queue (got {:?})", self.utilisation),
                "use a value such as 0.9; at ρ ≥ 1 every queue grows without bound",
            ));
        }
        if !(0.0..1.0).contains(&self.warmup) {
            return Err(FieldError::new(
                "warmup",
                format!("must be in [0, 1) (got {:?})", self.warmup),
                "use a fraction such as 0.1",
            ));
        }
        if self.mode == Mode::Queueing {
            // Arrivals at rate ρ·N: the last one comes about requests / (ρ·N) after the first.
            let span = self.requests as f64 / (self.utilisation * self.servers as f64);
            fits_clock("utilisation", span, "raise the utilisation or the servers, or run fewer requests")?;
        }
        if let Information::Stale { refresh_interval } = self.information {
            // Refreshes land on whole ticks (10⁻⁹ mean service times); far below the service time
            // a snapshot is fresh in effect, and each refresh costs O(servers).
            if !(MIN_REFRESH_INTERVAL..=limits::MAX_HORIZON).contains(&refresh_interval) {
                return Err(FieldError::new(
                    "information.stale.refresh_interval",
                    format!(
                        "must be in [{MIN_REFRESH_INTERVAL}, {:.1e}] mean service times (got {refresh_interval:?})",
                        limits::MAX_HORIZON
                    ),
                    "use e.g. 4 (mean service times); for information refreshed at every arrival use `information: fresh`",
                ));
            }
        }
        self.service.validate().map_err(|e| e.under("service"))
    }
}

impl Service {
    pub fn validate(&self) -> Result<(), FieldError> {
        let pos = |v: f64| v > 0.0 && v.is_finite();
        match self {
            Service::Exponential | Service::Deterministic => Ok(()),
            Service::Lognormal { cv } if !(pos(*cv) && *cv <= MAX_CV) => Err(FieldError::new(
                "lognormal.cv",
                format!("must be positive and at most {MAX_CV} (got {cv:?})"),
                "use e.g. 1.0",
            )),
            Service::BoundedPareto { alpha, min, max } => {
                if !(*alpha >= 0.01 && *alpha <= 100.0) {
                    Err(FieldError::new(
                        "bounded_pareto.alpha",
                        format!("must be in [0.01, 100] (got {alpha:?})"),
                        "use e.g. 1.1",
                    ))
                } else if !(pos(*min) && max > min && max.is_finite()) {
                    Err(FieldError::new(
                        "bounded_pareto",
                        format!("needs 0 < min < max < ∞ (got min {min}, max {max})"),
                        "use e.g. min: 1, max: 10000",
                    ))
                } else {
                    self.check_scaled_range()
                }
            }
            Service::Bimodal { p_large, small, large } => {
                if !(0.0..=1.0).contains(p_large) {
                    Err(FieldError::new(
                        "bimodal.p_large",
                        format!("must be in [0, 1] (got {p_large:?})"),
                        "use e.g. 0.1",
                    ))
                } else if !(pos(*small) && pos(*large)) {
                    Err(FieldError::new("bimodal", "small and large must be positive", "use e.g. small: 1, large: 10"))
                } else {
                    self.check_scaled_range()
                }
            }
            Service::Empirical { values } => {
                if values.is_empty()
                    || values.iter().any(|v| !(*v >= 0.0 && v.is_finite()))
                    || values.iter().sum::<f64>() <= 0.0
                {
                    Err(FieldError::new(
                        "empirical.values",
                        "needs at least one non-negative finite value and a positive sum",
                        "list observed sizes, e.g. [0.5, 1, 4]",
                    ))
                } else {
                    self.check_scaled_range()
                }
            }
            _ => Ok(()),
        }
    }

    /// The sizes rescaled to mean 1 must stay finite, positive and within [`MAX_SCALED_SIZE`]:
    /// extreme parameters (alpha → 0, values near f64::MAX) otherwise give infinite or zero
    /// sizes that saturate the clock.
    fn check_scaled_range(&self) -> Result<(), FieldError> {
        let (lo, hi) = match self {
            Service::BoundedPareto { min, max, .. } => (*min, *max),
            Service::Bimodal { p_large, small, large } => match *p_large {
                0.0 => (*small, *small),
                1.0 => (*large, *large),
                _ => (small.min(*large), small.max(*large)),
            },
            Service::Empirical { values } => {
                let positive = values.iter().copied().filter(|v| *v > 0.0);
                (positive.clone().fold(f64::INFINITY, f64::min), positive.fold(0.0, f64::max))
            }
            _ => return Ok(()),
        };
        let (_, raw_mean) = Sizes::new(self);
        let (lo, hi) = (lo / raw_mean, hi / raw_mean);
        let ok = raw_mean.is_finite()
            && raw_mean > 0.0
            && hi.is_finite()
            && hi <= MAX_SCALED_SIZE
            && lo * MAX_SCALED_SIZE >= hi / MAX_SCALED_SIZE;
        if !ok {
            return Err(FieldError::new(
                "",
                format!(
                    "rescaled to mean 1 (raw mean {raw_mean:.3e}), sizes would span [{lo:.3e}, {hi:.3e}] mean service times; \
                     the largest must be at most {MAX_SCALED_SIZE:.0e} and the ratio largest/smallest at most 1e16"
                ),
                "use a less extreme distribution (e.g. bounded_pareto {alpha: 1.1, min: 1, max: 10000})",
            ));
        }
        Ok(())
    }
}

/// Service-time sampler with mean 1.
#[derive(Clone, Debug)]
pub enum Sizes {
    Exponential,
    Deterministic,
    Lognormal(LogNormal<f64>),
    BoundedPareto { alpha: f64, min: f64, ratio: f64, scale: f64 },
    Bimodal { p_large: f64, small: f64, large: f64 },
    Empirical(Vec<f64>),
}

impl Sizes {
    /// The sampler for `service`, and the factor its raw mean was divided by to make it 1.
    pub fn new(service: &Service) -> (Self, f64) {
        match service {
            Service::Exponential => (Sizes::Exponential, 1.0),
            Service::Deterministic => (Sizes::Deterministic, 1.0),
            Service::Lognormal { cv } => {
                let s2 = (1.0 + cv * cv).ln();
                (Sizes::Lognormal(LogNormal::new(-s2 / 2.0, s2.sqrt()).expect("validated cv")), 1.0)
            }
            Service::BoundedPareto { alpha, min, max } => {
                let (a, l, h) = (*alpha, *min, *max);
                let ratio = (l / h).powf(a);
                let raw_mean = if (a - 1.0).abs() < 1e-12 {
                    l * (h / l).ln() / (1.0 - l / h)
                } else {
                    l.powf(a) / (1.0 - ratio) * a / (a - 1.0) * (l.powf(1.0 - a) - h.powf(1.0 - a))
                };
                (Sizes::BoundedPareto { alpha: a, min: l, ratio, scale: 1.0 / raw_mean }, raw_mean)
            }
            Service::Bimodal { p_large, small, large } => {
                let raw = p_large * large + (1.0 - p_large) * small;
                (Sizes::Bimodal { p_large: *p_large, small: small / raw, large: large / raw }, raw)
            }
            Service::Empirical { values } => {
                let raw = values.iter().sum::<f64>() / values.len() as f64;
                (Sizes::Empirical(values.iter().map(|v| v / raw).collect()), raw)
            }
        }
    }

    pub fn sample(&self, rng: &mut SimRng) -> f64 {
        match self {
            Sizes::Exponential => Exp1.sample(rng),
            Sizes::Deterministic => 1.0,
            Sizes::Lognormal(d) => d.sample(rng),
            Sizes::BoundedPareto { alpha, min, ratio, scale } => {
                let u: f64 = rng.random();
                min / (1.0 - u * (1.0 - ratio)).powf(1.0 / alpha) * scale
            }
            Sizes::Bimodal { p_large, small, large } => {
                if rng.random::<f64>() < *p_large {
                    *large
                } else {
                    *small
                }
            }
            Sizes::Empirical(v) => v[rng.random_range(0..v.len())],
        }
    }
}
