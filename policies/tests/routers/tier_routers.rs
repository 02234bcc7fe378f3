//! Tier-aware routing (policy-api 0.5.6's `tier.cpu.matched_tokens` and
//! `tier.remote.matched_tokens`): Dynamo's host/disk cache-hit weights (dynamo-kv-router 1.6.1,
//! `scheduling/selector/reference.rs` l. 326–331, defaults 0.75 / 0.25) and llm-d's medium
//! weights (llm-d-kv-cache @ 7be76e11, `kvblock_scorer.go`: gpu 1.0, cpu 0.8, a medium its
//! config does not name 1.0). Each decision computed by hand in the comments.

use routelab_policies::dynamo_kv::{self, DynamoKv};
use routelab_policies::llm_d::{self, LlmD};
use routelab_policy_api::*;

use crate::common::{ctx, make, req, seg};

/// Two idle replicas; per replica the row [prefilling, cpu tokens, remote tokens].
fn dynamo_signals(rows: [[f64; 3]; 2]) -> Vec<f64> {
    rows.concat()
}

#[test]
fn dynamo_credits_host_blocks_at_0_75_and_disk_blocks_at_0_25() {
    let d = DynamoKv::new(Default::default(), &ctx(2)).unwrap();
    assert_eq!(
        d.signals(),
        [signals::PREFILLING, signals::TIER_CPU_MATCHED_TOKENS, signals::TIER_REMOTE_MATCHED_TOKENS]
    );
    // A = 160 tokens, 10 blocks of 16, cached nowhere on a GPU; r0's CPU tier holds all of
    // it, the remote tier holds it for r1. Prefill (0 + 160) / 16 = 10 and decode 0 + 10 on
    // both; credit r0 0.75 · 10 = 7.5, r1 0.25 · 10 = 2.5.
    // r0: max(10 − 7.5, 0) + 10 = 12.5; r1: max(10 − 2.5, 0) + 10 = 17.5 → r0.
    let a = [seg(1, 160)];
    let views = [ReplicaView::default(); 2];
    let table = dynamo_signals([[0.0, 160.0, 0.0], [0.0, 0.0, 160.0]]);
    let replicas = Replicas::with_signals(&views, &table, 3);
    let mut d = DynamoKv::new(Default::default(), &ctx(2)).unwrap();
    assert_eq!(d.costs(&req(0, 0.0, &a), &replicas), [12.5, 17.5]);
    assert_eq!(d.route(&req(0, 0.0, &a), &replicas), 0);
    // Dispatched to r0, its effective cached tokens are round(7.5 · 16) = 120: 40 tokens join
    // r0's prefill load. With it queued (waiting 1), a fresh B = 160 tokens costs on r0
    // (40 + 160) / 16 = 12.5 prefill + (10 held + 10) decode = 32.5 (device-only accounting
    // would say (160 + 160) / 16 + 20 = 40); on r1 10 + 10 = 20.
    d.on_dispatch(&req(0, 0.0, &a), 0);
    let views = [ReplicaView { waiting: 1, outstanding_requests: 1, ..Default::default() }, ReplicaView::default()];
    let table = dynamo_signals([[0.0; 3]; 2]);
    assert_eq!(d.costs(&req(1, 0.1, &[seg(2, 160)]), &Replicas::with_signals(&views, &table, 3)), [32.5, 20.0]);
    // Without tier weights the tiers are unseen (and not asked for): 20 and 20, a tie.
    let cfg = dynamo_kv::Config { host_cache_hit_weight: 0.0, disk_cache_hit_weight: 0.0, ..Default::default() };
    let mut blind = DynamoKv::new(cfg, &ctx(2)).unwrap();
    assert_eq!(blind.signals(), [signals::PREFILLING]);
    let views = [ReplicaView::default(); 2];
    let table = dynamo_signals([[0.0, 160.0, 0.0], [0.0, 0.0, 160.0]]);
    assert_eq!(blind.costs(&req(0, 0.0, &a), &Replicas::with_signals(&views, &table, 3)), [20.0, 20.0]);
    // Approximate mode has no KV events, so no tiers (upstream's approximate indexer has none).
    let cfg = dynamo_kv::Config { prefix_state: dynamo_kv::PrefixState::Approximate, ..Default::default() };
    assert_eq!(DynamoKv::new(cfg, &ctx(2)).unwrap().signals(), [signals::PREFILLING]);
}

