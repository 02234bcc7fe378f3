use super::*;

fn line(gpu: &str, price: f64) -> Line {
    Line {
        gpu: gpu.into(),
        tp: 1,
        policy: "r".into(),
        spec: "r".into(),
        scaler: None,
        replica_price: price,
        fixed: None,
    }
}

fn settings(min: u32, max: u32, start: u32) -> Settings {
    Settings { min_replicas: min, max_replicas: max, start, budget: None, prefill: None, mix: None }
}

/// Line `i` holds from `edges[i]` replicas up (`u32::MAX`: never); margin grows with replicas.
fn synthetic<'a>(
    lines: &'a [Line],
    edges: &'a [u32],
    asked: &'a mut Vec<(usize, u32)>,
) -> impl FnMut(&[(usize, u32)]) -> Result<Batch, Error> + 'a {
    move |asks| {
        asked.extend_from_slice(asks);
        Ok(asks
            .iter()
            .map(|&(i, r)| {
                Ok(Evaluation {
                    replicas: r,
                    cost_per_hour: lines[i].cost(f64::from(r)),
                    holds: r >= edges[i],
                    seeds_holding: 0,
                    margin: (f64::from(r) - f64::from(edges[i]) + 0.5) / 10.0,
                    metrics: Metrics::new(),
                    note: None,
                })
            })
            .collect())
    }
}

#[test]
fn bisects_each_line_to_the_fewest_replicas_that_hold() {
    let lines = [line("a", 1.0), line("b", 1.0)];
    let mut asked = Vec::new();
    let r = search(&lines, &settings(1, 16, 8), &mut synthetic(&lines, &[5, 13], &mut asked)).unwrap();
    // a: 8 holds → 4 fails → 6 holds → 5 holds: found at 5 (4 fails).
    assert_eq!((r[0].status, r[0].replicas, r[0].fails_at), (Status::Found, Some(5), Some(4)));
    assert_eq!(r[0].points.iter().map(|e| e.replicas).collect::<Vec<_>>(), vec![8, 4, 6, 5]);
    // b: 8 fails; from then on a's 8 (cost 8) is no dearer than anything b has left (9..16):
    // dominated, never run again.
    assert_eq!((r[1].status, r[1].replicas, r[1].fails_at), (Status::Dominated, None, Some(8)));
    assert_eq!(asked.iter().filter(|a| a.0 == 1).count(), 1, "{asked:?}");
    let (i, e) = winner(&r).unwrap();
    assert_eq!((i, e.replicas), (0, 5));
}

#[test]
fn a_dearer_gpu_runs_only_counts_cheaper_than_the_best_so_far() {
    // h: 4× the price of a; a holds from 6 (cost 6), h from 1 (cost 4): h wins.
    let lines = [line("a", 1.0), line("h", 4.0)];
    let mut asked = Vec::new();
    let r = search(&lines, &settings(1, 16, 8), &mut synthetic(&lines, &[6, 1], &mut asked)).unwrap();
    let (i, e) = winner(&r).unwrap();
    assert_eq!((i, e.replicas, e.cost_per_hour), (1, 1, 4.0));
    // Once h holds at 1 (cost 4), a may only run counts below 4: 3 fails, and it stops.
    assert_eq!(r[0].status, Status::Dominated, "{:?}", r[0].points);
    for &(i, n) in &asked {
        assert!(lines[i].replica_price * f64::from(n) <= 32.0, "{asked:?}");
    }
    // Every shape dearer than the winner that ran, ran before the winner was known.
    assert!(r[0].points.iter().all(|e| e.replicas == 8 || e.cost_per_hour < 8.0 * 4.0));
}

#[test]
fn a_line_that_never_holds_doubles_to_the_top_and_the_budget_stops_it_early() {
    let lines = [line("a", 1.0)];
    let mut asked = Vec::new();
    let r = search(&lines, &settings(1, 16, 3), &mut synthetic(&lines, &[u32::MAX], &mut asked)).unwrap();
    assert_eq!(r[0].status, Status::FailsEverywhere);
    assert_eq!(r[0].points.iter().map(|e| e.replicas).collect::<Vec<_>>(), vec![3, 6, 12, 16]);
    assert!(winner(&r).is_none());
    let budget = Settings { budget: Some(10.0), ..settings(1, 16, 3) };
    let mut asked = Vec::new();
    let r = search(&lines, &budget, &mut synthetic(&lines, &[u32::MAX], &mut asked)).unwrap();
    assert_eq!(r[0].status, Status::OverBudget);
    assert_eq!(r[0].points.iter().map(|e| e.replicas).collect::<Vec<_>>(), vec![3, 6, 10]);
}

