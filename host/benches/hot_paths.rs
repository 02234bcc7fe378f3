//! `cargo bench -p routelab`: the per-call cost of a router through the ABI (static, the linked-in
//! ABI object, the loaded library) and the simulator's hot paths (event queue, least-loaded scan,
//! prefix-cache match and admit, a whole small cluster run). `routelab bench` measures whole
//! simulations; these isolate the pieces. Needs the built-in plugin library for the loaded case:
//! `cargo build --release -p routelab-builtin-plugin` (skipped with a note if absent).

use std::hint::black_box;
use std::path::PathBuf;

use divan::Bencher;
use routelab::bench::{ctx, views};
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::sim::cluster::prefix_cache::PrefixCache;
use routelab_core::sim::event_queue::EventQueue;
use routelab_policy_api::{Policy, Replicas, Request, RouterPolicy, Segment};

fn main() {
    divan::main();
}

const REQUEST: Request<'static> = Request::new(0, 0.0, 0);

/// The built-in plugin library of the release or bench build, if built.
fn plugin_library() -> Option<PathBuf> {
    let name = format!("{}routelab_builtin_plugin{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let exe = std::env::current_exe().ok()?;
    // The bench runs from target/<profile>/deps/; the library is built into target/release/.
    let target = exe.parent()?.parent()?.parent()?;
    ["release", "bench"].iter().map(|p| target.join(p).join(&name)).find(|p| p.exists())
}

/// One `route()` call of a router over 8 replicas, three ways.
mod route_call {
    use super::*;

    #[divan::bench(args = ["least_requests", "round_robin"])]
    fn static_call(b: Bencher, name: &str) {
        let v = views(8);
        match name {
            "least_requests" => {
                let mut p = routelab_policies::least_requests::LeastRequests::new(Default::default(), &ctx(8)).unwrap();
                b.bench_local(|| p.route(black_box(&REQUEST), black_box(&Replicas::new(&v))));
            }
            _ => {
                let mut p = routelab_policies::round_robin::RoundRobin::new(Default::default(), &ctx(8)).unwrap();
                b.bench_local(|| p.route(black_box(&REQUEST), black_box(&Replicas::new(&v))));
            }
        }
    }

    #[divan::bench(args = ["least_requests", "round_robin"])]
    fn linked_abi_object(b: Bencher, name: &str) {
        let v = views(8);
        let mut r = Loader::new().router(&PolicySpec::parse(name).unwrap(), &ctx(8)).unwrap();
        b.bench_local(|| r.route(black_box(&REQUEST), black_box(Replicas::new(&v))).unwrap());
    }

    #[divan::bench(args = ["least_requests", "round_robin"])]
    fn loaded_library(b: Bencher, name: &str) {
        let Some(lib) = plugin_library() else {
            eprintln!("loaded_library skipped: cargo build --release -p routelab-builtin-plugin");
            return;
        };
        let v = views(8);
        let spec = PolicySpec::parse(&format!("{}:{name}", lib.display())).unwrap();
        let mut r = Loader::new().router(&spec, &ctx(8)).unwrap();
        b.bench_local(|| r.route(black_box(&REQUEST), black_box(Replicas::new(&v))).unwrap());
    }
}

/// The least-loaded scan at cluster sizes (every view read per decision).
#[divan::bench(args = [16, 1024])]
fn least_requests_scan(b: Bencher, replicas: usize) {
    let v = views(replicas);
    // In the cluster world: in the dispatch world least_requests keeps an index from 32
    // replicas (`min_index::INDEX_FROM`) and, with views that never change, would not scan.
    let ctx = routelab_policy_api::RouterContext { world: routelab_policy_api::World::Cluster, ..ctx(replicas as u32) };
    let mut p = routelab_policies::least_requests::LeastRequests::new(Default::default(), &ctx).unwrap();
    b.bench_local(|| p.route(black_box(&REQUEST), black_box(&Replicas::new(&v))));
}

/// One pop and one push on a queue holding `len` events (the dispatch world's steady state).
#[divan::bench(args = [16, 1024, 65_536])]
fn event_queue_pop_push(b: Bencher, len: u64) {
    let mut q = EventQueue::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % 1_000_000
    };
    for i in 0..len {
        q.push(next(), i);
    }
    b.bench_local(|| {
        let (t, e) = q.pop().unwrap();
        q.push(t + next(), black_box(e));
    });
}

/// A prefix cache holding 1,000 prompts (a shared system prompt, 50 documents, one question each).
fn filled_cache() -> (PrefixCache, Vec<Vec<Segment>>) {
    let mut cache = PrefixCache::new();
    let prompts: Vec<Vec<Segment>> = (0..1000u64)
        .map(|i| {
            vec![
                Segment { id: 1, tokens: 400 },
                Segment { id: 100 + i % 50, tokens: 2000 },
                Segment { id: 10_000 + i, tokens: 60 },
            ]
        })
        .collect();
    let mut path = Vec::new();
    for p in &prompts {
        cache.admit(p, &mut path, 0, None);
        for (&n, s) in path.iter().zip(p) {
            cache.mark_computed(n, s.tokens);
        }
        cache.release(&path);
    }
    (cache, prompts)
}

#[divan::bench]
fn prefix_cache_match(b: Bencher) {
    let (cache, prompts) = filled_cache();
    let mut i = 0;
    b.bench_local(|| {
        i = (i + 1) % prompts.len();
        cache.cached_prefix(black_box(&prompts[i]))
    });
}

#[divan::bench]
fn prefix_cache_admit_release(b: Bencher) {
    let (mut cache, prompts) = filled_cache();
    let mut path = Vec::new();
    let mut i = 0;
    b.bench_local(|| {
        i = (i + 1) % prompts.len();
        cache.admit(black_box(&prompts[i]), &mut path, 0, None);
        cache.release(&path);
    });
}

/// A whole cluster run (batcher steps, prefix caches, routing): tool_use, 2,000 requests.
#[divan::bench(sample_count = 10, args = ["round_robin", "least_work_left", "dynamo_kv", "preble"])]
fn cluster_tool_use_2000(b: Bencher, policy: &str) {
    let text = include_str!("../../workloads/cluster/tool_use.yaml");
    let w = routelab_core::workload::parse(text, std::path::Path::new("tool_use.yaml")).unwrap();
    let mut spec = w.cluster.unwrap();
    spec.requests = Some(2000);
    spec.duration_s = None;
    let stream = routelab_core::workload::generate::generate(&spec, None, 1).unwrap();
    let sm = spec.step_model().unwrap();
    let ctx = routelab_core::sim::cluster::router_context(&sm, spec.replicas, 1);
    let mut loader = Loader::new();
    let spec_p = PolicySpec::parse(policy).unwrap();
    b.bench_local(|| {
        let router = loader.router(&spec_p, &ctx).unwrap();
        routelab_core::runner::run_cluster(&spec, &stream, router, policy, 1).unwrap()
    });
}
