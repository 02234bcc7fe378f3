//! A seeded mutation pass over every workload file: nothing a user could type panics or hangs,
//! and a failing mutation is shrunk to the smallest workload that still fails.

use super::*;

/// xorshift64*: the mutation pass's own deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const EXTREMES: [&str; 16] = [
    "0",
    "-1",
    "1e308",
    "-1e308",
    "1e-300",
    "4294967295",
    "18446744073709551615",
    ".nan",
    ".inf",
    "-.inf",
    "1e15",
    "[]",
    "{}",
    "~",
    "\"\"",
    "0.5",
];

/// One deterministic mutation of `text`.
fn mutate(text: &str, rng: &mut Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return text.into();
    }
    let i = rng.below(lines.len());
    match rng.below(8) {
        // A number (or the value after a colon) becomes an extreme one.
        0..=2 => {
            let line = &lines[i];
            let starts: Vec<usize> = line
                .char_indices()
                .filter(|&(k, c)| c.is_ascii_digit() && (k == 0 || !line.as_bytes()[k - 1].is_ascii_alphanumeric()))
                .map(|(k, _)| k)
                .collect();
            let ext = EXTREMES[rng.below(EXTREMES.len())];
            if let Some(&k) = starts.get(rng.below(starts.len())) {
                let end = line[k..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+'))
                    .map_or(line.len(), |e| k + e);
                lines[i] = format!("{}{ext}{}", &line[..k], &line[end..]);
            } else if let Some(c) = line.find(": ") {
                lines[i] = format!("{}: {ext}", &line[..c]);
            }
        }
        3 => {
            lines.remove(i);
        }
        4 => {
            let l = lines[i].clone();
            lines.insert(i, l);
        }
        5 => {
            let j = rng.below(lines.len());
            lines.swap(i, j);
        }
        6 => {
            let noise = ["[", "{", "]", "}", ": ", "- ", "'", "\"", "&a ", "*a", "!!binary ", "\t", "#"][rng.below(13)];
            let k = (0..=lines[i].len())
                .filter(|&k| lines[i].is_char_boundary(k))
                .nth(rng.below(lines[i].len() + 1))
                .unwrap_or(0);
            lines[i].insert_str(k, noise);
        }
        _ => {
            let indent = " ".repeat(rng.below(4) * 2);
            lines[i] = format!("{indent}{}", lines[i].trim_start());
        }
    }
    lines.join("\n") + "\n"
}

/// Every workload file, mutated a few hundred times in all: parse + validate must answer with a
/// workload or an error, never panic; and a valid mutant, shrunk to a small run (the size budget
/// that stands for "no hang"), must run to metrics or a per-policy error.
#[test]
fn seeded_mutations_of_every_workload_never_panic_or_hang() {
    let mut files = Vec::new();
    let mut dirs = vec![workspace().join("workloads")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            // Step-model profiles and measured runs are data beside the workloads, not workloads.
            let data = p.file_name().is_some_and(|n| n == "profiles" || n == "ground-truth");
            if p.is_dir() && !data {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml") && !data {
                files.push(p);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 20, "found only {} workloads", files.len());
    let per_file = 600 / files.len() + 1;
    let (mut total, mut valid, mut ran) = (0, 0, 0);
    for f in &files {
        // The merged text of a file with `base:` (the base is read from the repository).
        let text = workload::load_text(f).unwrap_or_else(|e| panic!("{e}"));
        // The caps and checks refuse nothing that ships.
        workload::parse(&text, f).unwrap_or_else(|e| panic!("a shipped workload is refused: {e}"));
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ total as u64 ^ text.len() as u64);
        for k in 0..per_file {
            let mut mutant = mutate(&text, &mut rng);
            if k % 3 == 2 {
                mutant = mutate(&mutant, &mut rng); // some get two mutations
            }
            total += 1;
            let result = std::panic::catch_unwind(|| workload::parse(&mutant, f));
            let Ok(parsed) = result else {
                panic!("parse+validate panicked on a mutant of {}:\n{mutant}", f.display())
            };
            let Ok(mut w) = parsed else { continue };
            valid += 1;
            let _ = estimate::estimate(&w);
            if shrink(&mut w) && k % 4 == 0 {
                ran += 1;
                let policies: Vec<String> = w.policies.iter().take(1).cloned().collect();
                if policies.is_empty() {
                    continue;
                }
                let yaml = serde_norway::to_string(&w).unwrap();
                // Relative trace paths resolve against the original file's folder.
                let name = f.to_string_lossy().into_owned();
                let result = std::panic::catch_unwind(|| compare_shrunk(&yaml, &name, &policies));
                assert!(result.is_ok(), "a small run of a mutant of {} panicked:\n{yaml}", f.display());
            }
        }
    }
    assert!(total >= 300, "{total} mutants");
    assert!(
        valid > total / 20,
        "only {valid} of {total} mutants were valid: the mutations are too destructive to test much"
    );
    eprintln!("mutation pass: {total} mutants of {} files, {valid} valid, {ran} run", files.len());
}

/// Shrinks a valid workload to a run of a fraction of a second; false when it cannot be (trace
/// replays are left out: their size is the trace's).
fn shrink(w: &mut workload::Workload) -> bool {
    w.seeds = 1;
    if let Some(d) = &mut w.dispatch {
        d.requests = d.requests.min(300);
        d.servers = d.servers.min(64);
        return true;
    }
    if let Some(c) = &mut w.cluster {
        if matches!(c.arrivals, workload::cluster::Arrivals::Trace { .. }) {
            return false;
        }
        c.requests = Some(c.requests.unwrap_or(100).min(100));
        c.replicas = c.replicas.min(8);
        return true;
    }
    if let Some(c) = &mut w.compound {
        c.variants.clear();
        c.questions.train = c.questions.train.min(50);
        c.questions.test = c.questions.test.min(50);
        c.budget = Some(c.budget.unwrap_or(200).min(200).max(c.model_count() as u64));
        return c.model_count() <= 8;
    }
    false
}

fn compare_shrunk(yaml: &str, name: &str, policies: &[String]) {
    let file = Path::new(name);
    let Ok(w) = workload::parse(yaml, file) else { return };
    let Ok(prepared) = routelab_core::runner::prepare(w, file) else { return };
    let specs: Vec<_> = policies.iter().filter_map(|p| routelab_core::plugin::PolicySpec::parse(p).ok()).collect();
    let r = routelab_core::runner::run_workload(
        &mut routelab_core::plugin::Loader::new(),
        &prepared,
        &specs,
        &|_| {},
        &|_| {},
    );
    for p in &r.results {
        for (k, v) in &p.metrics.0 {
            assert!(!(k.contains("latency") && *v < 0.0), "{name}: {k} = {v}");
        }
    }
}
