//! What `routelab validate` prints about a generated stream.

use std::collections::{HashMap, HashSet};

use super::RequestStream;
use crate::time::seconds;

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

/// [`stats`] of `spec`'s stream for `run_seed` when it can be generated lazily
/// ([`super::LazyStream::fits`]), in one pass that holds no more than a group of requests: the
/// same figures, bit for bit. In such a stream an id from [`super::FIRST_UNIQUE_ID`] on is one
/// group's own (its parallel samples, consecutive requests), so its uses are counted while the
/// group lasts; the shared ids below it (system prompt, contexts) are few. `each` sees every
/// request (by id) first; its error stops the pass.
pub fn stats_lazy<E>(
    spec: &crate::workload::cluster::ClusterSpec,
    trace: Option<&[crate::workload::trace::TraceRow]>,
    run_seed: u64,
    mut each: impl FnMut(usize, &super::GeneratedRequest) -> Result<(), E>,
) -> Result<Result<WorkloadStats, E>, super::GenerateError> {
    let mut lazy = super::LazyStream::unhinted(spec, trace, run_seed)?;
    let (mut n, mut total, mut shared, mut repeated, mut references) = (0usize, 0u64, 0u64, 0u64, 0u64);
    let (mut prompt_sum, mut output_sum, mut max_prompt) = (0.0f64, 0.0f64, 0u32);
    let (mut gap_min, mut gap_max, mut last) = (f64::INFINITY, 0.0f64, None);
    // Shared ids: every reference's tokens, by id; a group's own ids: its references so far.
    let mut common: HashMap<u64, (u32, u64)> = HashMap::new();
    let mut group: HashMap<u64, (u32, u64)> = HashMap::new();
    let settle = |m: &mut HashMap<u64, (u32, u64)>, shared: &mut u64| {
        *shared += m.drain().filter(|(_, (uses, _))| *uses > 1).map(|(_, (_, tokens))| tokens).sum::<u64>();
    };
    while lazy.reach(n) {
        let s = lazy.stream();
        let (r, prompt) = (s.request(n), s.prompt(n));
        if let Err(e) = each(n, r) {
            return Ok(Err(e));
        }
        if prompt.iter().any(|p| p.id >= super::FIRST_UNIQUE_ID && !group.contains_key(&p.id)) {
            settle(&mut group, &mut shared);
        }
        // Repeats are of ids an earlier request had, as in [`stats`].
        let had =
            |id: u64| if id >= super::FIRST_UNIQUE_ID { group.contains_key(&id) } else { common.contains_key(&id) };
        repeated += prompt.iter().filter(|p| had(p.id)).count() as u64;
        for p in prompt {
            let m = if p.id >= super::FIRST_UNIQUE_ID { &mut group } else { &mut common };
            let e = m.entry(p.id).or_default();
            e.0 += 1;
            e.1 += p.tokens as u64;
            total += p.tokens as u64;
        }
        references += prompt.len() as u64;
        if let Some(prev) = last {
            let gap = seconds(r.arrived_at - prev);
            gap_min = gap_min.min(gap);
            gap_max = gap_max.max(gap);
        }
        last = Some(r.arrived_at);
        prompt_sum += r.prompt_tokens as f64;
        output_sum += r.output_tokens as f64;
        max_prompt = max_prompt.max(r.prompt_tokens);
        n += 1;
        lazy.forget_below(n);
    }
    settle(&mut group, &mut shared);
    settle(&mut common, &mut shared);
    let span_s = last.map_or(0.0, seconds);
    Ok(Ok(WorkloadStats {
        requests: n as u64,
        span_s,
        rate_rps: if span_s > 0.0 { (n.saturating_sub(1)) as f64 / span_s } else { f64::NAN },
        mean_prompt_tokens: prompt_sum / n.max(1) as f64,
        max_prompt_tokens: max_prompt,
        mean_output_tokens: output_sum / n.max(1) as f64,
        shared_prompt_share: if total > 0 { shared as f64 / total as f64 } else { 0.0 },
        segment_references: references,
        repeated_segment_references: repeated,
        inter_arrival_min_s: if n > 1 { gap_min } else { f64::NAN },
        inter_arrival_max_s: if n > 1 { gap_max } else { f64::NAN },
    }))
}
