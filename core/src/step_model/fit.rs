//! Fitting a [`Calibration`]'s kernel terms to per-layer timings measured inside vLLM (the
//! LLMServingSim profiler's layout: `dense.csv`, `attention.csv`, `per_sequence.csv` and
//! `meta.yaml` in one folder; see docs/accuracy.md).
//!
//! - dense: one layer's projections, MLP, norms, activation and rotary embedding summed per token
//!   count `T` (two layernorms a layer), fitted as `max(floor, base + slope · T)`: the knee is the
//!   grid point that minimises the squared relative error, the floor the mean below it, the line
//!   least squares above it;
//! - attention: `base + per_pair · pairs` on prefill-only rows, then `per_kv_token · (n_decode ·
//!   kv_decode) + per_decode · n_decode` on decode-only rows, then a second KV rate on the rows
//!   that mix both (decodes that share a step with a prefill chunk run through the prefill
//!   kernel), each least squares on relative error;
//! - head: LM head + sampler, `base + per_sequence · sequences`, least squares.
//!
//! Rates come out of the slopes through the profiled model's shape (weights, heads, KV heads,
//! vocabulary), so the profile applies to other models by theirs. The terms a kernel profile
//! cannot see (per-step scheduler time, per-request costs, all-reduce) are fitted on measured
//! runs (`routelab calibrate --runs`) or keep their defaults.

use std::collections::BTreeMap;
use std::path::Path;

use super::Model;
use super::calibrated::{Calibration, TermFit};

/// A measurement file that cannot be read as one: the file, the line (1-based), the field, why.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasurementError {
    pub file: String,
    pub line: Option<usize>,
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for MeasurementError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: `{}`: {}", self.file, self.field, self.message),
            None => write!(f, "{}: `{}`: {}", self.file, self.field, self.message),
        }
    }
}

/// Least squares: the `x` minimising Σ w · (a·x − b)². `None` when the system is singular.
pub fn least_squares(rows: &[(Vec<f64>, f64, f64)]) -> Option<Vec<f64>> {
    let k = rows.first()?.0.len();
    let mut m = vec![vec![0.0; k + 1]; k];
    for (a, b, w) in rows {
        for i in 0..k {
            for j in 0..k {
                m[i][j] += w * a[i] * a[j];
            }
            m[i][k] += w * a[i] * b;
        }
    }
    // Gaussian elimination with partial pivoting on the normal equations.
    for c in 0..k {
        let p = (c..k).max_by(|&x, &y| m[x][c].abs().total_cmp(&m[y][c].abs()))?;
        if m[p][c].abs() < 1e-300 {
            return None;
        }
        m.swap(c, p);
        let pivot = m[c].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != c {
                let f = row[c] / pivot[c];
                for (x, p) in row.iter_mut().zip(&pivot).skip(c) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| m[i][k] / m[i][i]).collect())
}

