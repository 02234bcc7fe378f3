use super::*;

fn settings(tolerance: f64) -> Settings {
    Settings { tolerance, max_points: 60 }
}

/// A synthetic SLO that holds up to `edge`.
fn up_to(edge: f64) -> impl FnMut(f64) -> Result<Evaluated, Error> {
    move |x| Ok(Evaluated::Ran(Point { load: x, holds: x <= edge, metrics: Metrics::new() }))
}

#[test]
fn brackets_upward_then_bisects_to_the_tolerance() {
    let a = search(1.0, None, settings(0.01), &mut up_to(37.3)).unwrap();
    assert_eq!(a.status, Status::Found);
    assert!(a.lo <= 37.3 && 37.3 < a.hi && a.hi - a.lo <= 0.01 * a.hi, "{} {}", a.lo, a.hi);
    // 1, 2, …, 64 (7 points) then bisection of [32, 64] down to 1% (7 more).
    assert_eq!(a.points.len(), 14);
    assert!(a.points.iter().all(|p| p.holds == (p.load <= 37.3)));
}

/// Issue 32: a metric that improves with load near the answer is flagged; sampling noise
/// below 5% and points far below the answer are not.
#[test]
fn a_metric_better_at_a_higher_load_near_the_answer_is_flagged() {
    use super::expr::{Condition, Op, Target};
    let target =
        Target { conditions: vec![Condition { metric: "ttft_p99_s".into(), op: Op::Lt, value: 1.0 }], bounds: None };
    let at = |load: f64, v: f64| {
        let mut metrics = Metrics::new();
        metrics.push("ttft_p99_s", v);
        Point { load, holds: v < 1.0, metrics }
    };
    let rising = [at(1.0, 0.2), at(8.0, 0.5), at(16.0, 0.9), at(12.0, 0.7), at(14.0, 0.8)];
    assert_eq!(target.non_monotone(&rising, 14.0), None);
    // Within 5%: noise, no warning.
    let jitter = [at(8.0, 0.50), at(12.0, 0.49), at(16.0, 1.2)];
    assert_eq!(target.non_monotone(&jitter, 12.0), None);
    // Far below the answer (under half of it): does not decide it.
    let low = [at(1.0, 0.4), at(2.0, 0.2), at(16.0, 0.9), at(32.0, 1.3)];
    assert_eq!(target.non_monotone(&low, 16.0), None);
    let dip = [at(8.0, 0.5), at(16.0, 1.1), at(12.0, 0.6), at(10.0, 0.7)];
    let w = target.non_monotone(&dip, 12.0).expect("0.6 at 12 is better than 0.7 at 10");
    assert!(w.contains("ttft_p99_s is better at load 12") && w.contains("more --seeds"), "{w}");
}

#[test]
fn brackets_downward_when_the_start_fails() {
    let a = search(10.0, None, settings(0.02), &mut up_to(0.7)).unwrap();
    assert_eq!(a.status, Status::Found);
    assert!(a.lo <= 0.7 && 0.7 < a.hi && a.hi - a.lo <= 0.02 * a.hi);
}

#[test]
fn a_limited_range_starts_bracketed_and_reports_edges() {
    let a = search(0.5, Some(1.0), settings(0.005), &mut up_to(0.8)).unwrap();
    assert_eq!(a.status, Status::Found);
    assert!(a.lo <= 0.8 && 0.8 < a.hi && a.hi - a.lo <= 0.005);
    assert!(a.points.iter().all(|p| p.load < 1.0), "never runs at the limit");
    let all = search(0.5, Some(1.0), settings(0.01), &mut up_to(2.0)).unwrap();
    assert_eq!(all.status, Status::HoldsEverywhere);
    let none = search(1.0, None, settings(0.01), &mut up_to(0.0)).unwrap();
    assert_eq!((none.status, none.lo), (Status::FailsEverywhere, 0.0));
    // Issue 26: said after the start and the bottom of the range, not 21 loads.
    assert_eq!(none.points.iter().map(|p| p.load).collect::<Vec<_>>(), vec![1.0, 1.0 / 1048576.0]);
    assert!(none.note.as_deref().is_some_and(|n| n.contains("fails even at load 9.537e-7")), "{:?}", none.note);
    let never = search(1.0, None, settings(0.01), &mut up_to(f64::INFINITY)).unwrap();
    assert_eq!(never.status, Status::HoldsEverywhere);
    assert!(never.hi.is_infinite());
}

#[test]
fn the_knob_sets_the_rate_the_trace_speed_or_the_utilisation() {
    let parse = |y: &str| routelab_core::workload::parse(y, Path::new("w.yaml")).unwrap();
    let head = "  replicas: 1\n  generator: {output_tokens: 8}\n  requests: 10\n";
    let gamma = parse(&format!("cluster:\n{head}  arrivals: {{gamma: {{rate: 3, cv: 2}}}}\n"));
    assert_eq!(Knob::of(&gamma).unwrap(), (Knob::Rate, 3.0));
    let at = Knob::Rate.set(&gamma, 12.0);
    assert_eq!(at.cluster.unwrap().arrivals, cluster::Arrivals::Gamma { rate: 12.0, cv: 2.0 });
    let trace = parse(&format!("cluster:\n{head}  arrivals: {{trace: {{path: t.csv, time_scale: 3}}}}\n"));
    assert_eq!(Knob::of(&trace).unwrap(), (Knob::TraceSpeed, 1.0));
    let twice = Knob::TraceSpeed.set(&trace, 2.0);
    assert!(matches!(twice.cluster.unwrap().arrivals, cluster::Arrivals::Trace { time_scale: 1.5, .. }));
    let d = parse("dispatch: {servers: 2, requests: 10, utilisation: 0.3}\n");
    assert_eq!(Knob::of(&d).unwrap(), (Knob::Utilisation, 0.3));
    assert_eq!(Knob::Utilisation.set(&d, 0.7).dispatch.unwrap().utilisation, 0.7);
    let balls = parse("dispatch: {servers: 2, requests: 10, mode: balls_into_bins}\n");
    assert!(Knob::of(&balls).unwrap_err().message.contains("balls-into-bins"));
}

