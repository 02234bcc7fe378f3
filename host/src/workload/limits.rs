//! What a workload may ask of the machine, checked before any long work: the size of every file
//! read, YAML nesting, counts, the simulated clock's range, and an estimate of a run's memory and
//! time that refuses what cannot fit in memory.
//!
//! The caps are far above what the shipped workloads use (the largest asks for 200,000 requests,
//! 8 replicas and 500 contexts) and below what would abort on allocation or run for days; each
//! error says which field and what to use instead.

use std::io::Read;
use std::path::Path;

use super::{FieldError, InputError, Workload};

/// Largest workload file (and `base:` file) read, in bytes. Real ones are a few KB.
pub const MAX_WORKLOAD_BYTES: u64 = 1 << 20;
/// Deepest `[`/`{` nesting accepted in workload YAML (real workloads nest 4 deep); the YAML parser
/// is quadratic in flow nesting, so it is bounded before parsing.
pub const MAX_NESTING: usize = 64;
/// Longest `base:` chain (a file, its base, its base's base, ...).
pub const MAX_BASE_CHAIN: usize = 16;

/// Most seeds per run.
pub const MAX_SEEDS: u32 = 10_000;
/// Dispatch world: most servers and requests per seed.
pub const MAX_SERVERS: u32 = 1_000_000;
pub const MAX_DISPATCH_REQUESTS: u64 = 10_000_000_000;
/// Cluster world: most replicas, requests per seed, contexts, parallel samples, turns.
pub const MAX_REPLICAS: u32 = 10_000;
pub const MAX_CLUSTER_REQUESTS: u64 = 100_000_000;
pub const MAX_CONTEXTS: u32 = 10_000_000;
pub const MAX_FANOUT: u32 = 1_024;
pub const MAX_TURNS: u32 = 10_000;
/// Compound world: most questions in the training or the test set.
pub const MAX_QUESTIONS: u32 = 10_000_000;

/// Longest simulated span, in seconds (cluster) or mean service times (dispatch). The clock holds
/// u64 nanoseconds, about 1.8·10¹⁰ s; a tenth of that (57 years) leaves room for queues that
/// drain long after the last arrival.
pub const MAX_HORIZON: f64 = 1.8e9;
/// Largest coefficient of variation of any distribution (cv² and exp(σ·z) must stay finite).
pub const MAX_CV: f64 = 100.0;

/// Reads a file of at most `cap` bytes as UTF-8 text. A regular file's size is checked before
/// reading; anything else (a pipe, a device such as /dev/zero) is read up to the cap.
pub fn read_capped(path: &Path, cap: u64, what: &str, fix: &str) -> Result<String, InputError> {
    let fail = |message: String, fix: &str| InputError {
        file: path.into(),
        path: String::new(),
        line: None,
        message,
        fix: fix.into(),
    };
    let too_big = || {
        fail(
            format!("is larger than the {} MiB allowed for a {what}", cap >> 20),
            "check the path: it names something far larger than any file of this kind",
        )
    };
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot read the {what}: {e}"), fix))?;
    if let Ok(meta) = file.metadata() {
        if meta.is_file() && meta.len() > cap {
            return Err(too_big());
        }
        if meta.is_dir() {
            return Err(fail(format!("cannot read the {what}: it is a directory"), fix));
        }
    }
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes).map_err(|e| fail(format!("cannot read the {what}: {e}"), fix))?;
    if bytes.len() as u64 > cap {
        return Err(too_big());
    }
    String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()].iter().filter(|&&b| b == b'\n').count();
        InputError { line: Some(line), ..fail(format!("the {what} is not UTF-8 text"), "save the file as UTF-8 text") }
    })
}

