//! Preble's configuration: its knobs and their defaults (the table in the module's doc).

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DecodeEstimate {
    Single,
    Batched,
    MedianTpot,
}

/// Which requests L charges the decode estimate for.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DecodeLoad {
    /// Every request dispatched to the replica within the window H (the paper's §3.2 reading).
    Windowed,
    /// The requests running on the replica now (Preble's code, `get_node_cost`).
    Running,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub window_s: f64,
    pub decode_estimate: DecodeEstimate,
    pub decode_load: DecodeLoad,
    pub median_tpot_s: f64,
    pub include_p: bool,
    pub rebalance: bool,
    pub rebalance_threshold: f64,
    pub rebalance_after_per_replica: u64,
    pub autoscale: bool,
    pub autoscale_factor: f64,
    pub autoscale_min_samples: usize,
    pub pd_pairing: bool,
    pub pd_hit_ratio: f64,
    pub pd_window_s: f64,
    pub default_output_tokens: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            window_s: 180.0,
            decode_estimate: DecodeEstimate::Single,
            decode_load: DecodeLoad::Windowed,
            median_tpot_s: 0.15,
            include_p: true,
            rebalance: true,
            rebalance_threshold: 1.5,
            rebalance_after_per_replica: 0,
            autoscale: true,
            autoscale_factor: 2.0,
            autoscale_min_samples: 10,
            pd_pairing: true,
            pd_hit_ratio: 0.7,
            pd_window_s: 30.0,
            default_output_tokens: 64.0,
        }
    }
}
