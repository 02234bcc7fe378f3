//! Pricing a step: the host's step-time model as a policy sees it.
//!
//! A [`CostModel`] is the host's own pricer behind an `abi_stable` trait object ([`StepPricer`]):
//! a router asks it what a step costs and gets exactly the host's answer, whether the host times
//! its replicas with a roofline ([`Roofline`]) or with a model fitted to measurements. The
//! pricer's vtable is a prefix type, so a later patch can append a method (with a default body a
//! library built earlier runs) without a rebuild.
//!
//! [`Roofline`] is plain data — `max(flops / flops_per_s, bytes / bytes_per_s) + overhead` —
//! that any side can build and price with: tests, exercises, and hosts that have nothing better.

use std::fmt;

use abi_stable::{
    StableAbi, sabi_trait,
    sabi_trait::TD_Opaque,
    std_types::{RArc, RSlice, Tuple2},
};

/// One prefill chunk of a step: `new_tokens` computed on top of `context_tokens` already in the
/// KV cache (earlier chunks and the cached prefix).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Chunk {
    /// Tokens this chunk computes.
    pub new_tokens: u64,
    /// Tokens of the same request before the chunk.
    pub context_tokens: u64,
}

/// What one step of a replica runs: `decodes` decoding requests whose contexts add up to
/// `decode_context_tokens`, and the prefill chunks batched with them.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct Step<'a> {
    /// Requests that decode one token in this step.
    pub decodes: u64,
    /// Their context lengths, summed.
    pub decode_context_tokens: u64,
    /// Prefill chunks in the step, one per request.
    pub chunks: RSlice<'a, Chunk>,
}

impl<'a> Step<'a> {
    /// A decode-only step.
    pub const fn decode(batch: u64, context_tokens: u64) -> Self {
        Self { decodes: batch, decode_context_tokens: context_tokens, chunks: RSlice::EMPTY }
    }
    /// A step of `decodes` decoding requests and `chunks`.
    pub const fn mixed(decodes: u64, decode_context_tokens: u64, chunks: &'a [Chunk]) -> Self {
        Self { decodes, decode_context_tokens, chunks: RSlice::from_slice(chunks) }
    }
}

/// A step-time model. Hosts implement it; policies call it through [`CostModel`].
#[sabi_trait]
pub trait StepPricer: Clone + Send + Sync + 'static {
    /// Seconds for `step`; an empty step costs nothing.
    fn step_time_s(&self, step: Step<'_>) -> f64;
    /// Seconds added to a request outside the steps: to its first token, and to each later token
    /// (a calibrated engine's API and detokenisation time; 0 for a roofline).
    #[sabi(last_prefix_field)]
    fn per_request_s(&self) -> Tuple2<f64, f64>;
}

/// The replicas' step-time model as the host gives it to a policy (a shared, cheaply cloned
/// handle; the pricing runs in the host's code).
#[repr(transparent)]
#[derive(StableAbi, Clone)]
pub struct CostModel {
    pricer: StepPricer_TO<RArc<()>>,
}

impl CostModel {
    /// A cost model priced by `pricer`.
    pub fn new(pricer: impl StepPricer + 'static) -> Self {
        Self { pricer: StepPricer_TO::from_ptr(RArc::new(pricer), TD_Opaque) }
    }

    /// A roofline cost model.
    pub fn roofline(roofline: Roofline) -> Self {
        Self::new(roofline)
    }

    /// Seconds for `step`.
    #[inline]
    pub fn step_time(&self, step: Step<'_>) -> f64 {
        self.pricer.step_time_s(step)
    }

    /// Seconds to prefill `new_tokens` on top of `context_tokens` cached ones, alone, in one step.
    #[inline]
    pub fn prefill_time_s(&self, new_tokens: u64, context_tokens: u64) -> f64 {
        let chunk = [Chunk { new_tokens, context_tokens }];
        self.pricer.step_time_s(Step::mixed(0, 0, &chunk))
    }

    /// Seconds of one decode step for `batch` requests whose contexts add up to `context_tokens`.
    #[inline]
    pub fn decode_step_time_s(&self, batch: u64, context_tokens: u64) -> f64 {
        self.pricer.step_time_s(Step::decode(batch, context_tokens))
    }

