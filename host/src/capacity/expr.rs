//! The SLO a capacity search holds: `--slo 'ttft_p99_s<2, ttft_s=2, slo_attainment>=0.9'`.
//!
//! Comma-separated items, each either
//! - a condition on a summary metric: `METRIC OP NUMBER[UNIT]`, OP one of `<`, `<=`, `>`, `>=`
//!   (or `≤`, `≥`); UNIT `s` or `ms` for a metric in seconds (`ttft_p99<2s` reads as
//!   `ttft_p99_s < 2`), `%` for a fraction (`attainment>=90%`); or
//! - a per-request bound `ttft_s=`, `tpot_s=`, `latency_s=` (seconds), which sets the cluster
//!   workload's `slo:` and so defines `slo_attainment` and `goodput_rps`.
//!
//! A condition may name a class or tenant of a cluster workload (`cluster.classes`,
//! `cluster.tenants`): `critical.ttft_p99<1s`, `standard.attainment>=0.9`, `tenant.acme.goodput>5`
//! (`class.NAME.` and `tenant.NAME.` spell the group out; a bare `NAME.` is a class, else a
//! tenant). The metric is then that group's figure (`class.critical.ttft_p99_s`): per class
//! `requests`, `slo_attainment`, `goodput_rps`, `rejected`, `shed`, `ttft_p99_s`; per tenant
//! `requests`, `slo_attainment`, `goodput_rps` (docs/output.md).
//!
//! The SLO holds at a load when every condition holds on the mean over seeds.

use std::fmt;

use routelab_core::metrics::{CLUSTER_KEYS, DISPATCH_KEYS, Metrics, SLO_KEYS};
use routelab_core::workload::FieldError;
use routelab_core::workload::slo::{BOUNDS, Slo, parse_seconds};
use routelab_core::workload::{Workload, WorldKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    pub fn holds(self, value: f64, bound: f64) -> bool {
        // NaN (no request finished, say) holds no condition.
        match self {
            Op::Lt => value < bound,
            Op::Le => value <= bound,
            Op::Gt => value > bound,
            Op::Ge => value >= bound,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }
}

/// `metric op value`, the metric's key resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    pub metric: String,
    pub op: Op,
    pub value: f64,
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.metric, self.op.as_str(), self.value)
    }
}

/// A parsed `--slo`: the conditions, and the per-request bounds if any were given.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub conditions: Vec<Condition>,
    pub bounds: Option<Slo>,
}

/// A condition's metric that a policy's figures lack.
#[derive(Clone, Debug, PartialEq)]
pub struct MissingMetric(pub String);

impl fmt::Display for MissingMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no metric `{}`", self.0)
    }
}

impl std::error::Error for MissingMetric {}

impl Target {
    /// Whether every condition holds on `m`; `Err` names a metric `m` lacks.
    pub fn holds(&self, m: &Metrics) -> Result<bool, MissingMetric> {
        let mut all = true;
        for c in &self.conditions {
            let v = m.get(&c.metric).ok_or_else(|| MissingMetric(c.metric.clone()))?;
            all &= c.op.holds(v, c.value);
        }
        Ok(all)
    }
}

impl Target {
    /// Relative improvement with load beyond which a metric counts as not monotone: loads this
    /// close in a handful of seeds differ by a few per cent from sampling alone.
    const NOISE: f64 = 0.05;

    /// Whether some condition's metric is better at a higher load than at a lower one, by more
    /// than [`Self::NOISE`], among the points at or above half the answer `lo` (the ones that
    /// decide it): then where the search crossed the bound may be noise, and the message says
    /// so. Bisection never runs a load above one that failed, so `holds` alone cannot show it.
    pub fn non_monotone(&self, points: &[super::Point], lo: f64) -> Option<String> {
        let mut near: Vec<&super::Point> = points.iter().filter(|p| p.load >= lo / 2.0).collect();
        near.sort_by(|a, b| a.load.total_cmp(&b.load));
        for c in &self.conditions {
            let lower_is_better = matches!(c.op, Op::Lt | Op::Le);
            for (i, a) in near.iter().enumerate() {
                for b in &near[i + 1..] {
                    let (Some(va), Some(vb)) = (a.metrics.get(&c.metric), b.metrics.get(&c.metric)) else { continue };
                    let gain = if lower_is_better { va - vb } else { vb - va };
                    if gain > Self::NOISE * va.abs().max(vb.abs()) {
                        return Some(format!(
                            "{} is better at load {:.4} ({vb:.4}) than at {:.4} ({va:.4}): not monotone in load near \
                             the answer, which may hinge on noise; rerun with more --seeds",
                            c.metric, b.load, a.load
                        ));
                    }
                }
            }
        }
        None
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self.conditions.iter().map(ToString::to_string).collect();
        if let Some(b) = &self.bounds {
            parts.push(b.to_arg());
        }
        write!(f, "{}", parts.join(", "))
    }
}

