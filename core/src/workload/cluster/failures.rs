//! Failures: the `cluster.failures:` section of a fixed cluster. Replicas crash at
//! set times and/or at random (each replica's time to failure exponential with mean `mtbf_s`,
//! drawn from the run's seed), are down for `restart_s`, and come back with cold caches.
//!
//! ```yaml
//! cluster:
//!   failures:
//!     crashes: [{replica: 1, at_s: 30}]   # scheduled crashes (replica index from 0, time)
//!     mtbf_s: 3600        # optional: mean seconds between a replica's random crashes
//!     restart_s: 60       # down time: the restart (pod reschedule and model load)
//!     max_retries: 1      # times a request lost in a crash is sent again; then it fails
//!     slowdowns: [{replica: 2, factor: 3, from_s: 60, until_s: 600}]   # a replica running slow
//!     kv_event_loss: 0.05 # share of KV eviction events the router never hears
//! ```
//!
//! A slowdown is a gray failure: the replica stays up and routable, but every step it starts in
//! `[from_s, until_s)` takes `factor` times as long (thermal throttling, a noisy neighbour, a
//! degraded link). Overlapping slowdowns of one replica multiply.
//!
//! Where each runs: on aggregated clusters of single replicas, fixed or autoscaled (there
//! `replica` names a slot, below `max_replicas`; a crash of a slot that is off is ignored);
//! crashes also on disaggregated (P/D) clusters, fixed or autoscaled (there prefill slots
//! first, then decode ones; autoscaling runs without mixed instances), slowdowns and lost KV
//! events with them too, where `replica` indexes the instances as the P/D router's views list
//! them — prefill, then mixed, then decode (a slow prefill instance stretches prefills, a slow
//! decode instance decode steps; a KV transfer is not slowed). With lock-step groups
//! (`data_parallel`), a crash of any member takes its whole group down and back.
//!
//! Lost KV events: routers that index replicas' caches (`dynamo_kv`, `llm_d`'s precise mode,
//! `preble`, …) hear of evictions as events on a bus; a lossy one (ZMQ PUB/SUB drops what
//! overflows its high-water mark) leaves the router believing blocks are cached that are gone.
//! Each eviction event is lost with probability `kv_event_loss`, drawn from the run's seed.
//!
//! What the simulator does with it is in `sim/cluster/failures.rs`.

use serde::{Deserialize, Serialize};

use crate::workload::FieldError;
use crate::workload::limits::fits_clock;

/// When replicas crash, how long they stay down, and what becomes of their requests.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Failures {
    /// Scheduled crashes: `{replica, at_s}` each (a crash of a replica that is down, or with
    /// autoscaling off, is ignored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crashes: Vec<Crash>,
    /// Mean time between failures of each replica, seconds (> 0): after every start a replica's
    /// next crash is drawn exponential with this mean from the run's seed; absent = only the
    /// scheduled crashes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtbf_s: Option<f64>,
    /// Seconds a crashed replica is down before it takes requests again, with empty caches (≥ 0).
    #[serde(default = "default_restart")]
    pub restart_s: f64,
    /// How many times a request that was on a crashed replica is routed again (Dynamo's
    /// `migration_limit`); a request lost more often fails. 0 = lost requests fail.
    #[serde(default = "default_retries")]
    pub max_retries: u32,
    /// Replicas that run slow for a while, up and routable: `{replica, factor, from_s, until_s}`
    /// each; every step the replica starts in `[from_s, until_s)` takes `factor` times as long.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slowdowns: Vec<Slowdown>,
    /// Share of KV eviction events that never reach the router, in [0, 1): each one is dropped
    /// with this probability (a draw from the run's seed); 0 = every event arrives.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kv_event_loss: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// One replica running slow for a while.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Slowdown {
    /// The replica (0-based, as in `replicas`; with autoscaling, a slot below `max_replicas`).
    pub replica: u32,
    /// How many times as long each of its steps takes, in [1, 1000].
    pub factor: f64,
    /// When it starts, seconds from the start of the run (default 0).
    #[serde(default)]
    pub from_s: f64,
    /// When it ends (absent: never), > `from_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_s: Option<f64>,
}

impl Slowdown {
    /// The factor on a step of this slowdown's replica starting at `at_s` (1 outside the window).
    pub fn factor_at(&self, at_s: f64) -> f64 {
        if at_s >= self.from_s && self.until_s.is_none_or(|u| at_s < u) { self.factor } else { 1.0 }
    }
}

/// One scheduled crash.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Crash {
    /// The replica (0-based, as in `replicas`; with autoscaling, a slot below `max_replicas`).
    pub replica: u32,
    /// When, seconds from the start.
    pub at_s: f64,
}

/// `{path}.replica` names one of the cluster's `replicas` (0-based).
fn replica_index(path: &str, replica: u32, replicas: u32) -> Result<(), FieldError> {
    if replica >= replicas {
        return Err(FieldError::new(
            &format!("{path}.replica"),
            format!("is {replica} but the cluster has {replicas} replicas (indices 0..{replicas})"),
            format!("use a replica index below {replicas}"),
        ));
    }
    Ok(())
}

