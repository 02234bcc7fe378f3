//! The catalog: GPUs by their datasheet peaks and models by their published configs.
//!
//! GPUs: dense fp16/bf16 tensor throughput (FP32 accumulate, no sparsity) and memory bandwidth.
//! `rtx-pro-6000` is the Blackwell Server Edition as measured in the shipped vLLM runs
//! (`workloads/ground-truth/`): 96 GB at 1,597 GB/s (the workstation card is listed at
//! 1,792 GB/s), 503.8 TFLOP/s dense bf16 (its 4,000 sparse FP4 TOPS halved for density and
//! twice more for FP8 and bf16).
//! `rtx4090`: 24 GB, 1,008 GB/s, 165.2 TFLOP/s (FP32 accumulate).
//! `b200` (HGX B200, 1,000 W): 180 GB (DGX B200 lists 1,440 GB over its 8 GPUs; the package
//! holds 192 GB), 8,000 GB/s HBM3e, 2,250 TFLOP/s dense bf16 (4,500 with sparsity), as NVIDIA's
//! Blackwell figures are tabulated at <https://glennklockwood.com/garden/processors/B200>. No
//! measurement of a B200 is shipped: it is priced by the roofline only.
//!
//! Models: parameters, layers, hidden size, heads, KV heads, head dimension and vocabulary from
//! each model's `config.json`. A mixture of experts (`qwen3-30b-a3b`) adds its experts (`moe`:
//! `num_experts` 128, `num_experts_per_tok` 8, `moe_intermediate_size` 768 in
//! Qwen/Qwen3-30B-A3B-Instruct-2507's config.json; 48 layers, hidden 2048, 32 heads, 4 KV heads,
//! head_dim 128, vocabulary 151,936, untied embeddings, 30,532,122,624 parameters — the shapes
//! add up to that count exactly). The calibrated step model prices its experts by the ones a
//! step touches (see `calibrated`); the roofline computes on the active parameters but reads all
//! the weights every step. Neither models expert load imbalance or the lock-step of
//! data-parallel MoE engines (an idle engine runs dummy steps to join the others' collectives).

use super::{Gpu, Model, Moe};

pub const GPU_NAMES: [&str; 9] =
    ["a6000", "a100-40", "a100-80", "h100", "h200", "b200", "l40s", "rtx-pro-6000", "rtx4090"];
pub const MODEL_NAMES: [&str; 8] = [
    "mistral-7b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-2-70b",
    "qwen3-32b",
    "qwen3-30b-a3b",
];

/// A catalog GPU by name (datasheet peaks: dense fp16 tensor FLOP/s, HBM/GDDR bandwidth).
pub fn gpu(name: &str) -> Option<Gpu> {
    let (memory_gb, bandwidth_gb_s, tflops) = match name {
        "a6000" => (48.0, 768.0, 154.8),
        "a100-40" => (40.0, 1555.0, 312.0),
        "a100-80" => (80.0, 2039.0, 312.0),
        "h100" => (80.0, 3350.0, 989.5),
        "h200" => (141.0, 4800.0, 989.5),
        "b200" => (180.0, 8000.0, 2250.0),
        "l40s" => (48.0, 864.0, 362.05),
        "rtx-pro-6000" => (96.0, 1597.0, 503.8),
        "rtx4090" => (24.0, 1008.0, 165.2),
        _ => return None,
    };
    Some(Gpu { name: name.into(), memory_gb, bandwidth_gb_s, tflops })
}

/// A catalog model by name (shapes from the published configs).
pub fn model(name: &str) -> Option<Model> {
    // (parameters, layers, hidden, heads, kv_heads, vocab, experts of a mixture of experts:
    // (experts, per token, expert intermediate size))
    let (parameters, layers, hidden, heads, kv_heads, vocab, moe) = match name {
        "mistral-7b" => (7_241_732_096, 32, 4096, 32, 8, 32_000, None),
        "llama-3-8b" | "llama-3.1-8b" => (8_030_261_248, 32, 4096, 32, 8, 128_256, None),
        "llama-3-70b" | "llama-3.1-70b" => (70_553_706_496, 80, 8192, 64, 8, 128_256, None),
        "llama-2-70b" => (68_976_648_192, 80, 8192, 64, 8, 32_000, None),
        "qwen3-32b" => (32_762_123_264, 64, 5120, 64, 8, 151_936, None),
        "qwen3-30b-a3b" => (30_532_122_624, 48, 2048, 32, 4, 151_936, Some((128, 8, 768))),
        _ => return None,
    };
    Some(Model {
        name: name.into(),
        parameters,
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim: 128,
        bytes_per_element: 2,
        vocab,
        active_parameters: None,
        moe: moe.map(|(experts, experts_per_token, expert_intermediate)| Moe {
            experts,
            experts_per_token,
            expert_intermediate,
        }),
        kv_bytes_per_element: None,
    })
}

