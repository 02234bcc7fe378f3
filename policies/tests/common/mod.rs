//! What the policy tests share.

use routelab_policy_api::{CostModel, Roofline};

/// Mistral-7B on one A6000 (the step model's calibration, docs/architecture.md: 112 TFLOP/s
/// effective, 80% of 768 GB/s).
pub fn a6000_mistral() -> CostModel {
    let params = 7_241_732_096.0;
    CostModel::roofline(Roofline {
        flops_per_s: 112e12,
        bytes_per_s: 0.8 * 768e9,
        linear_flops_per_token: 2.0 * params,
        attention_flops_per_pair: 4.0 * 32.0 * 4096.0,
        weight_bytes: 2.0 * params,
        kv_bytes_per_token: 131_072.0,
        step_overhead_s: 0.0004,
    })
}
