//! Agent sessions as graphs of calls (`generator.session`, documented in
//! `workload/cluster/session.rs`): one session per group of the generator, its calls pushed in
//! an order where every call comes after what it waits for (a call's id is larger than its
//! parents'), all with the session's start as their nominal arrival; the simulator sends a call
//! when what it waits for is done, a tool pause later.

use std::collections::HashMap;
use std::ops::Range;

use rand::RngExt;
use rand_distr::{Distribution, Exp1};
use routelab_policy_api::Segment;

use super::{Builder, sample_tokens};
use crate::seeds::SimRng;
use crate::time::{SimTime, ticks};
use crate::workload::cluster::Tokens;
use crate::workload::cluster::session::{MAX_SESSION_CALLS, Seconds, SecondsShape, SessionSpec};
use crate::workload::mooncake::MooncakeRow;

/// Which call waits for which, in a stream of agent sessions (indexed by request id).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sessions {
    /// Per request: the range of [`Sessions::waits_for`] it waits for (empty: it starts its
    /// session and arrives at its `arrived_at`).
    pub after: Vec<Range<u32>>,
    /// Every request's parents, back to back.
    pub waits_for: Vec<u32>,
    /// Per request: the tool's run time between the last of its parents completing and its send.
    pub pause: Vec<SimTime>,
    /// Per request: its session (0-based, in order of start).
    pub session: Vec<u32>,
    /// How many sessions the stream holds.
    pub count: u32,
}

impl Sessions {
    /// The calls request `i` waits for.
    pub fn parents(&self, i: usize) -> &[u32] {
        let r = &self.after[i];
        &self.waits_for[r.start as usize..r.end as usize]
    }
}

pub(super) fn sample_seconds(s: &Seconds, rng: &mut SimRng) -> f64 {
    let below = |max: f64, rng: &mut SimRng, draw: &dyn Fn(&mut SimRng) -> f64| {
        (0..64).map(|_| draw(rng)).find(|v| *v <= max).unwrap_or(max)
    };
    match s {
        Seconds::Constant(v) => *v,
        Seconds::Shaped(SecondsShape::Uniform { min, max }) => {
            if min == max {
                *min
            } else {
                rng.random_range(*min..=*max)
            }
        }
        Seconds::Shaped(SecondsShape::Exponential { mean, max }) => {
            below(*max, rng, &|r| Distribution::<f64>::sample(&Exp1, r) * mean)
        }
        Seconds::Shaped(SecondsShape::Lognormal { mean, cv, max }) => {
            let s2 = (1.0 + cv * cv).ln();
            let (mu, sigma) = (mean.ln() - s2 / 2.0, s2.sqrt());
            below(*max, rng, &|r| {
                let z: f64 = rand_distr::StandardNormal.sample(r);
                (mu + sigma * z).exp()
            })
        }
    }
}

/// One session being generated.
pub(super) struct SessionBuilder<'a> {
    pub b: &'a mut Builder,
    pub rng: &'a mut SimRng,
    pub spec: &'a SessionSpec,
    pub output: &'a Tokens,
    pub at: SimTime,
    pub session: u32,
    /// Calls pushed so far in this session.
    pub calls: u32,
}

