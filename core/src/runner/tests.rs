use super::*;

/// What a parallel runner would share between threads (a rayon map over (policy, seed)).
#[test]
fn run_inputs_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<ResolvedPolicy>();
    shared::<Prepared>();
    shared::<SeedInput>();
}

/// `arrivals.trace.spread_s`: a trace's rows at one instant arrive spread over the seconds that
/// follow it (or up to the next timestamp), the same for every seed, in row order, and the
/// replay says so; as written without it; a negative spread is refused naming the field.
#[test]
fn a_trace_binned_to_whole_seconds_is_spread_within_its_bins() {
    let dir = std::env::temp_dir().join(format!("routelab-spread-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("binned.csv"),
        "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n0,11,5\n0,12,5\n3,13,5\n4,14,5\n4,15,5\n",
    )
    .unwrap();
    let file = dir.join("w.yaml");
    let arrivals = |spread: &str| {
        let yaml = format!(
            "seeds: 2\ncluster:\n  replicas: 1\n  generator: {{output_tokens: 8}}\n  arrivals: {{trace: {{path: binned.csv, time_scale: 2{spread}}}}}\n"
        );
        let prepared = prepare(crate::workload::parse(&yaml, &file).unwrap(), &file).unwrap();
        let inputs = prepared.seed_inputs().unwrap();
        let times = |k: usize| -> Vec<crate::time::SimTime> {
            inputs[k].stream().unwrap().requests.iter().map(|r| r.arrived_at).collect()
        };
        assert_eq!(times(0), times(1), "no draw: every seed sees the same times");
        let prompts: Vec<u32> = inputs[0].stream().unwrap().requests.iter().map(|r| r.prompt_tokens).collect();
        (times(0), prompts, prepared.notes.join("\n"))
    };
    let t = crate::time::ticks;
    let (plain, _, note) = arrivals("");
    assert_eq!(plain, [0.0, 0.0, 0.0, 6.0, 8.0, 8.0].map(t));
    assert!(!note.contains("spread over"), "{note}");
    // Spread over 1.5 trace seconds, times then scaled by 2: the three rows at 0 over [0, 3), the
    // two at 4 over [8, 11) (the last instant: the whole spread); the row at 3 alone stays.
    let (spread, prompts, note) = arrivals(", spread_s: 1.5");
    assert_eq!(spread, [0.0, 1.0, 2.0, 6.0, 8.0, 9.5].map(t));
    assert_eq!(prompts, [10, 11, 12, 13, 14, 15], "row order is kept");
    assert!(note.contains("spread over 1.5 s"), "{note}");
    // A spread longer than the gap to the next instant stops at it: order never changes.
    let (capped, _, _) = arrivals(", spread_s: 10");
    assert_eq!(capped, [0.0, 2.0, 4.0, 6.0, 8.0, 18.0].map(t));
    let bad = "cluster:\n  replicas: 1\n  generator: {output_tokens: 8}\n  arrivals: {trace: {path: binned.csv, spread_s: -1}}\n";
    let e = crate::workload::parse(bad, &file).expect_err("a negative spread is refused");
    let text = e.to_string();
    assert!(text.contains("spread_s") && text.contains("-1"), "{text}");
    assert_eq!(e.line, Some(4), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A trace row larger than a replica's KV memory is bad input found while preparing (exit
/// 2, naming the trace file and line), not a failed run.
#[test]
fn a_trace_row_too_large_for_a_replica_is_bad_input_before_any_run() {
    let dir = std::env::temp_dir().join(format!("routelab-runner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("big.csv"), "TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,100,10\n1.0,900000,10\n")
        .unwrap();
    let file = dir.join("w.yaml");
    let yaml = "cluster:\n  replicas: 1\n  generator: {output_tokens: 8}\n  arrivals: {trace: {path: big.csv}}\n";
    let w = crate::workload::parse(yaml, &file).unwrap();
    let e = prepare(w, &file).err().expect("the row cannot fit");
    // Refused as the trace is read: the error names the trace file and the row's line.
    assert_eq!((e.file.clone(), e.line), (dir.join("big.csv"), Some(3)));
    assert!(e.message.contains("needs 900000 prompt"), "{e}");
    assert_eq!(Error::from(e).exit_code(), 2);
    std::fs::remove_dir_all(&dir).ok();
}

/// A request that fits the cluster's own GPU but not a disaggregated pool's (a prefill pool of
/// RTX 4090s with ~42k tokens of KV, prompts of 60k) is bad input for the pool, named by its GPU
/// — whether the stream is generated whole or, under `summary: sketch`, as the run goes (which
/// once checked the main step model only, and the run then left every request unfinished).
#[test]
fn a_request_too_large_for_a_pd_pool_is_bad_input_naming_its_gpu() {
    let file = std::path::Path::new("pd_fit.yaml");
    for summary in ["exact", "sketch"] {
        let yaml = format!(
            "cluster:\n  replicas: 2\n  gpu: h100\n  model: llama-3.1-8b\n  summary: {summary}\n  disaggregation:\n    prefill: {{instances: 1, gpu: rtx4090}}\n    decode: {{instances: 1}}\n    link: {{bandwidth_gbps: 100}}\n  generator: {{system_prompt_tokens: 0, suffix_tokens: 60000, output_tokens: 10}}\n  arrivals: {{poisson: {{rate: 1.0}}}}\n  requests: 5\n"
        );
        let prepared = prepare(crate::workload::parse(&yaml, file).unwrap(), file).unwrap();
        let models = &prepared.cluster().expect("a cluster workload").1.step_models;
        assert!(models.main.kv_capacity_tokens > 60_010, "the main GPU holds a request");
        assert_eq!(models.tightest().gpu.name, "rtx4090");
        let e = prepared.run_input(0).err().expect("the prefill pool cannot hold a request");
        assert!(e.message.contains("needs 60000 prompt") && e.message.contains("on rtx4090, tp 1"), "{summary}: {e}");
        assert_eq!(Error::from(e).exit_code(), 2);
    }
}

/// With GPU pools no replica runs the cluster's own `gpu:` (it is what routers are told of), so
/// a request need not fit it: prompts of 60k tokens on H100 pools under an RTX 4090 `gpu:` (≈ 42k
/// tokens of KV) are accepted; one that fits no pool is refused naming the tightest pool.
#[test]
fn a_request_need_only_fit_the_gpus_replicas_run() {
    let file = std::path::Path::new("pools_fit.yaml");
    let yaml = |suffix: u32, second: &str| {
        format!(
            "cluster:\n  replicas: 2\n  gpu: rtx4090\n  model: llama-3.1-8b\n  pools:\n    - {{gpu: h100, replicas: 1}}\n    - {{gpu: {second}, replicas: 1}}\n  generator: {{system_prompt_tokens: 0, suffix_tokens: {suffix}, output_tokens: 10}}\n  arrivals: {{poisson: {{rate: 1.0}}}}\n  requests: 5\n"
        )
    };
    let prepared = prepare(crate::workload::parse(&yaml(60_000, "h200"), file).unwrap(), file).unwrap();
    let models = &prepared.cluster().expect("a cluster workload").1.step_models;
    assert!(models.main.kv_capacity_tokens < 60_010, "the cluster's own GPU would not hold a request");
    assert_eq!(models.tightest().gpu.name, "h100");
    prepared.run_input(0).expect("every replica holds every request");
    let e = crate::workload::parse(&yaml(60_000, "rtx4090"), file)
        .expect_err("the RTX 4090 pool cannot hold a request, and a router may send one there");
    assert!(e.message.contains("longest prompt (60000 tokens)") && e.message.contains("on rtx4090, tp 1"), "{e}");
}

/// On a cluster whose models run hardware of their own, a request must fit its own model's
/// replicas only: the same 60k-token prompts run when every request is drawn onto the H100
/// model, and are refused, naming the request and the RTX 4090, when some land on that one.
#[test]
fn a_request_need_only_fit_its_own_models_replicas() {
    let file = std::path::Path::new("models_fit.yaml");
    let yaml = |small_share: f64| {
        format!(
            "cluster:\n  replicas: 2\n  gpu: h100\n  model: llama-3.1-8b\n  models:\n    - {{name: small, replicas: 1, share: {small_share}, gpu: rtx4090}}\n    - {{name: large, replicas: 1, share: 1.0}}\n  generator: {{system_prompt_tokens: 0, suffix_tokens: 60000, output_tokens: 10}}\n  arrivals: {{poisson: {{rate: 1.0}}}}\n  requests: 20\n"
        )
    };
    let prepared = prepare(crate::workload::parse(&yaml(1e-9), file).unwrap(), file).unwrap();
    let models = &prepared.cluster().expect("a cluster workload").1.step_models;
    assert!(models.by_model && models.fit_for(0).gpu.name == "rtx4090" && models.fit_for(1).gpu.name == "h100");
    let input = prepared.run_input(0).expect("every request is drawn onto the H100 model");
    let SeedStream::Whole(stream) = &input.stream else { panic!("a multi-model stream is whole") };
    assert!(stream.models.iter().all(|&m| m == 1), "{:?}", stream.models);
    let e = prepare(crate::workload::parse(&yaml(1.0), file).unwrap(), file)
        .and_then(|p| p.run_input(0).map(|_| ()))
        .expect_err("about half the requests land on the RTX 4090 model");
    assert!(e.message.contains("request") && e.message.contains("on rtx4090"), "{e}");
}

/// A sketched replay of an Azure-format trace makes its requests as each run reaches them (the
/// rows held once, no stream kept), and gives the figures of the same run on the whole stream:
/// per seed, with noisy hints drawn from the workload's seed as the whole stream's are, cut by
/// `requests`. Kept exactly, the trace is one stream generated once, as before.
#[test]
fn a_sketched_trace_replay_streams_its_requests_with_the_whole_streams_figures() {
    let dir = std::env::temp_dir().join(format!("routelab-lazy-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut csv = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for i in 0..3000u32 {
        csv.push_str(&format!("{},{},{}\n", (i / 2) as f64 * 0.05, 50 + (i * 37) % 2000, 1 + i % 40));
    }
    std::fs::write(dir.join("t.csv"), csv).unwrap();
    let file = dir.join("w.yaml");
    for summary in ["sketch", "exact"] {
        let yaml = format!(
            "seeds: 2\ncluster:\n  replicas: 3\n  summary: {summary}\n  generator: {{system_prompt_tokens: 200, output_tokens: 8}}\n  hints: {{output_tokens: {{noisy: {{cv: 0.5}}}}}}\n  arrivals: {{trace: {{path: t.csv, time_scale: 0.5}}}}\n  requests: 2500\n"
        );
        let prepared = prepare(crate::workload::parse(&yaml, &file).unwrap(), &file).unwrap();
        let policy =
            resolve(&mut Loader::new(), &prepared, &PolicySpec::parse("least_work_left{work: hints}").unwrap())
                .unwrap();
        let streamed = prepared.cluster().unwrap().1.trace_stream.is_none();
        assert_eq!(streamed, summary == "sketch", "{summary}");
        for k in 0..2 {
            let (run, whole) = (prepared.run_input(k).unwrap(), prepared.seed_input(k).unwrap());
            assert_eq!(matches!(run.stream, SeedStream::Lazy(_)), streamed, "{summary}");
            assert_eq!(whole.stream().unwrap().len(), 2500);
            let (a, b) = (run_one(&policy, &prepared, &run).unwrap(), run_one(&policy, &prepared, &whole).unwrap());
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{summary}, seed {k}");
        }
        // The trace's requests, hints included, are the same for every seed (the router reads
        // the hints, so a lazy run drawing them from its own seed would differ above).
        assert_eq!(
            prepared.seed_input(0).unwrap().stream().unwrap().hints,
            prepared.seed_input(1).unwrap().stream().unwrap().hints
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
