//! The cluster world's request stream, generated once per (workload, seed) and replayed
//! identically for every policy (common random numbers).
//!
//! Synthetic streams: *groups* start by the arrival process at rate `rate / (mean turns × fanout)`
//! so that requests arrive at `rate` on average. A group is a session of `turns` turns; turn k
//! arrives an exponential think time (mean `think_time_s`) after turn k−1's arrival — independent
//! of any policy, so the stream is the same for all. Each turn is issued `fanout` times at once
//! (parallel samples with one prompt). Turn k's prompt = system prompt + the session's context +
//! [suffix₁, output₁, …, suffixₖ]: earlier outputs (of the first sample) are part of the history,
//! and the host caches a request's output when a later turn reuses it.
//!
//! Trace streams (Azure LLM inference trace format): one request per row at `at_s × time_scale`,
//! prompt = the shared system prompt + a unique remainder up to ContextTokens (the trace publishes
//! sizes, not contents), output = GeneratedTokens (at least 1).
//!
//! Mooncake trace streams: one request per row, each of its `hash_ids` a 512-token segment (see
//! [`mooncake_stream`]).
//!
//! Segment ids: 1 is the system prompt, 2 + i is context i, unique segments count up from 2^32,
//! Mooncake hash id h is 2^48 + h.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use rand::RngExt;
use rand_distr::{Distribution, Exp1, Gamma};
use routelab_policy_api::Segment;

use super::cluster::classes::{Label, Mix};
use super::cluster::{Arrivals, ClusterSpec, Popularity, TokenShape, Tokens};
use super::mooncake::{HASH_ID_BASE, MooncakeRow};
use super::trace::TraceRow;
use crate::seeds::{SimRng, stream, stream as stream_rng};
use crate::time::{SimTime, seconds, ticks};

mod session;
pub use session::Sessions;

/// One request of the stream.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedRequest {
    pub arrived_at: SimTime,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// This request's prompt: a range of [`RequestStream::segments`].
    pub segments: Range<u32>,
    /// Set when a later turn's prompt contains this request's output as a segment: the host then
    /// keeps the output in the prefix cache after completion.
    pub output_segment: Option<Segment>,
}

/// A generated request stream, in arrival order (request id = index).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestStream {
    pub requests: Vec<GeneratedRequest>,
    /// Every request's prompt segments, back to back.
    pub segments: Vec<Segment>,
    /// Every request's class and tenant, by request id; empty when the workload has neither
    /// `classes:` nor `tenants:` (every request is class 0, tenant 0).
    pub labels: Vec<Label>,
    /// Which call waits for which, for a stream of agent sessions (`generator.session`).
    pub sessions: Option<Sessions>,
    /// Every request's expected output length (`cluster.hints`), by request id; empty = none.
    pub hints: Vec<u32>,
}

impl RequestStream {
    pub fn prompt(&self, i: usize) -> &[Segment] {
        let r = &self.requests[i].segments;
        &self.segments[r.start as usize..r.end as usize]
    }

    /// Request `i`'s output-length hint (NaN: none).
    pub fn hint(&self, i: usize) -> f64 {
        self.hints.get(i).map_or(f64::NAN, |&h| h as f64)
    }

    /// Request `i`'s class and tenant.
    pub fn label(&self, i: usize) -> Label {
        self.labels.get(i).copied().unwrap_or_default()
    }
}

const SYSTEM_ID: u64 = 1;
const FIRST_UNIQUE_ID: u64 = 1 << 32;

fn sample_tokens(t: &Tokens, rng: &mut SimRng) -> u32 {
    match t {
        Tokens::Constant(v) => *v,
        Tokens::Shaped(TokenShape::Uniform { min, max }) => rng.random_range(*min..=*max),
        Tokens::Shaped(TokenShape::Lognormal { mean, cv, max }) => {
            let s2 = (1.0 + cv * cv).ln();
            let (mu, sigma) = (mean.ln() - s2 / 2.0, s2.sqrt());
            for _ in 0..64 {
                let z: f64 = rand_distr::StandardNormal.sample(rng);
                let v = (mu + sigma * z).exp().round().max(1.0);
                if v <= *max as f64 {
                    return v as u32;
                }
            }
            *max
        }
    }
}

/// The distribution's mean (lognormal: before truncation at `max`).
pub fn mean_tokens(t: &Tokens) -> f64 {
    t.mean()
}

