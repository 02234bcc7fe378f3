//! Allocations evaluated per second on debate with 1,000 training questions.
//! `cargo run --release -p routelab --example compound_bench [ALLOCATIONS]`
use routelab::sim::compound::bench_evaluations;
use routelab::workload::compound::CompoundSpec;

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    for accuracy in [1.0, 0.8] {
        let yaml = format!(
            "system: debate\npool: {{models: 5}}\nquestions: {{train: 1000, test: 1000}}\ndiagnoser_accuracy: {accuracy}\n"
        );
        let spec: CompoundSpec = serde_norway::from_str(&yaml).expect("spec");
        spec.validate().expect("valid");
        let r = bench_evaluations(&spec, 1, n);
        println!(
            "debate, 5 models, {} training questions, diagnoser accuracy {accuracy}: {} allocations in {:.3} s = {:.0} allocations/s (checksum {})",
            r.training_questions, r.allocations, r.seconds, r.allocations_per_second, r.checksum
        );
    }
}
