//! `routelab plan`'s fixed-part lines: the P/D split (`--prefill`), mixed GPUs (`--mix`) and
//! `--scalers` (none, or a scaler on the P/D split) — the cheapest P:D shape checked against
//! every shape run alone, mixed shapes and scaled P/D shapes costed as the simulator bills them
//! (its own `cost`), bad combinations refused before any run, and the same bytes on one and two
//! threads.

use crate::common::*;

fn scratch(name: &str) -> std::path::PathBuf {
    fixture("plan_shapes", name)
}

/// Runs a plan writing `--json`; (stdout, the JSON text).
fn plan(args: &[&str], name: &str) -> (String, String) {
    let json = scratch(name);
    let mut all: Vec<&str> = vec!["plan"];
    all.extend_from_slice(args);
    all.extend(["--json", json.to_str().unwrap()]);
    let out = routelab(&all);
    assert!(out.status.success(), "{all:?}: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), std::fs::read_to_string(&json).unwrap())
}

/// `aggregated_vs_disaggregated` (Mistral-7B on A6000s, 4P4D, ~1,500-token prompts) made small:
/// 400 requests at 6/s, one seed.
fn small_pd() -> String {
    let yaml = scratch("small_pd.yaml");
    let text =
        std::fs::read_to_string(workspace().join("workloads/cluster/pd/aggregated_vs_disaggregated.yaml")).unwrap();
    let small = text.replace("requests: 3000", "requests: 400").replace("seeds: 3", "seeds: 1");
    assert_ne!(small, text);
    std::fs::write(&yaml, small).unwrap();
    yaml.to_str().unwrap().to_string()
}

/// `tool_use` made small: 1,500 requests, one seed.
fn small_tool_use() -> String {
    let yaml = scratch("small_tool_use.yaml");
    let text = std::fs::read_to_string(workspace().join("workloads/cluster/tool_use.yaml")).unwrap();
    let small = text.replace("requests: 20000", "requests: 1500").replace("seeds: 3", "seeds: 1");
    assert_ne!(small, text);
    std::fs::write(&yaml, small).unwrap();
    yaml.to_str().unwrap().to_string()
}

const PD_SLO: &str = "ttft_s=2,tpot_s=0.05,attainment>=0.9";

/// The P/D plan over prefill 1..3 × decode 1..4 on A6000s picks a P:D shape, and it is the
/// cheapest of the 12: each (P, D) run on its own (`--prefill P --replicas D`) says whether it
/// holds, and no holding shape costs less than the winner. Every line is a prefill line, every
/// shape costs (P + D) × $0.80, and the search ran fewer shapes than the 12.
#[test]
fn the_pd_plan_picks_the_cheapest_split_of_all_shapes() {
    let yaml = small_pd();
    let (text, json) = plan(&[&yaml, "--slo", PD_SLO, "--prefill", "1..3", "--replicas", "1..4"], "pd.json");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let lines = v["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 3, "a line per prefill count");
    assert_eq!(v["shapes"].as_u64(), Some(12));
    assert_eq!(v["settings"]["prefill"], serde_json::json!([1, 3]));
    for (k, l) in lines.iter().enumerate() {
        assert_eq!(l["fixed"]["role"], "prefill", "{l}");
        let p = l["fixed"]["count"].as_u64().unwrap();
        assert_eq!(p, k as u64 + 1);
        for e in l["points"].as_array().unwrap() {
            let d = e["replicas"].as_u64().unwrap();
            let cost = e["cost_per_hour"].as_f64().unwrap();
            assert!((cost - 0.8 * (p + d) as f64).abs() < 1e-9, "{p}P{d}D costs {cost}");
        }
    }
    let w = &v["winner"];
    assert!(w.is_object(), "no P:D shape holds: {text}");
    let best = w["cost_per_hour"].as_f64().unwrap();
    let shape = w["shape"].as_str().unwrap();
    assert!(shape.contains("P + ") && shape.contains("D × a6000"), "{shape}");
    assert!(text.contains(&format!("winner: {shape}")), "{text}");
    // Every one of the 12 shapes on its own.
    let mut cheapest_holding = f64::INFINITY;
    for p in 1..=3 {
        for d in 1..=4 {
            let (ps, ds) = (p.to_string(), d.to_string());
            let (_, one) = plan(&[&yaml, "--slo", PD_SLO, "--prefill", &ps, "--replicas", &ds], "pd_one.json");
            let o: serde_json::Value = serde_json::from_str(&one).unwrap();
            let e = &o["lines"][0]["points"][0];
            assert_eq!(e["replicas"].as_u64(), Some(d));
            if e["holds"].as_bool().unwrap() {
                cheapest_holding = cheapest_holding.min(e["cost_per_hour"].as_f64().unwrap());
            }
        }
    }
    assert_eq!(best, cheapest_holding, "the plan's winner is not the cheapest P:D shape that holds");
    assert!(v["shapes_run"].as_u64().unwrap() < 12, "bisection and pruning run fewer than all 12");
}

/// `--mix 1` over a6000 and h100 (priced 1 and 5 per GPU-hour): beside the two single-GPU lines,
/// `a6000 + 1 × h100` and `h100 + 1 × a6000`. Every shape costs n × its GPU's price + 1 × the
/// other's; the simulator's own `cost` of a mixed run (pools priced per replica) comes to the
/// same per hour.
#[test]
fn mixed_lines_cost_each_gpu_at_its_price() {
    let yaml = small_tool_use();
    let args = [
        yaml.as_str(),
        "--slo",
        "ttft_p99<0.5s",
        "--gpus",
        "a6000,h100",
        "--mix",
        "1",
        "--prices",
        "a6000=1,h100=5",
        "--policies",
        "least_requests",
        "--replicas",
        "1..4",
        "--scalers",
        "none",
    ];
    let (text, json) = plan(&args, "mix.json");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let lines = v["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 4, "{text}");
    let price = |g: &str| if g == "a6000" { 1.0 } else { 5.0 };
    let mut mixed_runs = 0;
    for l in lines {
        let gpu = l["gpu"].as_str().unwrap();
        let fixed = &l["fixed"];
        let (second, count) = if fixed.is_null() {
            ("", 0)
        } else {
            assert_eq!(fixed["role"], "pool");
            (fixed["gpu"].as_str().unwrap(), fixed["count"].as_u64().unwrap())
        };
        if !fixed.is_null() {
            assert_ne!(second, gpu);
            assert_eq!(count, 1);
            assert_eq!(fixed["cost_per_hour"].as_f64(), Some(price(second)));
        }
        for e in l["points"].as_array().unwrap() {
            let n = e["replicas"].as_u64().unwrap() as f64;
            let want = n * price(gpu) + count as f64 * if count > 0 { price(second) } else { 0.0 };
            let cost = e["cost_per_hour"].as_f64().unwrap();
            assert!((cost - want).abs() < 1e-9, "{gpu} ×{n} + {count} × {second}: {cost}, want {want}");
            if count > 0 && e["note"].is_null() {
                // The run's own cost over its replica-seconds: (n + 1) replicas all run.
                let m = &e["metrics"];
                let hours = m["replica_seconds"].as_f64().unwrap() / (n + 1.0) / 3600.0;
                let per_hour = m["cost"].as_f64().unwrap() / hours;
                assert!((per_hour - want).abs() < 1e-6 * want, "the run says {per_hour}/h, the plan {want}/h");
                mixed_runs += 1;
            }
        }
    }
    assert!(mixed_runs > 0, "no mixed shape ran: {text}");
    assert!(text.contains("fixed part") && text.contains("+ 1 × h100") && text.contains("+ 1 × a6000"), "{text}");
}

/// `diurnal.yaml` autoscales with HPA: by default its plan's lines are scaled by `hpa`;
/// `--scalers none` leaves the scaled lines out, `--scalers none,hpa` keeps both — and the
/// unscaled line pays for every replica it has, the scaled one for its mean.
#[test]
fn scalers_none_skips_the_autoscaled_lines() {
    let yaml = scratch("small_diurnal.yaml");
    let text = std::fs::read_to_string(workspace().join("workloads/cluster/diurnal.yaml")).unwrap();
    let small = text.replace("duration_s: 1200", "duration_s: 240").replace("seeds: 3", "seeds: 1");
    assert_ne!(small, text);
    std::fs::write(&yaml, small).unwrap();
    let scalers_of = |more: &[&str], name: &str| -> Vec<serde_json::Value> {
        let args = [&[yaml.to_str().unwrap(), "--slo", "ttft_p99<5s", "--replicas", "3"][..], more].concat();
        let (_, json) = plan(&args, name);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        v["lines"].as_array().unwrap().iter().map(|l| l["scaler"].clone()).collect()
    };
    assert_eq!(scalers_of(&[], "scalers_default.json"), vec![serde_json::json!("hpa")]);
    assert_eq!(scalers_of(&["--scalers", "none"], "scalers_none.json"), vec![serde_json::Value::Null]);
    let (_, json) = plan(
        &[yaml.to_str().unwrap(), "--slo", "ttft_p99<5s", "--replicas", "3", "--scalers", "none,hpa"],
        "scalers_both.json",
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let lines = v["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 2);
    assert!(lines[0]["scaler"].is_null() && lines[1]["scaler"] == "hpa", "{v}");
    let (fixed, scaled) = (&lines[0]["points"][0], &lines[1]["points"][0]);
    assert_eq!(fixed["cost_per_hour"].as_f64(), Some(3.0), "3 replicas at 1.0 each: {fixed}");
    let mean = scaled["metrics"]["replicas_mean"].as_f64().unwrap();
    assert!((scaled["cost_per_hour"].as_f64().unwrap() - mean).abs() < 1e-9, "{scaled}");
    assert!(mean < 3.0, "HPA between 1 and 3 replicas averages fewer than 3: {mean}");
}

/// `pd/autoscaling.yaml` made small (5 minutes, one seed), 2 prefill × decode 2..3 at $2 per
/// A6000-hour, with `dynamo_planner` and without: a scaled P/D shape autoscales both pools
/// within its counts (at most 2 + D instances at once) and costs the price × the instances its
/// pools paid for over the run — (prefill + decode replica-seconds) ÷ the run's length, the
/// simulator's own `cost` per hour — not its 2 prefill on top; the unscaled one pays for 2 + D.
#[test]
fn a_scaled_pd_shape_costs_what_its_two_pools_paid_for() {
    let yaml = scratch("small_pd_autoscaling.yaml");
    let text = std::fs::read_to_string(workspace().join("workloads/cluster/pd/autoscaling.yaml")).unwrap();
    let small = text.replace("duration_s: 1200", "duration_s: 300").replace("seeds: 3", "seeds: 1");
    assert_ne!(small, text);
    std::fs::write(&yaml, small).unwrap();
    let args = [
        yaml.to_str().unwrap(),
        "--slo",
        "ttft_s=1,tpot_s=0.1,attainment>=0.5",
        "--prefill",
        "2",
        "--replicas",
        "2..3",
        "--policies",
        "pd_least_loaded",
        "--scalers",
        "dynamo_planner,none",
        "--prices",
        "a6000=2",
    ];
    let (text, json) = plan(&args, "pd_scaled.json");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let lines = v["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(
        (&lines[0]["scaler"], &lines[1]["scaler"]),
        (&serde_json::json!("dynamo_planner"), &serde_json::Value::Null)
    );
    let mut scaled_runs = 0;
    for l in lines {
        assert_eq!((&l["fixed"]["role"], l["fixed"]["count"].as_u64()), (&serde_json::json!("prefill"), Some(2)));
        for e in l["points"].as_array().unwrap() {
            let d = e["replicas"].as_u64().unwrap() as f64;
            let cost = e["cost_per_hour"].as_f64().unwrap();
            let m = &e["metrics"];
            assert!(e["note"].is_null(), "{e}");
            if l["scaler"].is_null() {
                assert!((cost - 2.0 * (2.0 + d)).abs() < 1e-9, "2P{d}D unscaled costs {cost}");
                continue;
            }
            let get = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("no {k}: {m}"));
            let paid = get("replica_seconds_prefill") + get("replica_seconds_decode");
            let run_s = get("replica_seconds") / get("replicas_mean");
            let want = 2.0 * paid / run_s;
            assert!((cost - want).abs() < 1e-9 * want, "2P{d}D scaled costs {cost}, its pools paid for {want}/h");
            assert!((get("cost") / (run_s / 3600.0) - cost).abs() < 1e-9 * cost, "the run's own bill: {m}");
            assert!(get("replicas_max") <= 2.0 + d && get("scale_downs") > 0.0, "{m}");
            assert!(cost < 2.0 * (2.0 + d), "scaled below its budget: {cost}");
            scaled_runs += 1;
        }
    }
    assert!(scaled_runs > 0, "{text}");
    assert!(text.contains("up to 2P + 2D × a6000 with pd_least_loaded, scaled by dynamo_planner"), "{text}");
}

#[test]
fn bad_shape_combinations_are_refused_naming_the_flag_and_the_fix() {
    let tool = "workloads/cluster/tool_use.yaml";
    let pd = "workloads/cluster/pd/aggregated_vs_disaggregated.yaml";
    let slo = "ttft_p99<1s";
    bad(
        &["plan", tool, "--slo", slo, "--prefill", "1..4"],
        &["--prefill", "no `disaggregation:`", "fix: drop --prefill"],
    );
    bad(
        &["plan", tool, "--slo", slo, "--mix"],
        &["--mix", "one (`a6000`)", "fix: name two or more: --gpus a6000,h100"],
    );
    bad(&["plan", tool, "--slo", slo, "--mix", "--gpus", "h100"], &["--mix", "--gpus h100,a6000"]);
    bad(
        &["plan", pd, "--slo", slo, "--mix", "--gpus", "a6000,h100"],
        &["--mix", "splits prefill from decode", "fix: drop --mix"],
    );
    bad(
        &["plan", "workloads/cluster/pd/mixed.yaml", "--slo", slo, "--scalers", "hpa"],
        &["--scalers", "`disaggregation.mixed`", "fix: drop --scalers, or pass --scalers none"],
    );
    bad(&["plan", pd, "--slo", slo, "--prefill", "0..2"], &["--prefill", "at least 1"]);
    bad(&["plan", pd, "--slo", slo, "--prefill", "3..1"], &["--prefill", "empty"]);
    bad(&["plan", "exp_rho09", "--slo", "wait_mean<1", "--prefill", "2"], &["--prefill", "dispatch world"]);
    bad(&["plan", "exp_rho09", "--slo", "wait_mean<1", "--mix"], &["--mix", "dispatch world", "fix: drop --mix"]);
    bad(&["plan", tool, "--slo", slo, "--scalers", ","], &["--scalers", "names no scaler"]);
}

/// The P/D plan and the mixed plan each print and write the same bytes on 1 and 2 threads.
#[test]
fn shape_plans_are_the_same_on_one_and_two_threads() {
    let pd = small_pd();
    let tool = small_tool_use();
    let pd_args = [pd.as_str(), "--slo", PD_SLO, "--prefill", "1..2", "--replicas", "1..4"];
    let mix_args = [
        tool.as_str(),
        "--slo",
        "ttft_p99<0.5s",
        "--gpus",
        "a6000,h100",
        "--mix",
        "--policies",
        "round_robin,least_requests",
        "--replicas",
        "1..4",
    ];
    for (name, args) in [("pd", &pd_args[..]), ("mix", &mix_args[..])] {
        let with = |j: &'static str| [args, &["-j", j]].concat();
        let one = plan(&with("1"), &format!("{name}_j1.json"));
        let two = plan(&with("2"), &format!("{name}_j2.json"));
        assert_eq!(one.0, two.0, "{name}: the tables differ with the thread count");
        assert_eq!(one.1, two.1, "{name}: the JSON differs with the thread count");
    }
}