/// Picks context indices by popularity (index 0 is the most popular under Zipf).
pub struct Popular {
    cdf: Vec<f64>,
}

impl Popular {
    pub fn new(count: u32, popularity: &Popularity) -> Self {
        let weights = (1..=count).map(|k| match popularity {
            Popularity::Uniform => 1.0,
            Popularity::Zipf { s } => (k as f64).powf(-s),
        });
        Self { cdf: crate::workload::cluster::classes::Mix::new(weights).into_cdf() }
    }

    /// Probability of the context at `index`.
    pub fn share(&self, index: usize) -> f64 {
        self.cdf[index] - if index == 0 { 0.0 } else { self.cdf[index - 1] }
    }

    pub fn sample(&self, rng: &mut SimRng) -> usize {
        let u: f64 = rng.random();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

struct Builder {
    stream: RequestStream,
    next_unique: u64,
    /// The label of the requests pushed next (kept only when `labelled`).
    label: Label,
    labelled: bool,
}

impl Builder {
    fn unique(&mut self, tokens: u32) -> Segment {
        let s = Segment { id: self.next_unique, tokens };
        self.next_unique += 1;
        s
    }

    fn push(&mut self, arrived_at: SimTime, prompt: &[Segment], output_tokens: u32, output_segment: Option<Segment>) {
        let start = self.stream.segments.len() as u32;
        self.stream.segments.extend(prompt.iter().filter(|s| s.tokens > 0));
        let end = self.stream.segments.len() as u32;
        let prompt_tokens = prompt.iter().map(|s| s.tokens).sum();
        self.stream.requests.push(GeneratedRequest {
            arrived_at,
            prompt_tokens,
            output_tokens,
            segments: start..end,
            output_segment,
        });
        if self.labelled {
            self.stream.labels.push(self.label);
        }
    }

    /// Sorts by arrival (stable: generation order breaks ties) and keeps the first `limit`.
    fn finish(self, limit: Option<u64>, horizon: Option<SimTime>) -> RequestStream {
        let RequestStream { requests, segments, labels, .. } = self.stream;
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by_key(|&i| requests[i].arrived_at);
        let mut out = RequestStream {
            requests: Vec::with_capacity(order.len()),
            segments: Vec::with_capacity(segments.len()),
            labels: Vec::with_capacity(labels.len()),
            ..Default::default()
        };
        for i in order {
            let r = &requests[i];
            if limit.is_some_and(|l| out.requests.len() as u64 >= l) || horizon.is_some_and(|h| r.arrived_at >= h) {
                break;
            }
            let start = out.segments.len() as u32;
            out.segments.extend_from_slice(&segments[r.segments.start as usize..r.segments.end as usize]);
            let end = out.segments.len() as u32;
            out.requests.push(GeneratedRequest { segments: start..end, ..r.clone() });
            if let Some(l) = labels.get(i) {
                out.labels.push(*l);
            }
        }
        out
    }
}

/// The stream replaying a Mooncake trace: one request per row at `at_s × time_scale`, each hash id
/// one prompt segment (id `HASH_ID_BASE + hash id`, 512 tokens, the last one partial), the tokens
/// the ids do not cover a unique suffix, output = `output_length` (at least 1). The generator is
/// not used: the trace gives the prompts' sharing. `requests` and `duration_s` cut it short.
pub fn mooncake_stream(spec: &ClusterSpec, rows: &[MooncakeRow]) -> RequestStream {
    let time_scale = match &spec.arrivals {
        Arrivals::Trace { time_scale, .. } => *time_scale,
        _ => 1.0,
    };
    block_stream(rows, super::mooncake::BLOCK_TOKENS, time_scale, spec.requests, spec.duration_s.map(ticks))
}

/// Rows whose `hash_ids` name `block`-token blocks (the last one partial) as a stream, in row
/// order (arrival times must not decrease), cut at `limit` requests and `horizon`.
pub fn block_stream(
    rows: &[MooncakeRow],
    block: u32,
    time_scale: f64,
    limit: Option<u64>,
    horizon: Option<SimTime>,
) -> RequestStream {
    let mut b = Builder {
        stream: RequestStream::default(),
        next_unique: FIRST_UNIQUE_ID,
        label: Label::default(),
        labelled: false,
    };
    let mut prompt = Vec::new();
    for row in rows {
        prompt.clear();
        prompt.extend(
            row.hash_ids
                .iter()
                .enumerate()
                .map(|(k, &h)| Segment { id: HASH_ID_BASE + h, tokens: row.block_tokens_of(k, block) }),
        );
        let rest = row.uncovered_tokens_of(block);
        if rest > 0 {
            prompt.push(b.unique(rest));
        }
        b.push(ticks(row.at_s * time_scale), &prompt, row.output_length.max(1), None);
    }
    b.finish(limit, horizon)
}

/// The stream of `spec` for `run_seed`. `trace` must hold the trace rows when arrivals come from
/// a trace. Errors (a trace row too large for a replica, a missing trace) are bad input.
pub fn generate(spec: &ClusterSpec, trace: Option<&[TraceRow]>, run_seed: u64) -> Result<RequestStream, String> {
    let g = &spec.generator;
    let labelled = !spec.classes.is_empty() || !spec.tenants.is_empty();
    let mut b =
        Builder { stream: RequestStream::default(), next_unique: FIRST_UNIQUE_ID, label: Label::default(), labelled };
    let horizon = spec.duration_s.map(ticks);
    let system = Segment { id: SYSTEM_ID, tokens: g.system_prompt_tokens };

    if let Arrivals::Trace { path, time_scale, .. } = &spec.arrivals {
        let rows = trace.ok_or_else(|| {
            format!(
                "arrivals come from the trace '{path}', but no trace was loaded; {}",
                super::trace::AZURE_TRACE_HINT
            )
        })?;
        let mut prompt = Vec::with_capacity(2);
        for row in rows {
            let context = row.context_tokens.max(1);
            prompt.clear();
            if context > system.tokens && system.tokens > 0 {
                prompt.push(system);
                prompt.push(b.unique(context - system.tokens));
            } else {
                prompt.push(b.unique(context));
            }
            b.label = Label { class: row.class, tenant: row.tenant };
            b.push(ticks(row.at_s * time_scale), &prompt, row.generated_tokens.max(1), None);
        }
        return Ok(b.finish(spec.requests, horizon));
    }

    let mut arrival_rng = stream(run_seed, "cluster.arrivals");
    let mut size_rng = stream(run_seed, "cluster.sizes");
    let mut context_rng = stream(run_seed, "cluster.contexts");
    // Classes and tenants have their own stream: adding them moves no arrival and no size.
    let mut class_rng = stream(run_seed, "cluster.classes");
    let class_mix = Mix::new(spec.classes.iter().map(|c| c.share));
    let tenant_mix = Mix::new(spec.tenants.iter().map(|t| t.weight));
    let contexts: Vec<Segment> = g.contexts.as_ref().map_or_else(Vec::new, |c| {
        (0..c.count).map(|i| Segment { id: 2 + i as u64, tokens: sample_tokens(&c.tokens, &mut context_rng) }).collect()
    });
    let popular = g.contexts.as_ref().map(|c| Popular::new(c.count, &c.popularity));
    let per_group = match &g.session {
        Some(s) => s.expected_calls().max(1.0),
        None => mean_tokens(&g.turns).max(1.0) * g.fanout as f64,
    };
    // Sessions' structure (steps, pauses, sub-agents) has its own stream.
    let mut session_rng = stream(run_seed, "cluster.sessions");
    let mut sessions = 0u32;
    // A day shape: candidates at the peak rate, each kept with probability rate(t) / peak.
    let (rate, cv, day) = match spec.arrivals {
        Arrivals::Poisson { rate } => (rate, 1.0, None),
        Arrivals::Gamma { rate, cv } => (rate, cv, None),
        Arrivals::Diurnal { rate, amplitude, period_s } => (rate * (1.0 + amplitude), 1.0, Some((amplitude, period_s))),
        Arrivals::Trace { .. } => unreachable!("handled above"),
    };
    let group_rate = rate / per_group;
    // Gamma with shape k = 1/cv² and mean 1/group_rate; cv = 1 is exponential.
    let gamma = Gamma::new(1.0 / (cv * cv), cv * cv / group_rate).map_err(|e| format!("arrivals: {e}"))?;
    let want = spec.requests.unwrap_or(u64::MAX);
    let mut t = 0.0f64;
    let mut made = 0u64;
    let mut prompt: Vec<Segment> = Vec::new();
    loop {
        t += if cv == 1.0 {
            Distribution::<f64>::sample(&Exp1, &mut arrival_rng) / group_rate
        } else {
            gamma.sample(&mut arrival_rng)
        };
        if let Some((a, period)) = day {
            let keep = (1.0 - a * (std::f64::consts::TAU * t / period).cos()) / (1.0 + a);
            if arrival_rng.random::<f64>() >= keep {
                if horizon.is_some_and(|h| ticks(t) >= h) {
                    break;
                }
                continue;
            }
        }
        if made >= want || horizon.is_some_and(|h| ticks(t) >= h) {
            break;
        }
        prompt.clear();
        prompt.push(system);
        if let (Some(p), false) = (&popular, contexts.is_empty()) {
            prompt.push(contexts[p.sample(&mut size_rng)]);
        }
        let (mut suffix_tokens, mut output_tokens) = (&g.suffix_tokens, &g.output_tokens);
        if labelled {
            let class = class_mix.pick(class_rng.random());
            let tenant = tenant_mix.pick(class_rng.random());
            b.label = Label { class: class as u16, tenant: tenant as u32 };
            if let Some(c) = spec.classes.get(class) {
                suffix_tokens = c.suffix_tokens.as_ref().unwrap_or(suffix_tokens);
                output_tokens = c.output_tokens.as_ref().unwrap_or(output_tokens);
            }
        }
        if let Some(spec) = &g.session {
            let suffix = sample_tokens(suffix_tokens, &mut size_rng);
            prompt.push(b.unique(suffix));
            let s = session::SessionBuilder {
                b: &mut b,
                rng: &mut session_rng,
                spec,
                output: output_tokens,
                at: ticks(t),
                session: sessions,
                calls: 0,
            };
            made += s.root(&mut prompt) as u64;
            sessions += 1;
            continue;
        }
        let turns = sample_tokens(&g.turns, &mut size_rng).max(1);
        let mut at = t;
        for turn in 0..turns {
            if turn > 0 {
                at += Distribution::<f64>::sample(&Exp1, &mut size_rng) * g.think_time_s;
            }
            let suffix = sample_tokens(suffix_tokens, &mut size_rng);
            let suffix = b.unique(suffix);
            prompt.push(suffix);
            let mut history_output = None;
            for sample in 0..g.fanout {
                let output = sample_tokens(output_tokens, &mut size_rng).max(1);
                let reused = (sample == 0 && turn + 1 < turns).then(|| b.unique(output));
                if sample == 0 {
                    history_output = reused;
                }
                b.push(ticks(at), &prompt, output, reused);
                made += 1;
            }
            if let Some(o) = history_output {
                prompt.push(o);
            }
        }
    }
    if g.session.is_some() {
        // Already in arrival order (sessions start in order; a session's calls share its start),
        // and whole: a cut would leave calls waiting for calls that are not there.
        return Ok(b.stream);
    }
    Ok(b.finish(spec.requests, horizon))
}

/// Fills `stream`'s output-length hints as `spec.hints` asks (`oracle`: the true lengths;
/// `noisy`: the true length times a lognormal factor of mean 1, from the run seed's own stream).
pub fn apply_hints(spec: &ClusterSpec, stream: &mut RequestStream, run_seed: u64) {
    use super::cluster::session::OutputHint;
    let Some(h) = &spec.hints else { return };
    stream.hints = match h.output_tokens {
        OutputHint::None => Vec::new(),
        OutputHint::Oracle => stream.requests.iter().map(|r| r.output_tokens).collect(),
        OutputHint::Noisy { cv } => {
            let mut rng = stream_rng(run_seed, "cluster.hints");
            let s2 = (1.0 + cv * cv).ln();
            let (mu, sigma) = (-s2 / 2.0, s2.sqrt());
            stream
                .requests
                .iter()
                .map(|r| {
                    let z: f64 = rand_distr::StandardNormal.sample(&mut rng);
                    (r.output_tokens as f64 * (mu + sigma * z).exp()).round().clamp(1.0, u32::MAX as f64) as u32
                })
                .collect()
        }
    };
}

/// What `routelab validate` prints about a generated stream.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadStats {
    pub requests: u64,
    /// Time of the last arrival.
    pub span_s: f64,
    pub rate_rps: f64,
    pub mean_prompt_tokens: f64,
    pub max_prompt_tokens: u32,
    pub mean_output_tokens: f64,
    /// Share of prompt tokens (counted per request) in segments that more than one request uses.
    pub shared_prompt_share: f64,
    /// Segment references (one per segment of each request's prompt) and how many name a segment
    /// an earlier request already had: what an infinite cache would serve. On a Mooncake trace a
    /// segment is one `hash_ids` entry, so this is the share of block references that repeat, as
    /// Dynamo counts it for its published 36.64% (105,710 of 288,500) on the conversation trace.
    pub segment_references: u64,
    pub repeated_segment_references: u64,
    pub inter_arrival_min_s: f64,
    pub inter_arrival_max_s: f64,
}

/// Statistics of a generated stream.
pub fn stats(stream: &RequestStream) -> WorkloadStats {
    let n = stream.requests.len();
    let mut uses: HashMap<u64, u32> = HashMap::new();
    for s in &stream.segments {
        *uses.entry(s.id).or_default() += 1;
    }
    let total: u64 = stream.segments.iter().map(|s| s.tokens as u64).sum();
    let shared: u64 = stream.segments.iter().filter(|s| uses[&s.id] > 1).map(|s| s.tokens as u64).sum();
    let (mut gap_min, mut gap_max) = (f64::INFINITY, 0.0f64);
    for w in stream.requests.windows(2) {
        let gap = seconds(w[1].arrived_at - w[0].arrived_at);
        gap_min = gap_min.min(gap);
        gap_max = gap_max.max(gap);
    }
    let span_s = stream.requests.last().map_or(0.0, |r| seconds(r.arrived_at));
    let mut seen: HashSet<u64> = HashSet::new();
    let mut repeated = 0;
    for i in 0..n {
        let prompt = stream.prompt(i);
        repeated += prompt.iter().filter(|s| seen.contains(&s.id)).count() as u64;
        seen.extend(prompt.iter().map(|s| s.id));
    }
    WorkloadStats {
        requests: n as u64,
        span_s,
        rate_rps: if span_s > 0.0 { (n.saturating_sub(1)) as f64 / span_s } else { f64::NAN },
        mean_prompt_tokens: stream.requests.iter().map(|r| r.prompt_tokens as f64).sum::<f64>() / n.max(1) as f64,
        max_prompt_tokens: stream.requests.iter().map(|r| r.prompt_tokens).max().unwrap_or(0),
        mean_output_tokens: stream.requests.iter().map(|r| r.output_tokens as f64).sum::<f64>() / n.max(1) as f64,
        shared_prompt_share: if total > 0 { shared as f64 / total as f64 } else { 0.0 },
        segment_references: stream.segments.len() as u64,
        repeated_segment_references: repeated,
        inter_arrival_min_s: if n > 1 { gap_min } else { f64::NAN },
        inter_arrival_max_s: if n > 1 { gap_max } else { f64::NAN },
    }
}

impl std::fmt::Display for WorkloadStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "requests              {}", self.requests)?;
        writeln!(f, "span                  {:.1} s ({:.3} requests/s)", self.span_s, self.rate_rps)?;
        writeln!(f, "prompt tokens         mean {:.0}, max {}", self.mean_prompt_tokens, self.max_prompt_tokens)?;
        writeln!(f, "output tokens         mean {:.1}", self.mean_output_tokens)?;
        writeln!(f, "shared prompt tokens  {:.1}%", self.shared_prompt_share * 100.0)?;
        let refs = self.segment_references.max(1) as f64;
        writeln!(
            f,
            "repeated segments     {:.2}% ({} of {} segment references; an infinite cache serves these)",
            self.repeated_segment_references as f64 * 100.0 / refs,
            self.repeated_segment_references,
            self.segment_references
        )?;
        write!(f, "inter-arrival         min {:.6} s, max {:.3} s", self.inter_arrival_min_s, self.inter_arrival_max_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        s.arrivals = Arrivals::Trace { path: "x.csv".into(), time_scale: 0.5, format: Default::default() };
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
        let e = generate(&s, None, 1).unwrap_err();
        assert!(e.contains("AzurePublicDataset"), "{e}");
    }
    #[test]
    fn mooncake_rows_become_block_segments_shared_by_id() {
        let mut s = doc_qa();
        s.arrivals = Arrivals::Trace {
            path: "x.jsonl".into(),
            time_scale: 2.0,
            format: super::super::cluster::TraceFormat::Mooncake,
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
}
