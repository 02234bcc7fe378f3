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

use std::ops::Range;

use rand::RngExt;
use rand_distr::Distribution;
use routelab_policy_api::Segment;

use super::cluster::classes::Label;
use super::cluster::{Arrivals, ClusterSpec, Popularity, TokenShape, Tokens};
use super::mooncake::{HASH_ID_BASE, MooncakeRow};
use super::trace::TraceRow;
use crate::seeds::{SimRng, stream as stream_rng};
use crate::time::{SimTime, ticks};

mod lazy;
mod lora;
mod models;
mod session;
mod stats;
mod synth;
pub use lazy::{Extent, LazyStream};
pub use lora::{NO_ADAPTER, apply_lora};
pub use models::apply_models;
pub use session::Sessions;
pub use stats::{WorkloadStats, stats, stats_lazy};
use synth::Synth;

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
    /// Every request's LoRA adapter (`cluster.lora`), by request id ([`NO_ADAPTER`]: the base
    /// model); empty = every request on the base model.
    pub adapters: Vec<u32>,
    /// Every request's model (`cluster.models`), by request id; empty = every request on model 0.
    pub models: Vec<u16>,
    /// The id of `requests[0]`: a [`LazyStream`] holds only the requests from the oldest one a
    /// run still reads to the newest generated (`labels` and `hints` likewise); 0 otherwise.
    pub base: usize,
    /// The whole stream's length and last arrival, when it is not all held (a [`LazyStream`]).
    pub extent: Option<Extent>,
}

impl RequestStream {
    /// Request `i` (it must be held: see [`RequestStream::base`]).
    pub fn request(&self, i: usize) -> &GeneratedRequest {
        &self.requests[i - self.base]
    }

    pub fn prompt(&self, i: usize) -> &[Segment] {
        let r = &self.request(i).segments;
        &self.segments[r.start as usize..r.end as usize]
    }

    /// Request `i`'s output-length hint (NaN: none).
    pub fn hint(&self, i: usize) -> f64 {
        self.hints.get(i - self.base).map_or(f64::NAN, |&h| h as f64)
    }

    /// Request `i`'s LoRA adapter, if it has one.
    pub fn adapter(&self, i: usize) -> Option<u32> {
        self.adapters.get(i - self.base).copied().filter(|&a| a != NO_ADAPTER)
    }

    /// Request `i`'s model (its index in `cluster.models`; 0 with one model).
    pub fn model(&self, i: usize) -> u16 {
        self.models.get(i - self.base).copied().unwrap_or(0)
    }

    /// Request `i`'s class and tenant.
    pub fn label(&self, i: usize) -> Label {
        self.labels.get(i - self.base).copied().unwrap_or_default()
    }

    /// Drops the held requests below id `id` (and their entries in every per-request list) once
    /// they are at least [`FORGET_BATCH`] and half of what is held, so that a stream read in
    /// order keeps its memory to the span still read, at amortised O(1) a request: a
    /// [`LazyStream`]'s, or the emulator's, which serves requests as they come.
    pub fn forget_below(&mut self, id: usize) {
        let k = id.saturating_sub(self.base).min(self.requests.len());
        if k < FORGET_BATCH || k < self.requests.len() / 2 {
            return;
        }
        self.requests.drain(..k);
        let shift = self.requests.first().map_or(self.segments.len() as u32, |r| r.segments.start);
        self.segments.drain(..shift as usize);
        for r in &mut self.requests {
            r.segments = r.segments.start - shift..r.segments.end - shift;
        }
        self.labels.drain(..k.min(self.labels.len()));
        self.hints.drain(..k.min(self.hints.len()));
        self.adapters.drain(..k.min(self.adapters.len()));
        self.models.drain(..k.min(self.models.len()));
        self.base += k;
    }