/// Short names a user may write for a metric.
const ALIASES: &[(&str, &str)] = &[("attainment", "slo_attainment"), ("goodput", "goodput_rps")];

/// The figures each class reports, as `class.NAME.<figure>`.
const CLASS_FIGURES: &[&str] =
    &["requests", "slo_attainment", "goodput_rps", "rejected", "shed", "ttft_p99_s", "admission_wait_mean_s"];
/// The figures each tenant reports, as `tenant.NAME.<figure>`.
const TENANT_FIGURES: &[&str] = &["requests", "slo_attainment", "goodput_rps"];

/// A grouped metric name `[class.|tenant.]GROUP.figure` resolved against `w`'s classes and
/// tenants: `Ok(None)` when `name` names no group (no dot), else the key or why not.
fn resolve_group(name: &str, w: &Workload) -> Result<Option<String>, (String, String)> {
    let Some((head, rest)) = name.split_once('.') else { return Ok(None) };
    let c = w.cluster.as_ref();
    let classes: Vec<&str> = c.map(|c| c.classes.iter().map(|k| k.name.as_str()).collect()).unwrap_or_default();
    let tenants: Vec<&str> = c.map(|c| c.tenants.iter().map(|k| k.name.as_str()).collect()).unwrap_or_default();
    let (kind, group, figure) = match head {
        "class" | "tenant" => {
            let (g, f) = rest.split_once('.').unwrap_or((rest, ""));
            (head, g, f)
        }
        _ if classes.contains(&head) => ("class", head, rest),
        _ if tenants.contains(&head) => ("tenant", head, rest),
        _ => ("", head, rest),
    };
    let list = |v: &[&str]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
    let known = match kind {
        "class" if classes.contains(&group) => CLASS_FIGURES,
        "tenant" if tenants.contains(&group) => TENANT_FIGURES,
        _ => {
            let what = if kind.is_empty() { "a class or tenant" } else { kind };
            return Err((
                format!(
                    "`{group}` is not {what} of this workload (classes: {}; tenants: {})",
                    list(&classes),
                    list(&tenants)
                ),
                "name one of the workload's `cluster.classes` or `cluster.tenants`, e.g. 'critical.ttft_p99<1s'".into(),
            ));
        }
    };
    let key = resolve(figure, known).ok_or_else(|| {
        (
            format!("`{figure}` is not a figure of a {kind} (a {kind} reports {})", known.join(", ")),
            format!("write e.g. '{group}.{}'", if kind == "class" { "ttft_p99<1s" } else { "attainment>=0.9" }),
        )
    })?;
    Ok(Some(format!("{kind}.{group}.{key}")))
}

/// The metric keys a world's runs report (besides a policy's own `router.`/`scheduler.` figures).
pub fn known_keys(world: WorldKind) -> Vec<&'static str> {
    match world {
        WorldKind::Dispatch => DISPATCH_KEYS.to_vec(),
        WorldKind::Cluster => {
            CLUSTER_KEYS.iter().chain(SLO_KEYS).chain(&["latency_p99_low_hit_s", "preemptions"]).copied().collect()
        }
        WorldKind::Compound => Vec::new(),
    }
}

const FIX: &str = "write e.g. --slo 'ttft_p99_s<2' or --slo 'ttft_s=2,tpot_s=0.1,slo_attainment>=0.9'";

