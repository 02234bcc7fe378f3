//! `routelab emulate`: one cluster-world replica behind an OpenAI-compatible HTTP API.
//!
//! `/v1/completions` and `/v1/chat/completions` (streamed as SSE, one event per token, at the
//! step model's step ends; or whole), `/v1/models`, `/health`, and vLLM-style `/metrics`. The
//! engine generates exactly `max_tokens` tokens (it has no EOS), each the text `"tok "`; the last
//! event carries `finish_reason: "length"` and `usage` (with `prompt_tokens_details.cached_tokens`,
//! the prompt tokens found in the prefix cache at admission).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use routelab_policy_api::SchedulerContext;
use serde_json::json;

use super::engine::{Engine, Snapshot, TokenEvent};
use super::{OutBody, error, kv_publish, text};
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::sim::cluster::replica::ReplicaConfig;
use routelab_core::step_model::StepModel;
use routelab_core::workload::InputError;

/// The replica's hardware, as in a cluster workload (`gpu`, `model`, `tp`, `memory_fraction`).
#[derive(clap::Args, Debug, Clone)]
pub struct HardwareArgs {
    /// GPU: a6000, a100-40, a100-80, h100, h200, b200, l40s, rtx-pro-6000, rtx4090.
    #[arg(long, default_value = "a6000")]
    pub gpu: String,
    /// Model: mistral-7b, llama-3-8b, llama-3-70b.
    #[arg(long, default_value = "mistral-7b")]
    pub model: String,
    /// Tensor-parallel degree (1, 2, 4 or 8).
    #[arg(long, default_value_t = 1)]
    pub tp: u32,
    /// Share of GPU memory for weights and KV cache, in (0, 1].
    #[arg(long, default_value_t = 0.9)]
    pub memory_fraction: f64,
}

