//! The course exercises (docs/exercises.md), computed: every number comes from a function
//! or a run, with the parameters shown so a student can change them.

pub mod cluster;
pub mod compound;
pub mod dispatch;
pub mod pd;
pub mod routing;

/// (number, title) of every exercise this build answers.
pub const EXERCISES: &[(u32, &str)] = &[
    (1, "balls into bins: ln n / ln ln n versus two choices"),
    (2, "random dispatch is M/M/1: theory versus simulation"),
    (3, "E2 exploit or explore: a 23,000-token request with its document cached on replica 2"),
    (4, "the cluster's total cache: KV capacity, documents per replica, round robin versus partitioning"),
    (5, "priority groups: the group of 63/100 cached, quotas of 55 requests, who still waits long"),
    (6, "LLMSelector's budget: exhaustive, the minimum, the case study, and how papers count"),
    (7, "adding cost: A+B versus C+C, a price per point, the cost-aware LLMSelector over λ"),
    (8, "where an approximate tree goes wrong: SGLang's trees versus eviction events, with delay"),
    (9, "prefill/decode disaggregation: which routing decisions change, and does Preble's P/D pairing still help"),
];

/// `routelab exercise --list`.
pub fn list() -> String {
    let mut out = String::from("exercises (routelab exercise N):\n");
    for (n, title) in EXERCISES {
        out.push_str(&format!("  {n}. {title}\n"));
    }
    out
}

/// The answer to exercise `n`; bad input for a number with no exercise, a run error when a
/// policy of exercise 6 or 7 fails.
pub fn run(n: u32) -> Result<String, routelab_core::error::Error> {
    match n {
        1 => Ok(dispatch::exercise1()),
        2 => Ok(dispatch::exercise2()),
        3 => Ok(routing::exercise3()),
        4 => Ok(cluster::exercise4()),
        5 => Ok(cluster::exercise5()),
        6 => Ok(compound::exercise_6(&compound::Exercise6::default())?),
        7 => Ok(compound::exercise_7(&compound::Exercise7::default())?),
        8 => Ok(routing::exercise8()),
        9 => Ok(pd::exercise9()),
        _ => Err(routelab_core::workload::InputError::command_line(
            "exercise",
            format!("no exercise {n} in this build"),
            "`routelab exercise --list` names the exercises",
        )
        .into()),
    }
}
