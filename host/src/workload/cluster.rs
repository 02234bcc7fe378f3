//! The `cluster:` section (the LLM cluster world). Filled in by the cluster-world issue.

use serde::{Deserialize, Serialize};

use super::FieldError;

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {}

impl ClusterSpec {
    pub fn validate(&self) -> Result<(), FieldError> {
        Err(FieldError::new("", "the cluster world is not built yet", "use a dispatch workload"))
    }
}