#[test]
fn dynamo_tier_blocks_are_whole_blocks_and_add_to_the_device_credit() {
    // A = 64 tokens (4 blocks) then B = 96 (6): r0 has A on the GPU (dispatched earlier) and 95
    // tokens of B in its CPU tier (5 whole blocks); r1 nothing. Prompt A + B = 10 blocks.
    let (a, b) = (seg(1, 64), seg(2, 96));
    let mut d = DynamoKv::new(Default::default(), &ctx(2)).unwrap();
    d.on_dispatch(&req(0, 0.0, &[a]), 0);
    d.on_complete(&crate::common::done(0, 0));
    let views = [ReplicaView::default(); 2];
    let table = dynamo_signals([[0.0, 95.0, 0.0], [0.0, 0.0, 0.0]]);
    // r0: credit 1 · 4 + 0.75 · 5 = 7.75 (95 tokens are 5 whole blocks); A's prefill is over
    // (nothing waits or prefills), so prefill (0 + 160) / 16 = 10, adjusted 10 − 7.75 = 2.25;
    // decode 0 + 10 (A finished) → 12.25.
    // r1: 10 + 10 = 20.
    let costs = d.costs(&req(1, 1.0, &[a, b]), &Replicas::with_signals(&views, &table, 3)).to_vec();
    assert_eq!(costs, [12.25, 20.0]);
}

/// llm-d precise on 2 replicas; engine signals [scraped.waiting, scraped.kv_utilisation,
/// tier.cpu, tier.remote] per replica, all load figures equal so the prefix score decides.
fn llm_d_pick(cfg: llm_d::Config, rows: [[f64; 4]; 2]) -> usize {
    // A = 32 tokens (2 blocks) on r1's GPU; the prompt A + B is 10 blocks.
    let (a, b) = (seg(1, 32), seg(2, 128));
    let mut l = LlmD::new(cfg, &ctx(2)).unwrap();
    l.on_dispatch(&req(0, 0.0, &[a]), 1);
    let views = [ReplicaView::default(); 2];
    let table = rows.concat();
    l.route(&req(1, 1.0, &[a, b]), &Replicas::with_signals(&views, &table, 4))
}

#[test]
fn llm_d_precise_weighs_each_block_by_the_medium_holding_it() {
    let precise = llm_d::Config { prefix_state: llm_d::PrefixState::Precise, ..Default::default() };
    let l = LlmD::new(precise.clone(), &ctx(2)).unwrap();
    assert_eq!(
        l.signals(),
        [
            signals::SCRAPED_WAITING,
            signals::SCRAPED_KV_UTILISATION,
            signals::TIER_CPU_MATCHED_TOKENS,
            signals::TIER_REMOTE_MATCHED_TOKENS
        ]
    );
    // r0: all 10 blocks in the remote tier; r1: 2 on the GPU, the other 8 in its CPU tier.
    // Prefix scores: r0 1.0 · 10 / 10 = 1.0 (a medium the default config does not name weighs
    // 1.0), r1 (2 + 0.8 · 8) / 10 = 0.84 → r0.
    let rows = [[0.0, 0.0, 0.0, 160.0], [0.0, 0.0, 128.0, 0.0]];
    assert_eq!(llm_d_pick(precise.clone(), rows), 0);
    // remote_weight 0.5: r0 0.5 < 0.84 → r1.
    assert_eq!(llm_d_pick(llm_d::Config { remote_weight: 0.5, ..precise.clone() }, rows), 1);
    // cpu_weight 0.5 as well: r1 (2 + 4) / 10 = 0.6 > 0.5 → r1; cpu 0.3: 0.44 < 0.5 → r0.
    assert_eq!(llm_d_pick(llm_d::Config { remote_weight: 0.5, cpu_weight: 0.5, ..precise.clone() }, rows), 1);
    assert_eq!(llm_d_pick(llm_d::Config { remote_weight: 0.5, cpu_weight: 0.3, ..precise.clone() }, rows), 0);
    // Both tier weights 0: the GPU alone (r1 0.2 vs r0 0), and no tier signals asked for.
    let blind = llm_d::Config { remote_weight: 0.0, cpu_weight: 0.0, ..precise };
    assert_eq!(LlmD::new(blind.clone(), &ctx(2)).unwrap().signals().len(), 2);
    assert_eq!(llm_d_pick(blind, rows), 1);
    // Approximate (the default) knows no tiers, upstream and here.
    assert_eq!(LlmD::new(Default::default(), &ctx(2)).unwrap().signals().len(), 2);
}

#[test]
fn negative_tier_weights_are_refused_naming_the_field() {
    for (name, yaml) in [
        ("dynamo_kv", "host_cache_hit_weight: -0.5"),
        ("dynamo_kv", "disk_cache_hit_weight: .nan"),
        ("llm_d", "cpu_weight: -1"),
        ("llm_d", "remote_weight: -1"),
    ] {
        let e = make(name, yaml).unwrap_err();
        assert!(e.contains(yaml.split(':').next().unwrap()), "{name} {yaml}: {e}");
    }
}
