//! The `cluster.generator:` section: what the requests look like — a shared system prompt,
//! contexts drawn by popularity, a unique suffix, outputs, fan-out and turns — and the bounded
//! token-count distributions its fields use.

use serde::{Deserialize, Serialize};

use super::super::FieldError;
use super::super::limits::{self, MAX_CV, at_most};

/// A bounded token-count distribution.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum Tokens {
    /// A constant number of tokens.
    Constant(u32),
    // A one-key mapping (`{lognormal: {...}}`) both ways: serde_norway's default would write a
    // YAML tag (`!lognormal`) that the untagged enum cannot read back.
    Shaped(
        #[serde(with = "serde_norway::with::singleton_map")]
        #[schemars(with = "TokenShape")]
        TokenShape,
    ),
}

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TokenShape {
    /// Uniform on [min, max].
    Uniform { min: u32, max: u32 },
    /// Lognormal with the given mean and coefficient of variation, redrawn above `max`.
    Lognormal { mean: f64, cv: f64, max: u32 },
}

impl Tokens {
    /// The distribution's mean (lognormal: before truncation at `max`).
    pub fn mean(&self) -> f64 {
        match self {
            Tokens::Constant(v) => *v as f64,
            Tokens::Shaped(TokenShape::Uniform { min, max }) => (*min as f64 + *max as f64) / 2.0,
            Tokens::Shaped(TokenShape::Lognormal { mean, .. }) => *mean,
        }
    }

    /// The largest value the distribution can produce.
    pub fn max(&self) -> u32 {
        match self {
            Tokens::Constant(v) => *v,
            Tokens::Shaped(TokenShape::Uniform { max, .. }) | Tokens::Shaped(TokenShape::Lognormal { max, .. }) => *max,
        }
    }

