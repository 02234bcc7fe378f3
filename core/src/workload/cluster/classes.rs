//! The `cluster.classes:` and `cluster.tenants:` sections: request classes (interactive chat,
//! batch jobs, …) mixed by share, each with its own priority, SLO and optionally its own prompt
//! and output sizes, and tenants sharing the fleet by weight.
//!
//! ```yaml
//! cluster:
//!   classes:
//!     - {name: critical, share: 0.3, priority: 2, slo: {ttft_s: 1}}
//!     - {name: standard, share: 0.5, priority: 0, slo: {ttft_s: 5}}
//!     - {name: batch, share: 0.2, priority: -1, output_tokens: {uniform: {min: 200, max: 800}}}
//!   tenants:
//!     - {name: acme, weight: 3}
//!     - {name: globex, weight: 1}
//! ```
//!
//! Each session (all its turns and parallel samples) draws one class by share and one tenant by
//! weight, from their own random stream (`cluster.classes`), so adding classes to a workload does
//! not move its arrivals or sizes, except where a class gives its own `suffix_tokens` or
//! `output_tokens`.
//!
//! A class may instead arrive by its own process (`arrivals:`, any synthetic one: poisson, gamma,
//! diurnal, stages; a steady interactive stream beside a bursty batch one): its sessions start
//! by that process alone, at its own rate, and it takes no `share`. The cluster's `arrivals:`
//! then drives the classes that have a share, split by share among them; at least one class
//! keeps a share (else the cluster's process would drive nothing). Each own process draws from
//! its own random stream (`cluster.classes.NAME.arrivals`), and the generator merges the
//! processes by time (`generate/synth.rs`). Classes and tenants are numbered from 0 in the order written: that number is
//! the request facts `class` and `tenant` a policy reads. A priority follows the Gateway API
//! Inference Extension's `InferenceObjective`: higher is more important, and a negative priority
//! marks the class sheddable. Without `classes:` every request is class 0 ("default", priority 0,
//! the cluster's `slo:`); without `tenants:` every request is tenant 0.

use serde::{Deserialize, Serialize};

use super::{Arrivals, Tokens};
use crate::workload::FieldError;
use crate::workload::slo::Slo;

/// Most classes and tenants a workload may name.
pub const MAX_CLASSES: usize = 64;
pub const MAX_TENANTS: usize = 10_000;

/// One request class.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClassSpec {
    /// The class's name: lowercase letters, digits and `_` (it becomes part of metric keys).
    pub name: String,
    /// The class's share of sessions, > 0 (shares are normalised over the classes that have one);
    /// required unless the class has its own `arrivals`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
    /// Higher is more important; negative = sheddable (the inference extension's convention).
    #[serde(default)]
    pub priority: i32,
    /// The class's own SLO (replacing the cluster's `slo:` for its requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<Slo>,
    /// The class's own unique prompt part, replacing `generator.suffix_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix_tokens: Option<Tokens>,
    /// The class's own output sizes, replacing `generator.output_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<Tokens>,
    /// The class's own arrival process (`{poisson: {rate}}`, `{gamma: {rate, cv}}`, `{diurnal: …}`
    /// or `{stages: […]}`, requests/s of this class alone), instead of a share of the cluster's
    /// `arrivals`; absent = a share.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "serde_norway::with::singleton_map")]
    #[schemars(with = "Option<Arrivals>")]
    pub arrivals: Option<Arrivals>,
}

/// One tenant.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// The tenant's name: lowercase letters, digits and `_`.
    pub name: String,
    /// The tenant's share of sessions, > 0 (weights are normalised over the tenants).
    pub weight: f64,
}

/// A request's class and tenant (indices into `classes:` and `tenants:`; 0 without them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Label {
    pub class: u16,
    pub tenant: u32,
}