impl HardwareArgs {
    pub fn step_model(&self) -> Result<StepModel, InputError> {
        if ![1, 2, 4, 8].contains(&self.tp) {
            return Err(InputError::command_line(
                "--tp",
                format!("must be 1, 2, 4 or 8 (got {})", self.tp),
                "use 1, 2, 4 or 8",
            ));
        }
        if !(self.memory_fraction > 0.0 && self.memory_fraction <= 1.0) {
            return Err(InputError::command_line(
                "--memory-fraction",
                format!("must be in (0, 1] (got {})", self.memory_fraction),
                "use e.g. 0.9",
            ));
        }
        StepModel::from_catalog(&self.gpu, &self.model, self.tp, self.memory_fraction)
            .map_err(|e| InputError::command_line("gpu/model", e.message, e.fix))
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct EmulateArgs {
    /// Address to listen on (port 0: any free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub hardware: HardwareArgs,
    /// Prefill tokens per step (chunked prefill); 0 = unchunked.
    #[arg(long, default_value_t = 512)]
    pub chunk_tokens: u32,
    /// Prefill tokens one unchunked step may hold.
    #[arg(long, default_value_t = 32_768)]
    pub max_step_tokens: u32,
    /// Most running requests.
    #[arg(long, default_value_t = 256)]
    pub max_batch_requests: u32,
    /// The local scheduler (a scheduler policy, e.g. fcfs, or lib.so:name).
    #[arg(long, default_value = "fcfs")]
    pub scheduler: String,
    /// Wall-clock seconds per model second: 0.1 runs ten times faster than the modelled GPU.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// The model name `/v1/models` lists (default: --model).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// The model's Hugging Face tokenizer.json: prompts become the engine's token ids (16 per
    /// KV block), as `routelab serve --tokenizer` splits them. Without it, the byte-level fallback.
    #[arg(long)]
    pub tokenizer: Option<std::path::PathBuf>,
    /// Publish the cache as KV events (needs --tokenizer: events carry token ids):
    /// tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T][,format=vllm|sglang][,page=N][,buffer=N]
    /// (vLLM's --kv-events-config endpoint and replay_endpoint; port 0: any free port, printed).
    #[arg(long)]
    pub kv_events: Option<String>,
    #[command(flatten)]
    pub limits: super::ConnLimits,
}

/// Runs the server until Ctrl-C / SIGTERM.
pub fn main(args: EmulateArgs) -> Result<i32> {
    let engine = Prepared::new(&args)?;
    super::runtime()?.block_on(async move {
        let listener = super::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
        engine.run(listener, super::shutdown_signal()).await?;
        Ok(0)
    })
}

/// An engine's checked arguments, ready to start (before any runtime).
pub struct Prepared {
    cfg: ReplicaConfig,
    cost: routelab_policy_api::Roofline,
    scheduler: routelab_core::handle::SchedulerHandle,
    time_scale: f64,
    model: String,
    tokenizer: text::Tokenizer,
    limits: super::ConnLimits,
    kv_events: Option<kv_publish::Spec>,
    publisher: Option<kv_publish::Publisher>,
}

impl Prepared {
    /// Checks the arguments (exit 2 on a bad one) and loads the scheduler.
    pub fn new(args: &EmulateArgs) -> Result<Self> {
        if !(args.time_scale > 0.0 && args.time_scale <= 1000.0) {
            return Err(InputError::command_line(
                "--time-scale",
                format!("{} is out of range", args.time_scale),
                "give a number in (0, 1000]",
            )
            .into());
        }
        if args.max_batch_requests == 0 {
            return Err(InputError::command_line("--max-batch-requests", "0 admits nothing", "give at least 1").into());
        }
        if args.chunk_tokens == 0 && args.max_step_tokens == 0 {
            return Err(InputError::command_line(
                "--max-step-tokens",
                "0 with --chunk-tokens 0 lets no step prefill anything: every request would hang",
                "give --chunk-tokens 512, or --max-step-tokens above the longest prompt",
            )
            .into());
        }
        args.limits.check()?;
        let sm = args.hardware.step_model()?;
        let spec = PolicySpec::parse(&args.scheduler)?;
        let ctx = SchedulerContext::new(0, 0, sm.kv_capacity_tokens);
        let scheduler = Loader::new().scheduler(&spec, &ctx)?;
        let scheduler = routelab_core::handle::SchedulerHandle::new(scheduler, 0, spec.label.as_str().into());
        let budget = if args.chunk_tokens == 0 { args.max_step_tokens } else { args.chunk_tokens };
        let cfg = ReplicaConfig::plain(sm.kv_capacity_tokens, budget, args.max_batch_requests);
        let model = args.served_model_name.clone().unwrap_or_else(|| sm.model.name.clone());
        let tokenizer = text::Tokenizer::load(args.tokenizer.as_deref(), "--tokenizer")?;
        let kv_events = args.kv_events.as_deref().map(kv_publish::parse).transpose()?;
        if kv_events.is_some() && args.tokenizer.is_none() {
            return Err(InputError::command_line(
                "--kv-events",
                "needs --tokenizer: the events carry the prompts' token ids, which the byte-level fallback has not",
                "give the model's tokenizer.json with --tokenizer (the same one `routelab serve --tokenizer` reads)",
            )
            .into());
        }
        Ok(Self {
            cfg,
            cost: sm.cost,
            scheduler,
            time_scale: args.time_scale,
            model,
            tokenizer,
            limits: args.limits,
            kv_events,
            publisher: None,
        })
    }

    /// Binds the `--kv-events` sockets (if asked for and not yet bound) and says where.
    pub async fn bind_kv_events(&mut self) -> std::io::Result<Option<kv_publish::Bound>> {
        let Some(spec) = self.kv_events.take() else { return Ok(None) };
        let (publisher, bound) = kv_publish::Publisher::bind(&spec).await?;
        let replay = bound.replay.as_deref().map(|r| format!(", replay {r}")).unwrap_or_default();
        println!("KV events on {}{replay} ({:?})", bound.endpoint, spec.format);
        self.publisher = Some(publisher);
        Ok(Some(bound))
    }

    /// Serves on `listener` until `shutdown` resolves, then lets open streams finish (30 s at most).
    pub async fn run(
        mut self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> std::io::Result<()> {
        self.bind_kv_events().await?;
        let mirror = self.publisher.map(kv_publish::mirror::Mirror::new);
        let token_ids = mirror.is_some();
        let engine = Engine::start(self.cfg, self.cost, self.scheduler, self.time_scale, mirror);
        let buffers = self.limits.buffers();
        let (model, tokenizer) = (self.model, self.tokenizer);
        let server = Arc::new(Server { engine, model, tokenizer, next_id: AtomicU64::new(0), buffers, token_ids });
        let handle = move |req| {
            let s = server.clone();
            async move { s.handle(req).await }
        };
        super::serve(listener, handle, shutdown, Duration::from_secs(30), self.limits).await
    }
}

pub struct Server {
    pub engine: Engine,
    pub model: String,
    pub tokenizer: text::Tokenizer,
    next_id: AtomicU64,
    buffers: super::bounded::Buffers,
    /// Whether the engine wants prompts' token ids (it publishes KV events).
    token_ids: bool,
}

impl Server {
    pub fn new(engine: Engine, model: String) -> Self {
        let buffers = super::ConnLimits::default().buffers();
        Self { engine, model, tokenizer: text::Tokenizer::Bytes, next_id: AtomicU64::new(0), buffers, token_ids: false }
    }

    pub async fn handle(&self, req: Request<Incoming>) -> Response<OutBody> {
        match (req.method(), req.uri().path()) {
            (&Method::GET, "/health") => super::full(StatusCode::OK, "text/plain", "ok\n"),
            (&Method::GET, "/v1/models") => super::json(
                StatusCode::OK,
                &json!({"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "routelab"}]}),
            ),
            (&Method::GET, "/metrics") => super::full(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                metrics_text(&self.engine.snapshot().await, &self.model),
            ),
            (&Method::POST, p @ ("/v1/completions" | "/v1/chat/completions")) => {
                let chat = p == "/v1/chat/completions";
                let body = match super::read_body(req, &self.buffers).await {
                    Ok(b) => b,
                    Err(r) => return r,
                };
                self.complete(&body.bytes, chat).await
            }
            (_, p) => super::method_not_allowed(p)
                .unwrap_or_else(|| error(StatusCode::NOT_FOUND, "not_found_error", format!("no route {p}"))),
        }
    }

    async fn complete(&self, body: &[u8], chat: bool) -> Response<OutBody> {
        let parsed = match text::parse_request(body, chat) {
            Ok(p) => p,
            Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", e.0),
        };
        let (mut prompt, mut ids) = (Vec::new(), Vec::new());
        self.tokenizer.segments_and_ids(&parsed.prompt, &mut prompt, self.token_ids.then_some(&mut ids));
        let mut events = match self.engine.submit(prompt, ids, parsed.max_tokens) {
            Ok(rx) => rx,
            Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", e.to_string()),
        };
        let id = format!("cmpl-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let chunk = Chunk { id, model: self.model.clone(), chat };
        if !parsed.stream {
            let mut produced = 0;
            while let Some(ev) = events.recv().await {
                match ev {
                    TokenEvent::Step { tokens, done } => {
                        produced += tokens;
                        if let Some((prompt_tokens, cached_tokens)) = done {
                            return super::json(StatusCode::OK, &chunk.whole(produced, prompt_tokens, cached_tokens));
                        }
                    }
                    TokenEvent::Failed => break,
                }
            }
            return error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the engine failed the request");
        }
        let (tx, response) = super::sse();
        tokio::spawn(async move {
            let mut produced = 0;
            while let Some(ev) = events.recv().await {
                let TokenEvent::Step { tokens, done } = ev else {
                    let e = json!({"error": {"message": "the engine failed the request", "type": "server_error"}});
                    let _ = tx.send(Bytes::from(format!("data: {e}\n\n"))).await;
                    return;
                };
                // One event per token; the request's last token carries the usage.
                for k in 0..tokens {
                    produced += 1;
                    let last = done.filter(|_| k + 1 == tokens).map(|(p, c)| (produced, p, c));
                    if tx.send(chunk.event(produced == 1, last)).await.is_err() {
                        return; // the client left; the engine finishes the request anyway
                    }
                }
                if done.is_some() {
                    let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                    return;
                }
            }
        });
        response
    }
}

/// One completion's response shapes.
struct Chunk {
    id: String,
    model: String,
    chat: bool,
}

const TOKEN_TEXT: &str = "tok ";

fn usage(completion: u32, prompt: u32, cached: u32) -> serde_json::Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

impl Chunk {
    /// One SSE event holding one token; `last` = (completion, prompt, cached tokens) on the last.
    fn event(&self, first: bool, last: Option<(u32, u32, u32)>) -> Bytes {
        let finish = if last.is_some() { json!("length") } else { json!(null) };
        let mut v = if self.chat {
            let delta = if first {
                json!({"role": "assistant", "content": TOKEN_TEXT})
            } else {
                json!({"content": TOKEN_TEXT})
            };
            json!({"id": self.id, "object": "chat.completion.chunk", "created": 0, "model": self.model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        } else {
            json!({"id": self.id, "object": "text_completion", "created": 0, "model": self.model,
                   "choices": [{"index": 0, "text": TOKEN_TEXT, "logprobs": null, "finish_reason": finish}]})
        };
        if let Some((c, p, k)) = last {
            v["usage"] = usage(c, p, k);
        }
        Bytes::from(format!("data: {v}\n\n"))
    }

    fn whole(&self, produced: u32, prompt: u32, cached: u32) -> serde_json::Value {
        let text = TOKEN_TEXT.repeat(produced as usize);
        if self.chat {
            json!({"id": self.id, "object": "chat.completion", "created": 0, "model": self.model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                   "usage": usage(produced, prompt, cached)})
        } else {
            json!({"id": self.id, "object": "text_completion", "created": 0, "model": self.model,
                   "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}],
                   "usage": usage(produced, prompt, cached)})
        }
    }
}

/// vLLM's metric names (v1 engine), with the older `gpu_cache_usage_perc` beside
/// `kv_cache_usage_perc` (both a fraction in [0, 1], as vLLM reports them).
pub fn metrics_text(s: &Snapshot, model: &str) -> String {
    let kv = if s.kv_capacity_tokens == 0 { 0.0 } else { s.kv_used_tokens as f64 / s.kv_capacity_tokens as f64 };
    let l = format!("{{model_name=\"{model}\"}}");
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, v: f64| {
        let v = super::prom::value(v);
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{l} {v}\n"));
    };
    put("vllm:num_requests_running", "gauge", "Requests in the running batch.", s.running as f64);
    put("vllm:num_requests_waiting", "gauge", "Requests waiting for admission.", s.waiting as f64);
    put("vllm:kv_cache_usage_perc", "gauge", "KV cache usage (1 = full).", kv);
    put("vllm:gpu_cache_usage_perc", "gauge", "KV cache usage (1 = full; older name).", kv);
    put(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        s.prefix_queries_tokens as f64,
    );
    put(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        s.prefix_hits_tokens as f64,
    );
    put("vllm:prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", s.prompt_tokens as f64);
    put("vllm:generation_tokens_total", "counter", "Output tokens generated.", s.generation_tokens as f64);
    put("vllm:request_success_total", "counter", "Requests finished.", s.requests_finished as f64);
    put("routelab:engine_steps_total", "counter", "Batcher steps run.", s.steps as f64);
    out
}
