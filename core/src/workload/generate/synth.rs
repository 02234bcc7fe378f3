//! The synthetic generator, one step of its arrival process at a time (see the parent module
//! for what it generates).

use rand::RngExt;
use rand_distr::{Distribution, Exp1, Gamma};
use routelab_policy_api::Segment;

use super::{Builder, GenerateError, Popular, SYSTEM_ID, mean_tokens, sample_tokens, session};
use crate::seeds::{SimRng, stream};
use crate::time::{SimTime, ticks};
use crate::workload::cluster::classes::{Label, Mix};
use crate::workload::cluster::stages::StageClock;
use crate::workload::cluster::{Arrivals, ClusterSpec};

/// One arrival process, step by step: when its groups start (the cluster's `arrivals`, or a
/// class's own).
struct Clock<'s> {
    rng: SimRng,
    day: Option<(f64, f64)>,
    stages: Option<StageClock<'s>>,
    unit: f64,
    cv: f64,
    group_rate: f64,
    gamma: Gamma<f64>,
    t: f64,
    /// The class its groups are of (`None`: drawn by share, the cluster's process).
    class: Option<usize>,
    /// Its next group's start, once drawn (a merge of several processes looks one ahead).
    next: Option<f64>,
}

impl<'s> Clock<'s> {
    /// The process `arrivals` (not a trace) with `per_group` requests a group on average.
    fn new(arrivals: &'s Arrivals, per_group: f64, rng: SimRng, class: Option<usize>) -> Result<Self, GenerateError> {
        // A day shape: candidates at the peak rate, each kept with probability rate(t) / peak.
        let (rate, cv, day) = match *arrivals {
            Arrivals::Poisson { rate } => (rate, 1.0, None),
            Arrivals::Gamma { rate, cv } => (rate, cv, None),
            Arrivals::Diurnal { rate, amplitude, period_s } => {
                (rate * (1.0 + amplitude), 1.0, Some((amplitude, period_s)))
            }
            Arrivals::Stages(_) => (1.0, 1.0, None),
            Arrivals::Trace { .. } => return Err(GenerateError::TraceNotGenerated),
        };
        // Stepped rates: unit-rate Poisson time `unit`, mapped to the clock by the stages.
        let stages = match arrivals {
            Arrivals::Stages(s) => Some(StageClock::new(s, 1.0 / per_group)),
            _ => None,
        };
        let group_rate = rate / per_group;
        // Gamma with shape k = 1/cv² and mean 1/group_rate; cv = 1 is exponential.
        let gamma =
            Gamma::new(1.0 / (cv * cv), cv * cv / group_rate).map_err(|e| GenerateError::Arrivals(e.to_string()))?;
        Ok(Self { rng, day, stages, unit: 0.0, cv, group_rate, gamma, t: 0.0, class, next: None })
    }

    /// One step: the next candidate's start and whether it is kept (a diurnal candidate may be
    /// dropped); `None` once the stages have ended.
    fn step(&mut self) -> Option<(f64, bool)> {
        let rng = &mut self.rng;
        if let Some(clock) = &mut self.stages {
            self.unit += Distribution::<f64>::sample(&Exp1, rng);
            self.t = clock.at(self.unit)?;
        } else if self.cv == 1.0 {
            self.t += Distribution::<f64>::sample(&Exp1, rng) / self.group_rate
        } else {
            self.t += self.gamma.sample(rng)
        }
        let t = self.t;
        if let Some((a, period)) = self.day {
            let keep = (1.0 - a * (std::f64::consts::TAU * t / period).cos()) / (1.0 + a);
            return Some((t, rng.random::<f64>() < keep));
        }
        Some((t, true))
    }

    /// Draws the next kept start into `next` (`None`: the process has ended — its stages, or a
    /// candidate at or past `horizon`).
    fn advance(&mut self, horizon: Option<SimTime>) {
        self.next = loop {
            match self.step() {
                None => break None,
                Some((t, true)) => break Some(t),
                Some((t, false)) if horizon.is_some_and(|h| ticks(t) >= h) => break None,
                Some(_) => {}
            }
        };
    }
}

/// The synthetic generator between two groups: [`generate`] runs it to the end, and a
/// [`lazy::LazyStream`] as far as the simulation has come. One call of [`Synth::group`] is one
/// step of the arrival process (a group, or a diurnal candidate dropped), so both draw the
/// same numbers in the same order.
pub(crate) struct Synth<'s> {
    spec: &'s ClusterSpec,
    /// The cluster's process alone (one step a call, as before classes could have their own),
    /// or it and every class's own, merged by time (`merged`).
    clocks: Vec<Clock<'s>>,
    merged: bool,
    /// Every merged process has drawn its first group.
    primed: bool,
    size_rng: SimRng,
    class_rng: SimRng,
    session_rng: SimRng,
    class_mix: Mix,
    tenant_mix: Mix,
    contexts: Vec<Segment>,
    popular: Option<Popular>,
    system: Segment,
    want: u64,
    horizon: Option<SimTime>,
    made: u64,
    sessions: u32,
    prompt: Vec<Segment>,
}