/// A line with a fixed part of cost 3 (`2P` of a P/D split at 1.5 each): its shapes cost
/// replicas × price + 3, and the pruning counts the fixed part: with a plain line holding at
/// cost 6, the fixed line may only run counts n with n + 3 < 6.
#[test]
fn a_fixed_part_is_paid_on_every_shape_and_counted_when_pruning() {
    let fixed = Fixed { role: Role::Prefill, count: 2, gpu: "a".into(), tp: 1, cost_per_hour: 3.0, choice: None };
    let lines = [line("a", 1.0), Line { fixed: Some(fixed), ..line("a", 1.0) }];
    assert_eq!(lines[1].shape(4), "2P + 4D × a with r");
    let mut asked = Vec::new();
    // Plain holds from 6; the fixed line from 1 (cost 4).
    let r = search(&lines, &settings(1, 16, 8), &mut synthetic(&lines, &[6, 1], &mut asked)).unwrap();
    for e in &r[1].points {
        assert_eq!(e.cost_per_hour, f64::from(e.replicas) + 3.0);
    }
    let (i, e) = winner(&r).unwrap();
    assert_eq!((i, e.replicas, e.cost_per_hour), (1, 1, 4.0));
    // Round 2 the fixed line may run only n + 3 < 8 (it runs 2, cost 5, and holds); then the
    // plain line, failed at 4, has nothing left under 5: dominated after 8 and 4.
    assert_eq!(r[1].points.iter().map(|e| e.replicas).collect::<Vec<_>>(), vec![8, 2, 1]);
    assert_eq!(r[0].points.iter().map(|e| e.replicas).collect::<Vec<_>>(), vec![8, 4]);
    assert_eq!(r[0].status, Status::Dominated);
    assert_eq!(cap_of(&lines[1], &settings(1, 16, 8), Some(6.0)), (2, Cap::Winner));
    let budget = Settings { budget: Some(5.0), ..settings(1, 16, 8) };
    assert_eq!(cap_of(&lines[1], &budget, None), (2, Cap::Budget));
}

#[test]
fn the_frontier_keeps_shapes_no_cheaper_shape_beats_on_margin() {
    let lines = [line("a", 1.0), line("h", 3.0)];
    let mut asked = Vec::new();
    let r = search(&lines, &settings(1, 16, 8), &mut synthetic(&lines, &[5, 2], &mut asked)).unwrap();
    let f = frontier(&r);
    let pts: Vec<(f64, f64)> = f.iter().map(|&(i, k)| (r[i].points[k].cost_per_hour, r[i].points[k].margin)).collect();
    assert!(!pts.is_empty());
    for w in pts.windows(2) {
        assert!(w[0].0 <= w[1].0 && w[0].1 < w[1].1, "{pts:?}");
    }
    // Every shape run is on the frontier or beaten by one that is.
    for l in &r {
        for e in &l.points {
            assert!(pts.iter().any(|&(c, m)| c <= e.cost_per_hour && m >= e.margin), "{e:?} not covered by {pts:?}");
        }
    }
}

#[test]
fn margins_are_relative_slack_and_the_smallest_counts() {
    let target = crate::capacity::expr::Target {
        conditions: vec![
            crate::capacity::expr::Condition {
                metric: "wait_mean".into(),
                op: crate::capacity::expr::Op::Le,
                value: 0.5,
            },
            crate::capacity::expr::Condition {
                metric: "utilisation".into(),
                op: crate::capacity::expr::Op::Ge,
                value: 0.8,
            },
        ],
        bounds: None,
    };
    let mut m = Metrics::new();
    m.push("wait_mean", 0.4);
    m.push("utilisation", 0.9);
    // 0.1/0.5 = 0.2 and 0.1/0.8 = 0.125: the smaller.
    assert!((margin(&target, &m) - 0.125).abs() < 1e-12);
    assert!(margin(&target, &Metrics::new()).is_nan());
}