impl SessionBuilder<'_> {
    /// Pushes call of `prompt` waiting for `after` (then `pause`).
    fn push(&mut self, prompt: &[Segment], output: u32, reused: Option<Segment>, after: &[u32], pause: SimTime) -> u32 {
        let id = self.b.stream.requests.len() as u32;
        self.b.push(self.at, prompt, output, reused);
        let s = self.b.stream.sessions.get_or_insert_with(Default::default);
        let start = s.waits_for.len() as u32;
        s.waits_for.extend_from_slice(after);
        s.after.push(start..s.waits_for.len() as u32);
        s.pause.push(pause);
        s.session.push(self.session);
        s.count = s.count.max(self.session + 1);
        self.calls += 1;
        id
    }

    /// The root agent's loop, whose first prompt is `prompt`; returns the number of calls pushed.
    pub fn root(mut self, prompt: &mut Vec<Segment>) -> u32 {
        let steps = sample_tokens(&self.spec.steps, self.rng).max(1);
        self.agent_loop(prompt, steps, 0, Vec::new(), SimTime::ZERO);
        self.calls
    }

    /// One agent loop of `steps` calls at nesting `depth`, the first prompt `prompt` (grown in
    /// place), the first call waiting for `after` and `pause`; returns the id of its last call.
    fn agent_loop(
        &mut self,
        prompt: &mut Vec<Segment>,
        steps: u32,
        depth: u32,
        mut after: Vec<u32>,
        mut pause: SimTime,
    ) -> u32 {
        let spec = self.spec;
        let mut k = 0;
        loop {
            let output = sample_tokens(self.output, self.rng).max(1);
            let more = k + 1 < steps;
            let reused = more.then(|| self.b.unique(output));
            let id = self.push(prompt, output, reused, &after, pause);
            let Some(out) = reused else { return id };
            prompt.push(out);
            k += 1;
            let spawn = spec.subagents.as_ref().filter(|s| {
                depth < s.depth
                    && self.calls < MAX_SESSION_CALLS
                    && s.probability > 0.0
                    && self.rng.random::<f64>() < s.probability
            });
            if let Some(sub) = spawn {
                let burst = sample_tokens(&sub.burst, self.rng).max(1);
                let mut lasts = Vec::with_capacity(burst as usize);
                for _ in 0..burst {
                    let mut child = prompt.clone();
                    let task = sample_tokens(&sub.task_tokens, self.rng);
                    child.push(self.b.unique(task));
                    let steps = sample_tokens(&sub.steps, self.rng).max(1);
                    lasts.push(self.agent_loop(&mut child, steps, depth + 1, vec![id], SimTime::ZERO));
                }
                // The sub-agents' results come back as one segment; no tool runs.
                let results = sample_tokens(&spec.tool_tokens, self.rng);
                prompt.push(self.b.unique(results));
                (after, pause) = (lasts, SimTime::ZERO);
            } else {
                let tool = sample_tokens(&spec.tool_tokens, self.rng);
                pause = ticks(sample_seconds(&spec.tool_pause_s, self.rng));
                prompt.push(self.b.unique(tool));
                after = vec![id];
            }
        }
    }
}

/// Which rows of a trace with agent sessions a replay keeps (`None`: the trace has none, cut it
/// as any other): a session is kept whole or not at all, by its first call — kept while fewer
/// than `limit` calls are kept and it starts before `horizon` (a cut session would leave calls
/// waiting for calls that are not there). Rows without a session are one-call sessions.
pub(super) fn kept_rows(
    rows: &[MooncakeRow],
    time_scale: f64,
    limit: Option<u64>,
    horizon: Option<SimTime>,
) -> Option<Vec<bool>> {
    if rows.iter().all(|r| r.session.is_none()) {
        return None;
    }
    let sessions = rows.iter().filter_map(|r| r.session.map(|s| s.session + 1)).max().unwrap_or(0);
    let mut kept_session = vec![false; sessions as usize];
    let mut kept = 0u64;
    let mut open = true;
    let keep = rows
        .iter()
        .map(|r| {
            let first = r.session.is_none_or(|s| s.call == 0);
            if first {
                open = open && limit.is_none_or(|l| kept < l) && horizon.is_none_or(|h| ticks(r.at_s * time_scale) < h);
                if let Some(s) = r.session {
                    kept_session[s.session as usize] = open;
                }
            }
            let k = match r.session {
                Some(s) => kept_session[s.session as usize],
                None => open,
            };
            kept += k as u64;
            k
        })
        .collect();
    Some(keep)
}

/// The waits of the kept rows of a trace with agent sessions: call k of a session waits for the
/// calls its `parents` name (the previous call when it names none), then its `wait_s ×
/// time_scale`.
pub(super) fn trace_sessions(rows: &[MooncakeRow], keep: &[bool], time_scale: f64) -> Sessions {
    let mut s = Sessions::default();
    // Per trace session: its number in the stream and the ids of its calls so far.
    let mut calls: HashMap<u32, (u32, Vec<u32>)> = HashMap::new();
    for (row, _) in rows.iter().zip(keep).filter(|(_, k)| **k) {
        let id = s.session.len() as u32;
        let start = s.waits_for.len() as u32;
        let (number, pause) = match row.session {
            Some(c) if c.call > 0 => {
                let (number, ids) = &calls[&c.session];
                if row.parents.is_empty() {
                    s.waits_for.push(ids[c.call as usize - 1]);
                } else {
                    s.waits_for.extend(row.parents.iter().map(|&p| ids[p as usize]));
                }
                (*number, ticks(c.wait_s * time_scale))
            }
            _ => (s.count, SimTime::ZERO),
        };
        if number == s.count {
            s.count += 1;
        }
        if let Some(c) = row.session {
            calls.entry(c.session).or_insert_with(|| (number, Vec::new())).1.push(id);
        }
        s.after.push(start..s.waits_for.len() as u32);
        s.pause.push(pause);
        s.session.push(number);
    }
    s
}