/// Refuses YAML nested deeper than [`MAX_NESTING`] (counting flow brackets and block
/// indentation levels), before the parser sees it. Brackets inside quotes and comments do not count.
pub fn check_nesting(text: &str, file: &Path) -> Result<(), InputError> {
    let mut depth = 0usize;
    let (mut single, mut double) = (false, false);
    for (i, line) in text.lines().enumerate() {
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        // Indentation: a deeply indented line is as deep as its columns / 1 (worst case).
        let indent = line.len() - line.trim_start_matches(' ').len();
        // `- - - x` opens a block sequence per dash.
        let dashes = line[indent..].split("- ").take_while(|s| s.is_empty()).count();
        let indent = indent + 2 * dashes;
        let mut line_depth = depth + indent / 2;
        while let Some(c) = chars.next() {
            match c {
                '\'' if !double => {
                    if single && chars.peek() == Some(&'\'') {
                        chars.next(); // '' is an escaped quote
                    } else {
                        single = !single;
                    }
                }
                '"' if !single && prev != '\\' => double = !double,
                '#' if !single && !double && prev.is_whitespace() => break,
                '[' | '{' if !single && !double => {
                    depth += 1;
                    line_depth = line_depth.max(depth + indent / 2);
                }
                ']' | '}' if !single && !double => depth = depth.saturating_sub(1),
                _ => {}
            }
            prev = if c == '\\' && prev == '\\' { ' ' } else { c };
        }
        if line_depth > MAX_NESTING {
            return Err(InputError {
                file: file.into(),
                path: String::new(),
                line: Some(i + 1),
                message: format!("nests deeper than {MAX_NESTING} levels"),
                fix: "a workload nests a few levels deep; check for unbalanced brackets or runaway indentation".into(),
            });
        }
        // A quoted flow scalar may span lines; a block line never continues a quote.
        if depth == 0 {
            single = false;
            double = false;
        }
    }
    Ok(())
}

/// What one run of a workload needs, roughly: enough to refuse the impossible and warn about the
/// slow. Constants come from `routelab bench` and the overload_scaling example on a laptop core.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Peak memory of one (policy, seed) run.
    pub bytes: f64,
    /// Wall time of one (policy, seed) run.
    pub seconds: f64,
    /// (policy, seed) runs.
    pub runs: u64,
}

impl std::fmt::Display for Estimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "about {} and {} per run, {} run(s) ({} in all; rough, from the sizes alone)",
            human_bytes(self.bytes),
            human_seconds(self.seconds),
            self.runs,
            human_seconds(self.seconds * self.runs as f64)
        )
    }
}

fn human_bytes(b: f64) -> String {
    match b {
        b if b >= 1e9 => format!("{:.1} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.0} MB", b / 1e6),
        b => format!("{:.0} KB", (b / 1e3).max(1.0)),
    }
}

fn human_seconds(s: f64) -> String {
    match s {
        s if s >= 86_400.0 => format!("{:.1} days", s / 86_400.0),
        s if s >= 3_600.0 => format!("{:.1} h", s / 3_600.0),
        s if s >= 60.0 => format!("{:.0} min", s / 60.0),
        s => format!("{s:.1} s"),
    }
}

/// The machine's memory in bytes (Linux: MemTotal), or 16 GB where it cannot be read.
pub fn machine_memory_bytes() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok().map(|kb| kb * 1024.0)
        })
        .unwrap_or(16e9)
}