#[test]
fn prices_parse_and_resolve_flag_first() {
    let w = routelab_core::workload::parse(
        "cluster: {replicas: 2, gpu: h100, tp: 2, cost_per_hour: 9, generator: {output_tokens: 8}, requests: 10, \
         arrivals: {poisson: {rate: 1}}}",
        std::path::Path::new("w.yaml"),
    )
    .unwrap();
    let flag = prices::parse("a6000=0.5, L40S=2").unwrap();
    assert_eq!(prices::of("a6000", &flag, &w), Some((0.5, prices::Source::Flag)));
    assert_eq!(prices::of("l40s", &flag, &w), Some((2.0, prices::Source::Flag)));
    // The workload's price is per replica of tp 2: per GPU, half.
    assert_eq!(prices::of("h100", &flag, &w), Some((4.5, prices::Source::Workload)));
    assert_eq!(prices::of("a100-80", &flag, &w), Some((2.5, prices::Source::Default)));
    assert_eq!(prices::of("rtx4090", &flag, &w), None);
    for bad in ["h100", "h100=x", "h100=-1", "a=1,a=2"] {
        assert!(prices::parse(bad).is_err(), "{bad}");
    }
}

/// A mixed line (2 of a second GPU fixed) starts at the workload's count less those 2, so its
/// first fleet is as large as the workload's; a P/D line starts at the count itself (decode's).
#[test]
fn a_mixed_line_starts_at_the_workloads_fleet_size() {
    let part = |role| Fixed { role, count: 2, gpu: "b".into(), tp: 1, cost_per_hour: 2.0, choice: None };
    let lines = [
        Line { fixed: Some(part(Role::Pool)), ..line("a", 1.0) },
        Line { fixed: Some(part(Role::Prefill)), ..line("a", 1.0) },
    ];
    let mut asked = Vec::new();
    search(&lines, &settings(1, 16, 8), &mut synthetic(&lines, &[1, 1], &mut asked)).unwrap();
    assert_eq!(&asked[..2], &[(0, 6), (1, 8)]);
    assert_eq!(lines[0].shape(6), "6 × a + 2 × b with r");
}

/// A scaled P/D line on `pd/autoscaling.yaml` (its pools' minimums 1): the shape `2P + 3D` runs
/// both pools full at the start, each bounded by its count (the budget their sum); it costs the
/// mean instances of both pools (no fixed part on top), and unrun its whole budget.
#[test]
fn a_scaled_pd_line_budgets_each_pool_at_its_count_and_costs_both_pools_mean() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/cluster/pd/autoscaling.yaml");
    let w = routelab_core::workload::load(&file).unwrap_or_else(|e| panic!("{e}"));
    let target = crate::capacity::expr::parse("ttft_p99_s<2", &w).unwrap();
    let fixed = Fixed { role: Role::Prefill, count: 2, gpu: "a6000".into(), tp: 1, cost_per_hour: 1.6, choice: None };
    let l = Line { scaler: Some("hpa".into()), fixed: Some(fixed), ..line("a6000", 0.8) };
    let gpu = routelab_core::step_model::Choice::Name("a6000".into());
    let p =
        Problem { workload: &w, file: &file, target: &target, specs: &[], gpus: std::slice::from_ref(&gpu), jobs: 1 };
    let c = run::shape(&p, 0, &l, 3).unwrap().cluster.unwrap();
    let d = c.disaggregation.as_ref().unwrap();
    assert_eq!((c.replicas, d.prefill.instances, d.decode.instances), (5, 2, 3));
    let a = c.autoscaling.as_ref().unwrap();
    assert_eq!((a.scaler.as_str(), a.min_replicas, a.max_replicas), ("hpa", 1, 5));
    let pools = a.pools.as_ref().unwrap();
    assert_eq!((pools.prefill.min_replicas, pools.prefill.max_replicas), (1, 2));
    assert_eq!((pools.decode.min_replicas, pools.decode.max_replicas), (1, 3));
    assert_eq!(c.cost_per_hour, Some(0.8));
    c.validate().unwrap();
    assert_eq!(l.shape(3), "up to 2P + 3D × a6000 with r, scaled by hpa");
    assert_eq!(l.scaled_cost(2.5), 2.5 * 0.8);
    assert_eq!(l.cost(3.0), 5.0 * 0.8);
}
