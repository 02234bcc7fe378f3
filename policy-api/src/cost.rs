//! Pricing a step with a [`CostModel`]: `max(flops / flops_per_s, bytes / bytes_per_s) + overhead`.

use crate::CostModel;

/// What one step of a replica computes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepShape {
    /// Tokens processed: prefill chunk tokens plus one per decoding request.
    pub tokens: u64,
    /// (new token, context token) attention pairs, causal pairs inside the chunk included.
    pub attention_pairs: f64,
    /// Context tokens whose KV the step reads.
    pub kv_read_tokens: u64,
    /// New tokens whose KV the step writes.
    pub kv_written_tokens: u64,
}

impl StepShape {
    /// `new_tokens` of prefill on top of `context_tokens` already in the KV cache.
    pub fn prefill(new_tokens: u64, context_tokens: u64) -> Self {
        let n = new_tokens as f64;
        Self {
            tokens: new_tokens,
            attention_pairs: n * context_tokens as f64 + n * (n + 1.0) / 2.0,
            kv_read_tokens: context_tokens + new_tokens,
            kv_written_tokens: new_tokens,
        }
    }

    /// One decode token for each of `batch` requests whose contexts add up to `context_tokens`.
    pub fn decode(batch: u64, context_tokens: u64) -> Self {
        Self {
            tokens: batch,
            attention_pairs: context_tokens as f64,
            kv_read_tokens: context_tokens,
            kv_written_tokens: batch,
        }
    }

    /// Two shapes run as one step (a decode batch with a prefill chunk piggybacked).
    pub fn merge(self, other: Self) -> Self {
        Self {
            tokens: self.tokens + other.tokens,
            attention_pairs: self.attention_pairs + other.attention_pairs,
            kv_read_tokens: self.kv_read_tokens + other.kv_read_tokens,
            kv_written_tokens: self.kv_written_tokens + other.kv_written_tokens,
        }
    }
}

impl CostModel {
    /// Seconds for one step of the given shape. An empty step costs nothing.
    pub fn step_time_s(&self, step: &StepShape) -> f64 {
        if step.tokens == 0 {
            return 0.0;
        }
        let flops =
            self.linear_flops_per_token * step.tokens as f64 + self.attention_flops_per_pair * step.attention_pairs;
        let bytes = self.weight_bytes + self.kv_bytes_per_token * (step.kv_read_tokens + step.kv_written_tokens) as f64;
        (flops / self.flops_per_s).max(bytes / self.bytes_per_s) + self.step_overhead_s
    }

    /// Seconds to prefill `new_tokens` on top of `context_tokens` cached ones, alone, in one step.
    pub fn prefill_time_s(&self, new_tokens: u64, context_tokens: u64) -> f64 {
        self.step_time_s(&StepShape::prefill(new_tokens, context_tokens))
    }

    /// Seconds of one decode step for `batch` requests whose contexts add up to `context_tokens`.
    pub fn decode_step_time_s(&self, batch: u64, context_tokens: u64) -> f64 {
        self.step_time_s(&StepShape::decode(batch, context_tokens))
    }
}
