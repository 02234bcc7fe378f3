//! The first stage: [`prepare`] reads what a workload names and resolves what every run shares
//! (the trace, the cluster's step model), and [`Prepared`] gives each seed its input — its request
//! stream, whole or generated as the run goes. Bad input is an [`InputError`].

use super::*;
use crate::workload::compound::CompoundSpec;
use crate::workload::dispatch::DispatchSpec;

/// The runs a workload stands for: itself, or one per compound `variants` entry (named
/// `name[label]`), each validated.
pub fn expand(w: Workload, file: &Path) -> Result<Vec<Workload>, InputError> {
    let Some(c) = &w.compound else { return Ok(vec![w]) };
    if c.variants.is_empty() {
        return Ok(vec![w]);
    }
    c.variants()
        .into_iter()
        .enumerate()
        .map(|(i, (label, spec))| {
            let mut v = w.clone();
            v.name = format!("{}[{}]", w.name, if label.is_empty() { i.to_string() } else { label });
            v.compound = Some(spec);
            v.validate().map_err(|e| InputError::from_field(file, e.under(&format!("compound.variants[{i}]"))))?;
            Ok(v)
        })
        .collect()
}

/// Input the worlds need besides the workload itself, read and resolved once.
pub struct Prepared {
    pub workload: Workload,
    /// The workload file (named in setup errors).
    pub file: PathBuf,
    pub notes: Vec<String>,
    /// What the workload's world needs resolved; [`Prepared::world`] pairs it with the spec.
    resolved: Resolved,
}

/// What [`prepare`] resolved for each world (the one switch over worlds, with
/// [`Prepared::world`]).
enum Resolved {
    Dispatch {
        /// The trace the arrivals replay (its file read once), if any.
        trace: Option<Vec<trace::TraceRow>>,
    },
    Cluster(Box<PreparedCluster>),
    Compound,
}

/// A cluster workload's shared input.
pub(super) struct PreparedCluster {
    /// Every pool's step model, resolved once.
    pub step_models: StepModels,
    /// An Azure trace the generator replays (its file read once), if any.
    pub(super) trace: Option<Vec<trace::TraceRow>>,
    /// A replayed trace's stream (the same for every seed), checked to fit.
    pub(super) trace_stream: Option<Arc<RequestStream>>,
}

impl PreparedCluster {
    /// The seed seed `seed`'s stream is drawn from: a replayed Azure-format trace is one stream
    /// for every seed (drawn, hints included, from the workload's seed); a generated one is the
    /// seed's own.
    pub(super) fn stream_seed(&self, workload_seed: u64, seed: u64) -> u64 {
        if self.trace.is_some() { workload_seed } else { seed }
    }
}

/// A prepared workload's world: its spec beside what was resolved for it.
pub(super) enum World<'a> {
    Dispatch(&'a DispatchSpec, Option<&'a [trace::TraceRow]>),
    Cluster(&'a ClusterSpec, &'a PreparedCluster),
    Compound(&'a CompoundSpec),
}

/// One seed's input, shared by every policy run on it.
pub struct SeedInput {
    pub seed: u64,
    pub(super) stream: SeedStream,
}

/// A seed's requests.
pub(super) enum SeedStream {
    /// Dispatch and compound worlds: the world draws its own.
    None,
    /// Cluster world: the whole request stream.
    Whole(Arc<RequestStream>),
    /// Cluster world, a stream each run generates as it goes ([`Prepared::run_input`]): its
    /// length and last arrival.
    Lazy(Extent),
}