    /// Seconds added to a request's first token and to each later token, outside the steps.
    pub fn per_request_s(&self) -> (f64, f64) {
        self.pricer.per_request_s().into_tuple()
    }
}

impl fmt::Debug for CostModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CostModel { .. }")
    }
}

/// A roofline of one GPU (or tensor-parallel group) running one model: plain data.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct Roofline {
    /// Effective compute rate, FLOP/s (peak × MFU × tensor-parallel degree).
    pub flops_per_s: f64,
    /// Effective memory bandwidth, bytes/s (peak × MBU × tensor-parallel degree).
    pub bytes_per_s: f64,
    /// Dense FLOPs per token: 2 × parameters.
    pub linear_flops_per_token: f64,
    /// Attention FLOPs per (new token, context token) pair: 4 × layers × heads × head_dim.
    pub attention_flops_per_pair: f64,
    /// Bytes of weights read once per step.
    pub weight_bytes: f64,
    /// KV cache bytes per token: 2 × layers × kv_heads × head_dim × bytes per element.
    pub kv_bytes_per_token: f64,
    /// Fixed time added to every step (kernel launches, scheduling, tensor-parallel communication).
    pub step_overhead_s: f64,
}

/// What one step computes, in the roofline's terms.
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

    /// The shape of `step`: its decodes merged with each chunk, in order.
    pub fn of(step: &Step<'_>) -> Self {
        let mut shape = Self::decode(step.decodes, step.decode_context_tokens);
        for c in step.chunks.iter() {
            shape = shape.merge(Self::prefill(c.new_tokens, c.context_tokens));
        }
        shape
    }
}

impl Roofline {
    /// Seconds for one step of the given shape. An empty step costs nothing.
    pub fn shape_time_s(&self, step: &StepShape) -> f64 {
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
        self.shape_time_s(&StepShape::prefill(new_tokens, context_tokens))
    }

    /// Seconds of one decode step for `batch` requests whose contexts add up to `context_tokens`.
    pub fn decode_step_time_s(&self, batch: u64, context_tokens: u64) -> f64 {
        self.shape_time_s(&StepShape::decode(batch, context_tokens))
    }
}

impl StepPricer for Roofline {
    fn step_time_s(&self, step: Step<'_>) -> f64 {
        self.shape_time_s(&StepShape::of(&step))
    }
    fn per_request_s(&self) -> Tuple2<f64, f64> {
        Tuple2(0.0, 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roofline() -> Roofline {
        Roofline {
            flops_per_s: 1e14,
            bytes_per_s: 1e12,
            linear_flops_per_token: 1.4e10,
            attention_flops_per_pair: 5e5,
            weight_bytes: 1.4e10,
            kv_bytes_per_token: 1.3e5,
            step_overhead_s: 1e-3,
        }
    }

    /// Through the trait object a router prices exactly as the roofline does, bit for bit.
    #[test]
    fn the_handle_prices_as_the_roofline_it_wraps() {
        let r = roofline();
        let c = CostModel::roofline(r);
        for (n, ctx) in [(1, 0), (512, 0), (512, 4096), (8192, 100)] {
            assert_eq!(c.prefill_time_s(n, ctx).to_bits(), r.prefill_time_s(n, ctx).to_bits());
        }
        for (b, ctx) in [(0, 0), (1, 10), (64, 200_000)] {
            assert_eq!(c.decode_step_time_s(b, ctx).to_bits(), r.decode_step_time_s(b, ctx).to_bits());
        }
        assert_eq!(c.decode_step_time_s(0, 0), 0.0);
        let chunks = [Chunk { new_tokens: 256, context_tokens: 0 }, Chunk { new_tokens: 128, context_tokens: 900 }];
        let mixed = Step::mixed(8, 4000, &chunks);
        let by_hand = StepShape::decode(8, 4000).merge(StepShape::prefill(256, 0)).merge(StepShape::prefill(128, 900));
        assert_eq!(c.step_time(mixed), r.shape_time_s(&by_hand));
        assert!(c.step_time(mixed) > c.decode_step_time_s(8, 4000));
        assert_eq!(c.clone().per_request_s(), (0.0, 0.0));
    }
}