/// Median and 90th percentile of the absolute relative errors of `pairs` (model, measured).
pub fn term_fit(pairs: impl Iterator<Item = (f64, f64)>) -> TermFit {
    let mut errs: Vec<f64> = pairs.map(|(model, real)| ((model - real) / real).abs()).collect();
    errs.sort_by(f64::total_cmp);
    let q = |p: f64| if errs.is_empty() { f64::NAN } else { errs[((errs.len() - 1) as f64 * p).round() as usize] };
    TermFit { points: errs.len() as u32, median_error: round4(q(0.5)), p90_error: round4(q(0.9)) }
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// `max(floor, base + slope · t)` fitted to (t, y) points: (floor, base, slope).
pub fn fit_knee(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    let mut ts: Vec<f64> = points.iter().map(|p| p.0).collect();
    ts.sort_by(f64::total_cmp);
    ts.dedup();
    let mut best: Option<(f64, (f64, f64, f64))> = None;
    for &knee in &ts {
        type Side<'a> = Vec<&'a (f64, f64)>;
        let (below, above): (Side, Side) = points.iter().partition(|p| p.0 < knee);
        if below.is_empty() || above.len() < 2 {
            continue;
        }
        let floor = below.iter().map(|p| p.1).sum::<f64>() / below.len() as f64;
        let rows: Vec<_> = above.iter().map(|p| (vec![1.0, p.0], p.1, 1.0 / (p.1 * p.1))).collect();
        let Some(line) = least_squares(&rows) else { continue };
        let f = |t: f64| floor.max(line[0] + line[1] * t);
        let sse: f64 = points.iter().map(|p| ((f(p.0) - p.1) / p.1).powi(2)).sum();
        if best.as_ref().is_none_or(|b| sse < b.0) {
            best = Some((sse, (floor, line[0], line[1])));
        }
    }
    best.map(|b| b.1)
}

/// Rows of a CSV with a header: (line number, the `label` column's text, the named numeric columns).
fn read_csv(path: &Path, label: &str, numeric: &[&str]) -> Result<Vec<(usize, String, Vec<f64>)>, MeasurementError> {
    let file = path.display().to_string();
    let err = |line: Option<usize>, field: &str, message: String| MeasurementError {
        file: file.clone(),
        line,
        field: field.into(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(None, "", format!("cannot read it: {e}")))?;
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = lines.next().map(|(_, h)| h.split(',').map(str::trim).collect()).unwrap_or_default();
    let cols: Vec<usize> = numeric
        .iter()
        .map(|c| header.iter().position(|h| h == c).ok_or_else(|| err(Some(1), c, "the column is missing".into())))
        .collect::<Result<_, _>>()?;
    let label = header.iter().position(|h| *h == label);
    let mut rows = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let mut values = Vec::with_capacity(cols.len());
        for (&c, name) in cols.iter().zip(numeric) {
            let cell = cells.get(c).copied().unwrap_or("");
            let v: f64 = cell.parse().map_err(|_| err(Some(i + 1), name, format!("not a number: {cell:?}")))?;
            if !(v.is_finite() && v >= 0.0) {
                return Err(err(Some(i + 1), name, format!("must be a non-negative number (got {cell})")));
            }
            values.push(v);
        }
        let name = label.and_then(|l| cells.get(l)).unwrap_or(&"").to_string();
        rows.push((i + 1, name, values));
    }
    if rows.is_empty() {
        return Err(err(None, "", "no measurements".into()));
    }
    Ok(rows)
}

/// Per-layer decoder ops of the dense profile and how many times each runs in a layer.
const LAYER_OPS: [(&str, f64); 7] = [
    ("qkv_proj", 1.0),
    ("o_proj", 1.0),
    ("gate_up_proj", 1.0),
    ("down_proj", 1.0),
    ("act_fn", 1.0),
    ("rotary_emb", 1.0),
    ("layernorm", 2.0),
];

/// Fits the kernel terms of a profile folder measured on `model`; the other terms are copied
/// from `base` (defaults or an earlier profile). Times in the files are microseconds.
pub fn fit_kernels(dir: &Path, model: &Model, base: &Calibration) -> Result<Calibration, MeasurementError> {
    let us = 1e-6;
    let mut c = base.clone();
    let mut fits = BTreeMap::new();
    let missing = |what: &str, file: &Path| MeasurementError {
        file: file.display().to_string(),
        line: None,
        field: what.into(),
        message: "too few measurements to fit this term".into(),
    };

    // Dense: one layer per token count.
    let dense_file = dir.join("dense.csv");
    let mut per_t: BTreeMap<u64, f64> = BTreeMap::new();
    for (_, layer, v) in read_csv(&dense_file, "layer", &["tokens", "time_us"])? {
        if let Some((_, times)) = LAYER_OPS.iter().find(|(n, _)| *n == layer) {
            *per_t.entry(v[0] as u64).or_default() += times * v[1] * us;
        }
    }
    let points: Vec<(u32, f64, f64)> = per_t.iter().map(|(&t, &y)| (1, t as f64, y)).collect();
    let dense = fit_dense(&mut c, &points, model).ok_or_else(|| missing("tokens", &dense_file))?;
    fits.insert("dense".into(), dense);
    let bpe = model.bytes_per_element as f64;

    // Attention: one layer. Three regimes, fitted in turn on relative error: a prefill chunk
    // alone (base + pairs), decodes alone (KV read + per decode), and decodes sharing a step with
    // a chunk, whose KV reads go through the prefill kernel's tiles and cost more per token.
    let att_file = dir.join("attention.csv");
    let att = read_csv(&att_file, "layer", &["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"])?;
    let pairs = |v: &[f64]| v[0] * v[1] + v[0] * (v[0] + 1.0) / 2.0;
    let w = |t: f64| 1.0 / (t * t);
    let prefill: Vec<_> =
        att.iter().filter(|r| r.2[2] == 0.0).map(|(_, _, v)| (vec![1.0, pairs(v)], v[4] * us, w(v[4] * us))).collect();
    let x = least_squares(&prefill).ok_or_else(|| missing("prefill_chunk", &att_file))?;
    let (a_base, per_pair) = (x[0].max(0.0), x[1]);
    let decode: Vec<_> = att
        .iter()
        .filter(|r| r.2[0] == 0.0 && r.2[2] > 0.0)
        .map(|(_, _, v)| (vec![v[2] * v[3], v[2]], v[4] * us - a_base, w(v[4] * us)))
        .collect();
    let x = least_squares(&decode).ok_or_else(|| missing("n_decode", &att_file))?;
    let (per_kv, per_dec) = (x[0], x[1].max(0.0));
    let mixed: Vec<_> = att
        .iter()
        .filter(|r| r.2[0] > 0.0 && r.2[2] > 0.0)
        .map(|(_, _, v)| (vec![v[2] * v[3]], v[4] * us - a_base - per_pair * pairs(v) - per_dec * v[2], w(v[4] * us)))
        .collect();
    let per_kv_mixed = match least_squares(&mixed) {
        Some(x) if x[0] > 0.0 => x[0],
        _ => per_kv,
    };
    if !(per_pair > 0.0 && per_kv > 0.0) {
        return Err(MeasurementError {
            file: att_file.display().to_string(),
            line: None,
            field: "time_us".into(),
            message: "attention time does not grow with context: cannot fit prefill and decode rates".into(),
        });
    }
    let d = model.head_dim as f64;
    let kv_bytes = 2.0 * model.kv_heads as f64 * d * bpe;
    c.attention_tflops = 4.0 * model.heads as f64 * d / per_pair / 1e12;
    c.attention_gb_s = kv_bytes / per_kv / 1e9;
    c.attention_mixed_head_gb_s = 2.0 * model.heads as f64 * d * bpe / per_kv_mixed / 1e9;
    c.attention_base_s = a_base;
    c.attention_per_decode_s = per_dec;
    let model_att = |v: &[f64]| {
        let kv = if v[0] > 0.0 { per_kv_mixed } else { per_kv };
        a_base + per_pair * pairs(v) + kv * v[2] * v[3] + per_dec * v[2]
    };
    fits.insert("attention".into(), term_fit(att.iter().map(|(_, _, v)| (model_att(v), v[4] * us))));

    // LM head and sampler, per step.
    let head_file = dir.join("per_sequence.csv");
    let mut per_s: BTreeMap<u64, f64> = BTreeMap::new();
    for (_, _, v) in read_csv(&head_file, "layer", &["sequences", "time_us"])? {
        *per_s.entry(v[0] as u64).or_default() += v[1] * us;
    }
    let rows: Vec<_> = per_s.iter().map(|(&s, &y)| (vec![1.0, s as f64], y, 1.0 / (y * y))).collect();
    let h = least_squares(&rows).ok_or_else(|| missing("sequences", &head_file))?;
    if !(h[0] > 0.0) || model.vocab == 0 {
        return Err(missing("sequences", &head_file));
    }
    c.head_gb_s = model.vocab as f64 * model.hidden as f64 * bpe / h[0] / 1e9;
    c.head_per_sequence_s = h[1].max(0.0);
    fits.insert("head".into(), term_fit(per_s.iter().map(|(&s, &y)| (h[0] + h[1].max(0.0) * s as f64, y))));
    c.fit.extend(fits);
    Ok(c)
}

/// Fits `c`'s dense terms (`dense_gb_s`, `dense_tflops`, `dense_base_share`) to one decoder
/// layer's non-attention time measured on `model`: points `(tp, tokens, seconds)`, the layer
/// split `tp` ways. Times are scaled by `tp` to the whole layer's, so points of several TP
/// degrees make one fit (their GEMMs' lower efficiency at higher TP averages in), then
/// `max(floor, base + slope · T)` is fitted as [`fit_knee`] does. Returns the fit's error on
/// the points as given, `None` when there are too few to fit.
pub fn fit_dense(c: &mut Calibration, points: &[(u32, f64, f64)], model: &Model) -> Option<TermFit> {
    let whole: Vec<(f64, f64)> = points.iter().map(|&(tp, t, y)| (t, y * tp as f64)).collect();
    let (floor, base_s, slope) = fit_knee(&whole)?;
    let bpe = model.bytes_per_element as f64;
    c.dense_gb_s = model.layer_weight_params() * bpe / floor / 1e9;
    c.dense_tflops = 2.0 * model.layer_active_params() / slope / 1e12;
    c.dense_base_share = base_s.max(0.0) / floor;
    Some(term_fit(points.iter().map(|&(tp, t, y)| (floor.max(base_s + slope * t) / tp as f64, y))))
}

/// Fits `allreduce_s` and `allreduce_gb_s` to measured all-reduce times of a `tp`-GPU group
/// (AIConfigurator's `custom_allreduce` layout: `num_gpus,message_size,latency_ms` with
/// `message_size` in elements of `bytes_per_element` bytes, `backend` `vllm_graph` rows when the
/// file has both): `latency = allreduce_s + bytes / allreduce_gb_s`, least squares on relative
/// error. Returns the profile with both set and their fit.
pub fn fit_allreduce(
    file: &Path,
    tp: u32,
    bytes_per_element: u32,
    base: &Calibration,
) -> Result<Calibration, MeasurementError> {
    let rows = read_csv(file, "backend", &["num_gpus", "message_size", "latency_ms"])?;
    // CUDA-graph rows when the table has a backend column (eager ones repeat them with launch costs).
    let graph_only = rows.iter().any(|r| !r.1.is_empty());
    let points: Vec<(f64, f64)> = rows
        .iter()
        .filter(|(_, backend, v)| v[0] == tp as f64 && (!graph_only || backend == "vllm_graph"))
        .map(|(_, _, v)| (v[1] * bytes_per_element as f64, v[2] * 1e-3))
        .collect();
    let rows_ls: Vec<_> = points.iter().map(|&(b, t)| (vec![1.0, b], t, 1.0 / (t * t))).collect();
    let x = least_squares(&rows_ls).filter(|x| x[1] > 0.0).ok_or_else(|| MeasurementError {
        file: file.display().to_string(),
        line: None,
        field: "num_gpus".into(),
        message: format!("too few all-reduce measurements on {tp} GPUs to fit latency and bandwidth"),
    })?;
    let mut c = base.clone();
    c.allreduce_s = x[0].max(0.0);
    c.allreduce_gb_s = 1.0 / x[1] / 1e9;
    c.fit.insert("allreduce".into(), term_fit(points.iter().map(|&(b, t)| (c.allreduce_s + b * x[1], t))));
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step_model::{Chunk, Step};

    #[test]
    fn least_squares_recovers_a_plane() {
        let rows: Vec<_> = (0..20)
            .map(|i| {
                let (a, b) = (i as f64, (i * i % 7) as f64);
                (vec![1.0, a, b], 3.0 + 2.0 * a - 0.5 * b, 1.0)
            })
            .collect();
        let x = least_squares(&rows).unwrap();
        assert!((x[0] - 3.0).abs() < 1e-9 && (x[1] - 2.0).abs() < 1e-9 && (x[2] + 0.5).abs() < 1e-9, "{x:?}");
        assert!(least_squares(&[(vec![1.0, 1.0], 1.0, 1.0), (vec![2.0, 2.0], 2.0, 1.0)]).is_none());
    }

    #[test]
    fn the_knee_fit_recovers_floor_base_and_slope() {
        let f = |t: f64| 300e-6f64.max(250e-6 + 1.05e-6 * t);
        let points: Vec<(f64, f64)> = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0]
            .iter()
            .map(|&t| (t, f(t)))
            .collect();
        let (floor, base, slope) = fit_knee(&points).unwrap();
        assert!((floor - 300e-6).abs() < 1e-12, "{floor}");
        assert!((base - 250e-6).abs() < 1e-10 && (slope - 1.05e-6).abs() < 1e-12, "{base} {slope}");
    }

    /// Measurements generated by the model itself from known terms: the fit gives them back.
    #[test]
    fn fitting_recovers_the_terms_that_generated_the_measurements() {
        let m = crate::step_model::catalog::model("llama-3.1-8b").unwrap();
        let mut truth = Calibration::unfitted("synthetic", "rtx-pro-6000", "test");
        truth.dense_gb_s = 1300.0;
        truth.dense_tflops = 400.0;
        truth.dense_base_share = 0.58;
        truth.attention_tflops = 200.0;
        truth.attention_gb_s = 1400.0;
        truth.attention_mixed_head_gb_s = 3000.0;
        truth.attention_base_s = 10e-6;
        truth.attention_per_decode_s = 0.1e-6;
        truth.head_gb_s = 1500.0;
        truth.head_per_sequence_s = 1e-6;
        let c = truth.for_model(&m, 1, 1);
        let dir = std::env::temp_dir().join(format!("routelab-fit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let us = |s: f64| s * 1e6;
        let mut dense = String::from("layer,tokens,time_us\n");
        for t in [1u64, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 1536, 2048] {
            let y = c.dense_s(t as f64);
            dense.push_str(&format!("qkv_proj,{t},{}\nembedding,{t},3.0\n", us(y)));
        }
        let mut att = String::from("prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n");
        let step = |chunk: u64, kp: u64, nd: u64, kd: u64| {
            let chunks = [Chunk { new_tokens: chunk, context_tokens: kp }];
            let one = Step::mixed(nd, nd * kd, if chunk > 0 { &chunks } else { &[] });
            // One layer's attention: the step's attention terms alone.
            let pairs =
                if chunk > 0 { chunk as f64 * kp as f64 + chunk as f64 * (chunk as f64 + 1.0) / 2.0 } else { 0.0 };
            let kv = if one.chunks.is_empty() { c.attention_per_kv_token_s } else { c.attention_mixed_per_kv_token_s };
            c.attention_base_s
                + pairs * c.attention_per_pair_s
                + (nd * kd) as f64 * kv
                + nd as f64 * c.attention_per_decode_s
        };
        for chunk in [0u64, 16, 128, 512, 2048] {
            for kp in [0u64, 512, 4096] {
                for nd in [0u64, 1, 8, 64, 128] {
                    for kd in [16u64, 1024, 8192] {
                        if (chunk == 0 && (nd == 0 || kp > 0)) || (nd == 0 && kd > 16) {
                            continue;
                        }
                        let kd = if nd == 0 { 0 } else { kd };
                        att.push_str(&format!("{chunk},{kp},{nd},{kd},{}\n", us(step(chunk, kp, nd, kd))));
                    }
                }
            }
        }
        let mut head = String::from("layer,sequences,time_us\n");
        for s in [1u64, 2, 4, 16, 64, 128, 256] {
            head.push_str(&format!("lm_head,{s},{}\n", us(c.head_base_s + s as f64 * c.head_per_sequence_s)));
        }
        std::fs::write(dir.join("dense.csv"), dense).unwrap();
        std::fs::write(dir.join("attention.csv"), att).unwrap();
        std::fs::write(dir.join("per_sequence.csv"), head).unwrap();
        let got = fit_kernels(&dir, &m, &Calibration::unfitted("fit", "rtx-pro-6000", "test")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let close = |name: &str, a: f64, b: f64| {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-9), "{name}: fitted {a}, true {b}")
        };
        close("dense_gb_s", got.dense_gb_s, truth.dense_gb_s);
        close("dense_tflops", got.dense_tflops, truth.dense_tflops);
        close("dense_base_share", got.dense_base_share, truth.dense_base_share);
        close("attention_tflops", got.attention_tflops, truth.attention_tflops);
        close("attention_gb_s", got.attention_gb_s, truth.attention_gb_s);
        close("attention_mixed_head_gb_s", got.attention_mixed_head_gb_s, truth.attention_mixed_head_gb_s);
        close("attention_base_s", got.attention_base_s, truth.attention_base_s);
        close("attention_per_decode_s", got.attention_per_decode_s, truth.attention_per_decode_s);
        close("head_gb_s", got.head_gb_s, truth.head_gb_s);
        close("head_per_sequence_s", got.head_per_sequence_s, truth.head_per_sequence_s);
        assert!(got.fit["dense"].median_error < 1e-6 && got.fit["attention"].p90_error < 1e-6, "{:?}", got.fit);
    }

    #[test]
    fn a_bad_measurement_names_its_file_line_and_field() {
        let dir = std::env::temp_dir().join(format!("routelab-fit-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("dense.csv"), "layer,tokens,time_us\nqkv_proj,1,3.0\nqkv_proj,2,-1\n").unwrap();
        let m = crate::step_model::catalog::model("llama-3.1-8b").unwrap();
        let e = fit_kernels(&dir, &m, &Calibration::unfitted("x", "a6000", "")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(3), "time_us"), "{e}");
        std::fs::write(dir.join("dense.csv"), "layer,time_us\nqkv_proj,3.0\n").unwrap();
        let e = fit_kernels(&dir, &m, &Calibration::unfitted("x", "a6000", "")).unwrap_err();
        assert_eq!(e.field, "tokens", "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_all_reduce_fit_recovers_latency_and_bandwidth() {
        let dir = std::env::temp_dir().join(format!("routelab-ar-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = String::from("gpu,backend,num_gpus,message_size,latency_ms\n");
        for k in 7..28 {
            let elems = 1u64 << k;
            let ms = (12e-6 + elems as f64 * 2.0 / 15e9) * 1e3;
            text.push_str(&format!(
                "x,vllm_graph,2,{elems},{ms}\nx,vllm_eager,2,{elems},{}\nx,vllm_graph,4,{elems},1.0\n",
                ms * 3.0
            ));
        }
        let file = dir.join("custom_allreduce.csv");
        std::fs::write(&file, text).unwrap();
        let c = fit_allreduce(&file, 2, 2, &Calibration::unfitted("x", "a6000", "")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!((c.allreduce_s - 12e-6).abs() < 1e-12, "{}", c.allreduce_s);
        assert!((c.allreduce_gb_s - 15.0).abs() < 1e-6, "{}", c.allreduce_gb_s);
        assert_eq!(c.fit["allreduce"].points, 21);
    }
}

/// One step measured end to end (no kernel timings): its shape on `tp` GPUs and its time.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredStep {
    pub tp: u32,
    /// Prompts prefilled in the step.
    pub chunks: Vec<super::Chunk>,
    /// Requests decoding one token, and their KV context in tokens (summed).
    pub decodes: u64,
    pub decode_context_tokens: u64,
    pub seconds: f64,
}

impl MeasuredStep {
    fn time_s(&self, c: &Calibration, model: &Model) -> f64 {
        let step = if self.chunks.is_empty() {
            super::Step::decode(self.decodes, self.decode_context_tokens)
        } else {
            super::Step::mixed(self.decodes, self.decode_context_tokens, &self.chunks)
        };
        c.for_model(model, self.tp, 1).step_time_s(&step)
    }
}

/// The terms a whole-step fit moves (rates and times), by name.
const STEP_TERMS: [&str; 8] = [
    "dense_gb_s",
    "dense_tflops",
    "attention_tflops",
    "attention_gb_s",
    "layer_overhead_s",
    "step_overhead_s",
    "allreduce_s",
    "allreduce_gb_s",
];

fn term<'a>(c: &'a mut Calibration, name: &str) -> &'a mut f64 {
    match name {
        "dense_gb_s" => &mut c.dense_gb_s,
        "dense_tflops" => &mut c.dense_tflops,
        "attention_tflops" => &mut c.attention_tflops,
        "attention_gb_s" => &mut c.attention_gb_s,
        "layer_overhead_s" => &mut c.layer_overhead_s,
        "step_overhead_s" => &mut c.step_overhead_s,
        "allreduce_s" => &mut c.allreduce_s,
        "allreduce_gb_s" => &mut c.allreduce_gb_s,
        _ => unreachable!("a term of STEP_TERMS"),
    }
}

/// Fits a profile to whole steps measured end to end — prefill and decode times of one model on
/// one GPU at several TP degrees (Splitwise's characterisation is such data) — when no kernel
/// timings exist for that GPU.
///
/// Starts from the datasheet (`gpu`'s peak bandwidth and tensor throughput, 15 µs and 50 GB/s
/// all-reduces, no overheads) and moves the eight terms (rates never above the datasheet's peak) of [`STEP_TERMS`] — dense and attention
/// rates, per-layer and per-step overheads, all-reduce latency and bandwidth — to minimise the
/// mean squared log error over the steps: coordinate descent on the logarithm of each term, steps
/// halving from a factor e to e^(1/256), the terms in a fixed order (deterministic). Times start
/// at 1 µs and move on a log scale, so a term the data does not need shrinks towards 0 without
/// reaching it. The LM head's rate follows the dense one, and the mixed-step attention rate the
/// decode one (whole steps do not separate them). `fit["steps"]` records the error on the steps
/// fitted.
pub fn fit_steps(steps: &[MeasuredStep], model: &Model, gpu: &super::Gpu, base: &Calibration) -> Calibration {
    let mut c = base.clone();
    c.dense_gb_s = gpu.bandwidth_gb_s;
    c.dense_tflops = gpu.tflops;
    fit_steps_moving(steps, model, gpu, c, &STEP_TERMS)
}

/// [`fit_steps`] keeping `base`'s dense terms (fitted to kernel timings by [`fit_dense`], e.g.
/// Vidur's): only the six other terms move.
pub fn fit_steps_on_dense(steps: &[MeasuredStep], model: &Model, gpu: &super::Gpu, base: &Calibration) -> Calibration {
    fit_steps_moving(steps, model, gpu, base.clone(), &STEP_TERMS[2..])
}

fn fit_steps_moving(
    steps: &[MeasuredStep],
    model: &Model,
    gpu: &super::Gpu,
    mut c: Calibration,
    terms: &[&str],
) -> Calibration {
    c.attention_tflops = gpu.tflops;
    c.attention_gb_s = gpu.bandwidth_gb_s;
    c.layer_overhead_s = 1e-6;
    c.step_overhead_s = 1e-6;
    let tie = |c: &mut Calibration| {
        c.head_gb_s = c.dense_gb_s;
        c.attention_mixed_head_gb_s = c.attention_gb_s;
    };
    tie(&mut c);
    let loss = |c: &Calibration| {
        steps.iter().map(|s| (s.time_s(c, model) / s.seconds).ln().powi(2)).sum::<f64>() / steps.len().max(1) as f64
    };
    // A rate never beats the datasheet's peak (the fit would otherwise trade a too-fast kernel
    // for a too-slow all-reduce and still match whole steps); times and all-reduces are free.
    let ceiling = |name: &str| match name {
        "dense_gb_s" | "attention_gb_s" => gpu.bandwidth_gb_s,
        "dense_tflops" | "attention_tflops" => gpu.tflops,
        _ => 1e6,
    };
    let mut best = loss(&c);
    let mut step = 1.0f64;
    while step > 1.0 / 256.0 {
        let mut moved = true;
        while moved {
            moved = false;
            for &name in terms {
                for dir in [1.0, -1.0] {
                    let mut trial = c.clone();
                    let v = term(&mut trial, name);
                    *v = (*v * (dir * step).exp()).clamp(1e-9, ceiling(name));
                    tie(&mut trial);
                    let l = loss(&trial);
                    if l < best * (1.0 - 1e-9) && trial.check().is_ok() {
                        (c, best) = (trial, l);
                        moved = true;
                    }
                }
            }
        }
        step /= 2.0;
    }
    let fitted = term_fit(steps.iter().map(|s| (s.time_s(&c, model), s.seconds)));
    c.fit.insert("steps".into(), fitted);
    c
}

/// The errors (model − measured) / measured of `c` on `steps`, in their order.
pub fn step_errors(steps: &[MeasuredStep], model: &Model, c: &Calibration) -> Vec<f64> {
    steps.iter().map(|s| (s.time_s(c, model) - s.seconds) / s.seconds).collect()
}