/// Parses `text` for workload `w` (whose world decides the metric names). Errors name the item
/// (as the field) and say what would be valid.
pub fn parse(text: &str, w: &Workload) -> Result<Target, FieldError> {
    let world = w.world();
    let keys = known_keys(world);
    let mut conditions = Vec::new();
    let mut bound_items = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((at, op_text, op)) = find_op(item) else {
            if item.contains('=') {
                bound_items.push(item);
                continue;
            }
            return Err(FieldError::new(item, "is neither a condition (`metric<value`) nor a bound (`ttft_s=2`)", FIX));
        };
        let name = item[..at].trim();
        let value_text = item[at + op_text.len()..].trim();
        let metric = if name.starts_with("router.") || name.starts_with("scheduler.") {
            None
        } else {
            resolve_group(name, w).map_err(|(why, fix)| FieldError::new(item, why, fix))?
        };
        let metric = metric.or_else(|| resolve(name, &keys)).ok_or_else(|| {
            let bound = if BOUNDS.contains(&name) {
                format!(" (`{name}` is a per-request bound: write `{name}={value_text}`)")
            } else {
                String::new()
            };
            FieldError::new(
                item,
                format!("`{name}` is not a metric of the {} world{bound}", world.as_str()),
                format!("use one of {} (`routelab docs output`), or `router.<figure>`", keys.join(", ")),
            )
        })?;
        let value = parse_value(value_text, &metric).ok_or_else(|| {
            FieldError::new(
                item,
                format!("`{value_text}` is not a number (a unit `s` or `ms` may follow for a metric in seconds, `%` for a fraction)"),
                FIX,
            )
        })?;
        conditions.push(Condition { metric, op, value });
    }
    let bounds = if bound_items.is_empty() {
        None
    } else {
        if world != WorldKind::Cluster {
            return Err(FieldError::new(
                bound_items[0],
                format!("per-request bounds apply to cluster workloads; this is a {} workload", world.as_str()),
                "bound a summary metric instead, e.g. --slo 'response_mean<5'",
            ));
        }
        Some(Slo::parse_arg(&bound_items.join(",")).map_err(|e| FieldError::new(&e.path, e.message, e.fix))?)
    };
    if conditions.is_empty() {
        return Err(FieldError::new(
            "",
            "has no condition on a metric, so nothing decides whether a load is within the SLO",
            "add one, e.g. --slo 'ttft_s=2,slo_attainment>=0.9' or --slo 'ttft_p99_s<2'",
        ));
    }
    let per_request = w.cluster.as_ref().is_some_and(|c| c.slo.is_some() || c.classes.iter().any(|k| k.slo.is_some()))
        || bounds.is_some();
    let needs_bounds = |m: &str| SLO_KEYS.contains(&m) || m.ends_with(".slo_attainment") || m.ends_with(".goodput_rps");
    if let Some(c) = conditions.iter().find(|c| needs_bounds(&c.metric)) {
        if !per_request {
            return Err(FieldError::new(
                &c.metric,
                "needs per-request bounds, and neither --slo nor the workload's `slo:` gives any",
                "add bounds to --slo, e.g. --slo 'ttft_s=2,tpot_s=0.1,slo_attainment>=0.9'",
            ));
        }
    }
    Ok(Target { conditions, bounds })
}

/// The first comparison operator in `item`: (byte offset, its text, the operator).
fn find_op(item: &str) -> Option<(usize, &'static str, Op)> {
    let at = item.find(['<', '>', '≤', '≥'])?;
    let rest = &item[at..];
    [("<=", Op::Le), (">=", Op::Ge), ("≤", Op::Le), ("≥", Op::Ge), ("<", Op::Lt), (">", Op::Gt)]
        .into_iter()
        .find(|(t, _)| rest.starts_with(t))
        .map(|(t, op)| (at, t, op))
}

/// The metric key `name` stands for: itself, an alias, or itself with the `_s` unit suffix.
pub fn resolve(name: &str, keys: &[&str]) -> Option<String> {
    if name.starts_with("router.") || name.starts_with("scheduler.") {
        return Some(name.to_string());
    }
    let name = ALIASES.iter().find(|(a, _)| *a == name).map_or(name, |(_, k)| k);
    [name.to_string(), format!("{name}_s")].into_iter().find(|k| keys.contains(&k.as_str()))
}

