//! `routelab step-model`: what the step model is made of, and what it predicts for a few prefills
//! and decode steps.

use std::fmt::Write as _;

use super::{Chunk, DoesNotFit, Step, StepModel};

/// The `routelab step-model` text: KV bytes per token, KV capacity, prefill times for a few
/// lengths, decode step times for a few batch sizes and contexts (memory_fraction 0.9, default
/// efficiency). Fails for unknown names or a model that does not fit.
pub fn describe(gpu_name: &str, model_name: &str, tp: u32) -> Result<String, DoesNotFit> {
    if ![1, 2, 4, 8].contains(&tp) {
        return Err(DoesNotFit {
            message: format!("tp must be 1, 2, 4 or 8 (got {tp})"),
            fix: "pass --tp 1, 2, 4 or 8".into(),
        });
    }
    let sm = StepModel::from_catalog(gpu_name, model_name, tp, 0.9)?;
    Ok(describe_model(&sm))
}

/// [`describe`] for an already resolved model.
pub fn describe_model(sm: &StepModel) -> String {
    let (g, m, e, c) = (&sm.gpu, &sm.model, &sm.efficiency, &sm.cost);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "step model: {} on {} × {} (tp {}), memory_fraction {}",
        m.name, sm.tp, g.name, sm.tp, sm.memory_fraction
    );
    match &sm.calibration {
        None => {
            let _ = writeln!(
                s,
                "  compute   {:.1} TFLOP/s effective = {} TFLOP/s peak × mfu {} × tp {}",
                c.flops_per_s / 1e12,
                g.tflops,
                e.mfu,
                sm.tp
            );
            let _ = writeln!(
                s,
                "  bandwidth {:.1} GB/s effective = {} GB/s peak × mbu {} × tp {}",
                c.bytes_per_s / 1e9,
                g.bandwidth_gb_s,
                e.mbu,
                sm.tp
            );
            let _ = writeln!(
                s,
                "  step overhead {:.3} ms{}",
                c.step_overhead_s * 1e3,
                if sm.tp > 1 { " (includes 2 all-reduces per layer)" } else { "" }
            );
        }
        Some(cal) => {
            let _ = writeln!(s, "  priced by the calibration '{}' ({})", cal.name, cal.source);
            let fit = |k: &str| {
                cal.fit.get(k).map_or(String::new(), |f| {
                    format!(
                        "  [fit: median {:.1}%, P90 {:.1}% over {} points]",
                        f.median_error * 100.0,
                        f.p90_error * 100.0,
                        f.points
                    )
                })
            };
            let _ = writeln!(
                s,
                "  dense, per layer      {:.0} GB/s reading weights, {:.0} TFLOP/s, base {:.3} × the weight read{}",
                cal.dense_gb_s,
                cal.dense_tflops,
                cal.dense_base_share,
                fit("dense")
            );
            let _ = writeln!(
                s,
                "  attention, per layer  {:.0} TFLOP/s prefill, {:.0} GB/s decode ({:.0} per query head beside a prefill), {:.1} µs + {:.2} µs/decode{}",
                cal.attention_tflops,
                cal.attention_gb_s,
                cal.attention_mixed_head_gb_s,
                cal.attention_base_s * 1e6,
                cal.attention_per_decode_s * 1e6,
                fit("attention")
            );
            let _ = writeln!(
                s,
                "  LM head + sampler     {:.0} GB/s + {:.2} µs/sequence{}",
                cal.head_gb_s,
                cal.head_per_sequence_s * 1e6,
                fit("head")
            );
            let _ = writeln!(
                s,
                "  per step              {:.3} ms + {:.1} µs per layer",
                cal.step_overhead_s * 1e3,
                cal.layer_overhead_s * 1e6
            );
            if sm.tp > 1 {
                let _ = writeln!(
                    s,
                    "  all-reduce            {:.0} µs + activations at {:.0} GB/s, 2 per layer",
                    cal.allreduce_s * 1e6,
                    cal.allreduce_gb_s
                );
            }
            let _ = writeln!(
                s,
                "  per request           {:.1} ms to the first token, {:.1} µs per later token",
                cal.request_overhead_s * 1e3,
                cal.output_token_s * 1e6
            );
        }
    }
    let _ = writeln!(
        s,
        "  weights {:.2} GB ({} parameters × {} bytes)",
        c.weight_bytes / 1e9,
        m.parameters,
        m.bytes_per_element
    );
    let _ = writeln!(
        s,
        "  KV per token {} bytes = 2 × {} layers × {} kv heads × {} head dim × {} bytes",
        c.kv_bytes_per_token, m.layers, m.kv_heads, m.head_dim, m.bytes_per_element
    );
    let _ = writeln!(
        s,
        "  KV capacity {} tokens = floor(({} GB × {} × {} − {:.2} GB) / {} bytes)",
        sm.kv_capacity_tokens,
        g.memory_gb,
        sm.tp,
        sm.memory_fraction,
        c.weight_bytes / 1e9,
        c.kv_bytes_per_token
    );
    let _ = writeln!(s, "\nprefill, alone in one step (no cached context)");
    let _ = writeln!(s, "  {:>8}  {:>10}  {:>12}", "tokens", "time [s]", "tokens/s");
    for n in [512u64, 2_100, 8_000, 21_000] {
        let t = sm.pricer.step_time_s(&Step::mixed(0, 0, &[Chunk { new_tokens: n, context_tokens: 0 }]));
        let _ = writeln!(s, "  {:>8}  {:>10.4}  {:>12.0}", n, t, n as f64 / t);
    }
    let _ = writeln!(s, "\ndecode step (one token per running request)");
    let _ = writeln!(s, "  {:>6}  {:>9}  {:>10}  {:>16}", "batch", "context", "step [ms]", "per request [ms]");
    for (batch, ctx) in [(1u64, 100u64), (1, 2_000), (8, 2_000), (32, 2_000), (64, 2_000), (32, 8_000)] {
        let t = sm.pricer.step_time_s(&Step::decode(batch, batch * ctx));
        let _ = writeln!(s, "  {:>6}  {:>9}  {:>10.2}  {:>16.2}", batch, ctx, t * 1e3, t * 1e3 / batch as f64);
    }
    s
}

