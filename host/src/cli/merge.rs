//! `--shard K/N` output and `routelab merge`: a shard's JSON carries each of its cells' per-seed
//! figures (not summaries: a mean over some seeds cannot be combined into the mean over all
//! without them), and merge assembles every policy from its cells exactly as an unsharded run
//! does, so the merged file is byte for byte what one unsharded run writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::args::Common;
use routelab_core::runner::parallel::Shard;
use routelab_core::runner::{Cell, PolicyResult, WorkloadResult, assemble};
use routelab_core::workload::{InputError, Workload};

/// A shard's `--json` document.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardDoc {
    pub routelab: String,
    pub command: String,
    pub shard: ShardId,
    pub workloads: Vec<ShardWorkload>,
}

#[derive(Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShardId {
    pub index: u32,
    pub count: u32,
}

/// A workload as in the full document, each policy with its cells instead of its summary.
#[derive(Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShardWorkload {
    pub name: String,
    pub world: String,
    pub seed: u64,
    pub seeds: u32,
    pub resolved: Workload,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub results: Vec<ShardPolicy>,
}

#[derive(Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShardPolicy {
    pub policy: String,
    pub spec: String,
    pub config: String,
    /// This shard's cells of the policy, in seed order.
    pub cells: Vec<Cell>,
}

impl ShardWorkload {
    /// `w`'s header, no policies yet.
    pub fn of(w: &WorkloadResult) -> Self {
        Self {
            name: w.name.clone(),
            world: w.world.to_string(),
            seed: w.seed,
            seeds: w.seeds,
            resolved: w.resolved.clone(),
            notes: w.notes.clone(),
            results: Vec::new(),
        }
    }

    /// The same workload and policies (cells aside).
    fn same_as(&self, o: &Self) -> bool {
        fn heads(w: &ShardWorkload) -> Vec<(&String, &String, &String)> {
            w.results.iter().map(|r| (&r.policy, &r.spec, &r.config)).collect()
        }
        (&self.name, &self.world, self.seed, self.seeds, &self.resolved, &self.notes)
            == (&o.name, &o.world, o.seed, o.seeds, &o.resolved, &o.notes)
            && heads(self) == heads(o)
    }
}

/// The JSON text of a shard's results.
pub fn render(command: &str, shard: Shard, workloads: &[ShardWorkload]) -> String {
    // The same fields as [`ShardDoc`], borrowed: the workloads are not cloned for every rewrite.
    #[derive(Serialize)]
    struct Borrowed<'a> {
        routelab: &'a str,
        command: &'a str,
        shard: ShardId,
        workloads: &'a [ShardWorkload],
    }
    let shard = ShardId { index: shard.index, count: shard.count };
    let doc = Borrowed { routelab: env!("CARGO_PKG_VERSION"), command, shard, workloads };
    serde_json::to_string_pretty(&doc).expect("results serialise")
}

/// `--shard` needs `--json` and works only with what can be merged later.
pub fn check(common: &Common) -> Result<(), InputError> {
    if common.shard.is_none() {
        return Ok(());
    }
    let flag = Path::new("--shard");
    let refuse =
        |other: &str, fix: &str| Err(InputError::new(flag, format!("--shard cannot be combined with {other}"), fix));
    if common.json.is_none() {
        return Err(InputError::new(flag, "a shard's results go to a --json file", "add --json shard-K.json"));
    }
    if common.isolate {
        return refuse("--isolate (whose unit is a policy, not a cell)", "drop --isolate or --shard");
    }
    if common.all_starts {
        return refuse("--all-starts", "drop --all-starts or --shard");
    }
    if common.csv.is_some() || common.plot.is_some() || common.report.is_some() {
        return refuse("--csv, --plot or --report (a shard has part of the results)", "merge the shards, then report");
    }
    Ok(())
}

/// Reads one shard's file; an unreadable or foreign file is bad input naming it.
fn read(file: &Path) -> Result<ShardDoc, InputError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| InputError::new(file, format!("cannot be read: {e}"), "give the --json file of a --shard run"))?;
    serde_json::from_str(&text).map_err(|e| {
        InputError::new(
            file,
            format!("is not a shard's results: {e}"),
            "give the --json files written by `--shard K/N` runs (a full run's file needs no merge)",
        )
        .at_line(e.line())
    })
}

