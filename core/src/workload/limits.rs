//! What a workload may ask of the machine, checked before any long work: the size of every file
//! read, YAML nesting, counts, the simulated clock's range, (the estimate of a run's memory and
//! time, which refuses what cannot fit in memory, is in [`super::estimate`]).
//!
//! The caps are far above what the shipped workloads use (the largest asks for 200,000 requests,
//! 8 replicas and 500 contexts) and below what would abort on allocation or run for days; each
//! error says which field and what to use instead.

use std::io::Read;
use std::path::Path;

use super::{FieldError, InputError};

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
    let file = open_capped(path, cap, what, fix)?;
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes).map_err(|e| unreadable(path, what, e, fix))?;
    if bytes.len() as u64 > cap {
        return Err(too_big(path, cap, what));
    }
    String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()].iter().filter(|&&b| b == b'\n').count();
        not_utf8(path, what, line)
    })
}

/// Reads a file of at most `cap` bytes as UTF-8 text one line at a time (numbered from 1, without
/// its line ending), so that it is never whole in memory: a trace of 10^8 rows streams. The
/// checks and errors are [`read_capped`]'s, each raised when reading reaches it.
pub fn read_lines_capped(
    path: &Path,
    cap: u64,
    what: &str,
    fix: &str,
    mut each: impl FnMut(usize, &str) -> Result<(), InputError>,
) -> Result<(), InputError> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(open_capped(path, cap, what, fix)?.take(cap + 1));
    let (mut buf, mut read, mut n) = (Vec::new(), 0u64, 0usize);
    loop {
        buf.clear();
        let got = reader.read_until(b'\n', &mut buf).map_err(|e| unreadable(path, what, e, fix))?;
        if got == 0 {
            return Ok(());
        }
        read += got as u64;
        if read > cap {
            return Err(too_big(path, cap, what));
        }
        n += 1;
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        each(n, std::str::from_utf8(&buf).map_err(|_| not_utf8(path, what, n))?)?;
    }
}

/// Opens a file that [`read_capped`] may read: a regular file's size is checked first.
fn open_capped(path: &Path, cap: u64, what: &str, fix: &str) -> Result<std::fs::File, InputError> {
    let file = std::fs::File::open(path).map_err(|e| unreadable(path, what, e, fix))?;
    if let Ok(meta) = file.metadata() {
        if meta.is_file() && meta.len() > cap {
            return Err(too_big(path, cap, what));
        }
        if meta.is_dir() {
            return Err(InputError::new(path, format!("cannot read the {what}: it is a directory"), fix));
        }
    }
    Ok(file)
}

fn unreadable(path: &Path, what: &str, e: std::io::Error, fix: &str) -> InputError {
    InputError::new(path, format!("cannot read the {what}: {e}"), fix)
}

fn too_big(path: &Path, cap: u64, what: &str) -> InputError {
    InputError::new(
        path,
        format!("is larger than the {} MiB allowed for a {what}", cap >> 20),
        "check the path: it names something far larger than any file of this kind",
    )
}

fn not_utf8(path: &Path, what: &str, line: usize) -> InputError {
    InputError::new(path, format!("the {what} is not UTF-8 text"), "save the file as UTF-8 text").at_line(line)
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
            return Err(InputError::new(
                file,
                format!("nests deeper than {MAX_NESTING} levels"),
                "a workload nests a few levels deep; check for unbalanced brackets or runaway indentation",
            )
            .at_line(i + 1));
        }
        // A quoted flow scalar may span lines; a block line never continues a quote.
        if depth == 0 {
            single = false;
            double = false;
        }
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