/// One prefill of a prompt of which some leading tokens are already cached, priced in the two
/// conventions people use (`routelab step-model --tokens N --cached M`, exercise 3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillPrice {
    /// Prompt tokens computed now (`tokens − cached`).
    pub new_tokens: u64,
    /// Prompt tokens already in the KV cache.
    pub cached_tokens: u64,
    /// What the simulator charges: every new token attends to the cached ones too (and their KV is
    /// read).
    pub with_cached_attention_s: f64,
    /// The back-of-the-envelope convention (the course lecture's): the cached part is ignored, as
    /// if the new tokens were a prompt of their own.
    pub without_cached_attention_s: f64,
}

impl StepModel {
    /// [`PrefillPrice`] of a `tokens`-token prompt whose first `cached` tokens are cached, alone in
    /// one step. `cached` above `tokens` is the caller's error to report; here it is clamped.
    pub fn prefill_price(&self, tokens: u64, cached: u64) -> PrefillPrice {
        let cached = cached.min(tokens);
        let new_tokens = tokens - cached;
        let time =
            |context_tokens: u64| self.pricer.step_time_s(&Step::mixed(0, 0, &[Chunk { new_tokens, context_tokens }]));
        PrefillPrice {
            new_tokens,
            cached_tokens: cached,
            with_cached_attention_s: time(cached),
            without_cached_attention_s: time(0),
        }
    }
}

/// The `routelab step-model --tokens N --cached M` text: one prefill in both conventions.
pub fn describe_prefill(sm: &StepModel, tokens: u64, cached: u64) -> String {
    let p = sm.prefill_price(tokens, cached);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nprefill of a {tokens}-token prompt with {} cached: {} new tokens, alone in one step",
        p.cached_tokens, p.new_tokens
    );
    let _ = writeln!(
        s,
        "  {:.3} s  with attention over the cached part (each new token attends to all {} tokens before it; \
         what the simulator charges)",
        p.with_cached_attention_s, p.cached_tokens
    );
    let _ = writeln!(
        s,
        "  {:.3} s  without it (the {} new tokens priced as a prompt of their own; the back-of-the-envelope \
         convention the course lecture uses)",
        p.without_cached_attention_s, p.new_tokens
    );
    s
}
