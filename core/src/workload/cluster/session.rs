//! The `cluster.generator.session:` section: agent sessions as graphs of LLM calls, and the
//! `cluster.hints:` section: what a request tells the router about itself (an expected output
//! length, exact or noisy).
//!
//! ```yaml
//! generator:
//!   system_prompt_tokens: 2000        # the agent's instructions and tool descriptions
//!   contexts: {...}                   # the repository / environment a session works in
//!   suffix_tokens: 300                # the session's task (the root's first user turn)
//!   output_tokens: {lognormal: {mean: 300, cv: 1, max: 2000}}   # every call's output
//!   session:
//!     steps: {uniform: {min: 4, max: 20}}      # calls in the root agent's loop
//!     tool_tokens: {lognormal: {mean: 600, cv: 1, max: 4000}}  # a tool's result, appended
//!     tool_pause_s: {lognormal: {mean: 2, cv: 1, max: 30}}     # a tool's run time
//!     subagents:                               # optional: bursts of sub-agents
//!       probability: 0.2                       # that a step spawns instead of calling a tool
//!       burst: {uniform: {min: 2, max: 8}}     # sub-agents started at once
//!       depth: 2                               # most nesting levels
//!       steps: {uniform: {min: 2, max: 6}}     # calls in a sub-agent's loop
//!       task_tokens: 200                       # a sub-agent's task
//! ```
//!
//! A session is an agent loop. Its first call's prompt is the system prompt, a context (as any
//! generated request's) and the task (`suffix_tokens`). When call k completes, and steps remain,
//! the agent either runs a tool — the tool runs `tool_pause_s`, and call k+1's prompt is call
//! k's prompt + call k's output + the tool's result (`tool_tokens`) — or, with `probability`
//! (while the agent is shallower than `depth`), spawns a burst of sub-agents at once: each is an
//! agent loop of its own (`subagents.steps` calls) whose first prompt is call k's prompt + call
//! k's output + its task (`task_tokens`), so every sub-agent shares its parent's whole context.
//! Call k+1 then waits for the last call of every sub-agent of the burst, and its prompt is
//! call k's prompt + output + the sub-agents' results (one `tool_tokens` segment), with no tool
//! pause. Every call therefore extends its parent's context: the prefix a router can keep warm.
//!
//! Calls are sent when what they wait for is done (closed loop): the structure (sizes, pauses,
//! which call waits for which) is drawn once per seed and is the same for every policy; *when* a
//! call arrives depends on how fast the cluster served its parent. Sessions start by the arrival
//! process at `rate / (expected calls per session)`, so calls arrive at about `rate` when the
//! cluster keeps up. `requests` counts calls; the last session started is generated whole, so a
//! stream may hold a few more calls than `requests`. A session stops spawning sub-agents once it
//! holds [`MAX_SESSION_CALLS`] calls.

use serde::{Deserialize, Serialize};

use super::Tokens;
use crate::workload::FieldError;
use crate::workload::limits::{self, MAX_CV, at_most};

/// Most calls one session may hold (sub-agents stop spawning there).
pub const MAX_SESSION_CALLS: u32 = 10_000;
/// Most calls in one agent loop.
pub const MAX_SESSION_STEPS: u32 = 1_000;
/// Deepest sub-agent nesting.
pub const MAX_DEPTH: u32 = 8;
/// Longest tool pause, in seconds.
pub const MAX_PAUSE_S: f64 = 3_600.0;

/// Agent sessions: each group of the generator is a graph of calls (see the module docs).
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    /// Calls in the root agent's loop, one after another (at least 1).
    pub steps: Tokens,
    /// Tokens a tool returns (appended to the context before the next call); may be 0.
    #[serde(default = "default_tool_tokens")]
    pub tool_tokens: Tokens,
    /// Seconds a tool runs, between a call's last token and the next call.
    #[serde(default = "default_pause")]
    pub tool_pause_s: Seconds,
    /// Bursts of sub-agents; absent = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagents: Option<SubAgents>,
}

fn default_tool_tokens() -> Tokens {
    Tokens::Constant(0)
}
fn default_pause() -> Seconds {
    Seconds::Constant(0.0)
}

