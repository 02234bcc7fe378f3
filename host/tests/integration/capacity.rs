//! SLO metrics and `routelab capacity`: answers pinned to values computed independently, and
//! bad SLOs refused with exit code 2 before any run.

use crate::common::*;

fn scratch(name: &str) -> std::path::PathBuf {
    fixture("capacity", name)
}

fn json_of(args: &[&str], name: &str) -> serde_json::Value {
    let json = scratch(name);
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    let out = routelab(&all);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// One M/M/1 queue (Poisson arrivals at ρ, exponential service of mean 1): the mean response
/// time is 1/(1 − ρ), so the SLO `response_mean ≤ 5` holds exactly up to ρ = 1 − 1/5 = 0.8.
/// With 4 seeds × 400 000 requests the mean near ρ = 0.8 is measured to within about ±2%
/// (±0.1, i.e. ±0.004 in ρ, as dρ = (1 − ρ)² dT); the bisection stops within 0.5% of its top.
/// So the answer must lie within 0.015 of 0.8, and the interval must be that narrow.
#[test]
fn mm1_capacity_matches_the_closed_form() {
    let yaml = scratch("mm1.yaml");
    std::fs::write(
        &yaml,
        "name: mm1\nseed: 1\nseeds: 4\ndispatch: {servers: 1, requests: 400000, utilisation: 0.5, warmup: 0.05}\n",
    )
    .unwrap();
    let v = json_of(
        &[
            "capacity",
            yaml.to_str().unwrap(),
            "--slo",
            "response_mean<=5",
            "--policies",
            "random",
            "--tolerance",
            "0.005",
        ],
        "mm1.json",
    );
    assert_eq!((v["command"].as_str(), v["knob"].as_str()), (Some("capacity"), Some("utilisation")));
    let r = &v["results"][0];
    assert_eq!(r["status"], "found", "{r}");
    let (lo, hi) = (r["lo"].as_f64().unwrap(), r["hi"].as_f64().unwrap());
    assert!((lo - 0.8).abs() < 0.015, "capacity {lo}, closed form 0.8");
    assert!(lo < hi && hi - lo <= 0.005 * hi + 1e-12, "[{lo}, {hi})");
    // Every load run is reported, judged as the closed form says away from the edge.
    let points = r["points"].as_array().unwrap();
    assert_eq!(r["runs"].as_u64(), Some(4 * points.len() as u64));
    for p in points {
        let (x, holds) = (p["load"].as_f64().unwrap(), p["holds"].as_bool().unwrap());
        if (x - 0.8).abs() > 0.02 {
            assert_eq!(holds, x < 0.8, "at ρ = {x}: {p}");
        }
        for key in routelab_core::metrics::DISPATCH_KEYS {
            assert!(p["metrics"][key].is_number(), "{key} missing: {p}");
        }
        let mean = p["metrics"]["response_mean"].as_f64().unwrap();
        assert_eq!(holds, mean <= 5.0, "the SLO is judged on the mean over seeds");
    }
}

/// A cluster workload's SLO metrics agree with figures computed without them: with bounds no
/// request can miss, attainment is completed ÷ requests; with a TTFT bound at the measured P99
/// TTFT, at least 99% of the finished requests meet it.
#[test]
fn cluster_slo_metrics_agree_with_the_latency_figures() {
    let base = ["run", "workloads/cluster/tool_use.yaml", "--policy", "round_robin", "--seeds", "1"];
    let loose = json_of(&[&base[..], &["--slo", "latency_s=1e9"]].concat(), "loose.json");
    let m = &loose["workloads"][0]["results"][0]["metrics"];
    let (completed, requests) = (m["completed"].as_f64().unwrap(), m["requests"].as_f64().unwrap());
    for key in routelab_core::metrics::SLO_KEYS {
        assert!(m[key].is_number(), "{key} missing: {m}");
    }
    assert_eq!(m["slo_attainment"].as_f64().unwrap(), completed / requests);
    assert!(m["goodput_rps"].as_f64().unwrap() > 0.0);
    let p99 = m["ttft_p99_s"].as_f64().unwrap();
    let tight = json_of(&[&base[..], &["--slo", &format!("ttft_s={p99}")]].concat(), "tight.json");
    let t = &tight["workloads"][0]["results"][0]["metrics"];
    let attained = t["slo_attainment"].as_f64().unwrap();
    assert!(attained >= 0.99 * completed / requests && attained < 1.0, "{attained}");
    assert_eq!(t["ttft_p99_s"], m["ttft_p99_s"], "an SLO changes no other figure");
    let goodput_ratio = t["goodput_rps"].as_f64().unwrap() / m["goodput_rps"].as_f64().unwrap();
    assert!((goodput_ratio - attained * requests / completed).abs() < 1e-9, "goodput ∝ requests that met it");
}

#[test]
fn bad_slos_are_refused_before_any_run() {
    let w = scratch("bad_slo.yaml");
    std::fs::write(
        &w,
        "cluster:\n  replicas: 1\n  generator: {output_tokens: 8}\n  arrivals: {poisson: {rate: 1}}\n  requests: 10\n  slo:\n    ttft_s: 0\n",
    )
    .unwrap();
    let f = w.to_str().unwrap();
    bad(&["run", f, "--policy", "random"], &["bad_slo.yaml:7", "cluster.slo.ttft_s", "positive", "fix:"]);
    std::fs::write(&w, "cluster:\n  replicas: 1\n  generator: {output_tokens: 8}\n  arrivals: {poisson: {rate: 1}}\n  requests: 10\n  slo: {}\n").unwrap();
    bad(&["run", f, "--policy", "random"], &["cluster.slo", "no bound", "fix:"]);
    std::fs::write(&w, "cluster:\n  replicas: 1\n  generator: {output_tokens: 8}\n  arrivals: {poisson: {rate: 1}}\n  requests: 10\n  slo: {ttft: 2}\n").unwrap();
    bad(&["run", f, "--policy", "random"], &["cluster.slo", "unknown field `ttft`", "ttft_s"]);
    let tool = "workloads/cluster/tool_use.yaml";
    bad(&["compare", tool, "--slo", "ttft_s=NaN"], &["--slo", "ttft_s", "positive"]);
    bad(&["compare", tool, "--slo", "ttfb_s=2"], &["ttfb_s", "ttft_s, tpot_s, latency_s"]);
    bad(&["compare", "exp_rho09", "--slo", "latency_s=2"], &["--slo", "cluster"]);
    bad(&["capacity", tool, "--slo", "ttft_p42_s<2"], &["--slo", "not a metric", "ttft_p99_s"]);
    bad(&["capacity", tool, "--slo", "ttft_s=2"], &["--slo", "no condition", "slo_attainment>=0.9"]);
    bad(&["capacity", tool, "--slo", "slo_attainment>=0.9"], &["needs per-request bounds"]);
    bad(&["capacity", tool, "--slo", "ttft_p99_s<2", "--tolerance", "0"], &["--tolerance", "(0, 1)"]);
    bad(&["capacity", tool, "--slo", "ttft_p99_s<2", "--policies", "no_such_router"], &["no_such_router"]);
    bad(&["capacity", "case_study", "--slo", "test_accuracy>0.5"], &["compound"]);
    // A per-class condition names a class (or tenant) the workload has.
    let classes = "workloads/cluster/classes/overload_shedding.yaml";
    bad(
        &["capacity", classes, "--slo", "critical.ttft_p99<1s,premium.attainment>=0.9"],
        &[
            "--slo",
            "premium.attainment>=0.9",
            "`premium` is not a class or tenant",
            "critical, standard, batch",
            "fix:",
        ],
    );
    bad(&["capacity", classes, "--slo", "critical.hit_rate>0.5"], &["not a figure of a class", "ttft_p99_s"]);
}

/// A cluster search end to end: every load is judged from its own figures, the answer's
/// bounds are loads that held and failed, and the chart is drawn. A trace replay searches its
/// speed instead of a rate.
#[test]
fn cluster_capacity_is_bracketed_by_loads_that_held_and_failed() {
    let yaml = scratch("small_cluster.yaml");
    std::fs::write(
        &yaml,
        "name: small\nseeds: 2\ncluster:\n  replicas: 2\n  generator: {system_prompt_tokens: 200, suffix_tokens: 300, output_tokens: 40}\n  arrivals: {poisson: {rate: 5}}\n  requests: 400\n",
    )
    .unwrap();
    let plots = scratch("plots");
    let v = json_of(
        &[
            "capacity",
            yaml.to_str().unwrap(),
            "--slo",
            "ttft_p99<500ms,latency_s=4,attainment>=95%",
            "--policies",
            "round_robin,least_requests",
            "--tolerance",
            "0.05",
            "--plot",
            plots.to_str().unwrap(),
        ],
        "small.json",
    );
    assert_eq!(v["knob"], "rate");
    assert_eq!(v["bounds"]["latency_s"], 4.0);
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["status"], "found", "{r}");
        let (lo, hi) = (r["lo"].as_f64().unwrap(), r["hi"].as_f64().unwrap());
        assert!(lo < hi && hi - lo <= 0.05 * hi + 1e-12);
        let points = r["points"].as_array().unwrap();
        for p in points {
            let m = &p["metrics"];
            let want = m["ttft_p99_s"].as_f64().unwrap() < 0.5
                && m["slo_attainment"].as_f64().unwrap() >= 0.95
                && m["unfinished"].as_f64().unwrap() == 0.0;
            assert_eq!(p["holds"].as_bool(), Some(want), "{p}");
        }
        let at = |x: f64| points.iter().find(|p| p["load"].as_f64() == Some(x)).unwrap()["holds"].as_bool();
        assert_eq!((at(lo), at(hi)), (Some(true), Some(false)));
    }
    // The seeds of a load run on threads: the answer is the same byte for byte with one.
    let one = json_of(
        &[
            "capacity",
            yaml.to_str().unwrap(),
            "--slo",
            "ttft_p99<500ms,latency_s=4,attainment>=95%",
            "--policies",
            "round_robin,least_requests",
            "--tolerance",
            "0.05",
            "-j",
            "1",
        ],
        "small-j1.json",
    );
    assert_eq!(one, v, "-j 1 and every core differ");
    for metric in ["ttft_p99_s", "slo_attainment"] {
        let svg = std::fs::read_to_string(plots.join(format!("small_capacity_{metric}.svg"))).unwrap();
        assert!(svg.contains("round_robin") && svg.contains("least_requests"), "{metric}: legend");
    }
    let replay = scratch("replay.yaml");
    let csv = workspace().join("workloads/cluster/traces/sample_conv.csv");
    std::fs::write(
        &replay,
        format!(
            "cluster:\n  replicas: 1\n  generator: {{output_tokens: 1}}\n  arrivals: {{trace: {{path: {}, time_scale: 2}}}}\n",
            csv.display()
        ),
    )
    .unwrap();
    let trace = json_of(
        &[
            "capacity",
            replay.to_str().unwrap(),
            "--slo",
            "ttft_p99_s<1",
            "--policies",
            "round_robin",
            "--tolerance",
            "0.1",
        ],
        "trace.json",
    );
    assert_eq!(trace["knob"], "trace_speed");
    assert_eq!(trace["start"], 1.0);
    let r = &trace["results"][0];
    assert_eq!(r["status"], "found", "{r}");
    // Speed x replays the trace at time_scale 2 / x.
    assert_eq!(trace["resolved"]["cluster"]["arrivals"]["trace"]["time_scale"], 2.0);
}

