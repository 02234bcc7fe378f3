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
    /// `cluster.pools`' step models, in order (empty without pools).
    pub pools: Vec<StepModel>,
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
        Ok(StepModels { main, pd, pools: spec.pool_step_models()? })
    }

    /// The step model with the least KV capacity: what every request must fit (a request may
    /// be sent to any pool, and on a disaggregated cluster passes through two).
    pub fn tightest(&self) -> &StepModel {
        self.all().min_by_key(|sm| sm.kv_capacity_tokens).expect("the main step model")
    }

    /// Every step model a replica of the cluster may run: the main one, the P/D pools', the GPU
    /// pools'.
    pub fn all(&self) -> impl Iterator<Item = &StepModel> {
        std::iter::once(&self.main)
            .chain(self.pd.iter().flat_map(|p| [&p.prefill, &p.decode, &p.mixed]))
            .chain(&self.pools)
    }
}