    pub(crate) fn validate(&self, allow_zero: bool) -> Result<(), FieldError> {
        match self {
            Tokens::Constant(0) if !allow_zero => Err(FieldError::new("", "must be at least 1 token", "use e.g. 16")),
            Tokens::Constant(_) => Ok(()),
            Tokens::Shaped(TokenShape::Uniform { min, max }) => {
                if min > max || (*max == 0 && !allow_zero) || (*min == 0 && !allow_zero) {
                    Err(FieldError::new(
                        "uniform",
                        format!("needs 1 ≤ min ≤ max (got min {min}, max {max})"),
                        "use e.g. {min: 8, max: 24}",
                    ))
                } else {
                    Ok(())
                }
            }
            Tokens::Shaped(TokenShape::Lognormal { mean, cv, max }) => {
                if !(*mean >= 1.0 && mean.is_finite() && *cv > 0.0 && *cv <= MAX_CV) {
                    Err(FieldError::new(
                        "lognormal",
                        format!("needs mean ≥ 1 and cv > 0 (got mean {mean:?}, cv {cv:?})"),
                        "use e.g. {mean: 2000, cv: 0.5, max: 8000}",
                    ))
                } else if (*max as f64) < *mean {
                    Err(FieldError::new(
                        "lognormal.max",
                        format!("must be at least the mean {mean} (got {max})"),
                        "use e.g. 4 × the mean",
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// What requests look like: a shared system prompt, an optional shared context, a unique suffix.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Generator {
    /// Shared by every request; short by default (short shared prefixes are what makes naive
    /// affinity collapse).
    #[serde(default = "default_system")]
    pub system_prompt_tokens: u32,
    /// Shared contexts (documents, tools, videos, environments, problems); none if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contexts: Option<Contexts>,
    /// The unique part of each prompt (question, user turn); may be 0.
    #[serde(default = "default_suffix")]
    pub suffix_tokens: Tokens,
    /// Tokens each request generates (ignored for trace replay, whose rows give them; a Mooncake
    /// replay ignores the whole generator).
    pub output_tokens: Tokens,
    /// Parallel samples sharing one prompt, arriving together.
    #[serde(default = "one_fanout")]
    pub fanout: u32,
    /// Turns per session: turn k's prompt is turn k−1's prompt plus its output plus a new suffix.
    #[serde(default = "default_turns")]
    pub turns: Tokens,
    /// Mean (exponential) time between a session's turns, from the previous turn's arrival.
    #[serde(default = "default_think")]
    pub think_time_s: f64,
    /// Agent sessions: each group is a graph of calls with tool pauses and sub-agent bursts
    /// instead of turns × fan-out (`workload/cluster/session.rs`); absent = turns × fan-out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<super::session::SessionSpec>,
}

fn default_system() -> u32 {
    13
}
fn default_suffix() -> Tokens {
    Tokens::Constant(64)
}
fn default_turns() -> Tokens {
    Tokens::Constant(1)
}
fn default_think() -> f64 {
    5.0
}

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Contexts {
    /// How many distinct contexts (documents, tools, videos, …).
    pub count: u32,
    /// Length of each context in tokens (drawn once per context).
    pub tokens: Tokens,
    /// How a request picks its context: `uniform` or `{zipf: {s}}`.
    #[serde(default, with = "serde_norway::with::singleton_map")]
    #[schemars(with = "Popularity")]
    pub popularity: Popularity,
}

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Popularity {
    /// Every context equally likely.
    #[default]
    Uniform,
    /// Context k (1-based, by rank) is chosen with probability ∝ k^−s.
    Zipf {
        /// Exponent, > 0: larger is more skewed.
        s: f64,
    },
}

impl Generator {
    pub fn validate(&self) -> Result<(), FieldError> {
        self.suffix_tokens.validate(true).map_err(|e| e.under("suffix_tokens"))?;
        self.output_tokens.validate(false).map_err(|e| e.under("output_tokens"))?;
        self.turns.validate(false).map_err(|e| e.under("turns"))?;
        if self.fanout == 0 {
            return Err(FieldError::new(
                "fanout",
                "must be at least 1 (got 0)",
                "use 1 for independent requests, 8 for 8 parallel samples",
            ));
        }
        at_most("fanout", self.fanout, limits::MAX_FANOUT, "use e.g. 8 parallel samples")?;
        at_most("turns", self.turns.max(), limits::MAX_TURNS, "use e.g. {uniform: {min: 1, max: 10}} turns")?;
        if !(self.think_time_s >= 0.0 && self.think_time_s.is_finite()) {
            return Err(FieldError::new(
                "think_time_s",
                format!("must be ≥ 0 (got {:?})", self.think_time_s),
                "use e.g. 5",
            ));
        }
        if let Some(c) = &self.contexts {
            if c.count == 0 {
                return Err(FieldError::new(
                    "contexts.count",
                    "must be at least 1 (got 0)",
                    "use e.g. 300, or drop `contexts`",
                ));
            }
            at_most("contexts.count", c.count, limits::MAX_CONTEXTS, "use e.g. 300 contexts")?;
            c.tokens.validate(false).map_err(|e| e.under("contexts.tokens"))?;
            if let Popularity::Zipf { s } = c.popularity {
                if !(s > 0.0 && s.is_finite()) {
                    return Err(FieldError::new(
                        "contexts.popularity.zipf.s",
                        format!("the Zipf exponent must be > 0 (got {s:?})"),
                        "use e.g. 1.1 (larger is more skewed), or `popularity: uniform`",
                    ));
                }
            }
        }
        if let Some(session) = &self.session {
            if self.fanout != 1 || self.turns != Tokens::Constant(1) {
                return Err(FieldError::new(
                    "session",
                    "replaces `turns` and `fanout`: a session's calls follow from its steps and sub-agents",
                    "drop `turns` and `fanout` (or `session`)",
                ));
            }
            session.validate().map_err(|e| e.under("session"))?;
        }
        if self.system_prompt_tokens == 0 && self.contexts.is_none() && self.suffix_tokens.max() == 0 {
            return Err(FieldError::new(
                "",
                "every prompt would be empty",
                "give a system prompt, contexts or suffix tokens",
            ));
        }
        Ok(())
    }
}

fn one_fanout() -> u32 {
    1
}
