//! Several models on one cluster (`cluster.models`, `workload/cluster/models.rs`): one router per
//! model, each shown only its model's replicas, as the field's gateways route a request to its
//! model's pool and let that pool's own picker choose.
//!
//! The routable set of a multi-model cluster is fixed (the workload refuses a scaler, crashes
//! and P/D pools with `models:`), every replica in slot order, so model `m`'s replicas are one
//! run of router indices, `bounds[m]..bounds[m + 1]`: its router sees that slice of the views
//! and answers an index into it, bounded by its own replica count ([`RouterHandle::route`]
//! refuses anything past it, naming the policy) — a replica of another model cannot be named.
//! Completions and eviction notices reach the router of the replica's model, by its index there.

use std::ops::Range;

use routelab_policy_api::{RouterBox, World};

use super::{ClusterSim, SetupError};
use crate::handle::RouterHandle;
use crate::ids::{ReplicaId, RouterIndex};

/// The routers of models 1.. (model 0's is the world's `router`) and where each model's
/// replicas start.
pub(super) struct Models {
    others: Vec<RouterHandle>,
    /// `models + 1` router indices: model `m` has `bounds[m]..bounds[m + 1]`.
    bounds: Vec<u32>,
    /// Per slot: its model.
    of_slot: Vec<u16>,
    /// The models' names (for the per-model metric keys).
    pub(super) names: Vec<String>,
}

impl Models {
    /// `spec`'s models (`None` with one model).
    pub(super) fn of(spec: &crate::workload::cluster::ClusterSpec) -> Option<Box<Self>> {
        if spec.models.len() < 2 {
            return None;
        }
        let bounds = spec.model_bounds();
        let of_slot = (0..spec.models.len())
            .flat_map(|m| std::iter::repeat_n(m as u16, (bounds[m + 1] - bounds[m]) as usize))
            .collect();
        let names = spec.models.iter().map(|m| m.name.clone()).collect();
        Some(Box::new(Self { others: Vec::new(), bounds, of_slot, names }))
    }
}

/// Model `m`'s router and its router indices (`routable` of them without models).
pub(super) fn router_of<'r>(
    router: &'r mut RouterHandle,
    models: Option<&'r mut Models>,
    m: usize,
    routable: usize,
) -> (&'r mut RouterHandle, ModelIndices) {
    match models {
        None => (router, ModelIndices(0..routable)),
        Some(ms) => {
            let range = ModelIndices(ms.bounds[m] as usize..ms.bounds[m + 1] as usize);
            if m == 0 { (router, range) } else { (&mut ms.others[m - 1], range) }
        }
    }
}

/// One model's replicas as router indices (a contiguous range of the routable set), which its
/// router numbers from 0: the one conversion between the two ([`ModelIndices::local`],
/// [`ModelIndices::router_index`]). Without models, the whole set, numbered as it is.
pub(super) struct ModelIndices(Range<usize>);

impl ModelIndices {
    /// The range of the views this model's router is shown.
    pub(super) fn views(&self) -> Range<usize> {
        self.0.clone()
    }

    /// Router index `k` (one of this model's) as its router numbers it. A draining replica's
    /// completions keep the index it had, which may now lie past the range's end; never below
    /// its start.
    pub(super) fn local(&self, k: RouterIndex) -> u32 {
        debug_assert!(k.index() >= self.0.start, "router index {} below its model's {:?}", k.index(), self.0);
        (k.index() - self.0.start) as u32
    }

    /// The router index of this model's candidate `i` (its router's answer).
    pub(super) fn router_index(&self, i: u32) -> RouterIndex {
        RouterIndex::new(self.0.start + i as usize)
    }
}

