//! Tests of the generated streams.

use super::*;
use crate::seeds::stream;
use crate::time::seconds;
use crate::workload::cluster::{Contexts, Generator};

pub(crate) fn spec(yaml: &str) -> ClusterSpec {
    serde_norway::from_str(yaml).unwrap()
}

fn doc_qa() -> ClusterSpec {
    spec(
        "replicas: 4\n\
         generator: {system_prompt_tokens: 13, contexts: {count: 300, tokens: {lognormal: {mean: 21000, cv: 0.2, max: 30000}}, popularity: {zipf: {s: 1.1}}}, suffix_tokens: {uniform: {min: 1500, max: 2500}}, output_tokens: {uniform: {min: 8, max: 24}}}\n\
         arrivals: {poisson: {rate: 1.0}}\n\
         requests: 3000\n",
    )
}

#[test]
fn same_seed_same_stream_other_seed_other_stream() {
    let s = doc_qa();
    let a = generate(&s, None, 7).unwrap();
    assert_eq!(a, generate(&s, None, 7).unwrap());
    assert_ne!(a, generate(&s, None, 8).unwrap());
    assert_eq!(a.requests.len(), 3000);
    assert!(a.requests.windows(2).all(|w| w[0].arrived_at <= w[1].arrived_at));
}

#[test]
fn long_doc_stream_has_the_documented_shape() {
    let st = stats(&generate(&doc_qa(), None, 1).unwrap());
    assert!((st.rate_rps - 1.0).abs() < 0.1, "{st}");
    assert!((st.mean_prompt_tokens - 23_000.0).abs() < 2_300.0, "{st}");
    assert!((st.mean_output_tokens - 16.0).abs() < 1.0, "{st}");
    // Everything but the question is shared: the documents repeat under Zipf.
    assert!(st.shared_prompt_share > 0.85 && st.shared_prompt_share < 0.95, "{st}");
}

