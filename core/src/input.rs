//! Bad input, said so a user can fix it: [`FieldError`] (a value that parsed but cannot be used,
//! by its dotted field path) and [`InputError`] (that, in a file, at a line: exit code 2).
//!
//! Its own module, below both the workloads and the built-ins, so that a workload's `base:` may
//! name a built-in without a circle between the two.

use std::fmt;
use std::path::{Path, PathBuf};

/// A value that parsed but cannot be used: where, what, and what would be valid.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
    pub fix: String,
}

impl FieldError {
    pub fn new(path: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { path: path.into(), message: message.into(), fix: fix.into() }
    }

    /// Prefixes the path with the enclosing field.
    pub fn under(mut self, parent: &str) -> Self {
        self.path = if self.path.is_empty() { parent.into() } else { format!("{parent}.{}", self.path) };
        self
    }
}

/// Bad input: a workload (or trace, or config) that cannot be run. Exit code 2.
#[derive(Debug, Clone, PartialEq)]
pub struct InputError {
    pub file: PathBuf,
    /// Dotted field path (`dispatch.servers`), empty for the whole file.
    pub path: String,
    pub line: Option<usize>,
    pub message: String,
    pub fix: String,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": field `{}`", self.path)?;
        }
        write!(f, ": {}", self.message)?;
        if !self.fix.is_empty() {
            write!(f, "\n  fix: {}", self.fix)?;
        }
        Ok(())
    }
}

impl std::error::Error for InputError {}

impl InputError {
    /// `file` (a path, or a flag such as `--set` standing for one) as a whole is bad: `message`
    /// says what, `fix` what would do. Narrow it with [`in_field`](Self::in_field) and
    /// [`at_line`](Self::at_line).
    pub fn new(file: impl Into<PathBuf>, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { file: file.into(), path: String::new(), line: None, message: message.into(), fix: fix.into() }
    }

    /// A bad value given on the command line: `field` names the flag or argument
    /// (`--kv-events`, `topic`); the file reads `<command line>`.
    pub fn command_line(field: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new("<command line>", message, fix).in_field(field)
    }

    /// A [`FieldError`] found in `file`.
    pub fn from_field(file: &Path, e: FieldError) -> Self {
        Self::new(file, e.message, e.fix).in_field(e.path)
    }

    /// The error is in the field at dotted `path` (`dispatch.servers`; empty for the whole file).
    pub fn in_field(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    /// The error is on `line` (1-based; `None` when no line is known).
    pub fn at_line(mut self, line: impl Into<Option<usize>>) -> Self {
        self.line = line.into();
        self
    }
}
