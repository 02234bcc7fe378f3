//! A synthetic stream generated as the simulation reaches it: the requests from the oldest one a
//! run still reads to the newest arrival are held, so a sketched run's memory does not grow with
//! its length. The numbers are those of [`super::generate`]: the same generator ([`Synth`]),
//! one group at a time, and hints drawn in request order.
//!
//! Only streams [`super::generate`] does not reorder qualify ([`LazyStream::fits`]): one turn per
//! group (later turns arrive out of order and the whole stream is sorted), no agent sessions
//! (whose calls are sent by their parents). An Azure-format trace qualifies too: its rows are
//! read and checked whole (32 bytes a row, held by the prepared workload), and each run makes
//! their requests as it reaches them (≈ 100 bytes a request not held). A Mooncake-format trace
//! does not (its rows, with their block ids, are the stream). Everything else is generated whole,
//! as before.

use routelab_policy_api::Segment;

use super::{Builder, FIRST_UNIQUE_ID, GenerateError, GeneratedRequest, Hinter, RequestStream, SYSTEM_ID, Synth};
use crate::time::{SimTime, ticks};
use crate::workload::cluster::classes::Label;
use crate::workload::cluster::{Arrivals, ClusterSpec, TokenShape, Tokens, TraceFormat};
use crate::workload::trace::TraceRow;

/// A stream's length and last arrival, found by one generating pass that keeps nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub total: usize,
    pub last_arrival: SimTime,
}

pub struct LazyStream<'s> {
    b: Builder,
    source: Source<'s>,
    hinter: Option<Hinter>,
    /// At most this many requests (`cluster.requests`): a group of parallel samples may pass it.
    limit: usize,
    /// The generator has ended (or the limit is reached).
    ended: bool,
    /// Never drop held requests (a run that reads every request's state).
    keep: bool,
}

/// Where the requests come from.
enum Source<'s> {
    Synth(Box<Synth<'s>>),
    /// An Azure-format trace's rows, in order (as [`super::generate`] makes them).
    Rows {
        rows: &'s [TraceRow],
        next: usize,
        system: Segment,
        time_scale: f64,
        horizon: Option<SimTime>,
    },
}

impl Source<'_> {
    /// The next group into `b`; `false` once there is none after it (as [`Synth::group`]).
    fn group(&mut self, b: &mut Builder) -> bool {
        match self {
            Source::Synth(s) => s.group(b),
            Source::Rows { rows, next, system, time_scale, horizon } => {
                let Some(row) = rows.get(*next) else { return false };
                // Rows are in time order: the first at or past the horizon ends the stream, as
                // the whole stream's cut does.
                if horizon.is_some_and(|h| ticks(row.at_s * *time_scale) >= h) {
                    return false;
                }
                b.push_row(row, *system, *time_scale);
                *next += 1;
                *next < rows.len()
            }
        }
    }
}

impl<'s> LazyStream<'s> {
    /// Whether `spec`'s stream can be generated lazily: arrivals from a process or an
    /// Azure-format trace, no agent sessions, one turn per group.
    pub fn fits(spec: &ClusterSpec) -> bool {
        let one_turn = match &spec.generator.turns {
            Tokens::Constant(v) => *v <= 1,
            Tokens::Shaped(TokenShape::Uniform { max, .. } | TokenShape::Lognormal { max, .. }) => *max <= 1,
        };
        // Adapters and models are drawn per session over the whole stream (`apply_lora`, `apply_models`); GPU pools and crashes
        // are checked and run on whole streams.
        one_turn
            && spec.generator.session.is_none()
            && !matches!(spec.arrivals, Arrivals::Trace { format: TraceFormat::Mooncake, .. })
            && spec.lora.is_none()
            && spec.models.is_empty()
            && spec.pool_count() == 0
            && spec.failures.is_none()
    }

    /// `spec`'s stream for `run_seed` (`spec` must [fit](Self::fits); `trace` holds the rows a
    /// trace replays), nothing generated yet; `extent` is its length and last arrival
    /// ([`Self::extent`]). A trace is the same stream for every seed: pass the workload's seed
    /// as `run_seed` for it (its hints are drawn from it, as the whole stream's are).
    pub fn new(
        spec: &'s ClusterSpec,
        trace: Option<&'s [TraceRow]>,
        run_seed: u64,
        extent: Extent,
    ) -> Result<Self, GenerateError> {
        let mut s = Self::unhinted(spec, trace, run_seed)?;
        s.hinter = Hinter::new(spec, run_seed);
        s.b.stream.extent = Some(extent);
        Ok(s)
    }

