//! Repeated measurements for `routelab bench`: every figure is sampled `warm-up + runs` times and
//! reported as its median with the spread of the kept runs, and variants that are compared with
//! each other are sampled in alternating rounds (one sample of each per round, the order rotated
//! every round), so a slow patch of the shared machine hits all of them instead of one.

use std::fmt::Write as _;

use anyhow::Result;
use serde::Serialize;

/// One measured figure: its samples (warm-up rounds dropped) and their summary.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub section: String,
    pub name: String,
    pub unit: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub samples: Vec<f64>,
}

impl Figure {
    fn new(section: &str, name: &str, unit: &str, samples: Vec<f64>) -> Self {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Self {
            section: section.into(),
            name: name.into(),
            unit: unit.into(),
            median,
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            samples,
        }
    }

    /// Half the min–max range relative to the median, in percent.
    pub fn spread_percent(&self) -> f64 {
        if self.median == 0.0 { 0.0 } else { (self.max - self.min) / 2.0 / self.median.abs() * 100.0 }
    }

    /// The median divided by `scale`, with `decimals` decimals, and its spread: `12.34 ±1.5%`.
    pub fn show(&self, scale: f64, decimals: usize) -> String {
        format!("{:.*} ±{:.1}%", decimals, self.median / scale, self.spread_percent())
    }
}

/// What one `routelab bench` run measured, as written by `--json`.
#[derive(Debug, Serialize)]
pub struct Report {
    pub runs: u32,
    pub warmup: u32,
    pub requests: u64,
    pub figures: Vec<Figure>,
}

/// Collects the figures and the text of a bench run.
pub struct Recorder {
    pub runs: u32,
    pub warmup: u32,
    pub figures: Vec<Figure>,
    pub text: String,
    section: String,
    /// Also print each line as it is written (a whole bench takes minutes).
    echo: bool,
}

impl Recorder {
    pub fn new(runs: u32, warmup: u32, echo: bool) -> Self {
        Self { runs: runs.max(1), warmup, figures: Vec::new(), text: String::new(), section: String::new(), echo }
    }

    fn write(&mut self, text: &str) {
        let _ = writeln!(self.text, "{text}");
        if self.echo {
            println!("{text}");
        }
    }

    /// Starts a section: its title line, and the name its figures are filed under.
    pub fn section(&mut self, key: &str, title: &str) {
        self.section = key.into();
        self.write(&format!("\n{title}"));
    }

    /// A line of text in the current section.
    pub fn line(&mut self, text: impl AsRef<str>) {
        self.write(text.as_ref());
    }

    /// Samples variant `i` of `names` with `sample(i)`: `warmup + runs` rounds of one sample each,
    /// round r starting at variant r mod n. Returns the figures (also kept for the report).
    pub fn compare(
        &mut self,
        names: &[impl AsRef<str>],
        unit: &str,
        mut sample: impl FnMut(usize) -> Result<f64>,
    ) -> Result<Vec<Figure>> {
        let n = names.len();
        let mut samples = vec![Vec::with_capacity(self.runs as usize); n];
        for round in 0..(self.warmup + self.runs) as usize {
            for k in 0..n {
                let i = (round + k) % n;
                let x = sample(i)?;
                if round >= self.warmup as usize {
                    samples[i].push(x);
                }
            }
        }
        let figures: Vec<Figure> =
            names.iter().zip(samples).map(|(name, s)| Figure::new(&self.section, name.as_ref(), unit, s)).collect();
        self.figures.extend(figures.iter().cloned());
        Ok(figures)
    }

    /// One figure on its own (nothing to alternate with).
    pub fn measure(&mut self, name: &str, unit: &str, mut sample: impl FnMut() -> Result<f64>) -> Result<Figure> {
        Ok(self.compare(&[name], unit, |_| sample())?.remove(0))
    }

    pub fn report(self, requests: u64) -> (String, Report) {
        (self.text, Report { runs: self.runs, warmup: self.warmup, requests, figures: self.figures })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compared_variants_alternate_and_warmup_rounds_are_dropped() {
        let mut rec = Recorder::new(3, 1, false);
        rec.section("s", "title");
        let mut order = Vec::new();
        let mut calls = 0.0;
        let figs = rec
            .compare(&["a", "b", "c"], "x", |i| {
                order.push(i);
                calls += 1.0;
                Ok(calls)
            })
            .unwrap();
        assert_eq!(order, [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]);
        // Variant a: calls 1 (warm-up, dropped), 6, 8, 10.
        assert_eq!(figs[0].samples, [6.0, 8.0, 10.0]);
        assert_eq!((figs[0].median, figs[0].min, figs[0].max), (8.0, 6.0, 10.0));
        assert_eq!(figs[0].section, "s");
        assert!((figs[0].spread_percent() - 25.0).abs() < 1e-12);
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let f = Figure::new("s", "n", "u", vec![4.0, 1.0, 3.0, 100.0]);
        assert_eq!(f.median, 3.5);
    }
}