impl ClusterSim<'_> {
    /// Gives models 1.. their routers (`routers[i]` serves model `i + 1`; made with
    /// `router_context_for_model`). A cluster of several models runs only with all of them.
    pub fn with_model_routers(mut self, routers: Vec<RouterBox>) -> Result<Self, SetupError> {
        let label = self.router.label().to_string();
        if self.models.is_none() {
            if routers.is_empty() {
                return Ok(self);
            }
            return Err(SetupError::new("models", "routers for other models, but the cluster serves one", "drop them"));
        }
        let ms = self.models.as_deref_mut().expect("checked");
        if routers.len() + 2 != ms.bounds.len() {
            return Err(SetupError::new(
                "models",
                format!("{} routers for the {} models after the first", routers.len(), ms.bounds.len() - 2),
                "give one router per model after the first",
            ));
        }
        for (i, r) in routers.into_iter().enumerate() {
            let mut h = RouterHandle::new(r, ms.bounds[i + 2] - ms.bounds[i + 1], World::Cluster, &label);
            h.track_view_changes();
            ms.others.push(h);
        }
        Ok(self)
    }

    /// Whether every model has its router (a cluster of several models needs
    /// [`Self::with_model_routers`]).
    pub(super) fn models_ready(&self) -> bool {
        self.models.as_ref().is_none_or(|ms| ms.others.len() + 2 == ms.bounds.len())
    }

    /// The model of the replica in slot `slot` (0 with one model).
    pub(super) fn model_of_slot(&self, slot: ReplicaId) -> usize {
        self.models.as_ref().map_or(0, |ms| ms.of_slot[slot] as usize)
    }

    /// How many models the cluster serves.
    pub(super) fn model_count(&self) -> usize {
        self.models.as_ref().map_or(1, |ms| ms.bounds.len() - 1)
    }

    /// The router that sees router index `k` (of the whole routable set), and `k` in its own
    /// indices.
    pub(super) fn router_at(&mut self, k: RouterIndex) -> (&mut RouterHandle, usize) {
        let m = self.models.as_ref().map_or(0, |ms| ms.of_slot[self.routable[k]] as usize);
        let n = self.routable.len();
        let (router, range) = router_of(&mut self.router, self.models.as_deref_mut(), m, n);
        (router, range.local(k) as usize)
    }

    /// Every router's own figures: `router.<stat>` with one model; with several, each model's
    /// router's as `router.<model>.<stat>`.
    pub(super) fn router_report(&self) -> Result<Vec<(String, f64)>, crate::error::RunError> {
        let Some(ms) = &self.models else { return self.router.report() };
        let mut out = Vec::new();
        for (m, h) in std::iter::once(&self.router).chain(&ms.others).enumerate() {
            for (k, v) in h.report()? {
                let stat = k.strip_prefix("router.").unwrap_or(&k);
                out.push((format!("router.{}.{stat}", ms.names[m]), v));
            }
        }
        Ok(out)
    }
}

/// Each model's figures, added one record at a time (`model.<name>.*` metrics).
pub(super) struct ModelTally {
    names: Vec<String>,
    /// Per slot: its model (a record's replica is a slot).
    of_slot: Vec<u16>,
    classes: Vec<crate::workload::cluster::classes::ClassSpec>,
    slo: Option<crate::workload::slo::Slo>,
    per_model: Vec<OneModel>,
}

struct OneModel {
    requests: usize,
    finished: usize,
    met: usize,
    /// Finished requests served by a replica of another model (the host never does this; the
    /// tests read it).
    elsewhere: usize,
    ttft: crate::sketch::Dist,
    latency: crate::sketch::Dist,
}

impl Models {
    /// An empty tally of the models' figures.
    pub(super) fn tally(
        &self,
        exact: bool,
        classes: &[crate::workload::cluster::classes::ClassSpec],
        slo: Option<&crate::workload::slo::Slo>,
    ) -> ModelTally {
        let one = || OneModel {
            requests: 0,
            finished: 0,
            met: 0,
            elsewhere: 0,
            ttft: crate::sketch::Dist::new(exact),
            latency: crate::sketch::Dist::new(exact),
        };
        ModelTally {
            names: self.names.clone(),
            of_slot: self.of_slot.clone(),
            classes: classes.to_vec(),
            slo: slo.cloned(),
            per_model: self.names.iter().map(|_| one()).collect(),
        }
    }
}

impl ModelTally {
    /// Adds a request's record (held to its class's SLO, else the cluster's, else to finishing,
    /// as `slo_attainment` holds it).
    pub(super) fn add(&mut self, r: &super::RequestRecord) {
        let none = crate::workload::slo::Slo::default();
        let slo =
            self.classes.get(r.class as usize).and_then(|c| c.slo.as_ref()).or(self.slo.as_ref()).unwrap_or(&none);
        let ok = super::summary::met(r, slo);
        let m = &mut self.per_model[r.model as usize];
        m.requests += 1;
        m.met += ok as usize;
        if r.completed_at_s.is_finite() {
            m.finished += 1;
            m.ttft.push(r.first_token_at_s - r.arrived_at_s);
            m.latency.push(r.completed_at_s - r.arrived_at_s);
            m.elsewhere += (self.of_slot.get(r.replica as usize) != Some(&r.model)) as usize;
        }
    }

    /// Per model `model.<name>.requests`, `.finished`, `.slo_attainment` (share of its requests
    /// meeting their SLO, or finishing without one), `.ttft_mean_s`, `.ttft_p99_s`,
    /// `.latency_mean_s` (over its finished requests) and `.served_elsewhere` (finished on a
    /// replica of another model: 0 by construction).
    pub(super) fn push(mut self, out: &mut crate::metrics::Metrics) {
        for (name, m) in self.names.iter().zip(&mut self.per_model) {
            let share = if m.requests == 0 { f64::NAN } else { m.met as f64 / m.requests as f64 };
            out.push(format!("model.{name}.requests"), m.requests as f64);
            out.push(format!("model.{name}.finished"), m.finished as f64);
            out.push(format!("model.{name}.slo_attainment"), share);
            out.push(format!("model.{name}.ttft_mean_s"), m.ttft.mean());
            out.push(format!("model.{name}.ttft_p99_s"), m.ttft.quantile(0.99));
            out.push(format!("model.{name}.latency_mean_s"), m.latency.mean());
            out.push(format!("model.{name}.served_elsewhere"), m.elsewhere as f64);
        }
    }
}