fn check_name(what: &str, name: &str, seen: &mut Vec<String>) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && name.as_bytes()[0].is_ascii_lowercase();
    if !ok {
        return Err(FieldError::new(
            "name",
            format!("`{name}` is not a {what} name (lowercase letters, digits and `_`, starting with a letter, ≤ 40)"),
            "use e.g. `critical`, `batch`, `tenant_7`",
        ));
    }
    if seen.iter().any(|s| s == name) {
        return Err(FieldError::new(
            "name",
            format!("the {what} `{name}` is named twice"),
            "give each a distinct name",
        ));
    }
    seen.push(name.to_string());
    Ok(())
}

fn check_share(field: &str, v: f64) -> Result<(), FieldError> {
    if !(v > 0.0 && v.is_finite() && v <= 1e9) {
        return Err(FieldError::new(field, format!("must be a positive number (got {v:?})"), "use e.g. 0.3 or 1"));
    }
    Ok(())
}

/// Checks `classes:` and `tenants:` (paths relative to the cluster).
pub fn validate(classes: &[ClassSpec], tenants: &[TenantSpec]) -> Result<(), FieldError> {
    if classes.len() > MAX_CLASSES {
        return Err(FieldError::new(
            "classes",
            format!("{} classes; at most {MAX_CLASSES}", classes.len()),
            "merge classes",
        ));
    }
    let mut seen = Vec::new();
    for (i, c) in classes.iter().enumerate() {
        let at = |e: FieldError| e.under(&format!("classes[{i}]"));
        check_name("class", &c.name, &mut seen).map_err(at)?;
        match (c.share, &c.arrivals) {
            (Some(_), Some(_)) => {
                return Err(at(FieldError::new(
                    "share",
                    "a class with its own `arrivals` takes no share: its process sets its traffic",
                    "drop `share`, or drop the class's `arrivals` (the cluster's then drives it, by share)",
                )));
            }
            (None, None) => {
                return Err(at(FieldError::new(
                    "share",
                    "is missing: a class needs a share of the cluster's arrivals, or its own `arrivals`",
                    "add e.g. `share: 0.3`, or `arrivals: {poisson: {rate: 10}}`",
                )));
            }
            (Some(share), None) => check_share("share", share).map_err(at)?,
            (None, Some(a)) => check_own_arrivals(a).map_err(|e| at(e.under("arrivals")))?,
        }
        if let Some(s) = &c.slo {
            s.validate().map_err(|e| at(e.under("slo")))?;
        }
        if let Some(t) = &c.suffix_tokens {
            t.validate(true).map_err(|e| at(e.under("suffix_tokens")))?;
        }
        if let Some(t) = &c.output_tokens {
            t.validate(false).map_err(|e| at(e.under("output_tokens")))?;
        }
    }
    if tenants.len() > MAX_TENANTS {
        return Err(FieldError::new(
            "tenants",
            format!("{} tenants; at most {MAX_TENANTS}", tenants.len()),
            "merge tenants",
        ));
    }
    let mut seen = Vec::new();
    for (i, t) in tenants.iter().enumerate() {
        let at = |e: FieldError| e.under(&format!("tenants[{i}]"));
        check_name("tenant", &t.name, &mut seen).map_err(at)?;
        check_share("weight", t.weight).map_err(at)?;
    }
    Ok(())
}

/// A class's own process: a synthetic one, valid.
fn check_own_arrivals(a: &Arrivals) -> Result<(), FieldError> {
    if matches!(a, Arrivals::Trace { .. }) {
        return Err(FieldError::new(
            "trace",
            "a class's own arrivals are a process (poisson, gamma, diurnal, stages), not a trace",
            "give the class a process, or replay a trace whose rows carry their `class` (docs/your-traffic.md)",
        ));
    }
    a.validate()
}