    /// How many requests the whole stream has (held or not).
    pub fn len(&self) -> usize {
        self.extent.map_or(self.requests.len(), |e| e.total)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole stream's last arrival (0 when empty).
    pub fn last_arrival(&self) -> SimTime {
        self.extent.map_or_else(|| self.requests.last().map_or(SimTime::ZERO, |r| r.arrived_at), |e| e.last_arrival)
    }
}

/// The per-session draws of a stream (a request's model, its LoRA adapter): one uniform in
/// [0, 1) per request, in request order, hashed from `seed` and the request's session key —
/// the session index for agent sessions, else the first unique segment of its prompt (a
/// group's turns and fan-out share it), else the request itself (a trace row of shared blocks
/// only). A draw depends on nothing else, so adding one moves no arrival, size or other draw,
/// and a session's requests agree whatever their order. `seed` is the run seed mixed with the
/// draw's own constant, so two keys of one session are independent.
///
/// Classes and tenants are not drawn here: they come from their own sequential stream
/// (`synth.rs`, `cluster.classes`), per group as it is generated.
pub(crate) fn keyed_draws(stream: &RequestStream, seed: u64) -> impl Iterator<Item = f64> + '_ {
    (0..stream.requests.len()).map(move |i| {
        let key = match &stream.sessions {
            Some(s) => s.session[i] as u64,
            None => stream
                .prompt(i)
                .iter()
                .find(|s| s.id >= FIRST_UNIQUE_ID && s.id < HASH_ID_BASE)
                .map_or(u64::MAX - i as u64, |s| s.id),
        };
        (crate::seeds::mix(seed ^ crate::seeds::mix(key)) >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// The fewest held requests [`RequestStream::forget_below`] drops at once.
pub const FORGET_BATCH: usize = 4096;

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
        self.pick(rng.random())
    }

    /// The index whose share of the unit interval holds `u` (in [0, 1)).
    pub fn pick(&self, u: f64) -> usize {
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

pub(crate) struct Builder {
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

    /// An Azure-format trace row as a request: the system prompt (when the row's context is
    /// longer) and a prompt of its own, arriving at `at_s × time_scale`, labelled as the row.
    fn push_row(&mut self, row: &TraceRow, system: Segment, time_scale: f64) {
        let context = row.context_tokens.max(1);
        // `push` leaves out the empty segment.
        let prompt = if context > system.tokens && system.tokens > 0 {
            [system, self.unique(context - system.tokens)]
        } else {
            [self.unique(context), Segment { id: 0, tokens: 0 }]
        };
        self.label = Label { class: row.class, tenant: row.tenant };
        self.push(ticks(row.at_s * time_scale), &prompt, row.generated_tokens.max(1), None);
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
        let RequestStream { mut requests, mut segments, mut labels, .. } = self.stream;
        let cut = |k: usize, r: &GeneratedRequest| {
            limit.is_some_and(|l| k as u64 >= l) || horizon.is_some_and(|h| r.arrived_at >= h)
        };
        if requests.is_sorted_by_key(|r| r.arrived_at) {
            // Already in order (one turn per group): cut in place rather than copy, so that
            // generating a long stream does not hold it twice.
            let keep = requests.iter().enumerate().position(|(k, r)| cut(k, r)).unwrap_or(requests.len());
            requests.truncate(keep);
            segments.truncate(requests.last().map_or(0, |r| r.segments.end as usize));
            labels.truncate(keep);
            return RequestStream { requests, segments, labels, ..Default::default() };
        }
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
            if cut(out.requests.len(), r) {
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
/// not used: the trace gives the prompts' sharing. `requests` and `duration_s` cut it short. With
/// `classes:` or `tenants:`, each request's class and tenant are its row's (0 where absent).
pub fn mooncake_stream(spec: &ClusterSpec, rows: &[MooncakeRow]) -> RequestStream {
    let time_scale = match &spec.arrivals {
        Arrivals::Trace { time_scale, .. } => *time_scale,
        _ => 1.0,
    };
    let labelled = !spec.classes.is_empty() || !spec.tenants.is_empty();
    let horizon = spec.duration_s.map(ticks);
    let block = super::mooncake::BLOCK_TOKENS;
    labelled_block_stream(rows, block, time_scale, spec.requests, horizon, labelled, &spec.models)
}

/// Rows whose `hash_ids` name `block`-token blocks (the last one partial) as a stream, in row
/// order (arrival times must not decrease), cut at `limit` requests and `horizon` (rows of agent
/// sessions: [`session::trace_sessions`]); labelled with the rows' classes and tenants when any
/// row gives one.
pub fn block_stream(
    rows: &[MooncakeRow],
    block: u32,
    time_scale: f64,
    limit: Option<u64>,
    horizon: Option<SimTime>,
) -> RequestStream {
    let labelled = rows.iter().any(|r| r.class.is_some() || r.tenant.is_some());
    labelled_block_stream(rows, block, time_scale, limit, horizon, labelled, &[])
}

/// [`block_stream`], with the rows' classes and tenants kept as the requests' labels when
/// `labelled` (absent ones are 0, as in the Azure trace's columns), and the rows' models as
/// indices into `models` when there are several and the rows name them (checked before).
fn labelled_block_stream(
    rows: &[MooncakeRow],
    block: u32,
    time_scale: f64,
    limit: Option<u64>,
    horizon: Option<SimTime>,
    labelled: bool,
    models: &[super::cluster::models::ModelSpec],
) -> RequestStream {
    let mut b =
        Builder { stream: RequestStream::default(), next_unique: FIRST_UNIQUE_ID, label: Label::default(), labelled };
    let keep = session::kept_rows(rows, time_scale, limit, horizon);
    let mut prompt = Vec::new();
    let kept = |i: usize| keep.as_ref().is_none_or(|k| k[i]);
    // The trace's adapters, when it gives them (`apply_lora` then keeps them).
    let given = rows.iter().any(|r| r.adapter.is_some());
    let mut adapters = Vec::new();
    // The trace's models likewise (`apply_models` then keeps them).
    let named = models.len() > 1 && rows.iter().any(|r| r.model.is_some());
    let mut model_of = Vec::new();
    for row in rows.iter().enumerate().filter(|&(i, _)| kept(i)).map(|(_, r)| r) {
        if given {
            adapters.push(row.adapter.unwrap_or(NO_ADAPTER));
        }
        if named {
            let m = models.iter().position(|m| row.model.as_deref() == Some(m.name.as_str()));
            model_of.push(m.unwrap_or(0) as u16);
        }
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
        b.label = Label { class: row.class.unwrap_or(0), tenant: row.tenant.unwrap_or(0) };
        b.push(ticks(row.at_s * time_scale), &prompt, row.output_length.max(1), None);
    }
    let mut stream = match keep {
        None => b.finish(limit, horizon),
        Some(keep) => {
            b.stream.sessions = Some(session::trace_sessions(rows, &keep, time_scale));
            // Already in arrival order (the rows are), and whole sessions only.
            b.stream
        }
    };
    // The rows are in arrival order, so a cut keeps a prefix of them.
    adapters.truncate(stream.requests.len());
    stream.adapters = adapters;
    model_of.truncate(stream.requests.len());
    stream.models = model_of;
    stream
}

/// Why a cluster's request stream cannot be generated: its `arrivals` cannot be had.
#[derive(Clone, Debug, PartialEq)]
pub enum GenerateError {
    /// Arrivals come from the trace at `path`, but no trace rows were given.
    NoTrace { path: String },
    /// A synthetic generator was asked for a trace's arrivals (a trace is replayed).
    TraceNotGenerated,
    /// The arrival process's parameters make no distribution (the sampler's message).
    Arrivals(String),
}

impl std::fmt::Display for GenerateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GenerateError::NoTrace { path } => write!(
                f,
                "arrivals come from the trace '{path}', but no trace was loaded; {}",
                super::trace::AZURE_TRACE_HINT
            ),
            GenerateError::TraceNotGenerated => f.write_str("a trace is replayed, not generated"),
            GenerateError::Arrivals(e) => write!(f, "arrivals: {e}"),
        }
    }
}

impl std::error::Error for GenerateError {}

/// The stream of `spec` for `run_seed`. `trace` must hold the trace rows when arrivals come from
/// a trace. Errors (a trace row too large for a replica, a missing trace) are bad input.
pub fn generate(spec: &ClusterSpec, trace: Option<&[TraceRow]>, run_seed: u64) -> Result<RequestStream, GenerateError> {
    let g = &spec.generator;
    let labelled = !spec.classes.is_empty() || !spec.tenants.is_empty();
    let mut b =
        Builder { stream: RequestStream::default(), next_unique: FIRST_UNIQUE_ID, label: Label::default(), labelled };
    let horizon = spec.duration_s.map(ticks);
    let system = Segment { id: SYSTEM_ID, tokens: g.system_prompt_tokens };

    if let Arrivals::Trace { path, time_scale, .. } = &spec.arrivals {
        let rows = trace.ok_or_else(|| GenerateError::NoTrace { path: path.to_string() })?;
        for row in rows {
            b.push_row(row, system, *time_scale);
        }
        return Ok(b.finish(spec.requests, horizon));
    }

    let mut synth = Synth::new(spec, run_seed)?;
    while synth.group(&mut b) {}
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
    let Some(mut h) = Hinter::new(spec, run_seed) else {
        stream.hints = Vec::new();
        return;
    };
    stream.hints = stream.requests.iter().map(|r| h.hint(r.output_tokens)).collect();
}

/// Draws output-length hints one request at a time, in request order (`None`: no hints).
pub(crate) struct Hinter {
    /// `None`: the true length (oracle); else the lognormal's (mu, sigma) and its stream.
    noise: Option<(f64, f64, SimRng)>,
}

impl Hinter {
    pub(crate) fn new(spec: &ClusterSpec, run_seed: u64) -> Option<Self> {
        use super::cluster::session::OutputHint;
        match spec.hints.as_ref()?.output_tokens {
            OutputHint::None => None,
            OutputHint::Oracle => Some(Self { noise: None }),
            OutputHint::Noisy { cv } => {
                let s2 = (1.0 + cv * cv).ln();
                Some(Self { noise: Some((-s2 / 2.0, s2.sqrt(), stream_rng(run_seed, "cluster.hints"))) })
            }
        }
    }

    pub(crate) fn hint(&mut self, output_tokens: u32) -> u32 {
        let Some((mu, sigma, rng)) = &mut self.noise else { return output_tokens };
        let z: f64 = rand_distr::StandardNormal.sample(rng);
        (output_tokens as f64 * (*mu + *sigma * z).exp()).round().clamp(1.0, u32::MAX as f64) as u32
    }
}

#[cfg(test)]
mod tests;