impl Prepared {
    /// The workload's world, its spec and what was resolved for it.
    pub(super) fn world(&self) -> World<'_> {
        let w = &self.workload;
        match (&self.resolved, &w.dispatch, &w.cluster, &w.compound) {
            (Resolved::Dispatch { trace }, Some(d), _, _) => World::Dispatch(d, trace.as_deref()),
            (Resolved::Cluster(p), _, Some(c), _) => World::Cluster(c, p),
            (Resolved::Compound, _, _, Some(c)) => World::Compound(c),
            _ => unreachable!("prepare resolves the workload's own world, and the workload is not changed after"),
        }
    }

    /// Cluster world: the spec and what was resolved for it (`None` in the other worlds).
    pub(super) fn cluster(&self) -> Option<(&ClusterSpec, &PreparedCluster)> {
        match self.world() {
            World::Cluster(c, p) => Some((c, p)),
            _ => None,
        }
    }

    /// Bad input found while setting a world up, in the workload file's terms.
    pub(super) fn setup_error(&self, e: SetupError) -> InputError {
        let section = self.workload.world().as_str();
        InputError::from_field(&self.file, FieldError::new(&e.field, e.message, e.fix).under(section))
    }

    /// Every seed's input: in the cluster world the request stream, generated once per
    /// (workload, seed) and shared by every policy.
    pub fn seed_inputs(&self) -> Result<Vec<SeedInput>, InputError> {
        (0..self.workload.seeds).map(|k| self.seed_input(k)).collect()
    }

    /// Seed `k`'s input (0-based: the seed is `seed_for(workload.seed, k)`), its stream whole.
    pub fn seed_input(&self, k: u32) -> Result<SeedInput, InputError> {
        let seed = seed_for(self.workload.seed, k);
        let stream = match self.cluster() {
            Some((_, PreparedCluster { trace_stream: Some(s), .. })) => SeedStream::Whole(s.clone()),
            Some((c, p)) => {
                SeedStream::Whole(Arc::new(self.generate(c, p, p.stream_seed(self.workload.seed, seed))?))
            }
            None => SeedStream::None,
        };
        Ok(SeedInput { seed, stream })
    }

    /// Every seed's input for runs ([`Prepared::run_input`]).
    pub fn run_inputs(&self) -> Result<Vec<SeedInput>, InputError> {
        (0..self.workload.seeds).map(|k| self.run_input(k)).collect()
    }

    /// Seed `k`'s input for runs: as [`Prepared::seed_input`], except that a stream the run may
    /// generate as it goes ([`LazyStream::fits`], and sketched: more requests than
    /// `summary: auto` keeps exactly) is generated here once without being kept — to check
    /// that every request fits a replica and to learn its length — and again by each run.
    pub fn run_input(&self, k: u32) -> Result<SeedInput, InputError> {
        let Some((c, p)) = self.cluster().filter(|(c, p)| p.trace_stream.is_none() && LazyStream::fits(c)) else {
            return self.seed_input(k);
        };
        let seed = seed_for(self.workload.seed, k);
        let sm = p.step_models.tightest();
        let extent = LazyStream::extent(c, p.trace.as_deref(), seed, |i, r| sim::cluster::check_fit(sm, i, r))
            .map_err(|e| self.setup_error(e.into()))?
            .map_err(|e| self.setup_error(e))?;
        if c.summary.exact(extent.total) {
            return self.seed_input(k);
        }
        Ok(SeedInput { seed, stream: SeedStream::Lazy(extent) })
    }

    fn generate(&self, c: &ClusterSpec, p: &PreparedCluster, seed: u64) -> Result<RequestStream, InputError> {
        let mut stream = generate(c, p.trace.as_deref(), seed).map_err(|e| self.setup_error(e.into()))?;
        crate::workload::generate::apply_hints(c, &mut stream, seed);
        crate::workload::generate::apply_lora(c, &mut stream, seed);
        crate::workload::generate::apply_models(c, &mut stream, seed);
        sim::cluster::check_fits(&p.step_models, &stream).map_err(|e| self.setup_error(e))?;
        Ok(stream)
    }
}

impl SeedInput {
    /// Cluster world: the request stream (what `routelab replay` sends over HTTP).
    pub fn stream(&self) -> Option<&RequestStream> {
        match &self.stream {
            SeedStream::Whole(s) => Some(s),
            SeedStream::None | SeedStream::Lazy(_) => None,
        }
    }
}