    /// As [`Self::new`], without hints and of unknown extent (a pass over the whole stream).
    pub(crate) fn unhinted(
        spec: &'s ClusterSpec,
        trace: Option<&'s [TraceRow]>,
        run_seed: u64,
    ) -> Result<Self, GenerateError> {
        debug_assert!(Self::fits(spec));
        let labelled = !spec.classes.is_empty() || !spec.tenants.is_empty();
        let b = Builder {
            stream: RequestStream::default(),
            next_unique: FIRST_UNIQUE_ID,
            label: Label::default(),
            labelled,
        };
        let limit = spec.requests.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
        let source = match &spec.arrivals {
            Arrivals::Trace { path, time_scale, .. } => Source::Rows {
                rows: trace.ok_or_else(|| GenerateError::NoTrace { path: path.to_string() })?,
                next: 0,
                system: Segment { id: SYSTEM_ID, tokens: spec.generator.system_prompt_tokens },
                time_scale: *time_scale,
                horizon: spec.duration_s.map(ticks),
            },
            _ => Source::Synth(Box::new(Synth::new(spec, run_seed)?)),
        };
        Ok(Self { b, source, hinter: None, limit, ended: false, keep: false })
    }

    /// Generates `spec`'s stream for `run_seed` once, keeping nothing: its extent, after `each`
    /// has seen every request (by id) — an error from `each` stops the pass.
    pub fn extent<E>(
        spec: &ClusterSpec,
        trace: Option<&[TraceRow]>,
        run_seed: u64,
        mut each: impl FnMut(usize, &GeneratedRequest) -> Result<(), E>,
    ) -> Result<Result<Extent, E>, GenerateError> {
        let mut s = LazyStream::unhinted(spec, trace, run_seed)?;
        let (mut id, mut last_arrival) = (0, SimTime::ZERO);
        while s.reach(id) {
            let r = s.b.stream.request(id);
            if let Err(e) = each(id, r) {
                return Ok(Err(e));
            }
            last_arrival = r.arrived_at;
            id += 1;
            s.forget_below(id);
        }
        Ok(Ok(Extent { total: id, last_arrival }))
    }

    /// The requests held (ids from `base`).
    pub fn stream(&self) -> &RequestStream {
        &self.b.stream
    }

    /// Generates up to request `id`; `false` when the stream ends before it.
    pub fn reach(&mut self, id: usize) -> bool {
        while self.b.stream.base + self.b.stream.requests.len() <= id && !self.ended {
            let before = self.b.stream.requests.len();
            self.ended = !self.source.group(&mut self.b);
            let s = &mut self.b.stream;
            if s.base + s.requests.len() >= self.limit {
                // Cut at the limit, as the whole stream is (its last group's extra samples go).
                let keep = self.limit - s.base;
                s.requests.truncate(keep);
                s.segments.truncate(s.requests.last().map_or(0, |r| r.segments.end as usize));
                s.labels.truncate(keep);
                self.ended = true;
            }
            if let Some(h) = &mut self.hinter {
                s.hints.extend(s.requests[before..].iter().map(|r| h.hint(r.output_tokens)));
            }
        }
        id < self.b.stream.base + self.b.stream.requests.len()
    }

    /// The run reads no request below `id` again: they may be dropped.
    pub fn forget_below(&mut self, id: usize) {
        if !self.keep {
            self.b.stream.forget_below(id);
        }
    }

