//! `routelab plan`: the cheapest fleet pinned to a closed form (M/M/c, Erlang C), the same
//! answer on 1 and 2 threads, and bad flags refused with exit code 2 naming the flag.

use crate::common::*;

fn scratch(name: &str) -> std::path::PathBuf {
    fixture("plan", name)
}

fn json_text(args: &[&str], name: &str) -> String {
    let json = scratch(name);
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    let out = routelab(&all);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(&json).unwrap()
}

/// Erlang C: the probability that an arrival waits in an M/M/c queue with offered load `a` = λ/μ.
fn erlang_c(c: u32, a: f64) -> f64 {
    // Terms a^k / k! built up one at a time (no factorial overflow).
    let (mut term, mut sum) = (1.0, 0.0);
    for k in 0..c {
        sum += term;
        term *= a / f64::from(k + 1);
    }
    let last = term * f64::from(c) / (f64::from(c) - a);
    last / (sum + last)
}

/// The mean wait in queue of M/M/c with service rate 1: C(c, a) / (c − a).
fn mean_wait(c: u32, a: f64) -> f64 {
    erlang_c(c, a) / (f64::from(c) - a)
}

/// M/M/c: Poisson arrivals at λ = 8 (10 servers at ρ = 0.8), exponential service of mean 1.
/// `least_work_left` with fresh information sends each request to the server that frees first,
/// which is exactly one FCFS queue in front of c servers: M/M/c. The SLO bounds the mean wait in
/// queue; Erlang C gives the fewest servers meeting it, computed here. The bound sits between
/// two server counts with room on both sides (the count below misses it by over 30%, the answer
/// meets it by over 25%), so 4 seeds × 200 000 requests (±3% on the mean wait) cannot move the
/// answer. Plan must pick exactly that count, find the count below failing, never run a fleet
/// with fewer servers than λ (unstable), and price it at one unit per server-hour.
#[test]
fn mmc_plan_picks_the_fewest_servers_erlang_c_allows() {
    let (lambda, bound) = (8.0, 0.13);
    let c_star = (1..100).find(|&c| f64::from(c) > lambda && mean_wait(c, lambda) <= bound).unwrap();
    assert!(mean_wait(c_star - 1, lambda) > 1.3 * bound && mean_wait(c_star, lambda) < 0.75 * bound);
    let yaml = scratch("mmc.yaml");
    std::fs::write(
        &yaml,
        "name: mmc\nseed: 1\nseeds: 4\ndispatch: {servers: 10, requests: 200000, utilisation: 0.8, warmup: 0.05}\n",
    )
    .unwrap();
    let slo = format!("wait_mean<={bound}");
    let page = scratch("mmc.html");
    let args = [
        "plan",
        yaml.to_str().unwrap(),
        "--slo",
        &slo,
        "--policies",
        "least_work_left",
        "--replicas",
        "1..20",
        "--report",
        page.to_str().unwrap(),
    ];
    let v: serde_json::Value = serde_json::from_str(&json_text(&args, "mmc.json")).unwrap();
    assert_eq!(v["command"], "plan");
    let line = &v["lines"][0];
    assert_eq!(line["status"], "found", "{line}");
    assert_eq!(line["replicas"].as_u64(), Some(u64::from(c_star)), "Erlang C says {c_star}: {line}");
    assert_eq!(line["fails_at"].as_u64(), Some(u64::from(c_star - 1)), "{line}");
    let w = &v["winner"];
    assert_eq!(w["replicas"].as_u64(), Some(u64::from(c_star)));
    assert_eq!(w["cost_per_hour"].as_f64(), Some(f64::from(c_star)), "one unit per server-hour");
    assert_eq!(w["seeds_holding"].as_u64(), Some(4));
    // The page: the winner, the frontier's chart, nothing loaded from elsewhere.
    let h = std::fs::read_to_string(&page).unwrap();
    assert!(h.contains(&format!("winner: {c_star} × server with least_work_left")), "{h}");
    assert!(h.contains("<svg") && h.contains("mmc_plan_frontier"));
    for outside in ["<script", "<link", "<img", "src=", "url("] {
        assert!(!h.contains(outside), "the page loads something ({outside})");
    }
    for p in line["points"].as_array().unwrap() {
        let c = p["replicas"].as_u64().unwrap() as u32;
        if f64::from(c) <= lambda {
            assert!(p["note"].as_str().unwrap().contains("unstable"), "{p}");
            continue;
        }
        // Each fleet run is judged as the closed form says, and measured near it.
        let measured = p["metrics"]["wait_mean"].as_f64().unwrap();
        let exact = mean_wait(c, lambda);
        assert_eq!(p["holds"].as_bool(), Some(exact <= bound), "{c} servers: {p}");
        assert!((measured - exact).abs() <= 0.1 * exact + 0.002, "{c} servers: measured {measured}, Erlang C {exact}");
    }
}

