//! Reports: the terminal table, JSON, CSV, charts and the HTML page. Each takes the runner's
//! results; none runs anything.

pub mod chart;
pub mod csv;
pub mod figures;
pub mod heatmap;
pub mod html;
pub mod json;
pub mod plot;
pub mod table;

/// A column of the terminal table: metric key, header (with unit), and whether it shows only
/// when the run has an SLO (the figures SLOs are written in).
pub struct Column {
    pub key: &'static str,
    pub header: &'static str,
    pub with_slo: bool,
}

const fn col(key: &'static str, header: &'static str) -> Column {
    Column { key, header, with_slo: false }
}

const fn slo_col(key: &'static str, header: &'static str) -> Column {
    Column { key, header, with_slo: true }
}

/// Columns of the terminal table, in order; those a run did not produce are skipped (JSON and CSV
/// carry every metric; `--columns` chooses others).
pub const COLUMNS: &[Column] = &[
    // dispatch
    col("response_mean", "response mean [E[S]]"),
    col("response_p50", "p50 [E[S]]"),
    col("response_p99", "p99 [E[S]]"),
    col("wait_mean", "wait mean [E[S]]"),
    col("max_load", "max load [balls]"),
    // cluster
    col("latency_mean_s", "latency mean [s]"),
    col("latency_p99_s", "p99 [s]"),
    col("ttft_mean_s", "TTFT mean [s]"),
    slo_col("ttft_p99_s", "TTFT p99 [s]"),
    slo_col("tpot_p99_s", "TPOT p99 [s]"),
    col("hit_rate", "hit rate"),
    col("replication_factor", "replication"),
    col("busiest_replica_share", "busiest share"),
    col("slo_attainment", "SLO attained"),
    col("goodput_rps", "goodput [req/s]"),
    // compound
    col("train_accuracy", "train acc"),
    col("test_accuracy", "test acc"),
    col("evaluations", "evaluations"),
    col("cost_per_question", "cost/question"),
    col("gap_to_exhaustive", "gap to exhaustive"),
];

/// The metric the ratio column compares: the first of these a result has.
pub const RATIO_KEYS: &[&str] = &["response_mean", "max_load", "latency_mean_s", "test_accuracy"];