/// `field` is a time from the start of the run: ≥ 0 and on the clock (`example` in the fix).
fn time_from_start(field: &str, v: f64, example: u32) -> Result<(), FieldError> {
    if !(v >= 0.0) {
        return Err(FieldError::new(field, format!("must be ≥ 0 (got {v:?})"), format!("use e.g. {example}")));
    }
    fits_clock(field, v, &format!("use e.g. {example} (seconds)"))
}

fn default_restart() -> f64 {
    60.0
}
fn default_retries() -> u32 {
    1
}

impl Failures {
    /// Checks the section against the cluster's `replicas`.
    /// Whether any replica may crash (scheduled or at random).
    pub fn has_crashes(&self) -> bool {
        !self.crashes.is_empty() || self.mtbf_s.is_some()
    }

    pub fn validate(&self, replicas: u32) -> Result<(), FieldError> {
        if self.crashes.is_empty() && self.mtbf_s.is_none() && self.slowdowns.is_empty() && self.kv_event_loss == 0.0 {
            return Err(FieldError::new(
                "crashes",
                "no crash is scheduled, `mtbf_s` is absent, no replica slows down and no KV event is lost: nothing would fail",
                "add `crashes: [{replica: 0, at_s: 30}]`, `mtbf_s: 3600`, `slowdowns: [{replica: 0, factor: 2}]` or `kv_event_loss: 0.05`, or drop `failures:`",
            ));
        }
        if !(0.0..1.0).contains(&self.kv_event_loss) {
            return Err(FieldError::new(
                "kv_event_loss",
                format!("must be in [0, 1) (got {:?})", self.kv_event_loss),
                "use the share of eviction events lost, e.g. 0.05",
            ));
        }
        for (i, d) in self.slowdowns.iter().enumerate() {
            let path = format!("slowdowns[{i}]");
            replica_index(&path, d.replica, replicas)?;
            if !(1.0..=1000.0).contains(&d.factor) {
                return Err(FieldError::new(
                    &format!("{path}.factor"),
                    format!("must be in [1, 1000] (got {:?})", d.factor),
                    "use how many times as long a step takes, e.g. 3",
                ));
            }
            time_from_start(&format!("{path}.from_s"), d.from_s, 60)?;
            if let Some(u) = d.until_s
                && !(u > d.from_s && u.is_finite())
            {
                return Err(FieldError::new(
                    &format!("{path}.until_s"),
                    format!("must be after from_s = {} (got {u:?})", d.from_s),
                    "use a later time, or leave it out for a slowdown that lasts the run",
                ));
            }
        }
        for (i, c) in self.crashes.iter().enumerate() {
            let path = format!("crashes[{i}]");
            replica_index(&path, c.replica, replicas)?;
            time_from_start(&format!("{path}.at_s"), c.at_s, 30)?;
        }
        if let Some(m) = self.mtbf_s {
            if !(m > 0.0) {
                return Err(FieldError::new("mtbf_s", format!("must be positive (got {m:?})"), "use e.g. 3600"));
            }
            fits_clock("mtbf_s", m, "use e.g. 3600 (seconds)")?;
        }
        if !(self.restart_s >= 0.0) {
            return Err(FieldError::new("restart_s", format!("must be ≥ 0 (got {:?})", self.restart_s), "use e.g. 60"));
        }
        fits_clock("restart_s", self.restart_s, "use e.g. 60 (seconds)")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bad slowdowns are refused naming the entry and field: a replica past the cluster, a factor
    /// below 1, a window that ends before it starts; slowdowns alone are enough to keep the section.
    #[test]
    fn bad_slowdowns_are_refused_naming_the_field() {
        let check = |yaml: &str| {
            let f: Failures = serde_norway::from_str(yaml).unwrap();
            f.validate(4).map_err(|e| (e.path, e.message))
        };
        assert_eq!(check("slowdowns: [{replica: 3, factor: 2, from_s: 5, until_s: 9}]"), Ok(()));
        let (path, message) = check("slowdowns: [{replica: 0, factor: 2}, {replica: 4, factor: 2}]").unwrap_err();
        assert_eq!(path, "slowdowns[1].replica", "{message}");
        let (path, message) = check("slowdowns: [{replica: 0, factor: 0.5}]").unwrap_err();
        assert_eq!(path, "slowdowns[0].factor");
        assert!(message.contains("[1, 1000]"), "{message}");
        let (path, _) = check("slowdowns: [{replica: 0, factor: 2, from_s: 10, until_s: 10}]").unwrap_err();
        assert_eq!(path, "slowdowns[0].until_s");
        let (path, _) = check("slowdowns: [{replica: 0, factor: 2, from_s: -1}]").unwrap_err();
        assert_eq!(path, "slowdowns[0].from_s");
        assert!(serde_norway::from_str::<Failures>("slowdowns: [{replica: 0, factr: 2}]").is_err(), "unknown field");
        assert_eq!(check("kv_event_loss: 0.05"), Ok(()), "a lossy event bus alone keeps the section");
        let (path, message) = check("kv_event_loss: 1").unwrap_err();
        assert_eq!(path, "kv_event_loss", "{message}");
    }
}
