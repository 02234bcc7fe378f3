//! The first stage: [`prepare`] reads what a workload names and resolves what every run shares
//! (the trace, the cluster's step model), and [`Prepared`] gives each seed its input — its request
//! stream, whole or generated as the run goes. Bad input is an [`InputError`].

use super::*;

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
    /// The trace the workload replays (its file read once), if any.
    pub(super) trace: Option<Vec<trace::TraceRow>>,
    /// Cluster world: one replica's step model.
    pub(super) step_models: Option<StepModels>,
    /// Cluster world replaying a trace: the stream (the same for every seed), checked to fit.
    pub(super) trace_stream: Option<Arc<RequestStream>>,
}

/// One seed's input, shared by every policy run on it.
pub struct SeedInput {
    pub seed: u64,
    /// Cluster world: the request stream.
    pub(super) stream: Option<Arc<RequestStream>>,
    /// Cluster world, a stream each run generates as it goes ([`Prepared::run_input`]): its
    /// length and last arrival (then `stream` is `None`).
    pub(super) lazy: Option<Extent>,
}

impl Prepared {
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
        let w = &self.workload;
        let seed = seed_for(w.seed, k);
        let stream = match (&w.cluster, &self.trace_stream) {
            (Some(_), Some(s)) => Some(s.clone()),
            (Some(c), None) => Some(Arc::new(self.generate(c, seed)?)),
            (None, _) => None,
        };
        Ok(SeedInput { seed, stream, lazy: None })
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
        let w = &self.workload;
        let Some(c) = w.cluster.as_ref().filter(|c| self.trace_stream.is_none() && LazyStream::fits(c)) else {
            return self.seed_input(k);
        };
        let seed = seed_for(w.seed, k);
        let sm = self.step_models.as_ref().expect("cluster world").tightest();
        let extent = LazyStream::extent(c, seed, |i, r| sim::cluster::check_fit(sm, i, r))
            .map_err(|e| self.setup_error(e.into()))?
            .map_err(|e| self.setup_error(e))?;
        if c.summary.exact(extent.total) {
            return self.seed_input(k);
        }
        Ok(SeedInput { seed, stream: None, lazy: Some(extent) })
    }

    pub(super) fn generate(&self, c: &ClusterSpec, seed: u64) -> Result<RequestStream, InputError> {
        let mut stream = generate(c, self.trace.as_deref(), seed).map_err(|e| self.setup_error(e.into()))?;
        crate::workload::generate::apply_hints(c, &mut stream, seed);
        crate::workload::generate::apply_lora(c, &mut stream, seed);
        crate::workload::generate::apply_models(c, &mut stream, seed);
        let sm = self.step_models.as_ref().expect("cluster world").tightest();
        sim::cluster::check_fits(sm, &stream).map_err(|e| self.setup_error(e))?;
        Ok(stream)
    }
}

impl SeedInput {
    /// Cluster world: the request stream (what `routelab replay` sends over HTTP).
    pub fn stream(&self) -> Option<&RequestStream> {
        self.stream.as_deref()
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
        step_models = Some(StepModels::resolve(c).map_err(|e| InputError::from_field(file, e.under("cluster")))?);
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
                    trace::check_cluster_rows(&rows, c, &p)?;
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
                    trace::check_cluster_sizes(sizes, c, &p)?;
                    notes.push(format!(
                        "Mooncake trace replay of {} ({} rows, time scale {time_scale}{spread})",
                        crate::builtin::shown(&p.display().to_string()),
                        rows.len()
                    ));
                    mooncake_rows = Some(rows);
                }
            }
        }
    }
    let mut prepared = Prepared { workload, file: file.into(), notes, trace, step_models, trace_stream: None };
    if let (Some(c), Some(rows)) = (prepared.workload.cluster.as_ref(), mooncake_rows) {
        // The stream is built from the rows directly (the generator is not used) and checked once.
        let mut stream = crate::workload::generate::mooncake_stream(c, &rows);
        crate::workload::generate::apply_hints(c, &mut stream, prepared.workload.seed);
        crate::workload::generate::apply_lora(c, &mut stream, prepared.workload.seed);
        crate::workload::generate::apply_models(c, &mut stream, prepared.workload.seed);
        let sm = prepared.step_models.as_ref().expect("cluster world").tightest();
        sim::cluster::check_fits(sm, &stream).map_err(|e| prepared.setup_error(e))?;
        prepared.trace_stream = Some(Arc::new(stream));
    } else if let Some(c) = prepared
        .workload
        .cluster
        .as_ref()
        .filter(|c| matches!(c.arrivals, crate::workload::cluster::Arrivals::Trace { .. }))
    {
        // A replayed trace is the same stream for every seed: generate and check it now.
        prepared.trace_stream = Some(Arc::new(prepared.generate(c, prepared.workload.seed)?));
    }
    Ok(prepared)
}

/// A cluster workload's generated-stream statistics for seed `workload.seed` (`None` elsewhere).
pub fn cluster_stats(p: &Prepared) -> Result<Option<(String, usize)>, InputError> {
    let Some(c) = &p.workload.cluster else { return Ok(None) };
    if p.trace_stream.is_none() && LazyStream::fits(c) {
        // One pass holding a group at a time: a day of 10^8 requests is never whole.
        let sm = p.step_models.as_ref().expect("cluster world").tightest();
        let stats = crate::workload::generate::stats_lazy(c, p.workload.seed, |i, r| sim::cluster::check_fit(sm, i, r))
            .map_err(|e| p.setup_error(e.into()))?
            .map_err(|e| p.setup_error(e))?;
        return Ok(Some((stats.to_string(), stats.requests as usize)));
    }
    let stream = match &p.trace_stream {
        Some(s) => s.clone(),
        None => Arc::new(p.generate(c, p.workload.seed)?),
    };
    Ok(Some((crate::workload::generate::stats(&stream).to_string(), stream.requests.len())))
}

/// `path` as written in `workload_file`: relative paths are relative to the workload's folder.
pub fn relative_to(workload_file: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        return p.into();
    }
    workload_file.parent().unwrap_or(Path::new(".")).join(p)
}
