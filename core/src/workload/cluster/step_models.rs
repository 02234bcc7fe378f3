//! Every step model a cluster's replicas run, resolved once from its spec (when the workload is
//! prepared) and shared by every run, context and check that prices a step.

use super::ClusterSpec;
use crate::step_model::StepModel;
use crate::workload::FieldError;

/// A cluster's step models: its own, its disaggregated pools' and its GPU pools'.
#[derive(Clone, Debug)]
pub struct StepModels {
    /// `cluster.gpu`, `model` and `tp`'s: every replica's on a cluster without pools or
    /// disaggregation (and the one a replica's scheduler is told of).
    pub main: StepModel,
    /// A disaggregated cluster's pools.
    pub pd: Option<PdStepModels>,
    /// `cluster.pools`' step models, in order (empty without pools); or, when `cluster.models`
    /// give their replicas hardware of their own, the models' (`by_model`).
    pub pools: Vec<StepModel>,
    /// `pools` are `cluster.models`' (a request runs on its own model's replicas only).
    pub by_model: bool,
}

/// The step models of a disaggregated cluster's prefill, decode and mixed pools.
#[derive(Clone, Debug)]
pub struct PdStepModels {
    pub prefill: StepModel,
    pub decode: StepModel,
    /// The mixed pool's; the decode pool's when there is no mixed pool.
    pub mixed: StepModel,
}

impl StepModels {
    /// Resolves every step model of `spec` (its catalog entries, calibrations and per-pool
    /// overrides): the first that cannot be had is the error, with its field.
    pub fn resolve(spec: &ClusterSpec) -> Result<Self, FieldError> {
        let main = spec.step_model()?;
        let pd = match &spec.disaggregation {
            None => None,
            Some(d) => {
                let (prefill, decode) = d.step_models(spec)?;
                let mixed = d.mixed_step_model(spec)?.unwrap_or_else(|| decode.clone());
                Some(PdStepModels { prefill, decode, mixed })
            }
        };
        let by_model = spec.pools.is_empty() && spec.pool_count() > 0;
        Ok(StepModels { main, pd, pools: spec.pool_step_models()?, by_model })
    }

    /// The served step model with the least KV capacity: what a request must fit when it may be
    /// sent to any replica (and on a disaggregated cluster it passes through two pools).
    pub fn tightest(&self) -> &StepModel {
        self.served().min_by_key(|sm| sm.kv_capacity_tokens).expect("a served step model")
    }

    /// What a request of model `model` (its index in `cluster.models`; 0 with one model) must
    /// fit: its own model's replicas' when the models have hardware of their own, else
    /// [`Self::tightest`].
    pub fn fit_for(&self, model: usize) -> &StepModel {
        match self.pools.get(model) {
            Some(sm) if self.by_model => sm,
            _ => self.tightest(),
        }
    }

    /// What a trace row must fit before its model is drawn: the roomiest model's replicas when
    /// the models have hardware of their own (a row no model holds is refused at its line; one
    /// drawn onto a model too small for it is refused once the draw is made, by
    /// [`Self::fit_for`]), else [`Self::tightest`].
    pub fn row_fit(&self) -> &StepModel {
        if self.by_model {
            self.pools.iter().max_by_key(|sm| sm.kv_capacity_tokens).expect("a model's step model")
        } else {
            self.tightest()
        }
    }

    /// Every step model some replica runs: the P/D pools' on a disaggregated cluster, else the
    /// GPU pools' (or the models') when there are any, else the main one. With pools the main
    /// step model is only what routers are told of: no replica runs it, so no request has to
    /// fit it.
    pub fn served(&self) -> impl Iterator<Item = &StepModel> {
        let pd = self.pd.iter().flat_map(|p| [&p.prefill, &p.decode, &p.mixed]);
        let main = (self.pd.is_none() && self.pools.is_empty()).then_some(&self.main);
        main.into_iter().chain(pd).chain(if self.pd.is_none() { &self.pools[..] } else { &[] })
    }
}