/// Joins shard documents into the results of the unsharded run; refuses files that do not fit
/// together. Returns the command they ran.
pub fn merge(files: &[PathBuf]) -> Result<(String, Vec<WorkloadResult>), InputError> {
    let docs: Vec<ShardDoc> = files.iter().map(|f| read(f)).collect::<Result<_, _>>()?;
    let (first, first_file) = (&docs[0], &files[0]);
    let version = env!("CARGO_PKG_VERSION");
    let mut seen: BTreeMap<u32, &PathBuf> = BTreeMap::new();
    for (doc, file) in docs.iter().zip(files) {
        if doc.routelab != version {
            return Err(InputError::new(
                file,
                format!("was written by routelab {}; this is routelab {version}", doc.routelab),
                "run every shard and the merge with the same routelab",
            ));
        }
        if doc.command != first.command || doc.shard.count != first.shard.count {
            return Err(InputError::new(
                file,
                format!(
                    "is shard {}/{} of `{}`, but {} is shard {}/{} of `{}`",
                    doc.shard.index,
                    doc.shard.count,
                    doc.command,
                    first_file.display(),
                    first.shard.index,
                    first.shard.count,
                    first.command
                ),
                "merge the shards of one command line",
            ));
        }
        if doc.workloads.len() != first.workloads.len()
            || doc.workloads.iter().zip(&first.workloads).any(|(a, b)| !a.same_as(b))
        {
            let name = doc
                .workloads
                .iter()
                .zip(&first.workloads)
                .find(|(a, b)| !a.same_as(b))
                .map_or("the list of workloads".to_string(), |(a, _)| format!("workload {}", a.name));
            return Err(InputError::new(
                file,
                format!("differs from {} in {name} (its fields, seeds or policies)", first_file.display()),
                "merge the shards of one command line, run with the same workload files and options",
            ));
        }
        if doc.shard.index == 0 || doc.shard.index > doc.shard.count {
            return Err(InputError::new(
                file,
                format!(
                    "names itself shard {}/{}, which no --shard K/N run writes (1 ≤ K ≤ N)",
                    doc.shard.index, doc.shard.count
                ),
                "give unedited shard files",
            ));
        }
        if let Some(other) = seen.insert(doc.shard.index, file) {
            return Err(InputError::new(
                file,
                format!("is shard {}/{}, and so is {}", doc.shard.index, doc.shard.count, other.display()),
                "give each shard once",
            ));
        }
    }
    let missing: Vec<String> = (1..=first.shard.count)
        .filter(|k| !seen.contains_key(k))
        .map(|k| format!("{k}/{}", first.shard.count))
        .collect();
    if !missing.is_empty() {
        return Err(InputError::new(
            Path::new("routelab merge"),
            format!("shard {} missing", missing.join(", ")),
            "run the missing shards with the same command line and --shard K/N, and give every file",
        ));
    }
    let mut out = Vec::new();
    // Each cell's place in (workload, policy, seed) order: the one shard that runs it.
    let mut ordinal = 0;
    for (w, head) in first.workloads.iter().enumerate() {
        let mut result = WorkloadResult {
            name: head.name.clone(),
            world: head.resolved.world().as_str(),
            seed: head.seed,
            seeds: head.seeds,
            resolved: head.resolved.clone(),
            notes: head.notes.clone(),
            results: Vec::new(),
        };
        for (p, policy) in head.results.iter().enumerate() {
            let mut cells: Vec<Option<(&Cell, &PathBuf)>> = vec![None; head.seeds as usize];
            for (doc, file) in docs.iter().zip(files) {
                for cell in &doc.workloads[w].results[p].cells {
                    let at =
                        format!("workload {}, policy {}, seed index {}", head.name, policy.policy, cell.seed_index);
                    let slot = cells.get_mut(cell.seed_index as usize).ok_or_else(|| {
                        InputError::new(
                            file,
                            format!("has a cell beyond the workload's {} seeds ({at})", head.seeds),
                            "give unedited shard files",
                        )
                    })?;
                    let owner = Shard { index: doc.shard.index, count: doc.shard.count };
                    if !owner.keeps(ordinal + cell.seed_index as usize) {
                        return Err(InputError::new(
                            file,
                            format!(
                                "says it is shard {}/{} but holds a cell another shard runs ({at})",
                                doc.shard.index, doc.shard.count
                            ),
                            "give unedited shard files (a shard's id decides which cells it holds)",
                        ));
                    }
                    if let Some((_, other)) = slot {
                        return Err(InputError::new(
                            file,
                            format!("repeats a cell of {} ({at})", other.display()),
                            "give unedited shard files of one command line",
                        ));
                    }
                    *slot = Some((cell, file));
                }
            }
            if let Some(k) = cells.iter().position(Option::is_none) {
                return Err(InputError::new(
                    Path::new("routelab merge"),
                    format!("no shard has workload {}, policy {}, seed index {k}", head.name, policy.policy),
                    "rerun the shard that was cut short (its --json is written as it goes), then merge again",
                ));
            }
            ordinal += head.seeds as usize;
            let cells: Vec<Cell> = cells.into_iter().map(|c| c.expect("checked").0.clone()).collect();
            let empty = PolicyResult {
                policy: policy.policy.clone(),
                spec: policy.spec.clone(),
                config: policy.config.clone(),
                metrics: Default::default(),
                per_seed: Vec::new(),
                allocation: Vec::new(),
                error: None,
                input_error: false,
                detail: None,
            };
            result.results.push(assemble(empty, &cells));
        }
        out.push(result);
    }
    Ok((first.command.clone(), out))
}
