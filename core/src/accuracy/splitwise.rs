//! A second check of the step model, on measurements it was fitted on none of: Splitwise's
//! Llama-2-70B prefill and decode times on DGX-A100 and DGX-H100 at tensor parallel 2, 4 and 8
//! (`workloads/profiles/measured/Splitwise_Llama-2-70B_A100-H100/`, MIT; its README).
//!
//! Each measured point (the median of its repetitions) is priced as one step of routelab's step
//! model for `llama-2-70b` on `a100-80` or `h100` (the roofline: no profile is fitted for these
//! GPUs): the prefill of `batch` prompts of `prompt` tokens together, and a decode step of
//! `batch` requests at the mean context of their generation (`prompt + tokens / 2`).

use crate::step_model::{Chunk, Step, StepModel};

const DATA: &str = include_str!("../../../workloads/profiles/measured/Splitwise_Llama-2-70B_A100-H100/perf_model.csv");

/// One measured point: the configuration and the median times (s).
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub gpu: &'static str,
    pub tp: u32,
    pub prompt: u64,
    pub batch: u64,
    pub tokens: u64,
    pub prefill_s: f64,
    pub decode_step_s: f64,
}

/// The points of the shipped subset, medians over repetitions, in file order of first sight.
pub fn points() -> Vec<Point> {
    let mut groups: Vec<(Point, Vec<f64>, Vec<f64>)> = Vec::new();
    for line in DATA.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let gpu = match f[1] {
            "a100-80gb" => "a100-80",
            "h100-80gb" => "h100",
            other => panic!("unexpected hardware {other}"),
        };
        let n = |i: usize| f[i].parse::<f64>().unwrap();
        let key = Point {
            gpu,
            tp: n(10) as u32,
            prompt: n(2) as u64,
            batch: n(3) as u64,
            tokens: n(4) as u64,
            prefill_s: 0.0,
            decode_step_s: 0.0,
        };
        match groups.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, p, d)) => {
                p.push(n(7) / 1e3);
                d.push(n(8) / 1e3);
            }
            None => groups.push((key, vec![n(7) / 1e3], vec![n(8) / 1e3])),
        }
    }
    groups
        .into_iter()
        .map(|(mut k, p, d)| {
            k.prefill_s = median(p);
            k.decode_step_s = median(d);
            k
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// The step model's (prefill, decode step) times for `p`.
pub fn predict(p: &Point) -> (f64, f64) {
    let sm = StepModel::from_catalog(p.gpu, "llama-2-70b", p.tp, 0.9).expect("Llama-2-70B fits at tp ≥ 2");
    let chunks = vec![Chunk { new_tokens: p.prompt, context_tokens: 0 }; p.batch as usize];
    let prefill = sm.pricer.step_time_s(&Step::mixed(0, 0, &chunks));
    let decode = sm.pricer.step_time_s(&Step::decode(p.batch, p.batch * (p.prompt + p.tokens / 2)));
    (prefill, decode)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signed errors (model − measured) / measured per configuration: the median over its
    /// points of prefill and decode. Printed as docs/accuracy.md's table
    /// (`cargo test -p routelab-core splitwise -- --nocapture`).
    #[test]
    fn the_roofline_against_splitwise_llama2_70b() {
        let pts = points();
        let mut all_prefill = Vec::new();
        let mut all_decode = Vec::new();
        println!("| GPU | TP | prefill: median signed error | range | decode step: median signed error | range |");
        println!("|---|---|---|---|---|---|");
        for gpu in ["a100-80", "h100"] {
            for tp in [2, 4, 8] {
                let (mut pe, mut de) = (Vec::new(), Vec::new());
                for p in pts.iter().filter(|p| p.gpu == gpu && p.tp == tp) {
                    let (prefill, decode) = predict(p);
                    pe.push((prefill - p.prefill_s) / p.prefill_s);
                    de.push((decode - p.decode_step_s) / p.decode_step_s);
                }
                let range = |v: &[f64]| {
                    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    format!("{:+.0}% … {:+.0}%", lo * 100.0, hi * 100.0)
                };
                println!(
                    "| {gpu} | {tp} | {:+.1}% | {} | {:+.1}% | {} |",
                    median(pe.clone()) * 100.0,
                    range(&pe),
                    median(de.clone()) * 100.0,
                    range(&de)
                );
                all_prefill.extend(pe);
                all_decode.extend(de);
            }
        }
        let (mp, md) = (median(all_prefill.clone()), median(all_decode.clone()));
        println!("all {} points: prefill median signed {:+.1}%, decode {:+.1}%", pts.len(), mp * 100.0, md * 100.0);
        assert_eq!(pts.len(), 6 * 19, "6 configurations × 19 points");
        // The bands hold the figures measured when this test was written (docs/accuracy.md)
        // with a few points of room: a step model that moved either way by more fails here.
        // Measured: prefill −48.9%, decode −49.1% (the roofline, every GPU and TP).
        assert!((-0.55..=-0.43).contains(&mp), "prefill median signed error {mp}");
        assert!((-0.55..=-0.43).contains(&md), "decode median signed error {md}");
    }
}