/// Sub-agents spawned in bursts.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SubAgents {
    /// Chance, in [0, 1], that a step (between two calls of a loop) spawns a burst instead of
    /// calling a tool.
    pub probability: f64,
    /// Sub-agents started at once, all sharing the spawning call's context.
    pub burst: Tokens,
    /// Most nesting levels (1: only the root spawns); the depth reached is geometric up to this.
    #[serde(default = "one")]
    pub depth: u32,
    /// Calls in a sub-agent's loop.
    pub steps: Tokens,
    /// Tokens of a sub-agent's task, after its parent's context; may be 0.
    #[serde(default = "default_task")]
    pub task_tokens: Tokens,
}

fn one() -> u32 {
    1
}
fn default_task() -> Tokens {
    Tokens::Constant(100)
}

/// A bounded distribution of seconds.
#[derive(Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum Seconds {
    /// A constant number of seconds.
    Constant(f64),
    Shaped(
        #[serde(with = "serde_norway::with::singleton_map")]
        #[schemars(with = "SecondsShape")]
        SecondsShape,
    ),
}

/// A number is a constant; a mapping must be a shape, and the shape's own error (an unknown
/// field, a missing one) is the one reported — an untagged enum would only say nothing matched.
impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Seconds;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("seconds, or a mapping {uniform | exponential | lognormal: {...}}")
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Seconds, E> {
                Ok(Seconds::Constant(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Seconds, E> {
                Ok(Seconds::Constant(v as f64))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Seconds, E> {
                Ok(Seconds::Constant(v as f64))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Seconds, A::Error> {
                serde_norway::with::singleton_map::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(Seconds::Shaped)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SecondsShape {
    /// Uniform on [min, max].
    Uniform { min: f64, max: f64 },
    /// Exponential with the given mean, redrawn above `max`.
    Exponential { mean: f64, max: f64 },
    /// Lognormal with the given mean and coefficient of variation, redrawn above `max`.
    Lognormal { mean: f64, cv: f64, max: f64 },
}

impl Seconds {
    /// The distribution's mean (before truncation at `max`).
    pub fn mean(&self) -> f64 {
        match self {
            Seconds::Constant(v) => *v,
            Seconds::Shaped(SecondsShape::Uniform { min, max }) => (min + max) / 2.0,
            Seconds::Shaped(SecondsShape::Exponential { mean, .. } | SecondsShape::Lognormal { mean, .. }) => *mean,
        }
    }

    /// The largest value the distribution can produce.
    pub fn max(&self) -> f64 {
        match self {
            Seconds::Constant(v) => *v,
            Seconds::Shaped(
                SecondsShape::Uniform { max, .. }
                | SecondsShape::Exponential { max, .. }
                | SecondsShape::Lognormal { max, .. },
            ) => *max,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), FieldError> {
        let ok = |v: f64| (0.0..=MAX_PAUSE_S).contains(&v);
        let fix = "use e.g. {lognormal: {mean: 2, cv: 1, max: 30}} (seconds)";
        match self {
            Seconds::Constant(v) if !ok(*v) => {
                Err(FieldError::new("", format!("must be in [0, {MAX_PAUSE_S}] s (got {v:?})"), fix))
            }
            Seconds::Shaped(SecondsShape::Uniform { min, max }) if !(ok(*min) && ok(*max) && min <= max) => Err(
                FieldError::new("uniform", format!("needs 0 ≤ min ≤ max ≤ {MAX_PAUSE_S} (got {min:?}, {max:?})"), fix),
            ),
            Seconds::Shaped(SecondsShape::Exponential { mean, max }) if !(*mean > 0.0 && ok(*max) && max >= mean) => {
                Err(FieldError::new(
                    "exponential",
                    format!("needs mean > 0 and mean ≤ max ≤ {MAX_PAUSE_S} (got mean {mean:?}, max {max:?})"),
                    fix,
                ))
            }
            Seconds::Shaped(SecondsShape::Lognormal { mean, cv, max })
                if !(*mean > 0.0 && *cv > 0.0 && *cv <= MAX_CV && ok(*max) && max >= mean) =>
            {
                Err(FieldError::new(
                    "lognormal",
                    format!(
                        "needs mean > 0, cv in (0, {MAX_CV}] and mean ≤ max ≤ {MAX_PAUSE_S} (got mean {mean:?}, cv {cv:?}, max {max:?})"
                    ),
                    fix,
                ))
            }
            _ => Ok(()),
        }
    }
}

impl SessionSpec {
    pub fn validate(&self) -> Result<(), FieldError> {
        self.steps.validate(false).map_err(|e| e.under("steps"))?;
        at_most("steps", self.steps.max(), MAX_SESSION_STEPS, "use e.g. {uniform: {min: 4, max: 20}} calls")?;
        self.tool_tokens.validate(true).map_err(|e| e.under("tool_tokens"))?;
        self.tool_pause_s.validate().map_err(|e| e.under("tool_pause_s"))?;
        if let Some(s) = &self.subagents {
            let under = |e: FieldError| e.under("subagents");
            if !(0.0..=1.0).contains(&s.probability) {
                return Err(under(FieldError::new(
                    "probability",
                    format!("must be in [0, 1] (got {:?})", s.probability),
                    "use e.g. 0.2 (one step in five spawns sub-agents)",
                )));
            }
            s.burst.validate(false).map_err(|e| under(e.under("burst")))?;
            at_most("burst", s.burst.max(), limits::MAX_FANOUT, "use e.g. {uniform: {min: 2, max: 8}}")
                .map_err(under)?;
            if !(1..=MAX_DEPTH).contains(&s.depth) {
                return Err(under(FieldError::new(
                    "depth",
                    format!("must be in [1, {MAX_DEPTH}] (got {})", s.depth),
                    "use e.g. 2 (sub-agents may spawn their own once)",
                )));
            }
            s.steps.validate(false).map_err(|e| under(e.under("steps")))?;
            at_most("steps", s.steps.max(), MAX_SESSION_STEPS, "use e.g. {uniform: {min: 2, max: 6}}")
                .map_err(under)?;
            s.task_tokens.validate(true).map_err(|e| under(e.under("task_tokens")))?;
        }
        Ok(())
    }

    /// Expected calls of one session (before the [`MAX_SESSION_CALLS`] cap): a loop of S calls
    /// has S − 1 steps between calls, each spawning with probability p a burst of B sub-agents.
    pub fn expected_calls(&self) -> f64 {
        let mean_tokens = Tokens::mean;
        let root = mean_tokens(&self.steps);
        let Some(s) = &self.subagents else { return root };
        let (p, b, t) = (s.probability, mean_tokens(&s.burst), mean_tokens(&s.steps));
        // A sub-agent at level `depth` spawns nothing; one above it spawns from its T − 1 steps.
        let mut sub = t;
        for _ in 1..s.depth {
            sub = t + (t - 1.0).max(0.0) * p * b * sub;
        }
        (root + (root - 1.0).max(0.0) * p * b * sub).min(MAX_SESSION_CALLS as f64)
    }

    /// The most tokens a session adds to its task's prompt, in any call: the root's steps each
    /// add an output and a tool result, and every nesting level a task and its own loop's.
    pub fn max_growth_tokens(&self, output_max: u32) -> u64 {
        let step = output_max as u64 + self.tool_tokens.max() as u64;
        let mut grow = self.steps.max() as u64 * step;
        if let Some(s) = &self.subagents {
            grow += s.depth as u64 * (s.task_tokens.max() as u64 + s.steps.max() as u64 * step);
        }
        grow
    }
}

/// What requests tell the router about themselves (`cluster.hints:`): the request fact
/// `hint.output_tokens`.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Hints {
    /// The expected output length each request carries: `none` (the fact reads NaN), `oracle`
    /// (the true length: what a perfect predictor buys) or `{noisy: {cv}}` (the true length
    /// times a lognormal factor of mean 1 and the given coefficient of variation, rounded, at
    /// least 1).
    #[serde(default, with = "serde_norway::with::singleton_map")]
    #[schemars(with = "OutputHint")]
    pub output_tokens: OutputHint,
}

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum OutputHint {
    /// No hint: the fact reads NaN.
    #[default]
    None,
    /// The true output length.
    Oracle,
    /// The true length times a lognormal factor (mean 1, coefficient of variation `cv`).
    Noisy {
        /// Coefficient of variation of the factor, > 0.
        cv: f64,
    },
}

impl Hints {
    pub fn validate(&self) -> Result<(), FieldError> {
        if let OutputHint::Noisy { cv } = self.output_tokens {
            if !(cv > 0.0 && cv <= MAX_CV) {
                return Err(FieldError::new(
                    "output_tokens.noisy.cv",
                    format!("must be in (0, {MAX_CV}] (got {cv:?})"),
                    "use e.g. 0.5, or `output_tokens: oracle` for exact hints",
                ));
            }
        }
        Ok(())
    }
}