fn parse_value(text: &str, metric: &str) -> Option<f64> {
    if let Some(p) = text.strip_suffix('%') {
        return p.trim().parse::<f64>().ok().map(|v| v / 100.0).filter(|v| v.is_finite());
    }
    let has_unit = text.ends_with('s');
    if has_unit && !metric.ends_with("_s") {
        return None;
    }
    parse_seconds(text).filter(|v| v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(slo: bool) -> Workload {
        let yaml = format!(
            "cluster:\n  replicas: 1\n  generator: {{output_tokens: 8}}\n  arrivals: {{poisson: {{rate: 1}}}}\n  requests: 10\n{}",
            if slo { "  slo: {ttft_s: 1}\n" } else { "" }
        );
        routelab_core::workload::parse(&yaml, std::path::Path::new("w.yaml")).unwrap()
    }

    fn dispatch() -> Workload {
        routelab_core::workload::parse("dispatch: {servers: 1, requests: 10}\n", std::path::Path::new("d.yaml"))
            .unwrap()
    }

    #[test]
    fn conditions_read_with_units_aliases_and_bounds() {
        let t = parse("ttft_p99<2s, attainment ≥ 90%, tpot_mean_s<=50ms, ttft_s=2", &cluster(false)).unwrap();
        let c = |m: &str, op, value| Condition { metric: m.into(), op, value };
        assert_eq!(
            t.conditions,
            vec![c("ttft_p99_s", Op::Lt, 2.0), c("slo_attainment", Op::Ge, 0.9), c("tpot_mean_s", Op::Le, 0.05)]
        );
        assert_eq!(t.bounds, Some(Slo { ttft_s: Some(2.0), ..Slo::default() }));
        let d = parse("response_mean<=5", &dispatch()).unwrap();
        assert_eq!(d.conditions, vec![c("response_mean", Op::Le, 5.0)]);
        assert_eq!(d.bounds, None);
    }

    fn classes() -> Workload {
        let yaml = "cluster:\n  replicas: 1\n  generator: {output_tokens: 8}\n  arrivals: {poisson: {rate: 1}}\n  \
                    requests: 10\n  classes:\n    - {name: critical, share: 1, priority: 2, slo: {ttft_s: 1}}\n    \
                    - {name: standard, share: 1}\n  tenants:\n    - {name: acme, weight: 1}\n";
        routelab_core::workload::parse(yaml, std::path::Path::new("c.yaml")).unwrap()
    }

    /// Per-class and per-tenant conditions resolve to the group's figure; a class's own SLO is
    /// enough for its attainment; an unknown group or figure is refused naming what exists.
    #[test]
    fn class_and_tenant_conditions_resolve_to_their_figures() {
        let t = parse(
            "critical.ttft_p99<1s, standard.attainment>=0.9, tenant.acme.goodput>2, class.critical.shed<=5",
            &classes(),
        )
        .unwrap();
        let c = |m: &str, op, value| Condition { metric: m.into(), op, value };
        assert_eq!(
            t.conditions,
            vec![
                c("class.critical.ttft_p99_s", Op::Lt, 1.0),
                c("class.standard.slo_attainment", Op::Ge, 0.9),
                c("tenant.acme.goodput_rps", Op::Gt, 2.0),
                c("class.critical.shed", Op::Le, 5.0),
            ]
        );
        assert_eq!(parse("acme.requests>1", &classes()).unwrap().conditions[0].metric, "tenant.acme.requests");
        let wait = parse("critical.admission_wait_mean<0.5s", &classes()).unwrap();
        assert_eq!(wait.conditions, vec![c("class.critical.admission_wait_mean_s", Op::Lt, 0.5)]);
        let e = parse("premium.ttft_p99<1s", &classes()).unwrap_err();
        assert_eq!(e.path, "premium.ttft_p99<1s");
        assert!(
            e.message.contains("`premium` is not a class or tenant") && e.message.contains("critical, standard"),
            "{e:?}"
        );
        let e = parse("class.acme.ttft_p99<1s", &classes()).unwrap_err();
        assert!(e.message.contains("`acme` is not class"), "{e:?}");
        let e = parse("acme.ttft_p99<1s", &classes()).unwrap_err();
        assert!(e.message.contains("not a figure of a tenant") && e.message.contains("slo_attainment"), "{e:?}");
        let e = parse("critical.ttft_p99<1s", &cluster(false)).unwrap_err();
        assert!(e.message.contains("classes: none"), "{e:?}");
        assert!(parse("default.attainment>=0.5", &cluster(false)).is_err());
    }

    #[test]
    fn holds_on_the_means_and_nan_holds_nothing() {
        let t = parse("latency_p99_s<2,slo_attainment>=0.9", &cluster(true)).unwrap();
        let mut m = Metrics::new();
        m.push("latency_p99_s", 1.5);
        m.push("slo_attainment", 0.9);
        assert_eq!(t.holds(&m), Ok(true));
        m.0[1].1 = 0.89;
        assert_eq!(t.holds(&m), Ok(false));
        m.0[1].1 = f64::NAN;
        assert_eq!(t.holds(&m), Ok(false));
        assert_eq!(t.holds(&Metrics::new()), Err(MissingMetric("latency_p99_s".into())));
    }

    #[test]
    fn bad_expressions_are_refused_with_what_is_valid() {
        let err = |t: &str, w: &Workload| parse(t, w).unwrap_err();
        let e = err("ttft_p42_s<2", &cluster(false));
        assert!(e.message.contains("not a metric of the cluster world") && e.fix.contains("ttft_p99_s"), "{e:?}");
        assert!(err("ttft_s<2", &cluster(false)).message.contains("write `ttft_s=2`"));
        assert!(err("ttft_s=2", &cluster(false)).message.contains("no condition"));
        assert!(err("slo_attainment>=0.9", &cluster(false)).message.contains("needs per-request bounds"));
        assert!(parse("slo_attainment>=0.9", &cluster(true)).is_ok(), "the workload's slo: is enough");
        assert!(err("ttft_p99_s<fast", &cluster(false)).message.contains("not a number"));
        assert!(err("hit_rate>0.5s", &cluster(false)).message.contains("not a number"), "no seconds on a fraction");
        assert_eq!(err("ttft_s=-1,ttft_p99_s<2", &cluster(false)).path, "ttft_s");
        assert!(err("latency_s=2,response_mean<5", &dispatch()).message.contains("cluster workloads"));
        assert!(err("response_mean", &dispatch()).message.contains("neither a condition"));
    }
}
