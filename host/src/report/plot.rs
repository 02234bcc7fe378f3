//! `--plot DIR`: the charts of [`super::figures`] as SVG files, `<stem>.svg`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::figures::{self, Figure};
use routelab_core::runner::WorkloadResult;

/// Writes `figures` into `dir` (created if missing); returns the files written.
pub fn write(dir: &Path, figures: &[Figure]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    figures
        .iter()
        .map(|f| {
            let path = dir.join(format!("{}.svg", f.stem));
            std::fs::write(&path, &f.svg).with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        })
        .collect()
}

/// The charts of one comparison; returns the files written.
pub fn comparison(dir: &Path, w: &WorkloadResult) -> Result<Vec<PathBuf>> {
    write(dir, &figures::comparison(w)?)
}

/// The curves of one sweep (`points`: the workload at each point, in order); returns the files.
pub fn sweep(dir: &Path, name: &str, field: &str, points: &[WorkloadResult]) -> Result<Vec<PathBuf>> {
    write(dir, &figures::sweep(name, field, points)?)
}