/// Issue 26: an SLO no load can meet was searched through 21 loads. One below the quickest step
/// a replica takes is refused before any run (exit 2, naming the condition); one that fails at
/// the bottom of the range is said after two loads, the start and the bottom.
#[test]
fn impossible_slos_are_said_early() {
    bad(
        &["capacity", "tool_use", "--slo", "ttft_p99_s<0.005", "--policies", "round_robin"],
        &[
            "--slo",
            "ttft_p99_s < 0.005",
            "can never hold",
            "quickest step on a6000 × mistral-7b",
            "fix: bound it above",
        ],
    );
    bad(
        &["capacity", "tool_use", "--slo", "ttft_s=0.001,attainment>=0.5", "--policies", "round_robin"],
        &["slo_attainment >= 0.5", "per-request bound ttft_s=0.001"],
    );
    bad(&["capacity", "tool_use", "--slo", "hit_rate>1.5", "--policies", "round_robin"], &["never above 1"]);
    // Above one step, below every request's bare prefill: the runs say it.
    let v = json_of(
        &["capacity", "tool_use", "--slo", "ttft_p99_s<0.05", "--policies", "round_robin", "--seeds", "1"],
        "impossible.json",
    );
    let r = &v["results"][0];
    assert_eq!(r["status"], "fails_everywhere", "{r}");
    let loads: Vec<f64> = r["points"].as_array().unwrap().iter().map(|p| p["load"].as_f64().unwrap()).collect();
    assert_eq!(loads.len(), 2, "{loads:?}");
    assert_eq!(loads[1], loads[0] / 1048576.0);
    assert!(r["note"].as_str().unwrap().contains("the SLO fails even at load"), "{r}");
}

