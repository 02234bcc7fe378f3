//! The command line's shape: every command and flag, with the help `routelab … --help` prints.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};

use super::help::{POLICIES_HELP, POLICY_HELP, WORKLOAD_ARG, WORKLOADS_ARG};

#[derive(Parser, Debug)]
#[command(
    name = "routelab",
    version,
    about = "A lab for request-routing policies in LLM serving",
    after_help = "Exit codes: 0 ok, 1 a policy's run failed (the others still report), 2 bad input.\n\
                  Docs: `routelab docs` (built in; `routelab docs output`: every metric key and unit)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Three routing problems in under a second: cache vs balance, classic dispatch, model selection.
    Demo,
    /// Run one policy on a workload and print every metric.
    Run {
        #[arg(help = WORKLOAD_ARG)]
        workload: PathBuf,
        /// The policy: a built-in name or `lib.so:name`, optionally with `{key: value}` config.
        #[arg(long, long_help = POLICY_HELP)]
        policy: String,
        /// The policy's config as a YAML file (instead of `name{key: value}`).
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Compare policies side by side on one or more workloads.
    Compare {
        #[arg(required = true, help = WORKLOADS_ARG)]
        workloads: Vec<PathBuf>,
        /// Comma-separated policies (default: each workload's `policies:`); see --help for the syntax.
        #[arg(long, long_help = POLICIES_HELP)]
        policies: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Run policies over a range of one field's values: a curve per policy.
    Sweep {
        #[arg(required = true, help = WORKLOADS_ARG)]
        workloads: Vec<PathBuf>,
        /// Comma-separated policies (default: each workload's `policies:`); see --help for the syntax.
        #[arg(long, long_help = POLICIES_HELP)]
        policies: Option<String>,
        /// `field.path=v1,v2,...` (`xF` multiplies the workload's value by F); the path may start
        /// inside the world section (`arrivals.poisson.rate`). Several `--set`s move together.
        #[arg(long = "set", required = true)]
        set: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Per policy, the highest load whose SLO holds: bracketing, then bisection, the same seeds
    /// at every load (docs/output.md, "Capacity").
    Capacity {
        #[command(flatten)]
        setup: SloArgs,
        /// Stop bisecting when the interval's width is at most this fraction of its top.
        #[arg(long, default_value_t = 0.02)]
        tolerance: f64,
        /// Most loads run per policy.
        #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(2..))]
        max_loads: u32,
        /// Write the answers and every load run (mean metrics over seeds) as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Draw each SLO metric against the load, a line per policy, as SVG into this folder.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Write one self-contained HTML page: the answers, notes and warnings, each SLO metric
        /// against the load, every load run, the workload as run and the command that reproduces
        /// it (as `compare --report`).
        #[arg(long)]
        report: Option<PathBuf>,
    },
    /// The cheapest fleet that meets an SLO at the workload's own load: searches GPU type ×
    /// tensor parallelism × replica count × router (× scaler), and fixed-part lines — a P/D
    /// split's prefill count (`--prefill`), a second GPU type (`--mix`) — bisecting the count
    /// searched of each and skipping shapes dearer than one already seen to hold; prints each
    /// line's answer, the frontier (cost against the SLO's margin) and the winner with how sure
    /// it is (docs/output.md, "Plan").
    Plan {
        #[command(flatten)]
        setup: SloArgs,
        /// Comma-separated catalog GPUs to try (default: the workload's `gpu`); cluster
        /// workloads only.
        #[arg(long)]
        gpus: Option<String>,
        /// Comma-separated tensor-parallel degrees to try, of 1, 2, 4, 8 (default: the
        /// workload's `tp`); cost counts every GPU.
        #[arg(long)]
        tp: Option<String>,
        /// Replica counts to search, `A..B` inclusive or one count (default: 1 to twice the
        /// workload's); in the dispatch world, servers; on a `disaggregation:` workload, decode
        /// instances.
        #[arg(long)]
        replicas: Option<String>,
        /// A `disaggregation:` workload's prefill instance counts to try, `A..B` or one count
        /// (default: the workload's): a line per count, its decode count bisected.
        #[arg(long)]
        prefill: Option<String>,
        /// Mixed-GPU lines too: for each two `--gpus` A, B, a line per fixed count 1..N of B
        /// (default N = 2) beside the A replicas searched; each costed per GPU.
        #[arg(long, num_args = 0..=1, default_missing_value = "2", value_parser = clap::value_parser!(u32).range(1..))]
        mix: Option<u32>,
        /// Comma-separated scalers (`hpa`, `dynamo_planner`, `llm_d_wva`, …; `none`: no scaler):
        /// each line then autoscales between 1 and the replica count searched, and costs its mean
        /// replicas (default: the workload's own scaler, if any; `--scalers none` skips them). On
        /// a `disaggregation:` workload a P/D shape's prefill and decode counts are the pools'
        /// `max_replicas` (the fleet's budget their sum): each pool starts full and scales down to
        /// the workload's own `autoscaling.pools` minimum (default 1); it costs both pools' mean
        /// instances. Not with `mixed:` instances.
        #[arg(long)]
        scalers: Option<String>,
        /// Most a shape may cost per hour: dearer shapes are not run.
        #[arg(long)]
        budget: Option<f64>,
        /// Prices per GPU-hour, `GPU=PRICE,…`, over the workload's `cost_per_hour` and the
        /// built-in on-demand table (docs/output.md, "Plan"); the dispatch world's are `server=`.
        #[arg(long)]
        prices: Option<String>,
        /// Write every line's search, the frontier and the winner as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write one self-contained HTML page: the lines, the frontier with its chart (cost
        /// against the SLO's margin), the winner, the workload and the command that reproduces it.
        #[arg(long)]
        report: Option<PathBuf>,
    },
    /// Join the partial results of `--shard K/N` runs into what one unsharded run writes.
    Merge {
        /// The shards' `--json` files, in any order (every shard 1/N..N/N exactly once).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write the merged results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Print tables as Markdown.
        #[arg(long)]
        markdown: bool,
    },
    /// Which metrics of which policies moved beyond their 95% intervals between two `--json` files.
    /// Exit code 0: nothing moved; 1: something moved or failed differently; 2: bad input.
    Diff {
        /// The results before the change (`--json` of compare, sweep, run or merge).
        before: PathBuf,
        /// The results after the change.
        after: PathBuf,
        /// Print the tables as Markdown.
        #[arg(long)]
        markdown: bool,
    },
    /// List the built-in policies, or what a plugin library exports.
    Policies {
        /// A plugin library (`.so`/`.dylib`/`.dll`) to list instead of the built-ins.
        #[arg(long)]
        plugin: Option<PathBuf>,
    },
    /// List the built-in workloads, one line each (run any by name from any directory).
    Workloads,
    /// Check a workload (fields, policy names, trace) and print its resolved form and statistics.
    Validate {
        #[arg(help = WORKLOAD_ARG)]
        workload: PathBuf,
        /// Replay this trace file instead of the one the workload names, read in the workload's
        /// trace format (Azure CSV, or Mooncake JSON Lines where it says `format: mooncake`); a
        /// built-in trace by name works from any directory (`conversation_trace`).
        #[arg(long, value_parser = trace_arg)]
        trace: Option<PathBuf>,
    },
    /// Write a cluster workload's request stream as a trace other simulators read: Mooncake JSON
    /// Lines, one request a line — timestamp (ms), input and output length, and `hash_ids` of
    /// 512-token blocks, equal for equal prefixes. Replay it with
    /// `arrivals: {trace: {path: F, format: mooncake}}` (docs/workloads.md: what a replay keeps).
    ExportTrace {
        #[arg(help = WORKLOAD_ARG)]
        workload: PathBuf,
        /// The trace format (only `mooncake` for now).
        #[arg(long, value_enum, default_value = "mooncake")]
        format: TraceFormat,
        /// The file to write.
        #[arg(long)]
        out: PathBuf,
        /// The run seed whose stream is exported (default: the workload's `seed`).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Turn an OpenAI-style request log (JSON Lines: `timestamp` in seconds, the request body —
    /// `messages` or `prompt`, inline or under `request` — and `output_tokens` or
    /// `usage.completion_tokens`) into a Mooncake-format trace: replay it with `arrivals: {trace:
    /// {path: F, format: mooncake}}`, or `--trace F` on a workload that replays Mooncake traces
    /// (`mooncake_conversation`); docs/your-traffic.md walks it through.
    Import {
        /// The request log.
        log: PathBuf,
        /// The trace file to write.
        #[arg(long)]
        out: PathBuf,
        /// The workload that will replay the trace: a log line's `class` and `tenant` names
        /// become indices into its `cluster.classes` and `cluster.tenants`.
        #[arg(long)]
        workload: Option<PathBuf>,
    },
    /// Print one of the documents in the repository's docs/ (built in), or list them.
    Docs {
        /// The document: `workloads`, `output`, `plugins`, … (none: the list).
        topic: Option<String>,
    },
    /// Print the JSON Schema of workload files (for editors: `routelab schema > workload.schema.json`).
    Schema,
    /// Print a shell completion script: `routelab completions bash > ~/.local/share/bash-completion/completions/routelab`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The step model of one replica: KV capacity, prefill and decode times.
    StepModel {
        /// GPU: a6000, a100-40, a100-80, h100, h200, b200, l40s, rtx-pro-6000, rtx4090.
        #[arg(long, default_value = "a6000")]
        gpu: String,
        /// Model: mistral-7b, llama-3-8b, llama-3-70b, llama-3.1-8b, llama-3.1-70b, llama-2-70b,
        /// qwen3-32b, qwen3-30b-a3b.
        #[arg(long, default_value = "mistral-7b")]
        model: String,
        /// Tensor-parallel degree (1, 2, 4 or 8).
        #[arg(long, default_value_t = 1)]
        tp: u32,
        /// Price steps by a measured profile (a shipped name: rtx-pro-6000, rtx4090, h100-splitwise,
        /// a100-80-splitwise) instead of the roofline, and show its terms with their fit errors.
        #[arg(long)]
        calibration: Option<String>,
        /// Price one prefill of a prompt of this many tokens (with --cached: how many of them are
        /// cached), with and without attention over the cached part, instead of the overview.
        #[arg(long)]
        tokens: Option<u64>,
        /// Leading prompt tokens already cached (needs --tokens; at most --tokens).
        #[arg(long, requires = "tokens")]
        cached: Option<u64>,
    },
    /// Fit a step-model profile to per-layer timings measured inside vLLM (and, with --runs, its
    /// per-step overhead to measured runs); print each term with its fit error (docs/accuracy.md).
    Calibrate {
        /// A folder of layer timings: dense.csv, attention.csv, per_sequence.csv, meta.yaml
        /// (workloads/profiles/measured/ has two). Or, instead, --splitwise.
        #[arg(required_unless_present = "splitwise")]
        profile: Option<PathBuf>,
        /// Whole prefill and decode steps measured end to end, as Splitwise's perf_model.csv
        /// (Llama-2-70B on A100 and H100; workloads/profiles/measured/Splitwise_Llama-2-70B_A100-H100
        /// has it): fits the step model's rates, overheads and all-reduce to them, for --gpu.
        #[arg(long, conflicts_with_all = ["profile", "runs", "allreduce"], requires = "gpu")]
        splitwise: Option<PathBuf>,
        /// With --splitwise: the GPU to fit (a100-80 or h100).
        #[arg(long, requires = "splitwise")]
        gpu: Option<String>,
        /// With --splitwise: leave this TP degree's steps out of the fit and report the error on
        /// them (steps the profile never saw).
        #[arg(long, requires = "splitwise")]
        hold_out_tp: Option<u32>,
        /// Measured run folders to fit the per-step overhead on (see `routelab accuracy`).
        #[arg(long, num_args = 1..)]
        runs: Vec<PathBuf>,
        /// Measured all-reduce times (AIConfigurator's custom_allreduce CSV) to fit the two-GPU
        /// all-reduce latency and bandwidth from (default: 15 µs and 50 GB/s, not fitted).
        #[arg(long)]
        allreduce: Option<PathBuf>,
        /// The profile's name (default: the catalog GPU).
        #[arg(long)]
        name: Option<String>,
        /// Write the profile (YAML) here instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Replay measured runs exactly and print, per run and figure, measured vs simulated and the
    /// signed error; then the median and mean absolute error across runs (docs/accuracy.md).
    Accuracy {
        /// Run folders (requests.jsonl, meta.json, stream.jsonl); default: every shipped run
        /// (workloads/ground-truth/).
        runs: Vec<PathBuf>,
        /// The request stream, when not the run folder's stream.jsonl (one run only).
        #[arg(long)]
        stream: Option<PathBuf>,
        /// Catalog GPU (default: from the run's device).
        #[arg(long)]
        gpu: Option<String>,
        /// Catalog model (default: from meta.json's model).
        #[arg(long)]
        model: Option<String>,
        /// Tensor-parallel degree (default: meta.json's tensor_parallel_size).
        #[arg(long)]
        tp: Option<u32>,
        /// The step model: a shipped profile name, or `roofline` (default: the shipped profile of
        /// the run's GPU when there is one, else the roofline).
        #[arg(long)]
        calibration: Option<String>,
        /// The router in front of a data-parallel run's engines (default: `vllm_dp_lb`, vLLM's
        /// own balancer; any router spec, e.g. `least_requests`).
        #[arg(long)]
        router: Option<String>,
        /// Also write the comparison as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Scaffold a policy crate that builds with `cargo build --release` and loads by path.
    NewPolicy {
        /// The folder to create (must not exist, or be empty).
        dir: PathBuf,
        /// What the policy decides.
        #[arg(long, value_enum)]
        kind: Kind,
        /// The policy's name: lowercase letters, digits and `_`, starting with a letter (default:
        /// the folder's name in snake_case).
        #[arg(long)]
        name: Option<String>,
        /// Path to routelab's `policy-api` crate (default: the one this binary was built from).
        #[arg(long)]
        api_path: Option<PathBuf>,
    },
    /// Course exercises, computed (docs/exercises.md).
    Exercise {
        /// Exercise number.
        number: Option<u32>,
        /// List the exercises.
        #[arg(long)]
        list: bool,
    },
    /// Simulation speed and the cost of a router call, static versus through a loaded library.
    Bench {
        /// Requests per dispatch-world measurement.
        #[arg(long, default_value_t = 1_000_000)]
        requests: u64,
        /// The built-in plugin library (default: beside this executable).
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// Only the routing-decisions table, for these routers (comma-separated).
        #[arg(long, value_delimiter = ',')]
        routers: Option<Vec<String>>,
        /// Only what admission and request classes cost: a tool_use run without an admission
        /// policy, behind admit_all, and behind admit_all with classes (time ratios in one run).
        #[arg(long, conflicts_with = "routers")]
        admission: bool,
        /// Only the agentic presets' replay speed (coding_agent, research_agent, chat_tools with
        /// least_work_left: LLM calls simulated per wall second).
        #[arg(long, conflicts_with_all = ["routers", "admission"])]
        agentic: bool,
        /// Kept runs per figure (each figure is their median).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
        runs: u32,
        /// Runs per figure measured first and dropped.
        #[arg(long, default_value_t = 1)]
        warmup: u32,
        /// Also write every figure (median, min, max, samples) to this JSON file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// An OpenAI-compatible routing gateway in front of real servers (vLLM, SGLang, `emulate`),
    /// routing with a simulator policy (docs/serving.md).
    Serve(routelab_serve::gateway::ServeArgs),
    /// A simulator policy as the Gateway API Inference Extension's endpoint picker: Envoy's
    /// ext_proc gRPC service, for Envoy Gateway, kgateway, Istio or GKE (docs/serving.md; built
    /// with the `epp` feature).
    Epp(routelab_serve::epp::EppArgs),
    /// One cluster-world replica as an OpenAI-compatible server, in real time (optionally scaled).
    Emulate(routelab_serve::emulate::EmulateArgs),
    /// Send a cluster workload's request stream to a server over HTTP (a bounded load generator).
    Replay(routelab_serve::replay::ReplayArgs),
    /// The gateway's added latency and throughput against direct access to a trivial backend.
    GatewayBench(routelab_serve::replay::BenchArgs),
    /// Internal: one policy's runs for a parent running with `--isolate` (core/src/runner/isolate.rs).
    #[command(name = "__isolated-run", hide = true)]
    IsolatedRun {
        /// The request the parent wrote (JSON).
        request: PathBuf,
        /// Where to write the result (JSON).
        result: PathBuf,
    },
}

#[derive(clap::Args, Debug, Default)]
pub struct Common {
    /// Number of seeds, at least 1 (overrides the workload's `seeds`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub seeds: Option<u32>,
    /// First seed (overrides the workload's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the results as JSON to this file (rewritten after each policy).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the results as CSV to this file, one row per (workload, policy).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Draw SVG charts into this folder (created if missing).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write one self-contained HTML page: every table, the charts, the workloads as run and the
    /// command that reproduces it (docs/output.md).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Compound world: start every selector from this allocation (model names, one per module).
    #[arg(long, value_delimiter = ',')]
    pub start: Option<Vec<String>>,
    /// Compound world: run each selector from every starting allocation and count how often it
    /// reaches the training optimum.
    #[arg(long)]
    pub all_starts: bool,
    /// Replay this trace file instead of the one the workload names, read in the workload's trace
    /// format: Azure LLM trace CSV, or Mooncake JSON Lines (with `hash_ids`) where the workload
    /// says `format: mooncake`, as mooncake_conversation does. A built-in trace by name works from
    /// any directory: `conversation_trace`, `AzureLLMInferenceTrace_code`.
    #[arg(long, value_parser = trace_arg)]
    pub trace: Option<PathBuf>,
    /// Cluster workloads: a per-request SLO, `ttft_s=2,tpot_s=0.1,latency_s=30` (any subset,
    /// seconds; `500ms` also reads), replacing the workload's `slo:`; adds `slo_attainment` and
    /// `goodput_rps`.
    #[arg(long, value_parser = parse_slo)]
    pub slo: Option<routelab_core::workload::slo::Slo>,
    /// Cluster workloads: keep every request's record, for exact percentiles and the in-flight
    /// charts, however long the run (the default keeps them up to 1,000,000 requests and
    /// sketches above: docs/performance.md, "Scale"). Sets `cluster.summary: exact`.
    #[arg(long, conflicts_with = "sketch")]
    pub exact: bool,
    /// Cluster workloads: percentiles from HDR histograms (within 0.1%) in bounded memory,
    /// however short the run. Sets `cluster.summary: sketch`.
    #[arg(long)]
    pub sketch: bool,
    /// Print tables as Markdown (for docs).
    #[arg(long)]
    pub markdown: bool,
    /// The table's columns: comma-separated metric keys (`ttft_p99_s,tpot_mean_s,hit_rate`;
    /// `routelab docs output` lists them). Default: the world's main figures, with TTFT and TPOT
    /// P99 when the run has an SLO. JSON and CSV carry every metric either way.
    #[arg(long, value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// Cells (workload × sweep point × policy × seed) to run at once (default: every core).
    /// Results are the same for every value.
    #[arg(short = 'j', long = "jobs", value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: Option<u32>,
    /// Run only slice K of N of the cells and write them (`--json`, required) for `routelab
    /// merge`; run K = 1..N anywhere, in any order (docs/scale.md).
    #[arg(long, value_name = "K/N", value_parser = routelab_core::runner::parallel::Shard::parse)]
    pub shard: Option<routelab_core::runner::parallel::Shard>,
    /// Run each policy in a child process, so that a plugin that aborts, exits, crashes,
    /// overflows its stack, runs out of memory or hangs fails only its own row (docs/plugins.md,
    /// "Isolation"). Use it for untrusted or new plugins.
    #[arg(long)]
    pub isolate: bool,
    /// With --isolate: seconds one policy's runs on one workload (every seed) may take before
    /// the child is killed.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..), requires = "isolate")]
    pub policy_timeout: u64,
    /// With --isolate: the child's address-space limit in MiB (RLIMIT_AS; 0 for none).
    #[arg(long, default_value_t = 8192, requires = "isolate")]
    pub policy_memory: u64,
}

fn parse_slo(text: &str) -> Result<routelab_core::workload::slo::Slo, String> {
    routelab_core::workload::slo::Slo::parse_arg(text).map_err(|e| {
        let at = if e.path.is_empty() { String::new() } else { format!("`{}` ", e.path) };
        format!("{at}{}\n  fix: {}", e.message, e.fix)
    })
}

pub use crate::scaffold::Kind;

/// A `--trace` value: a file, or a built-in trace by name.
fn trace_arg(s: &str) -> Result<PathBuf, routelab_core::builtin::TraceArgError> {
    routelab_core::builtin::resolve_trace(Path::new(s))
}

/// Formats `routelab export-trace` writes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// Mooncake (FAST'25) JSON Lines with `hash_ids` of 512-token blocks.
    Mooncake,
}

/// The flags `capacity` and `plan` share.
#[derive(clap::Args, Debug)]
pub struct SloArgs {
    #[arg(help = WORKLOAD_ARG)]
    pub workload: PathBuf,
    /// The SLO: comma-separated conditions on summary metrics (`ttft_p99_s<2`, `ttft_p99<2s`,
    /// `slo_attainment>=0.9`, `response_mean<=5`; operators < <= > >=) and, for cluster
    /// workloads, per-request bounds (`ttft_s=2,tpot_s=0.1,latency_s=30`) that define
    /// `slo_attainment` and `goodput_rps`. It holds (at a load, for a shape) when every
    /// condition holds on the mean over seeds and no request was left unfinished.
    #[arg(long)]
    pub slo: String,
    /// Comma-separated policies (default: the workload's `policies:`); see --help for the syntax.
    #[arg(long, long_help = POLICIES_HELP)]
    pub policies: Option<String>,
    /// Number of seeds at every load or shape, at least 1 (overrides the workload's `seeds`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub seeds: Option<u32>,
    /// First seed (overrides the workload's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Threads (default: every core); results do not depend on it.
    #[arg(short = 'j', long, value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: Option<u32>,
    /// Print the tables as Markdown.
    #[arg(long)]
    pub markdown: bool,
}
