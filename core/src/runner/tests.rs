use super::*;

/// What a parallel runner would share between threads (a rayon map over (policy, seed)).
#[test]
fn run_inputs_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<ResolvedPolicy>();
    shared::<Prepared>();
    shared::<SeedInput>();
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
