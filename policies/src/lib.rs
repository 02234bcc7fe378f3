//! routelab's built-in policies, one file each. Each file opens with its algorithm, its
//! parameters with defaults, and where it comes from.
//!
//! [`registry`] lists them all; the host links this crate directly, and
//! `routelab-builtin-plugin` exports the same registry through the plugin ABI.

pub mod admission;
pub mod aibrix_lora;
pub mod aibrix_prefix_cache;
pub mod best_single;
pub mod chwbl;
pub mod dynamo_kv;
pub mod exhaustive;
pub mod fcfs;
pub mod greedy;
pub mod index;
pub mod least_requests;
pub mod least_work_left;
pub mod llm_d;
pub mod llm_d_predicted_latency;
pub mod llm_d_sticky;
pub mod llmselector;
pub mod llmselector_cost;
pub mod lora_load_state;
pub mod lpm;
pub mod max_affinity;
pub mod pd;
pub mod power_of_two;
pub mod preble;
pub mod priority;
pub mod priority_groups;
pub mod random;
pub mod random_search;
pub mod ray_prefix_aware;
pub mod round_robin;
pub mod scalers;
pub mod selection;
pub mod sglang_cache_aware;
pub mod threshold_affinity;
pub mod vllm_dp_lb;
pub mod vllm_loadaware;
pub mod vllm_prefix_aware;

use routelab_policy_api::{
    Entry, admission as admission_entry, pd_router, router, scaler as scaler_entry, scheduler, selector,
};

/// Every built-in policy.
pub fn registry() -> Vec<Entry> {
    vec![
        router::<random::Random>(),
        router::<round_robin::RoundRobin>(),
        router::<least_requests::LeastRequests>(),
        router::<power_of_two::PowerOfTwo>(),
        router::<least_work_left::LeastWorkLeft>(),
        router::<max_affinity::MaxAffinity>(),
        router::<threshold_affinity::ThresholdAffinity>(),
        router::<sglang_cache_aware::SglangCacheAware>(),
        router::<preble::Preble>(),
        router::<dynamo_kv::DynamoKv>(),
        router::<llm_d::LlmD>(),
        router::<llm_d_sticky::LlmDSticky>(),
        router::<llm_d_predicted_latency::LlmDPredictedLatency>(),
        router::<vllm_prefix_aware::VllmPrefixAware>(),
        router::<vllm_loadaware::VllmLoadAware>(),
        router::<vllm_dp_lb::VllmDpLb>(),
        router::<chwbl::Chwbl>(),
        router::<aibrix_prefix_cache::AibrixPrefixCache>(),
        router::<aibrix_lora::AibrixLora>(),
        router::<ray_prefix_aware::RayPrefixAware>(),
        pd_router::<pd::pd_random::PdRandom>(),
        pd_router::<pd::pd_round_robin::PdRoundRobin>(),
        pd_router::<pd::pd_least_loaded::PdLeastLoaded>(),
        pd_router::<pd::pd_sglang::PdSglang>(),
        pd_router::<pd::pd_dynamo::PdDynamo>(),
        pd_router::<pd::pd_llm_d::PdLlmD>(),
        pd_router::<pd::pd_aibrix::PdAibrix>(),
        pd_router::<pd::pd_mooncake::PdMooncake>(),
        selector::<llmselector::LlmSelector>(),
        selector::<greedy::Greedy>(),
        selector::<random_search::RandomSearch>(),
        selector::<exhaustive::Exhaustive>(),
        selector::<best_single::BestSingle>(),
        selector::<llmselector_cost::LlmSelectorCost>(),
        scheduler::<fcfs::Fcfs>(),
        scheduler::<lpm::Lpm>(),
        scheduler::<priority_groups::PriorityGroups>(),
        scheduler::<priority::Priority>(),
        admission_entry::<admission::AdmitAll>(),
        admission_entry::<admission::GieSaturation>(),
        admission_entry::<admission::TokenBucket>(),
        admission_entry::<admission::vtc::Vtc>(),
        admission_entry::<admission::flow_control::FlowControl>(),
        admission_entry::<admission::early_reject::EarlyReject>(),
        scaler_entry::<scalers::Hpa>(),
        scaler_entry::<scalers::DynamoPlanner>(),
        scaler_entry::<scalers::LlmDWva>(),
    ]
}

/// Config of a policy without parameters: accepts only `{}` (or nothing).
#[derive(serde::Serialize, serde::Deserialize, Default, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct NoConfig {}