    /// Generates the whole stream and keeps it (a run that reads every request's state).
    pub fn hold_all(&mut self) {
        self.keep = true;
        self.reach(usize::MAX - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::generate::tests::spec;
    use crate::workload::generate::{apply_hints, generate};

    const BASE: &str = "replicas: 4\n\
        generator: {system_prompt_tokens: 13, contexts: {count: 30, tokens: 500, popularity: {zipf: {s: 1.1}}}, suffix_tokens: {uniform: {min: 10, max: 90}}, output_tokens: {uniform: {min: 1, max: 50}}";

    /// An Azure-format trace of `n` rows: pairs of rows at one instant, contexts from 1 token
    /// (below the system prompt) to 3,000, outputs from 0, two classes and two tenants.
    fn rows(n: usize) -> Vec<TraceRow> {
        (0..n)
            .map(|i| TraceRow {
                at_s: (i / 2) as f64 * 0.04,
                context_tokens: 1 + (i as u32 * 37) % 3000,
                generated_tokens: i as u32 % 50,
                class: (i % 2) as u16,
                tenant: (i % 2) as u32,
                line: i + 2,
            })
            .collect()
    }

    /// Streams that fit, with the rows of a trace they replay: classes and tenants with noisy
    /// hints; parallel samples cut mid-group by `requests`; a diurnal day cut by `duration_s`;
    /// stepped rates; gamma arrivals; a trace cut by `requests`, with noisy hints, classes and
    /// tenants; a trace cut by `duration_s`.
    fn specs() -> Vec<(ClusterSpec, Option<Vec<TraceRow>>)> {
        let trace = "arrivals: {trace: {path: t.csv, time_scale: 0.5}}";
        let labels = "classes: [{name: a, share: 0.5}, {name: b, share: 0.5}]\ntenants: [{name: x, weight: 1}, {name: y, weight: 3}]";
        let traces = [
            format!("{BASE}}}\n{trace}\nrequests: 15000\nhints: {{output_tokens: {{noisy: {{cv: 1.0}}}}}}\n{labels}\n"),
            format!("{BASE}}}\n{trace}\nduration_s: 250\n"),
        ];
        let generated = [
            format!(
                "{BASE}}}\narrivals: {{poisson: {{rate: 50}}}}\nrequests: 20000\nhints: {{output_tokens: {{noisy: {{cv: 1.0}}}}}}\nclasses: [{{name: a, share: 0.3}}, {{name: b, share: 0.7, output_tokens: 7}}]\ntenants: [{{name: x, weight: 1}}, {{name: y, weight: 3}}]\n"
            ),
            format!("{BASE}, fanout: 3}}\narrivals: {{poisson: {{rate: 50}}}}\nrequests: 13001\n"),
            format!("{BASE}}}\narrivals: {{diurnal: {{rate: 30, amplitude: 0.8, period_s: 200}}}}\nduration_s: 600\n"),
            format!(
                "{BASE}}}\narrivals: {{stages: [{{rate: 40, duration_s: 100}}, {{rate: 120, duration_s: 100}}]}}\n"
            ),
            format!(
                "{BASE}}}\narrivals: {{gamma: {{rate: 40, cv: 3}}}}\nrequests: 13000\nhints: {{output_tokens: oracle}}\n"
            ),
        ];
        let generated = generated.iter().map(|y| (spec(y), None));
        generated.chain(traces.iter().map(|y| (spec(y), Some(rows(30_000))))).collect()
    }

    #[test]
    fn a_lazy_stream_is_the_whole_stream_request_by_request_in_bounded_memory() {
        for (s, rows) in specs() {
            assert!(LazyStream::fits(&s));
            let rows = rows.as_deref();
            let mut whole = generate(&s, rows, 5).unwrap();
            apply_hints(&s, &mut whole, 5);
            let extent = LazyStream::extent(&s, rows, 5, |_, _| Ok::<(), ()>(())).unwrap().unwrap();
            assert_eq!(extent, Extent { total: whole.len(), last_arrival: whole.last_arrival() });
            assert!(extent.total > 3 * super::super::FORGET_BATCH, "{extent:?}");
            if let Some(rows) = rows {
                assert!(extent.total < rows.len(), "the trace is cut: {extent:?}");
            }
            let mut lazy = LazyStream::new(&s, rows, 5, extent).unwrap();
            let mut most_held = 0;
            for i in 0..whole.len() {
                assert!(lazy.reach(i));
                let held = lazy.stream();
                assert_eq!(held.request(i).arrived_at, whole.request(i).arrived_at, "request {i}");
                assert_eq!(
                    (held.request(i).prompt_tokens, held.request(i).output_tokens),
                    (whole.request(i).prompt_tokens, whole.request(i).output_tokens)
                );
                assert_eq!(held.request(i).output_segment, whole.request(i).output_segment);
                assert_eq!(held.prompt(i), whole.prompt(i), "request {i}");
                assert_eq!(held.label(i), whole.label(i), "request {i}");
                assert_eq!(held.hint(i).to_bits(), whole.hint(i).to_bits(), "request {i}");
                most_held = most_held.max(held.requests.len());
                lazy.forget_below(i + 1);
            }
            assert!(!lazy.reach(whole.len()), "the stream ends where the whole one does");
            assert!(most_held <= 2 * super::super::FORGET_BATCH + 3, "held {most_held}");
        }
    }

    #[test]
    fn one_pass_statistics_are_those_of_the_whole_stream() {
        for (s, rows) in specs() {
            let whole = generate(&s, rows.as_deref(), 9).unwrap();
            let lazy = super::super::stats_lazy(&s, rows.as_deref(), 9, |_, _| Ok::<(), ()>(())).unwrap().unwrap();
            assert_eq!(format!("{lazy:?}"), format!("{:?}", super::super::stats(&whole)));
        }
    }

    #[test]
    fn multi_turn_sessions_and_mooncake_traces_are_generated_whole() {
        let s = spec(&format!("{BASE}, turns: 3}}\narrivals: {{poisson: {{rate: 5}}}}\nrequests: 100\n"));
        assert!(!LazyStream::fits(&s));
        assert!(LazyStream::fits(&spec(&format!("{BASE}, turns: 1}}\narrivals: {{poisson: {{rate: 5}}}}\n"))));
        let mooncake = "arrivals: {trace: {path: t.jsonl, format: mooncake}}";
        assert!(!LazyStream::fits(&spec(&format!("{BASE}}}\n{mooncake}\n"))));
        assert!(LazyStream::fits(&spec(&format!("{BASE}}}\narrivals: {{trace: {{path: t.csv}}}}\n"))));
    }
}