/// Issue 32: a trace replay's capacity is a speed and, beside it, requests/s — the trace's rate
/// at speed 1 computed here from the trace file itself ((n − 1) gaps over the span of its
/// timestamps, in ms) — in the table, the JSON and the `--report` page, which shows every load
/// each policy ran.
#[test]
fn a_trace_replays_capacity_is_also_in_requests_per_second_and_the_report_shows_the_search() {
    let trace = std::fs::read_to_string(workspace().join("workloads/traces/example-requests/trace.jsonl")).unwrap();
    let stamps: Vec<f64> = trace
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["timestamp"].as_f64().unwrap())
        .collect();
    let expected = (stamps.len() - 1) as f64 / ((stamps[stamps.len() - 1] - stamps[0]) / 1000.0);
    let (json, page) = (scratch("trace.json"), scratch("trace.html"));
    let _ = std::fs::remove_file(&page);
    let args = [
        "capacity",
        "example_requests",
        "--slo",
        "ttft_p99_s<2",
        "--policies",
        "round_robin,least_requests",
        "--tolerance",
        "0.1",
        "--json",
        json.to_str().unwrap(),
        "--report",
        page.to_str().unwrap(),
    ];
    let out = routelab(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rate = doc["trace_rate_rps"].as_f64().expect("a trace replay states its rate");
    assert!((rate - expected).abs() < 1e-9 * expected, "{rate} vs {expected} from the file");
    assert!(
        stdout.contains("capacity [requests/s]") && stdout.contains("speed 1 replays the trace at 1.378 requests/s")
    );
    let html = std::fs::read_to_string(&page).expect("the report was written");
    assert!(html.contains("<code>routelab capacity example_requests --slo"));
    assert!(html.contains("id=\"example_requests_capacity_ttft_p99_s\""));
    for r in doc["results"].as_array().unwrap() {
        let (policy, lo) = (r["policy"].as_str().unwrap(), r["lo"].as_f64().unwrap());
        assert_eq!(r["status"], "found", "{policy}");
        assert_eq!(r["capacity_rps"].as_f64(), Some(lo * rate), "{policy}");
        // Its row, and a table of every load it ran, as many as the JSON's points.
        assert!(html.contains(&format!("<tr><td>{policy}</td><td class=\"num\">")), "{policy}");
        let n = r["points"].as_array().unwrap().len();
        let loads = html.split(&format!("<summary>{policy}: the {n} loads run, in order</summary>")).nth(1);
        let loads = loads.expect("a table of the loads").split("</table>").next().unwrap();
        assert_eq!(loads.matches("<tr><td class=\"num\">").count(), n, "{policy}");
    }
    // Without a trace there is no rate to state.
    let plain = json_of(
        &[
            "capacity",
            "tool_use",
            "--slo",
            "ttft_p99_s<2",
            "--policies",
            "round_robin",
            "--seeds",
            "1",
            "--tolerance",
            "0.2",
        ],
        "plain.json",
    );
    assert!(plain.get("trace_rate_rps").is_none() && plain["results"][0].get("capacity_rps").is_none());
}
