//! The `compound:` section (the compound-AI world). Filled in by the compound-world issue.

use serde::{Deserialize, Serialize};

use super::FieldError;

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct CompoundSpec {}

impl CompoundSpec {
    pub fn validate(&self) -> Result<(), FieldError> {
        Err(FieldError::new("", "the compound world is not built yet", "use a dispatch workload"))
    }
}