/// The catalog names of a device or model as an engine reports it (`meta.json`, `/v1/models`):
/// "NVIDIA RTX PRO 6000 Blackwell Server Edition" → `rtx-pro-6000`,
/// "meta-llama/Llama-3.1-8B" → `llama-3.1-8b`. `None` when nothing matches.
pub fn gpu_for_device(device: &str) -> Option<&'static str> {
    let d = device.to_ascii_lowercase().replace([' ', '_'], "-");
    let table: [(&str, &str); 10] = [
        ("rtx-pro-6000", "rtx-pro-6000"),
        ("rtxpro6000", "rtx-pro-6000"),
        ("rtx-4090", "rtx4090"),
        ("rtx4090", "rtx4090"),
        ("b200", "b200"),
        ("h200", "h200"),
        ("h100", "h100"),
        ("l40s", "l40s"),
        ("a6000", "a6000"),
        ("a100", "a100-80"),
    ];
    table.iter().find(|(k, _)| d.contains(k)).map(|(_, v)| *v)
}

/// See [`gpu_for_device`].
pub fn model_for_name(name: &str) -> Option<&'static str> {
    let n = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
    let table: [(&str, &str); 8] = [
        ("qwen3-30b-a3b", "qwen3-30b-a3b"),
        ("qwen3-32b", "qwen3-32b"),
        ("llama-3.1-70b", "llama-3.1-70b"),
        ("llama-3.1-8b", "llama-3.1-8b"),
        ("meta-llama-3-70b", "llama-3-70b"),
        ("meta-llama-3-8b", "llama-3-8b"),
        ("llama-2-70b", "llama-2-70b"),
        ("mistral-7b", "mistral-7b"),
    ];
    table.iter().find(|(k, _)| n.starts_with(k)).map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_name_resolves() {
        assert!(GPU_NAMES.iter().all(|n| gpu(n).is_some()));
        assert!(MODEL_NAMES.iter().all(|n| model(n).is_some()));
    }

    #[test]
    fn engine_names_map_to_the_catalog() {
        assert_eq!(gpu_for_device("NVIDIA RTX PRO 6000 Blackwell Server Edition"), Some("rtx-pro-6000"));
        assert_eq!(gpu_for_device("NVIDIA GeForce RTX 4090"), Some("rtx4090"));
        assert_eq!(gpu_for_device("RTXPRO6000"), Some("rtx-pro-6000"));
        assert_eq!(gpu_for_device("NVIDIA B200"), Some("b200"));
        assert_eq!(gpu_for_device("a toaster"), None);
        assert_eq!(model_for_name("meta-llama/Llama-3.1-8B"), Some("llama-3.1-8b"));
        assert_eq!(model_for_name("Qwen/Qwen3-32B"), Some("qwen3-32b"));
        assert_eq!(model_for_name("Qwen/Qwen3-30B-A3B-Instruct-2507"), Some("qwen3-30b-a3b"));
        assert_eq!(model_for_name("gpt-2"), None);
    }

    #[test]
    fn qwen3_30b_a3b_is_a_mixture_of_experts_whose_shapes_add_up() {
        let m = model("qwen3-30b-a3b").unwrap();
        // Per layer by hand: q 2048×4096, k and v 2048×512, o 4096×2048, two layernorms of 2048,
        // q/k norms of 128, the router 2048×128, and 128 experts of 3 × 2048 × 768.
        let shared = 2048.0 * 4096.0 * 2.0 + 2048.0 * 512.0 * 2.0 + 2.0 * 2048.0 + 2.0 * 128.0 + 2048.0 * 128.0;
        let experts = 128.0 * 3.0 * 2048.0 * 768.0;
        assert_eq!(m.layer_expert_params(), experts);
        // The final norm (2,048) is the only parameter outside the layers and the embeddings.
        assert_eq!(m.layer_weight_params() * 48.0, (shared + experts) * 48.0 + 2048.0);
        // Active: the shared weights, 8 experts a layer and the embeddings: ~3.35B ("A3B").
        let active = (shared + 8.0 * 3.0 * 2048.0 * 768.0) * 48.0 + 2048.0 + 2.0 * 151_936.0 * 2048.0;
        assert_eq!(m.active_params(), active);
        assert!((3.3e9..3.4e9).contains(&active));
    }

    #[test]
    fn per_layer_weights_of_llama_3_1_8b_match_its_shapes() {
        // q/k/v/o/gate/up/down of Llama-3.1-8B: 218,103,808 parameters per layer.
        let m = model("llama-3.1-8b").unwrap();
        let per_layer = (m.parameters - 2 * m.vocab as u64 * m.hidden as u64) / m.layers as u64;
        assert!((per_layer as f64 / 218_103_808.0 - 1.0).abs() < 0.001, "{per_layer}");
    }
}
