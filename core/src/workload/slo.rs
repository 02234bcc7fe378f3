//! A per-request service-level objective: bounds on a request's TTFT, TPOT and end-to-end
//! latency. A request meets the SLO when it finished and is within every bound given; the
//! cluster world then reports `slo_attainment` (the fraction of requests that met it) and
//! `goodput_rps` (requests that met it per second of the run's arrival span).
//!
//! ```yaml
//! cluster:
//!   slo: {ttft_s: 2, tpot_s: 0.1}    # any subset of ttft_s, tpot_s, latency_s; each > 0
//! ```
//!
//! On the command line (`--slo`), the same bounds are written `ttft_s=2,tpot_s=0.1`.

use serde::{Deserialize, Serialize};

use super::FieldError;

/// Bounds a request must meet, in seconds (absent = no bound).
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    /// Arrival → first output token, at most this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_s: Option<f64>,
    /// Mean time per output token after the first, at most this many seconds (requests with one
    /// output token have none and meet it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_s: Option<f64>,
    /// Arrival → last output token, at most this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_s: Option<f64>,
}

/// The bounds' names, as written in the workload and on the command line.
pub const BOUNDS: &[&str] = &["ttft_s", "tpot_s", "latency_s"];

const FIX: &str = "give at least one positive bound in seconds, e.g. `slo: {ttft_s: 2, tpot_s: 0.1}`";

impl Slo {
    fn bounds(&self) -> [(&'static str, Option<f64>); 3] {
        [("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s), ("latency_s", self.latency_s)]
    }

    fn slot(&mut self, name: &str) -> Option<&mut Option<f64>> {
        match name {
            "ttft_s" => Some(&mut self.ttft_s),
            "tpot_s" => Some(&mut self.tpot_s),
            "latency_s" => Some(&mut self.latency_s),
            _ => None,
        }
    }

    pub fn validate(&self) -> Result<(), FieldError> {
        if self.bounds().iter().all(|(_, b)| b.is_none()) {
            return Err(FieldError::new("", "has no bound, so every request would meet it", FIX));
        }
        for (name, bound) in self.bounds() {
            if let Some(b) = bound {
                if !(b > 0.0 && b.is_finite()) {
                    return Err(FieldError::new(
                        name,
                        format!("must be a positive number of seconds (got {b:?})"),
                        "use e.g. 2 (seconds); leave the bound out to not bound it",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether a request with these times (seconds; NaN = never happened) meets every bound.
    /// `tpot_s` is NaN for a request with a single output token: it has no TPOT to bound.
    pub fn met(&self, ttft_s: f64, tpot_s: f64, latency_s: f64) -> bool {
        // A request that never finished has NaN latency and fails every comparison below.
        latency_s.is_finite()
            && self.ttft_s.is_none_or(|b| ttft_s <= b)
            && self.tpot_s.is_none_or(|b| tpot_s.is_nan() || tpot_s <= b)
            && self.latency_s.is_none_or(|b| latency_s <= b)
    }

    /// The bounds as the command line writes them: `ttft_s=2,tpot_s=0.1`.
    pub fn to_arg(&self) -> String {
        let parts: Vec<String> = self.bounds().iter().filter_map(|(n, b)| b.map(|b| format!("{n}={b}"))).collect();
        parts.join(",")
    }

    /// Parses `ttft_s=2,tpot_s=0.1` (seconds; `ms` or `s` may follow the number). Errors are
    /// (field, message, fix) as a [`FieldError`] whose path is the bound's name.
    pub fn parse_arg(text: &str) -> Result<Slo, FieldError> {
        let mut slo = Slo::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((name, value)) = item.split_once('=') else {
                return Err(FieldError::new(
                    "",
                    format!("`{item}` is not `bound=seconds`"),
                    "write e.g. --slo 'ttft_s=2,tpot_s=0.1'",
                ));
            };
            let name = name.trim();
            let value = parse_seconds(value).ok_or_else(|| {
                FieldError::new(
                    name,
                    format!("`{}` is not a number of seconds", value.trim()),
                    "write e.g. ttft_s=2 or ttft_s=500ms",
                )
            })?;
            let Some(slot) = slo.slot(name) else {
                return Err(FieldError::new(
                    name,
                    format!("is not a bound (the bounds are {})", BOUNDS.join(", ")),
                    "write e.g. --slo 'ttft_s=2,tpot_s=0.1'",
                ));
            };
            if slot.is_some() {
                return Err(FieldError::new(name, "is given twice", "give each bound once"));
            }
            *slot = Some(value);
        }
        slo.validate()?;
        Ok(slo)
    }
}

/// A number of seconds, optionally followed by `s` or `ms`.
pub fn parse_seconds(text: &str) -> Option<f64> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    number.trim().parse::<f64>().ok().map(|v| v * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_parse_from_the_command_line_with_units() {
        let s = Slo::parse_arg("ttft_s=2, tpot_s=100ms").unwrap();
        assert_eq!(s, Slo { ttft_s: Some(2.0), tpot_s: Some(0.1), latency_s: None });
        assert_eq!(Slo::parse_arg(&s.to_arg()).unwrap(), s);
    }

    #[test]
    fn bad_bounds_are_refused_naming_the_bound() {
        let err = |t: &str| Slo::parse_arg(t).unwrap_err();
        assert!(err("").message.contains("no bound"));
        assert_eq!(err("ttft_s=0").path, "ttft_s");
        assert_eq!(err("tpot_s=NaN").path, "tpot_s");
        assert_eq!(err("tpot_s=-1").path, "tpot_s");
        assert_eq!(err("ttft=2").path, "ttft");
        assert!(err("ttft=2").message.contains("ttft_s, tpot_s, latency_s"));
        assert!(err("ttft_s=2,ttft_s=3").message.contains("twice"));
        assert!(err("ttft_s<2").message.contains("not `bound=seconds`"));
        assert!(err("ttft_s=fast").message.contains("not a number"));
    }

    #[test]
    fn a_request_meets_the_slo_only_within_every_bound_and_finished() {
        let s = Slo { ttft_s: Some(1.0), tpot_s: Some(0.1), latency_s: None };
        assert!(s.met(1.0, 0.1, 50.0), "bounds are inclusive");
        assert!(!s.met(1.01, 0.05, 2.0));
        assert!(!s.met(0.5, 0.2, 2.0));
        assert!(s.met(0.5, f64::NAN, 0.5), "a one-token output has no TPOT to miss");
        assert!(!s.met(f64::NAN, f64::NAN, f64::NAN), "an unfinished request misses");
    }
}