/// The same plan — cluster shapes on two GPUs, two routers — on 1 and on 2 threads writes the
/// same JSON, byte for byte.
#[test]
fn a_plan_is_the_same_on_one_and_two_threads() {
    let yaml = scratch("small_tool_use.yaml");
    let tool = std::fs::read_to_string(workspace().join("workloads/cluster/tool_use.yaml")).unwrap();
    let small = tool.replace("requests: 20000", "requests: 1500").replace("seeds: 3", "seeds: 2");
    assert_ne!(small, tool);
    std::fs::write(&yaml, small).unwrap();
    let run = |jobs: &str, name: &str| {
        json_text(
            &[
                "plan",
                yaml.to_str().unwrap(),
                "--slo",
                "ttft_p99<0.5s",
                "--gpus",
                "a6000,h100",
                "--policies",
                "round_robin,least_requests",
                "--replicas",
                "1..8",
                "-j",
                jobs,
            ],
            name,
        )
    };
    let one = run("1", "one.json");
    let two = run("2", "two.json");
    assert_eq!(one, two, "plan's answer depends on the thread count");
    let v: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(v["lines"].as_array().unwrap().len(), 4);
    assert_eq!(v["shapes"].as_u64(), Some(32));
    assert!(v["shapes_run"].as_u64().unwrap() < 32, "bisection and pruning run fewer shapes than the space");
}

#[test]
fn bad_plans_are_refused_naming_the_flag() {
    let tool = "workloads/cluster/tool_use.yaml";
    let slo = ["--slo", "ttft_p99<1s"];
    let with = |more: &[&'static str]| -> Vec<&'static str> { [&["plan", tool][..], &slo[..], more].concat() };
    bad(&with(&["--gpus", "a6000,h1000"]), &["--gpus", "unknown GPU `h1000`", "did you mean `h100`", "fix:"]);
    bad(&with(&["--gpus", "rtx4090"]), &["--prices", "no price for `rtx4090`", "--prices rtx4090="]);
    bad(&with(&["--prices", "h100=cheap"]), &["--prices", "not a number"]);
    bad(&with(&["--replicas", "8..2"]), &["--replicas", "empty"]);
    bad(&with(&["--replicas", "0..4"]), &["--replicas", "at least 1"]);
    bad(&with(&["--replicas", "1..many"]), &["--replicas", "not a whole number"]);
    bad(&with(&["--tp", "3"]), &["--tp", "1, 2, 4 or 8"]);
    bad(&with(&["--budget", "0"]), &["--budget", "positive"]);
    bad(&with(&["--policies", "no_such_router"]), &["no_such_router"]);
    bad(&["plan", tool, "--slo", "ttft_p42_s<2"], &["--slo", "not a metric"]);
    bad(&["plan", tool, "--slo", "ttft_p99<<2"], &["--slo"]);
    bad(&["plan", "exp_rho09", "--slo", "wait_mean<1", "--gpus", "h100"], &["--gpus", "dispatch world"]);
    bad(&["plan", "case_study", "--slo", "wait_mean<1"], &["compound"]);
}
