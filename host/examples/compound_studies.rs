//! Library-level runs of the compound workloads, printed as Markdown tables (the source of the
//! compound sections of docs/experiments.md).
//! `cargo run --release -p routelab --example compound_studies`.

use std::path::Path;

use routelab_core::metrics::{Metrics, over_seeds};
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::seeds::seed_for;
use routelab_core::sim::compound;

fn compare(file: &str, keys: &[&str]) {
    let w = routelab_core::workload::load(Path::new(file)).expect("workload");
    let spec = w.compound.as_ref().expect("compound workload");
    let mut loader = Loader::new();
    println!("### {} ({} seeds from {})\n", w.name, w.seeds, w.seed);
    for (label, variant) in spec.variants() {
        if !label.is_empty() {
            println!("**{label}**\n");
        }
        println!("| policy | {} |", keys.join(" | "));
        println!("|---|{}", "---:|".repeat(keys.len()));
        for p in &w.policies {
            let ps = PolicySpec::parse(p).expect("policy");
            let mut per_seed: Vec<Metrics> = Vec::new();
            for i in 0..w.seeds {
                let seed = seed_for(w.seed, i);
                let mut sel = loader.selector(&ps, &compound::selector_context(&variant, seed)).expect("selector");
                let out = compound::run(&variant, &mut sel, p, seed, None).expect("run");
                per_seed.push(out.metrics);
            }
            let m = over_seeds(&per_seed);
            let cells: Vec<String> = keys
                .iter()
                .map(|k| match (m.get(k), m.get(&format!("{k}_ci95"))) {
                    (Some(v), Some(ci)) if ci.is_finite() => format!("{v:.3} ± {ci:.3}"),
                    (Some(v), _) => format!("{v:.3}"),
                    (None, _) => "–".into(),
                })
                .collect();
            println!("| `{p}` | {} |", cells.join(" | "));
        }
        println!();
    }
}

/// Where the exhaustive optimum puts its models, per variant of non_monotone.yaml: how often the
/// self_refine optimum gives generator and critic the same model, and how many distinct models
/// the debate optimum uses among its three generators.
fn optimum_shapes(file: &str) {
    let w = routelab_core::workload::load(Path::new(file)).expect("workload");
    let spec = w.compound.as_ref().expect("compound workload");
    println!(
        "| variant | optimum: generator = critic | optimum: distinct generator models (mean) | best single / optimum train accuracy |"
    );
    println!("|---|---:|---:|---:|");
    for (label, variant) in spec.variants() {
        let (mut same_critic, mut generators, mut single, mut best) = (0, 0.0, 0.0, 0.0);
        for i in 0..w.seeds {
            let world = compound::World::new(&variant, seed_for(w.seed, i));
            let (opt, correct) = compound::best_allocation(&world).expect("small space");
            same_critic += (opt[0] == opt[1]) as u32;
            let mut g = opt[..3.min(opt.len())].to_vec();
            g.sort_unstable();
            g.dedup();
            generators += g.len() as f64;
            best += correct as f64 / world.train as f64;
            single += (0..world.models.len() as u32)
                .map(|k| world.accuracy(&vec![k; world.modules()], compound::Split::Train))
                .fold(0.0, f64::max);
        }
        let n = w.seeds as f64;
        let is_refine = variant.system == routelab_core::workload::compound::System::SelfRefine;
        println!(
            "| {label} | {} | {} | {:.3} / {:.3} |",
            if is_refine { format!("{same_critic}/{}", w.seeds) } else { "–".into() },
            if is_refine { "–".into() } else { format!("{:.1}", generators / n) },
            single / n,
            best / n
        );
    }
    println!();
}

/// The case study: the training table, each selector from C,C (also with a noisy diagnoser), and
/// each selector from all 25 starting allocations.
fn case_study() {
    let file = "workloads/compound/case_study.yaml";
    let w = routelab_core::workload::load(Path::new(file)).expect("workload");
    let spec = w.compound.as_ref().expect("compound workload");
    println!("```\n{}```\n", compound::training_table(spec, w.seed));
    let mut loader = Loader::new();
    let start: Vec<String> = ["C", "C"].iter().map(|s| s.to_string()).collect();
    println!(
        "| policy | diagnoser accuracy | allocation | train_accuracy | test_accuracy | evaluations | cost_per_question | starts reaching A+B (of 25) |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for p in &w.policies {
        let ps = PolicySpec::parse(p).expect("policy");
        for accuracy in [1.0, 0.8] {
            let mut variant = spec.clone();
            variant.diagnoser_accuracy = accuracy;
            let ctx = compound::selector_context(&variant, w.seed);
            let mut sel = loader.selector(&ps, &ctx).expect("selector");
            let out = compound::run(&variant, &mut sel, p, w.seed, Some(&start)).expect("run");
            let factory = loader.resolve(&ps, routelab_policy_api::PolicyKind::Selector).expect("selector");
            let make = || factory.selector(&ctx);
            let all = compound::all_starts(&variant, &make, w.seed).expect("all starts");
            let m = |k: &str| out.metrics.get(k).unwrap_or(f64::NAN);
            println!(
                "| `{p}` | {accuracy} | {} | {:.3} | {:.3} | {} | {:.2} | {} |",
                out.allocation.join("+"),
                m("train_accuracy"),
                m("test_accuracy"),
                m("evaluations"),
                m("cost_per_question"),
                all.successes
            );
        }
    }
    println!();
}

fn main() {
    let which: Vec<String> = std::env::args().skip(1).collect();
    let all = which.is_empty();
    if all || which.iter().any(|w| w == "case_study") {
        case_study();
    }
    let keys =
        ["train_accuracy", "test_accuracy", "evaluations", "cost_per_question", "distinct_models", "gap_to_exhaustive"];
    if all || which.iter().any(|w| w == "random_pools") {
        compare("workloads/compound/random_pools.yaml", &keys);
    }
    if all || which.iter().any(|w| w == "noisy") {
        compare(
            "workloads/compound/noisy_diagnoser.yaml",
            &[
                "train_accuracy",
                "test_accuracy",
                "evaluations",
                "selector.rounds",
                "selector.converged",
                "gap_to_exhaustive",
            ],
        );
    }
    if all || which.iter().any(|w| w == "non_monotone") {
        compare("workloads/compound/non_monotone.yaml", &keys);
        optimum_shapes("workloads/compound/non_monotone.yaml");
    }
}