/// Resolves files a workload names (relative to the workload's folder) and derived facts.
pub fn prepare(workload: Workload, file: &Path) -> Result<Prepared, InputError> {
    // Again: command-line overrides (--seeds) may have changed it since it was loaded.
    workload.validate().map_err(|e| InputError::from_field(file, e))?;
    let mut notes = Vec::new();
    let mut trace = None;
    let mut mooncake_rows = None;
    let mut step_models = None;
    if let Some(d) = &workload.dispatch {
        let (_, raw_mean) = crate::workload::dispatch::Sizes::new(&d.service);
        if raw_mean != 1.0 {
            notes.push(format!("service sizes divided by {raw_mean:.6} so their mean is 1"));
        }
        if let crate::workload::dispatch::Arrivals::Trace { path } = &d.arrivals {
            let p = relative_to(file, path);
            let rows = trace::load(&p)?;
            if rows.len() < 2 {
                return Err(InputError::new(p, "a trace needs at least two rows to give a rate", "use a longer trace"));
            }
            notes.push(format!(
                "trace arrivals from {} ({} rows) rescaled to utilisation {}",
                path,
                rows.len(),
                d.utilisation
            ));
            trace = Some(rows);
        }
    }
    if let Some(c) = &workload.cluster {
        let models = StepModels::resolve(c).map_err(|e| InputError::from_field(file, e.under("cluster")))?;
        if let crate::workload::cluster::Arrivals::Trace { path, time_scale, format, spread_s } = &c.arrivals {
            let p = relative_to(file, path);
            let spread = match *spread_s {
                0.0 => String::new(),
                s => format!(", rows at one instant spread over {s} s"),
            };
            match format {
                TraceFormat::Azure => {
                    let mut rows = trace::load(&p)?;
                    trace::spread_instants(rows.iter_mut().map(|r| &mut r.at_s).collect(), *spread_s);
                    trace::check_cluster_rows(&rows, c, &models, &p)?;
                    notes.push(format!(
                        "trace replay of {} ({} rows, time scale {time_scale}{spread})",
                        crate::builtin::shown(&p.display().to_string()),
                        rows.len()
                    ));
                    trace = Some(rows);
                }
                TraceFormat::Mooncake => {
                    let mut rows = mooncake::load(&p)?;
                    trace::spread_instants(rows.iter_mut().map(|r| &mut r.at_s).collect(), *spread_s);
                    mooncake::check_adapters(&rows, c.lora.as_ref(), &p)?;
                    mooncake::check_labels(&rows, c, &p)?;
                    mooncake::check_models(&rows, c, &p)?;
                    let sizes = rows.iter().map(|r| trace::RowSize {
                        line: r.line,
                        prompt: r.input_length,
                        output: r.output_length,
                        at_s: r.at_s,
                    });
                    trace::check_cluster_sizes(sizes, c, &models, &p)?;
                    notes.push(format!(
                        "Mooncake trace replay of {} ({} rows, time scale {time_scale}{spread})",
                        crate::builtin::shown(&p.display().to_string()),
                        rows.len()
                    ));
                    mooncake_rows = Some(rows);
                }
            }
        }
        step_models = Some(models);
    }
    let resolved = match step_models {
        Some(step_models) => Resolved::Cluster(Box::new(PreparedCluster { step_models, trace, trace_stream: None })),
        None if workload.dispatch.is_some() => Resolved::Dispatch { trace },
        None => Resolved::Compound,
    };
    let mut prepared = Prepared { workload, file: file.into(), notes, resolved };
    let seed = prepared.workload.seed;
    let trace_stream = match prepared.cluster() {
        Some((c, p)) => match mooncake_rows {
            // The stream is built from the rows directly (the generator is not used) and checked once.
            Some(rows) => {
                let mut stream = crate::workload::generate::mooncake_stream(c, &rows);
                crate::workload::generate::apply_hints(c, &mut stream, seed);
                crate::workload::generate::apply_lora(c, &mut stream, seed);
                crate::workload::generate::apply_models(c, &mut stream, seed);
                sim::cluster::check_fits(&p.step_models, &stream).map_err(|e| prepared.setup_error(e))?;
                Some(Arc::new(stream))
            }
            // A replayed trace is the same stream for every seed: generate and check it now,
            // unless each run makes it as it goes (sketched, and it fits: `run_input`).
            None if matches!(c.arrivals, crate::workload::cluster::Arrivals::Trace { .. }) && !streamed(c, p) => {
                Some(Arc::new(prepared.generate(c, p, seed)?))
            }
            None => None,
        },
        None => None,
    };
    if let Resolved::Cluster(p) = &mut prepared.resolved {
        p.trace_stream = trace_stream;
    }
    Ok(prepared)
}

/// A cluster workload's generated-stream statistics for seed `workload.seed` (`None` elsewhere).
pub fn cluster_stats(p: &Prepared) -> Result<Option<(String, usize)>, InputError> {
    let Some((c, pc)) = p.cluster() else { return Ok(None) };
    if pc.trace_stream.is_none() && LazyStream::fits(c) {
        // One pass holding a group at a time: a day of 10^8 requests is never whole.
        let sm = pc.step_models.tightest();
        let trace = pc.trace.as_deref();
        let stats =
            crate::workload::generate::stats_lazy(c, trace, p.workload.seed, |i, r| sim::cluster::check_fit(sm, i, r))
                .map_err(|e| p.setup_error(e.into()))?
                .map_err(|e| p.setup_error(e))?;
        return Ok(Some((stats.to_string(), stats.requests as usize)));
    }
    let stream = match &pc.trace_stream {
        Some(s) => s.clone(),
        None => Arc::new(p.generate(c, pc, p.workload.seed)?),
    };
    Ok(Some((crate::workload::generate::stats(&stream).to_string(), stream.requests.len())))
}

/// Whether each run of `c` makes its trace's requests as it reaches them: the stream fits
/// ([`LazyStream::fits`]) and the run is sketched.
fn streamed(c: &ClusterSpec, p: &PreparedCluster) -> bool {
    LazyStream::fits(c) && !c.summary.exact(replayed_rows(c, p.trace.as_deref().unwrap_or(&[])))
}

/// How many of an Azure-format trace's `rows` its stream replays: those before the horizon
/// (`duration_s`), at most `requests` (the rows are in time order).
fn replayed_rows(c: &ClusterSpec, rows: &[trace::TraceRow]) -> usize {
    let time_scale = match &c.arrivals {
        crate::workload::cluster::Arrivals::Trace { time_scale, .. } => *time_scale,
        _ => 1.0,
    };
    let before = match c.duration_s.map(crate::time::ticks) {
        Some(h) => rows.partition_point(|r| crate::time::ticks(r.at_s * time_scale) < h),
        None => rows.len(),
    };
    c.requests.map_or(before, |l| before.min(usize::try_from(l).unwrap_or(usize::MAX)))
}

/// `path` as written in `workload_file`: relative paths are relative to the workload's folder.
pub fn relative_to(workload_file: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        return p.into();
    }
    workload_file.parent().unwrap_or(Path::new(".")).join(p)
}
