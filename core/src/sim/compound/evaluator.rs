//! The host's side of a selection: the [`Evaluator`] a selector borrows. It runs allocations on
//! the training set only and counts every call against the budget.

use abi_stable::std_types::{RErr, RNone, ROk, ROption, RResult, RSlice, RSome};
use routelab_policy_api::{Evaluation, Evaluator, PolicyError};

use super::world::World;

pub struct TrainingEvaluator<'w> {
    world: &'w World,
    evaluations: u64,
    budget: Option<u64>,
}

impl<'w> TrainingEvaluator<'w> {
    pub fn new(world: &'w World, budget: Option<u64>) -> Self {
        Self { world, evaluations: 0, budget }
    }

    pub fn evaluations(&self) -> u64 {
        self.evaluations
    }
}

impl Evaluator for TrainingEvaluator<'_> {
    fn evaluate(&mut self, allocation: RSlice<'_, u32>) -> RResult<Evaluation, PolicyError> {
        let allocation = allocation.as_slice();
        if !self.world.is_allocation(allocation) {
            return RErr(PolicyError::failed(format!(
                "evaluate: {allocation:?} is not an allocation: it needs one model index in 0..{} for each of the {} modules",
                self.world.models.len(),
                self.world.modules()
            )));
        }
        if let Some(budget) = self.budget {
            if self.evaluations >= budget {
                return RErr(PolicyError::failed(format!(
                    "evaluate: the budget of {budget} evaluated allocations is spent"
                )));
            }
        }
        let evaluation = self.world.evaluate_training(allocation, self.evaluations);
        self.evaluations += 1;
        ROk(evaluation)
    }

    fn evaluations(&self) -> u64 {
        self.evaluations
    }

    fn remaining(&self) -> ROption<u64> {
        match self.budget {
            Some(b) => RSome(b.saturating_sub(self.evaluations)),
            None => RNone,
        }
    }
}