#[test]
fn a_load_the_workload_refuses_ends_the_range() {
    let mut eval = |x: f64| {
        Ok(if x > 10.0 {
            Evaluated::OutOfRange(format!("too many requests at {x}"))
        } else {
            Evaluated::Ran(Point { load: x, holds: true, metrics: Metrics::new() })
        })
    };
    let a = search(1.0, None, settings(0.01), &mut eval).unwrap();
    assert_eq!((a.status, a.lo, a.points.len()), (Status::HoldsEverywhere, 8.0, 4));
    assert_eq!(a.note.as_deref(), Some("the search stopped at a load the workload refuses: too many requests at 16"));
}

/// An answer below the start is still found when the bottom of the range holds; when the
/// bottom is out of the workload's range, halving from the start finds it as before.
#[test]
fn a_failing_start_probes_the_bottom_then_bisects() {
    let a = search(10.0, None, settings(0.02), &mut up_to(0.7)).unwrap();
    assert_eq!(a.points[1].load, 10.0 / 1048576.0);
    assert!(a.points[1].holds);
    assert_eq!(a.status, Status::Found);
    let mut eval = |x: f64| {
        Ok(if x < 1e-3 {
            Evaluated::OutOfRange(format!("too slow at {x}"))
        } else {
            Evaluated::Ran(Point { load: x, holds: x <= 0.7, metrics: Metrics::new() })
        })
    };
    let b = search(10.0, None, settings(0.02), &mut eval).unwrap();
    assert_eq!(b.status, Status::Found);
    assert!(b.lo <= 0.7 && 0.7 < b.hi, "{} {}", b.lo, b.hi);
    assert_eq!(b.note, None, "the refused bottom is no reason the search stopped");
}

/// Issue 26: SLOs no load can meet were searched through 21 loads; these are refused before
/// any run, naming the condition.
#[test]
fn conditions_no_load_can_meet_are_found_before_any_run() {
    let parse = |y: &str| routelab_core::workload::parse(y, Path::new("w.yaml")).unwrap();
    let c = parse(
        "cluster:\n  replicas: 1\n  gpu: a6000\n  model: mistral-7b\n  generator: {output_tokens: 8}\n  \
         arrivals: {poisson: {rate: 1}}\n  requests: 10\n",
    );
    // mistral-7b's 14.5 GB of weights at the a6000's effective bandwidth, once per step.
    let (floor, _) = quickest_step(c.cluster.as_ref().unwrap()).unwrap();
    assert!(floor > 0.015 && floor < 0.03, "{floor}");
    let check = |slo: &str, w: &Workload| impossible(&expr::parse(slo, w).unwrap(), w);
    let found = check("ttft_p99_s<0.001", &c).expect("below one step");
    assert_eq!(found.0, "ttft_p99_s < 0.001");
    assert!(found.1.contains("waits for at least one step") && found.1.contains("a6000"), "{found:?}");
    assert!(check(&format!("latency_mean_s<={}", floor * 0.99), &c).is_some());
    assert!(check(&format!("ttft_p50_s<{}", floor * 1.01), &c).is_none(), "above the floor: for the runs to say");
    assert!(check("ttft_p99_s<2", &c).is_none());
    assert!(check("tpot_mean_s<0.001", &c).is_none(), "one-token outputs have no TPOT: no floor claimed");
    assert_eq!(check("hit_rate>1", &c).unwrap().0, "hit_rate > 1");
    assert!(check("hit_rate>=1", &c).is_none(), "a hit rate of 1 can happen");
    assert!(check("throughput_rps<0", &c).is_some());
    // Per-request bounds no request meets: attainment and goodput stay 0.
    assert!(check("ttft_s=0.001,slo_attainment>=0.5", &c).unwrap().1.contains("ttft_s=0.001"));
    assert!(check("latency_s=0.001,goodput_rps>0", &c).is_some());
    assert!(check("ttft_s=0.001,slo_attainment>=0", &c).is_none(), "holds trivially");
    assert!(check("ttft_s=1,slo_attainment>=0.5", &c).is_none());
    // The dispatch world: ranges only.
    let d = parse("dispatch: {servers: 1, requests: 10}\n");
    assert!(check("response_mean<0", &d).is_some());
    assert!(check("utilisation>1", &d).is_some());
    assert!(check("response_mean<0.01", &d).is_none());
}

#[test]
fn the_point_budget_leaves_it_unresolved() {
    let s = Settings { tolerance: 1e-9, max_points: 9 };
    let a = search(1.0, None, s, &mut up_to(5.0)).unwrap();
    assert_eq!((a.status, a.points.len()), (Status::Unresolved, 9));
    assert!(a.lo <= 5.0 && 5.0 < a.hi);
}