/// Rough memory and time of one run of `w` (cluster traces: per row, counted when they are read).
pub fn estimate(w: &Workload) -> Estimate {
    let policies = w.policies.len().max(1) as u64;
    let mut runs = policies * w.seeds as u64;
    let (bytes, seconds) = if let Some(d) = &w.dispatch {
        let n = d.requests as f64;
        let refreshes = match d.information {
            super::dispatch::Information::Stale { refresh_interval } => {
                n / (d.utilisation.max(1e-9) * d.servers as f64) / refresh_interval
            }
            super::dispatch::Information::Fresh => 0.0,
        };
        // Responses kept for quantiles (8 B each), server state, the event heap.
        (n * 8.0 + d.servers as f64 * 64.0, n * 150e-9 + refreshes * d.servers as f64 * 2e-9)
    } else if let Some(c) = &w.cluster {
        let n = c.expected_requests();
        let turns = c.generator.turns.max().max(1) as f64;
        let contexts = c.generator.contexts.as_ref().map_or(0.0, |x| x.count as f64);
        // Per request: the generated request, its segments, its state and its record.
        let per_request = 240.0 + (turns + 2.0) * 16.0;
        (n * per_request + contexts * 40.0 + c.replicas as f64 * 4096.0, n * 25e-6)
    } else if let Some(c) = &w.compound {
        runs *= c.variants.len().max(1) as u64;
        let questions = c.questions.train as f64 + c.questions.test as f64;
        let cells = questions * c.system.modules().len() as f64 * c.model_count() as f64;
        // Outcome tables (2 B per question × module × model); a selector evaluates about
        // modules × models allocations over the training set.
        let evaluations = (c.system.modules().len() * c.model_count()) as f64 * 4.0;
        let eval_cost = c.questions.train as f64 * c.system.modules().len() as f64 * 20e-9;
        (cells * 2.0 + questions * 8.0, cells * 10e-9 + evaluations * eval_cost)
    } else {
        (0.0, 0.0)
    };
    Estimate { bytes: bytes + 4e6, seconds, runs }
}

/// Refuses a workload whose estimated run cannot fit in this machine's memory.
pub fn check_memory(w: &Workload) -> Result<(), FieldError> {
    check_memory_within(w, machine_memory_bytes())
}

/// [`check_memory`] on a machine with `have` bytes.
pub fn check_memory_within(w: &Workload, have: f64) -> Result<(), FieldError> {
    let e = estimate(w);
    if e.bytes > have * 0.8 {
        let field = match w.world() {
            super::WorldKind::Dispatch => "dispatch.requests",
            super::WorldKind::Cluster => "cluster.requests",
            super::WorldKind::Compound => "compound.questions",
        };
        return Err(FieldError::new(
            field,
            format!(
                "a run would need {} of memory, more than this machine's {} ({e})",
                human_bytes(e.bytes),
                human_bytes(have)
            ),
            "run fewer requests (or questions) per seed and more seeds",
        ));
    }
    Ok(())
}

/// `v` must be at most `cap`: a count a user could mean.
pub fn at_most<T: PartialOrd + std::fmt::Display>(path: &str, v: T, cap: T, fix: &str) -> Result<(), FieldError> {
    if v > cap {
        return Err(FieldError::new(path, format!("{v} is above the limit of {cap}"), fix));
    }
    Ok(())
}

/// A span of simulated time (seconds or mean service times) that fits the clock.
pub fn fits_clock(path: &str, span: f64, fix: &str) -> Result<(), FieldError> {
    if !(span.is_finite() && span <= MAX_HORIZON) {
        return Err(FieldError::new(
            path,
            format!(
                "gives a simulated span of {span:.3e}, beyond the clock's {MAX_HORIZON:.1e} (nanosecond ticks in 64 bits)"
            ),
            fix,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_counts_flow_brackets_but_not_quoted_ones() {
        let f = Path::new("w.yaml");
        assert!(
            check_nesting("a: [[[1]]]\nb: '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['\n", f)
                .is_ok()
        );
        let deep = format!("a: {}\n", "[".repeat(MAX_NESTING + 1));
        let e = check_nesting(&deep, f).unwrap_err();
        assert_eq!(e.line, Some(1));
        let indented: String = (0..200).map(|i| format!("{}k{i}:\n", " ".repeat(i * 2))).collect();
        assert!(check_nesting(&indented, f).is_err());
        assert!(check_nesting("policies: [\"a{x: [1, 2]}\", 'b # c']  # [[[[\n", f).is_ok());
        assert!(check_nesting(&format!("policies:\n{}x\n", "- ".repeat(100_000)), f).is_err());
        assert!(check_nesting("policies:\n  - - a\n    - b\n", f).is_ok());
    }
}
