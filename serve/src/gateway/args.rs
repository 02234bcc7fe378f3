//! `routelab serve`'s arguments.

use std::net::SocketAddr;

use crate::emulate::HardwareArgs;

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// A backend's base URL (http://host:port), repeated; the policy's replica i is the i-th.
    #[arg(long = "backend", required = true)]
    pub backends: Vec<String>,
    /// The routing policy: a built-in (`least_requests`, `sglang_cache_aware{...}`) or
    /// `./lib.so:name` (as in `routelab compare`).
    #[arg(long, default_value = "least_requests")]
    pub policy: String,
    /// The backends' hardware, for routers that price steps or read KV capacity.
    #[command(flatten)]
    pub hardware: HardwareArgs,
    /// The backends' KV capacity in tokens, for an engine the catalogue does not describe (a
    /// llama.cpp server: its `-c`); replaces what --gpu/--model/--tp give.
    #[arg(long)]
    pub kv_capacity_tokens: Option<u64>,
    /// Seconds between scrapes of every backend's /metrics (also the health check).
    #[arg(long, default_value_t = 0.05)]
    pub scrape_interval_s: f64,
    /// A bearer token sent with the scrapes of /metrics and /health (an engine started with
    /// `--api-key` refuses unauthenticated scrapes); clients' own `Authorization` headers are
    /// passed on with their requests as before. Also read from ROUTELAB_SCRAPE_API_KEY.
    #[arg(long)]
    pub scrape_api_key: Option<String>,
    /// Seconds to wait for a streamed response's headers, and between two of its events.
    #[arg(long, default_value_t = 60.0)]
    pub timeout_s: f64,
    /// Seconds a non-streamed completion may take, headers and body (engines send its headers
    /// only when the whole answer is ready); past it the client gets a 504, and the request is
    /// not re-run elsewhere.
    #[arg(long, default_value_t = 600.0)]
    pub generation_timeout_s: f64,
    /// Other backends tried after a failure before the client gets an error.
    #[arg(long, default_value_t = 2)]
    pub retries: u32,
    /// Consecutive failures that open a backend's circuit, and how long it stays open (s).
    #[arg(long, default_value_t = 3)]
    pub breaker_failures: u32,
    #[arg(long, default_value_t = 5.0)]
    pub breaker_open_s: f64,
    /// When a backend dies mid-stream, re-send the request elsewhere and skip the events the
    /// client already has. Only sound for deterministic (greedy) decoding on identical engines.
    #[arg(long)]
    pub resume_streams: bool,
    /// The run's seed, as a workload's `seed:`: the router draws the random stream it draws in
    /// `routelab run` with that seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Append every completed request to this file as a request-log line (`timestamp`, the
    /// request body, `usage.completion_tokens`): `routelab import` turns it into a trace the
    /// simulator replays. The file holds the prompts.
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
    /// The model's Hugging Face tokenizer.json: prompts are counted and split into KV blocks by
    /// the engine's token ids (16 per block). Without it, the byte-level fallback (4 bytes a
    /// token).
    #[arg(long)]
    pub tokenizer: Option<std::path::PathBuf>,
    /// A backend's KV-cache event publisher (vLLM's `--kv-events-config` ZMQ endpoint),
    /// `tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T]`, repeated once per --backend in the
    /// same order (`none` for one without). Routers then see the engines' own caches instead of
    /// the gateway's guess. Needs --tokenizer (the events carry token ids).
    #[arg(long = "kv-events")]
    pub kv_events: Vec<String>,
    #[command(flatten)]
    pub limits: crate::ConnLimits,
}

impl ServeArgs {
    /// The defaults of `routelab serve --backend B...` (for tests and in-process gateways).
    pub fn with_backends(backends: &[String]) -> Self {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ServeArgs,
        }
        let mut argv = vec!["serve".to_string()];
        for b in backends {
            argv.extend(["--backend".to_string(), b.clone()]);
        }
        Cli::try_parse_from(argv).expect("the defaults parse").args
    }
}