impl<'s> Synth<'s> {
    /// The generator of `spec` (synthetic arrivals, not a trace) for `run_seed`.
    pub(crate) fn new(spec: &'s ClusterSpec, run_seed: u64) -> Result<Self, GenerateError> {
        let g = &spec.generator;
        let arrival_rng = stream(run_seed, "cluster.arrivals");
        let size_rng = stream(run_seed, "cluster.sizes");
        let mut context_rng = stream(run_seed, "cluster.contexts");
        // Classes and tenants have their own stream: adding them moves no arrival and no size.
        let class_rng = stream(run_seed, "cluster.classes");
        // The cluster's process drives the classes with a share (all of them, unless some have
        // their own arrivals).
        let class_mix = Mix::new(spec.classes.iter().map(|c| c.share.unwrap_or(0.0)));
        let tenant_mix = Mix::new(spec.tenants.iter().map(|t| t.weight));
        let contexts: Vec<Segment> = g.contexts.as_ref().map_or_else(Vec::new, |c| {
            (0..c.count)
                .map(|i| Segment { id: 2 + i as u64, tokens: sample_tokens(&c.tokens, &mut context_rng) })
                .collect()
        });
        let popular = g.contexts.as_ref().map(|c| Popular::new(c.count, &c.popularity));
        let per_group = match &g.session {
            Some(s) => s.expected_calls().max(1.0),
            None => mean_tokens(&g.turns).max(1.0) * g.fanout as f64,
        };
        // Sessions' structure (steps, pauses, sub-agents) has its own stream.
        let session_rng = stream(run_seed, "cluster.sessions");
        let mut clocks = vec![Clock::new(&spec.arrivals, per_group, arrival_rng, None)?];
        for (k, c) in spec.classes.iter().enumerate() {
            if let Some(a) = &c.arrivals {
                let rng = stream(run_seed, &format!("cluster.classes.{}.arrivals", c.name));
                clocks.push(Clock::new(a, per_group, rng, Some(k))?);
            }
        }
        Ok(Self {
            spec,
            size_rng,
            class_rng,
            session_rng,
            class_mix,
            tenant_mix,
            contexts,
            popular,
            system: Segment { id: SYSTEM_ID, tokens: g.system_prompt_tokens },
            merged: clocks.len() > 1,
            primed: false,
            clocks,
            want: spec.requests.unwrap_or(u64::MAX),
            horizon: spec.duration_s.map(ticks),
            made: 0,
            sessions: 0,
            prompt: Vec::new(),
        })
    }

    /// One step of the arrival process: pushes the next group's requests onto `b` (none when a
    /// diurnal candidate is dropped); `false` once the stream has ended. With classes of their
    /// own arrivals, one step is the earliest next group of all the processes.
    pub(crate) fn group(&mut self, b: &mut Builder) -> bool {
        let horizon = self.horizon;
        let (t, class) = if self.merged {
            // Each process looks one group ahead; the earliest goes (the first listed on a tie).
            if !self.primed {
                self.primed = true;
                for c in &mut self.clocks {
                    c.advance(horizon);
                }
            }
            let Some(k) = (0..self.clocks.len())
                .filter(|&k| self.clocks[k].next.is_some())
                .min_by(|&i, &j| self.clocks[i].next.unwrap().total_cmp(&self.clocks[j].next.unwrap()))
            else {
                return false;
            };
            let c = &mut self.clocks[k];
            let t = c.next.expect("filtered");
            c.advance(horizon);
            (t, c.class)
        } else {
            let Some((t, kept)) = self.clocks[0].step() else { return false };
            if !kept {
                return horizon.is_none_or(|h| ticks(t) < h);
            }
            (t, None)
        };
        if self.made >= self.want || horizon.is_some_and(|h| ticks(t) >= h) {
            return false;
        }
        let (spec, g) = (self.spec, &self.spec.generator);
        let (size_rng, prompt) = (&mut self.size_rng, &mut self.prompt);
        prompt.clear();
        prompt.push(self.system);
        if let (Some(p), false) = (&self.popular, self.contexts.is_empty()) {
            prompt.push(self.contexts[p.sample(size_rng)]);
        }
        let (mut suffix_tokens, mut output_tokens) = (&g.suffix_tokens, &g.output_tokens);
        if b.labelled {
            let class = class.unwrap_or_else(|| self.class_mix.pick(self.class_rng.random()));
            let tenant = self.tenant_mix.pick(self.class_rng.random());
            b.label = Label { class: class as u16, tenant: tenant as u32 };
            if let Some(c) = spec.classes.get(class) {
                suffix_tokens = c.suffix_tokens.as_ref().unwrap_or(suffix_tokens);
                output_tokens = c.output_tokens.as_ref().unwrap_or(output_tokens);
            }
        }
        if let Some(spec) = &g.session {
            let suffix = sample_tokens(suffix_tokens, size_rng);
            prompt.push(b.unique(suffix));
            let s = session::SessionBuilder {
                b,
                rng: &mut self.session_rng,
                spec,
                output: output_tokens,
                at: ticks(t),
                session: self.sessions,
                calls: 0,
            };
            self.made += s.root(prompt) as u64;
            self.sessions += 1;
            return true;
        }
        let turns = sample_tokens(&g.turns, size_rng).max(1);
        let mut at = t;
        for turn in 0..turns {
            if turn > 0 {
                at += Distribution::<f64>::sample(&Exp1, size_rng) * g.think_time_s;
            }
            let suffix = sample_tokens(suffix_tokens, size_rng);
            let suffix = b.unique(suffix);
            prompt.push(suffix);
            let mut history_output = None;
            for sample in 0..g.fanout {
                let output = sample_tokens(output_tokens, size_rng).max(1);
                let reused = (sample == 0 && turn + 1 < turns).then(|| b.unique(output));
                if sample == 0 {
                    history_output = reused;
                }
                b.push(ticks(at), prompt, output, reused);
                self.made += 1;
            }
            if let Some(o) = history_output {
                prompt.push(o);
            }
        }
        true
    }
}