/// Checks the classes' own arrivals against the cluster's (paths relative to the cluster): a
/// replayed trace gives every request's arrival, so no class may have its own; and some class
/// must keep a share of the cluster's process.
pub fn validate_arrivals(classes: &[ClassSpec], cluster: &Arrivals) -> Result<(), FieldError> {
    let Some(i) = classes.iter().position(|c| c.arrivals.is_some()) else { return Ok(()) };
    if matches!(cluster, Arrivals::Trace { .. }) {
        return Err(FieldError::new(
            &format!("classes[{i}].arrivals"),
            "the cluster replays a trace, which gives every request's arrival: a class cannot have its own",
            "drop the class's `arrivals` and give it a `share`, or give the trace's rows a `class`",
        ));
    }
    if classes.iter().all(|c| c.arrivals.is_some()) {
        return Err(FieldError::new(
            "classes",
            "every class has its own `arrivals`, so the cluster's `arrivals` would drive no request",
            "give one class a `share` instead of its own `arrivals` (the cluster's process then drives it)",
        ));
    }
    Ok(())
}

/// Draws an index by weight (a cumulative table; one uniform draw).
pub struct Mix {
    cdf: Vec<f64>,
}

impl Mix {
    pub fn new(weights: impl Iterator<Item = f64>) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = weights
            .map(|w| {
                acc += w;
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Self { cdf }
    }

    /// The cumulative shares, normalised (the last is 1).
    pub fn into_cdf(self) -> Vec<f64> {
        self.cdf
    }

    /// An index for the uniform draw `u` in [0, 1); 0 when the mix is empty.
    pub fn pick(&self, u: f64) -> usize {
        self.cdf.partition_point(|&c| c <= u).min(self.cdf.len().saturating_sub(1))
    }
}

/// A class's name by index (`default` without classes).
pub fn class_name(classes: &[ClassSpec], i: u16) -> &str {
    classes.get(i as usize).map_or("default", |c| c.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mix_picks_by_cumulative_share() {
        let m = Mix::new([1.0, 3.0].into_iter());
        assert_eq!(m.pick(0.0), 0);
        assert_eq!(m.pick(0.2499), 0);
        assert_eq!(m.pick(0.25), 1);
        assert_eq!(m.pick(0.9999), 1);
        assert_eq!(Mix::new(std::iter::empty()).pick(0.5), 0);
    }

    #[test]
    fn bad_classes_and_tenants_name_their_field() {
        let c = |name: &str, share: f64| ClassSpec {
            name: name.into(),
            share: Some(share),
            priority: 0,
            slo: None,
            suffix_tokens: None,
            output_tokens: None,
            arrivals: None,
        };
        assert_eq!(validate(&[c("a", 1.0), c("b", 0.0)], &[]).unwrap_err().path, "classes[1].share");
        assert_eq!(validate(&[c("Crit", 1.0)], &[]).unwrap_err().path, "classes[0].name");
        let e = validate(&[c("a", 1.0), c("a", 1.0)], &[]).unwrap_err();
        assert!(e.path == "classes[1].name" && e.message.contains("twice"), "{e:?}");
        let bad_slo = ClassSpec { slo: Some(Slo { ttft_s: Some(-1.0), ..Slo::default() }), ..c("a", 1.0) };
        assert_eq!(validate(&[bad_slo], &[]).unwrap_err().path, "classes[0].slo.ttft_s");
        let t = |name: &str, weight: f64| TenantSpec { name: name.into(), weight };
        assert_eq!(validate(&[], &[t("x", 1.0), t("y", f64::NAN)]).unwrap_err().path, "tenants[1].weight");
        assert!(validate(&[c("a", 1.0)], &[t("x", 2.0)]).is_ok());
    }

    /// In a workload file, a bad class or tenant is an input error naming the file, the line
    /// and the field, with a fix (the CLI exits 2 on it).
    #[test]
    fn a_bad_class_in_a_workload_names_file_line_and_field() {
        let text = |classes: &str| {
            format!(
                "name: t\ncluster:\n  replicas: 2\n  generator: {{output_tokens: 16}}\n  arrivals: {{poisson: {{rate: 1}}}}\n  \
                 requests: 10\n{classes}"
            )
        };
        let file = std::path::Path::new("w.yaml");
        let bad = text("  classes:\n    - {name: chat, share: 1}\n    - {name: batch, share: -2}\n");
        let e = crate::workload::parse(&bad, file).unwrap_err();
        assert_eq!((e.path.as_str(), e.line), ("cluster.classes[1].share", Some(9)), "{e}");
        assert!(e.to_string().starts_with("w.yaml:9: field `cluster.classes[1].share`") && !e.fix.is_empty(), "{e}");
        let bad = text("  tenants:\n    - {name: a, weight: 1}\n    - {name: a, weight: 2}\n");
        let e = crate::workload::parse(&bad, file).unwrap_err();
        assert_eq!((e.path.as_str(), e.line), ("cluster.tenants[1].name", Some(9)), "{e}");
        let bad = text("  classes:\n    - {name: chat, share: 1, priorty: 2}\n");
        let e = crate::workload::parse(&bad, file).unwrap_err();
        assert!(e.message.contains("priorty") && e.line == Some(8), "{e}");
        assert!(crate::workload::parse(&text("  classes:\n    - {name: chat, share: 1}\n"), file).is_ok());
    }

    /// A class's own arrivals: its process is checked under its path; it takes no share; some
    /// class keeps a share; a trace replay has none. Each names file, line and field.
    #[test]
    fn bad_class_arrivals_name_file_line_and_field() {
        let text = |arrivals: &str, classes: &str| {
            format!(
                "name: t\ncluster:\n  replicas: 2\n  generator: {{output_tokens: 16}}\n  arrivals: {arrivals}\n  \
                 requests: 10\n  classes:\n{classes}"
            )
        };
        let file = std::path::Path::new("w.yaml");
        let poisson = "{poisson: {rate: 1}}";
        let err = |a: &str, c: &str| crate::workload::parse(&text(a, c), file).unwrap_err();
        let e =
            err(poisson, "    - {name: chat, share: 1}\n    - {name: batch, arrivals: {gamma: {rate: 0, cv: 2}}}\n");
        assert_eq!((e.path.as_str(), e.line), ("cluster.classes[1].arrivals.gamma", Some(9)), "{e}");
        let e = err(
            poisson,
            "    - {name: chat, share: 1}\n    - {name: batch, share: 1, arrivals: {poisson: {rate: 2}}}\n",
        );
        assert_eq!((e.path.as_str(), e.line), ("cluster.classes[1].share", Some(9)), "{e}");
        assert!(e.to_string().starts_with("w.yaml:9: field `cluster.classes[1].share`") && !e.fix.is_empty(), "{e}");
        let e = err(poisson, "    - {name: chat}\n");
        assert_eq!((e.path.as_str(), e.line), ("cluster.classes[0].share", Some(8)), "{e}");
        let e = err(poisson, "    - {name: chat, arrivals: {poisson: {rate: 2}}}\n");
        assert!(e.path == "cluster.classes" && e.message.contains("every class"), "{e}");
        let e = err(poisson, "    - {name: chat, share: 1}\n    - {name: b, arrivals: {trace: {path: t.csv}}}\n");
        assert_eq!(e.path, "cluster.classes[1].arrivals.trace", "{e}");
        let trace = "{trace: {path: t.csv}}";
        let e = err(trace, "    - {name: chat, share: 1}\n    - {name: b, arrivals: {poisson: {rate: 2}}}\n");
        assert_eq!((e.path.as_str(), e.line), ("cluster.classes[1].arrivals", Some(9)), "{e}");
        let fine = text(
            poisson,
            "    - {name: chat, share: 1}\n    - {name: b, arrivals: {stages: [{rate: 2, duration_s: 5}]}}\n",
        );
        assert!(crate::workload::parse(&fine, file).is_ok());
    }
}