#[test]
fn gamma_arrivals_keep_the_rate_and_are_burstier_than_poisson() {
    let mut s = doc_qa();
    s.requests = Some(20_000);
    let cv_of = |st: &RequestStream| {
        let gaps: Vec<f64> = st.requests.windows(2).map(|w| seconds(w[1].arrived_at - w[0].arrived_at)).collect();
        let m = gaps.iter().sum::<f64>() / gaps.len() as f64;
        ((gaps.iter().map(|g| (g - m).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt() / m, 1.0 / m)
    };
    let (cv_poisson, _) = cv_of(&generate(&s, None, 1).unwrap());
    s.arrivals = Arrivals::Gamma { rate: 1.0, cv: 3.0 };
    let (cv_gamma, rate) = cv_of(&generate(&s, None, 1).unwrap());
    assert!((cv_poisson - 1.0).abs() < 0.05, "{cv_poisson}");
    assert!((cv_gamma - 3.0).abs() < 0.3, "{cv_gamma}");
    assert!((rate - 1.0).abs() < 0.1, "{rate}");
}

#[test]
fn zipf_shares_and_sampling_agree() {
    let p = Popular::new(300, &Popularity::Zipf { s: 1.1 });
    let mut rng = stream(3, "t");
    let n = 200_000;
    let hits = (0..n).filter(|_| p.sample(&mut rng) == 0).count() as f64 / n as f64;
    assert!((hits - p.share(0)).abs() < 0.005, "{hits} vs {}", p.share(0));
    assert!(p.share(0) > p.share(1) && p.share(1) > p.share(299));
}

#[test]
fn multi_turn_prompts_grow_by_previous_output_and_fanout_shares_prompts() {
    let mut s = doc_qa();
    s.generator = Generator {
        system_prompt_tokens: 10,
        contexts: Some(Contexts { count: 1, tokens: Tokens::Constant(100), popularity: Popularity::Uniform }),
        suffix_tokens: Tokens::Constant(5),
        output_tokens: Tokens::Constant(7),
        fanout: 2,
        turns: Tokens::Constant(3),
        think_time_s: 0.0,
        session: None,
    };
    s.requests = Some(6);
    let st = generate(&s, None, 1).unwrap();
    let prompts: Vec<u32> = st.requests.iter().map(|r| r.prompt_tokens).collect();
    assert_eq!(prompts, vec![115, 115, 127, 127, 139, 139]);
    assert_eq!(st.prompt(0), st.prompt(1));
    let out0 = st.requests[0].output_segment.unwrap();
    assert_eq!(st.prompt(2)[3], out0);
    assert!(st.requests[1].output_segment.is_none() && st.requests[4].output_segment.is_none());
}

#[test]
fn trace_rows_become_requests_with_the_system_prompt_shared() {
    let mut s = doc_qa();
    s.arrivals = Arrivals::Trace { path: "x.csv".into(), time_scale: 0.5, format: Default::default(), spread_s: 0.0 };
    s.requests = None;
    let rows = [
        TraceRow { at_s: 0.0, context_tokens: 374, generated_tokens: 44, class: 0, tenant: 0, line: 2 },
        TraceRow { at_s: 4.0, context_tokens: 5, generated_tokens: 0, class: 0, tenant: 0, line: 3 },
    ];
    let st = generate(&s, Some(&rows), 1).unwrap();
    assert_eq!(st.requests[1].arrived_at, ticks(2.0));
    assert_eq!((st.requests[0].prompt_tokens, st.requests[0].output_tokens), (374, 44));
    assert_eq!(st.prompt(0)[0].id, SYSTEM_ID);
    assert_eq!((st.requests[1].prompt_tokens, st.requests[1].output_tokens), (5, 1));
    let e = generate(&s, None, 1).unwrap_err().to_string();
    assert!(e.contains("AzurePublicDataset"), "{e}");
}
#[test]
fn mooncake_rows_become_block_segments_shared_by_id() {
    let mut s = doc_qa();
    s.arrivals = Arrivals::Trace {
        path: "x.jsonl".into(),
        time_scale: 2.0,
        format: super::super::cluster::TraceFormat::Mooncake,
        spread_s: 0.0,
    };
    s.requests = None;
    // Row 1: 1100 tokens = 512 + 512 + 76 over ids [7, 8, 9]. Row 2 shares the first block
    // (id 7), then its own: 700 tokens = 512 + 188 over [7, 20]. Row 3: its one id covers
    // 512 of 600 tokens, so 88 are a unique suffix.
    let row = |at_s, input_length, output_length, hash_ids: &[u64], line| MooncakeRow {
        at_s,
        input_length,
        output_length,
        hash_ids: hash_ids.to_vec(),
        line,
        session: None,
        parents: Vec::new(),
        adapter: None,
        class: None,
        tenant: None,
        model: None,
    };
    let rows = [row(0.0, 1100, 30, &[7, 8, 9], 1), row(1.5, 700, 0, &[7, 20], 2), row(2.0, 600, 4, &[7], 3)];
    let st = mooncake_stream(&s, &rows);
    let seg = |id: u64, tokens: u32| Segment { id: HASH_ID_BASE + id, tokens };
    assert_eq!(st.prompt(0), &[seg(7, 512), seg(8, 512), seg(9, 76)]);
    assert_eq!(st.prompt(1), &[seg(7, 512), seg(20, 188)]);
    assert_eq!(&st.prompt(2)[..1], &[seg(7, 512)]);
    assert_eq!(st.prompt(2)[1], Segment { id: FIRST_UNIQUE_ID, tokens: 88 });
    assert_eq!((st.requests[0].prompt_tokens, st.requests[0].output_tokens), (1100, 30));
    assert_eq!((st.requests[1].prompt_tokens, st.requests[1].output_tokens), (700, 1));
    assert_eq!(st.requests[2].prompt_tokens, 600);
    assert_eq!(st.requests[1].arrived_at, ticks(3.0));
}

/// Per-class arrivals: `steady` takes the cluster's Poisson process (20/s) by share, `bursty`
/// arrives by its own gamma process (10/s, cv 4) and `late` by its own stages (nothing for 100 s,
/// then 5/s). Over 400 s, seed 3, each class's count is its own rate × 400 within 4 standard
/// deviations of its count (Poisson: √n; gamma renewal: cv·√n), its gaps have its own
/// coefficient of variation, and `late` has no request before 100 s.
#[test]
fn each_class_arrives_by_its_own_process() {
    let s = spec(
        "replicas: 4\n\
         generator: {system_prompt_tokens: 13, suffix_tokens: 50, output_tokens: 8}\n\
         arrivals: {poisson: {rate: 20}}\n\
         duration_s: 400\n\
         classes:\n\
         - {name: steady, share: 1}\n\
         - {name: bursty, arrivals: {gamma: {rate: 10, cv: 4}}, output_tokens: 300}\n\
         - {name: late, arrivals: {stages: [{rate: 0, duration_s: 100}, {rate: 5, duration_s: 300}]}}\n",
    );
    let st = generate(&s, None, 3).unwrap();
    assert!(st.requests.windows(2).all(|w| w[0].arrived_at <= w[1].arrived_at), "merged in time order");
    let times = |class: u16| -> Vec<f64> {
        (0..st.len()).filter(|&i| st.label(i).class == class).map(|i| seconds(st.request(i).arrived_at)).collect()
    };
    let cv = |t: &[f64]| {
        let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let m = gaps.iter().sum::<f64>() / gaps.len() as f64;
        (gaps.iter().map(|g| (g - m).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt() / m
    };
    let (steady, bursty, late) = (times(0), times(1), times(2));
    let within = |n: usize, want: f64, sd: f64| (n as f64 - want).abs() < 4.0 * sd;
    assert!(within(steady.len(), 8000.0, 8000f64.sqrt()), "steady: {}", steady.len());
    assert!(within(bursty.len(), 4000.0, 4.0 * 4000f64.sqrt()), "bursty: {}", bursty.len());
    assert!(within(late.len(), 1500.0, 1500f64.sqrt()), "late: {}", late.len());
    assert!((cv(&steady) - 1.0).abs() < 0.1, "steady cv {}", cv(&steady));
    assert!((cv(&bursty) - 4.0).abs() < 0.8, "bursty cv {}", cv(&bursty));
    assert!(late[0] >= 100.0, "late starts at {}", late[0]);
    // The class's own sizes go with its own arrivals.
    assert!((0..st.len()).all(|i| (st.label(i).class == 1) == (st.request(i).output_tokens == 300)));
    // Same seed, same stream; the merged processes are cut by `requests` like one.
    assert_eq!(st, generate(&s, None, 3).unwrap());
    let cut = ClusterSpec { requests: Some(1000), ..s.clone() };
    let first = generate(&cut, None, 3).unwrap();
    assert_eq!(first.requests[..], st.requests[..1000]);
}
