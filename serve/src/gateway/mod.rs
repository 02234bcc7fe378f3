//! `routelab serve`: the gateway's state — backends, the policy, what the policy sees, scrapes,
//! the circuit breaker and `/metrics`. The request path is in [`super::proxy`].
//!
//! The request view is built as in the cluster world: the prompt's segments and token count
//! ([`super::text`]), and one [`ReplicaView`] per backend: `outstanding_requests` and
//! `outstanding_work` (prompt + max_tokens − tokens streamed, of requests in flight) are the
//! gateway's own exact counters; `waiting`, `running` and KV use are the last scrape of the
//! backend's `/metrics` (vLLM or SGLang names), as are the `scraped.` signals; `matched_tokens`
//! (for routers that ask for exact matches) counts leading segments the gateway has sent to that
//! backend before — a guess that ignores evictions — unless the backend publishes KV events
//! ([`kv_events`], `--kv-events`): then it is what the engine holds or is computing, and removed
//! blocks reach the router as `on_evict`. Completions reach the policy through `on_complete`
//! (TTFT, tokens, cached tokens when the engine reports them in `usage`).
//!
//! Robustness: a policy that fails or panics (a panic is caught at the ABI boundary) does not
//! stop the gateway: that request is routed by the fallback (fewest requests in flight among
//! healthy backends) and `routelab_gateway_policy_errors_total` counts it. A backend whose
//! circuit is open shows the policy an overloaded view, and is replaced by the fallback's choice
//! if picked anyway.

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Uri;
use hyper::header::HeaderValue;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use routelab_policy_api::{Completion, ReplicaView, Request, Segment, World};

use super::prom::{EngineLoad, Histogram};
use routelab_core::facts::RequestInfo;
use routelab_core::handle::RouterHandle;
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::sim::cluster::prefix_cache::extend_path_hash;
use routelab_core::workload::InputError;

mod args;
mod breaker;
pub mod capacity;
pub mod kv_events;
mod metrics;
mod scrape;

pub use args::ServeArgs;
pub use breaker::Breaker;
pub use scrape::{MAX_SCRAPE_BYTES, ScrapeFailure};

pub struct Backend {
    pub url: String,
    pub base: Uri,
    metrics_uri: Uri,
    health_uri: Uri,
    pub in_flight: AtomicI64,
    /// prompt + max_tokens − streamed tokens, of requests in flight.
    pub outstanding_work: AtomicI64,
    pub dispatched: AtomicU64,
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub ttft: Histogram,
    pub latency: Histogram,
    pub scraped: Mutex<EngineLoad>,
    /// Opened by request failures only; closed by a request's success (or probed after the
    /// cool-down). Scrapes never touch it.
    pub breaker: Mutex<Breaker>,
    /// Consecutive scrapes that got no HTTP answer at all (refused, reset, timed out): at
    /// `--breaker-failures` the backend is unreachable until a scrape is answered again. A scrape
    /// answered badly (404, no gauge, not text) only leaves the load unknown.
    pub unanswered_scrapes: AtomicU32,
    /// Scrapes that gave no load, by [`ScrapeFailure`].
    scrape_failures: [AtomicU64; ScrapeFailure::ALL.len()],
    /// The last scrape's failure (`ScrapeFailure as u8 + 1`, 0 when it gave a load): a change is
    /// logged once, not at every scrape.
    scrape_state: std::sync::atomic::AtomicU8,
}

/// The policy and what it is shown, behind one lock (a decision takes microseconds).
pub struct Routing {
    pub router: RouterHandle,
    exact: bool,
    views: Vec<ReplicaView>,
    /// Path hashes sent to each backend (for `matched_tokens`); cleared when it grows past a bound.
    sent_paths: Vec<HashSet<u64>>,
    /// The router hears `on_evict` (from KV events).
    wants_evictions: bool,
    /// Each backend's cache as its KV events tell it (`--kv-events`), if it publishes them.
    pub kv: Vec<Option<kv_events::View>>,
}

const MAX_SENT_PATHS: usize = 1 << 20;

pub struct Gateway {
    pub args: ServeArgs,
    pub backends: Vec<Backend>,
    pub routing: Mutex<Routing>,
    pub client: Client<HttpConnector, Full<Bytes>>,
    /// Request and response bodies in memory, over every request.
    pub buffers: super::bounded::Buffers,
    pub kv_capacity_tokens: u64,
    /// Where `kv_capacity_tokens` comes from (for the log and `/metrics`).
    pub kv_capacity_source: String,
    start: Instant,
    next_id: AtomicU64,
    pub retries: AtomicU64,
    pub policy_errors: AtomicU64,
    pub rerouted: AtomicU64,
    pub resumed: AtomicU64,
    /// `--tokenizer`'s, or the byte-level fallback.
    pub tokenizer: crate::text::Tokenizer,
    /// `--record`'s file.
    pub recorder: Option<super::record::Recorder>,
    /// `--kv-events`, per backend, and what came of them.
    pub kv_specs: Vec<Option<kv_events::Spec>>,
    pub kv_stats: Vec<kv_events::Stats>,
}

/// A routing decision, and the request's hold on its backend's `in_flight` and
/// `outstanding_work`: released exactly once, when the decision is dropped — after the response,
/// on a failure, on a retry elsewhere, or when hyper drops the handler's future because the client
/// gave up (a release at the end of the handler would never run then). The router heard
/// `on_dispatch` for it; unless [`Gateway::completed`] reported its end, the drop reports it
/// abandoned (`on_abandon`), so the router's own counts return to where they were.
pub struct Decision {
    pub backend: usize,
    pub request_id: u64,
    pub arrived_at: f64,
    gw: Arc<Gateway>,
    work: i64,
    prompt_tokens: u32,
    /// `completed` reported this request's end to the router.
    ended: std::sync::atomic::AtomicBool,
    /// The request's path hashes, pending in its backend's KV event view until it ends.
    pending: Vec<u64>,
}

impl Drop for Decision {
    fn drop(&mut self) {
        let b = &self.gw.backends[self.backend];
        b.in_flight.fetch_sub(1, Ordering::Relaxed);
        b.outstanding_work.fetch_sub(self.work, Ordering::Relaxed);
        if !self.pending.is_empty() {
            if let Ok(mut r) = self.gw.routing.lock() {
                if let Some(view) = r.kv.get_mut(self.backend).and_then(Option::as_mut) {
                    for p in &self.pending {
                        if let Some(n) = view.pending.get_mut(p) {
                            *n -= 1;
                            if *n == 0 {
                                view.pending.remove(p);
                            }
                        }
                    }
                }
            }
        }
        if !self.ended.load(Ordering::Relaxed) {
            let now = self.gw.now_s();
            let c = Completion {
                request_id: self.request_id,
                replica: self.backend as u32,
                arrived_at: self.arrived_at,
                completed_at: now,
                ttft: now - self.arrived_at,
                prompt_tokens: self.prompt_tokens,
                cached_tokens: 0,
                output_tokens: 0,
            };
            // A poisoned lock means a panic elsewhere already; the router's counts no longer matter.
            if let Ok(mut r) = self.gw.routing.lock() {
                if let Err(e) = r.router.abandon(&c) {
                    self.gw.policy_errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("serve: {e}");
                }
            }
        }
    }
}

impl Gateway {
    pub fn new(mut args: ServeArgs) -> Result<Self, routelab_core::error::Error> {
        if args.scrape_api_key.is_none() {
            args.scrape_api_key = std::env::var("ROUTELAB_SCRAPE_API_KEY").ok().filter(|k| !k.is_empty());
        }
        // Below a millisecond the interval rounds to 0 ns, which panicked the scrape task.
        if !(args.scrape_interval_s >= 0.001 && args.scrape_interval_s <= 3600.0) {
            return Err(InputError::command_line(
                "--scrape-interval-s",
                format!("{} is out of range", args.scrape_interval_s),
                "give seconds in [0.001, 3600]",
            )
            .into());
        }
        if !(args.timeout_s > 0.0 && args.timeout_s <= 86_400.0) {
            return Err(InputError::command_line("--timeout-s", "out of range", "give seconds in (0, 86400]").into());
        }
        if !(args.generation_timeout_s > 0.0 && args.generation_timeout_s <= 86_400.0) {
            return Err(InputError::command_line(
                "--generation-timeout-s",
                "out of range",
                "give seconds in (0, 86400]",
            )
            .into());
        }
        if !(args.breaker_open_s >= 0.0 && args.breaker_open_s <= 86_400.0) {
            return Err(
                InputError::command_line("--breaker-open-s", "out of range", "give seconds in [0, 86400]").into()
            );
        }
        args.limits.check()?;
        let sm = args.hardware.step_model()?;
        let kv_capacity_source = match args.kv_capacity_tokens {
            None => format!("the catalogue: {} {} tp {}", args.hardware.gpu, args.hardware.model, args.hardware.tp),
            Some(_) => "--kv-capacity-tokens".into(),
        };
        let kv_capacity_tokens = match args.kv_capacity_tokens {
            None => sm.kv_capacity_tokens,
            Some(k) if (1..=1 << 40).contains(&k) => k,
            Some(k) => {
                return Err(InputError::command_line(
                    "--kv-capacity-tokens",
                    format!("{k} is out of range"),
                    "give the engines' KV capacity in tokens, from 1 (llama.cpp: its -c)",
                )
                .into());
            }
        };
        if args.scrape_api_key.as_ref().is_some_and(|k| HeaderValue::from_str(&format!("Bearer {k}")).is_err()) {
            return Err(InputError::command_line(
                "--scrape-api-key",
                "is not a valid header value",
                "give the key as printable ASCII",
            )
            .into());
        }
        let mut backends = Vec::new();
        for url in &args.backends {
            let base: Uri = url.trim_end_matches('/').parse().map_err(|e| {
                InputError::command_line("--backend", format!("'{url}' is not a URL: {e}"), "give http://host:port")
            })?;
            if base.scheme_str() != Some("http") || base.authority().is_none() {
                return Err(InputError::command_line(
                    "--backend",
                    format!("'{url}': only http://host:port is supported"),
                    "give http://host:port",
                )
                .into());
            }
            let uri = |path: &str| {
                format!("{}{path}", url.trim_end_matches('/')).parse::<Uri>().map_err(|e| {
                    InputError::command_line("--backend", format!("'{url}' is not a URL: {e}"), "give http://host:port")
                })
            };
            let (metrics_uri, health_uri) = (uri("/metrics")?, uri("/health")?);
            backends.push(Backend {
                url: url.trim_end_matches('/').to_string(),
                base,
                metrics_uri,
                health_uri,
                in_flight: AtomicI64::new(0),
                outstanding_work: AtomicI64::new(0),
                dispatched: AtomicU64::new(0),
                ok: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                ttft: Histogram::default(),
                latency: Histogram::default(),
                scraped: Mutex::new(EngineLoad::default()),
                breaker: Mutex::new(Breaker::default()),
                unanswered_scrapes: AtomicU32::new(0),
                scrape_failures: Default::default(),
                scrape_state: Default::default(),
            });
        }
        let n = backends.len() as u32;
        let kv_specs = kv_events::parse(&args.kv_events, backends.len())?;
        if kv_specs.iter().any(Option::is_some) && args.tokenizer.is_none() {
            return Err(InputError::command_line(
                "--kv-events",
                "needs --tokenizer: the events carry token ids, which the byte-level fallback cannot match",
                "give the model's tokenizer.json with --tokenizer, or leave --kv-events out",
            )
            .into());
        }
        // Twice the cache: room for what the engine holds and removals in flight.
        let max_tokens = (kv_capacity_tokens * 2).clamp(1 << 14, 1 << 26) as usize;
        let spec = PolicySpec::parse(&args.policy)?;
        let ctx = routelab_core::sim::cluster::gateway_router_context(
            &sm,
            n,
            args.seed,
            kv_capacity_tokens,
            args.scrape_interval_s,
        );
        let router = RouterHandle::new(Loader::new().router(&spec, &ctx)?, n, World::Cluster, &spec.label);
        let exact = router.capabilities().needs_exact_match();
        let wants_evictions = router.capabilities().wants_evictions();
        let routing = Routing {
            router,
            exact,
            views: vec![ReplicaView::default(); n as usize],
            sent_paths: vec![HashSet::new(); if exact { n as usize } else { 0 }],
            wants_evictions,
            kv: kv_specs.iter().map(|s| s.as_ref().map(|_| kv_events::View::new(max_tokens))).collect(),
        };
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1024).build(connector);
        let buffers = args.limits.buffers();
        let recorder = args.record.as_deref().map(super::record::Recorder::open).transpose()?;
        let tokenizer = crate::text::Tokenizer::load(args.tokenizer.as_deref(), "--tokenizer")?;
        Ok(Self {
            args,
            backends,
            routing: Mutex::new(routing),
            client,
            buffers,
            kv_capacity_tokens,
            kv_capacity_source,
            start: Instant::now(),
            next_id: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            policy_errors: AtomicU64::new(0),
            rerouted: AtomicU64::new(0),
            resumed: AtomicU64::new(0),
            tokenizer,
            recorder,
            kv_stats: kv_specs.iter().map(|_| kv_events::Stats::default()).collect(),
            kv_specs,
        })
    }

    /// As [`Gateway::new`], but when `--kv-capacity-tokens` is not given the engines are asked
    /// their KV capacity first ([`capacity`]: llama.cpp's `/props`, vLLM's cache config or
    /// `max_model_len`); what they state replaces the catalogue's. Says which it took.
    pub async fn start(mut args: ServeArgs) -> Result<Self, routelab_core::error::Error> {
        // Bad arguments are refused before the engines are asked.
        let mut gw = Self::new(args.clone())?;
        if args.kv_capacity_tokens.is_none() {
            let key = gw.args.scrape_api_key.clone();
            if let Some((s, backend)) = capacity::stated(&args.backends, key.as_deref(), Duration::from_secs(5)).await {
                args.kv_capacity_tokens = Some(s.tokens);
                drop(gw);
                gw = Self::new(args)?;
                gw.kv_capacity_source = format!("{backend}{}", s.source);
            }
        }
        eprintln!("serve: KV capacity {} tokens per backend, from {}", gw.kv_capacity_tokens, gw.kv_capacity_source);
        Ok(gw)
    }

    fn now_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Whether backend `i` may be sent requests: its request circuit is closed (or half-open)
    /// and its `/metrics` still answers (a bad answer counts as an answer).
    pub fn healthy(&self, i: usize, now: Instant) -> bool {
        let b = &self.backends[i];
        b.unanswered_scrapes.load(Ordering::Relaxed) < self.args.breaker_failures
            && b.breaker.lock().expect("breaker lock").allows(now)
    }

    fn view(&self, i: usize, now: Instant) -> ReplicaView {
        let b = &self.backends[i];
        let load = *b.scraped.lock().expect("scrape lock");
        let healthy = self.healthy(i, now);
        let in_flight = b.in_flight.load(Ordering::Relaxed).max(0) as u32;
        let kv = self.kv_capacity_tokens;
        if !healthy {
            // An open circuit looks full to load-aware policies.
            let busy = u32::MAX / 4;
            return ReplicaView {
                waiting: busy,
                running: busy,
                outstanding_requests: busy,
                outstanding_work: f64::MAX / 4.0,
                kv_used_tokens: kv,
                kv_capacity_tokens: kv,
                matched_tokens: 0,
            };
        }
        ReplicaView {
            waiting: load.waiting as u32,
            running: load.running as u32,
            outstanding_requests: in_flight,
            outstanding_work: b.outstanding_work.load(Ordering::Relaxed).max(0) as f64,
            kv_used_tokens: (load.kv_usage * kv as f64) as u64,
            kv_capacity_tokens: kv,
            matched_tokens: 0,
        }
    }

    /// Picks a backend for a request with `segments`, skipping those in `tried` (a retry).
    /// `None` when no healthy backend is left.
    pub fn route(
        self: &Arc<Self>,
        segments: &[Segment],
        prompt_tokens: u32,
        max_tokens: u32,
        tried: &[bool],
    ) -> Option<Decision> {
        let now = Instant::now();
        let arrived_at = self.now_s();
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut guard = self.routing.lock().expect("routing lock");
        let r = &mut *guard;
        for (i, v) in r.views.iter_mut().enumerate() {
            *v = self.view(i, now);
            if tried[i] {
                // Already failed this request: as good as full.
                v.outstanding_requests = u32::MAX / 4;
                v.waiting = u32::MAX / 4;
            }
        }
        if r.exact {
            for ((v, sent), kv) in r.views.iter_mut().zip(&r.sent_paths).zip(&r.kv) {
                // With live KV events: what the engine holds or is computing; else the guess
                // (what was routed there), united with events since a loss.
                let held = |h: u64| match kv {
                    Some(k) => k.index.holds(h) || k.pending.contains_key(&h) || (!k.live && sent.contains(&h)),
                    None => sent.contains(&h),
                };
                let mut h = 0;
                for s in segments {
                    h = extend_path_hash(h, s.id);
                    if !held(h) {
                        break;
                    }
                    v.matched_tokens += s.tokens;
                }
            }
        }
        let req = Request::new(request_id, arrived_at, prompt_tokens).with_segments(segments);
        let eligible = |i: usize| !tried[i] && self.healthy(i, now);
        let info = RequestInfo::default();
        let ticket = match r.router.route(&req, &info, &r.views) {
            Ok(t) => Some(t),
            Err(e) => {
                self.policy_errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("serve: {e}; routing request {request_id} by the fallback");
                None
            }
        };
        let chosen = match &ticket {
            Some(t) if eligible(t.replica as usize) => Some(t.replica as usize),
            Some(t) => {
                // Rerouted: the policy chose a backend whose circuit is open. A retry that the
                // policy sends back to the backend that just refused it is not a reroute.
                let i = t.replica as usize;
                if i < tried.len() && !tried[i] {
                    self.rerouted.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
            None => None,
        };
        let backend = chosen.or_else(|| {
            (0..self.backends.len())
                .filter(|&i| eligible(i))
                .min_by_key(|&i| self.backends[i].in_flight.load(Ordering::Relaxed))
        });
        // The router hears where the request really went (`on_dispatch`), or nothing if nowhere.
        let committed = match (ticket, backend) {
            (Some(t), Some(b)) => match r.router.commit(t, &req, &info, b as u32) {
                Ok(_) => true,
                Err(e) => {
                    self.policy_errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("serve: {e}");
                    false
                }
            },
            (Some(t), None) => {
                r.router.decline(t);
                false
            }
            (None, _) => false,
        };
        let backend = backend?;
        let mut pending = Vec::new();
        if r.exact {
            let sent = &mut r.sent_paths[backend];
            if sent.len() > MAX_SENT_PATHS {
                sent.clear();
            }
            let mut h = 0;
            for s in segments {
                h = extend_path_hash(h, s.id);
                sent.insert(h);
            }
            if let Some(view) = r.kv[backend].as_mut() {
                let mut h = 0;
                for s in segments {
                    h = extend_path_hash(h, s.id);
                    *view.pending.entry(h).or_default() += 1;
                    pending.push(h);
                }
            }
        }
        drop(guard);
        let b = &self.backends[backend];
        b.dispatched.fetch_add(1, Ordering::Relaxed);
        let work = prompt_tokens as i64 + max_tokens as i64;
        b.in_flight.fetch_add(1, Ordering::Relaxed);
        b.outstanding_work.fetch_add(work, Ordering::Relaxed);
        let ended = std::sync::atomic::AtomicBool::new(!committed);
        Some(Decision { backend, request_id, arrived_at, gw: self.clone(), work, prompt_tokens, ended, pending })
    }

    /// A request to `backend` failed (refused, reset, timed out, or a 5xx).
    pub fn failure(&self, backend: usize) {
        self.backends[backend].failed.fetch_add(1, Ordering::Relaxed);
        self.trip(backend);
    }

    fn trip(&self, backend: usize) {
        let b = &self.backends[backend];
        let open_for = Duration::from_secs_f64(self.args.breaker_open_s);
        b.breaker.lock().expect("breaker lock").failure(Instant::now(), self.args.breaker_failures, open_for);
    }

    /// The request finished on `d.backend`: counters, histograms, and the policy's `on_complete`.
    /// `ttft_s`: from dispatch to the first text event of a stream; `None` for a non-streamed
    /// response, whose first token reaches the client with the last (the TTFT histogram skips it,
    /// and the policy is told the latency).
    pub fn completed(
        &self,
        d: &Decision,
        ttft_s: Option<f64>,
        prompt_tokens: u32,
        cached_tokens: u32,
        output_tokens: u32,
    ) {
        let b = &self.backends[d.backend];
        b.ok.fetch_add(1, Ordering::Relaxed);
        b.breaker.lock().expect("breaker lock").success();
        let now = self.now_s();
        let latency = (now - d.arrived_at).max(0.0);
        if let Some(t) = ttft_s {
            b.ttft.observe(t);
        }
        let ttft_s = ttft_s.unwrap_or(latency);
        b.latency.observe(latency);
        let c = Completion {
            request_id: d.request_id,
            replica: d.backend as u32,
            arrived_at: d.arrived_at,
            completed_at: now,
            ttft: ttft_s,
            prompt_tokens,
            cached_tokens: cached_tokens.min(prompt_tokens),
            output_tokens,
        };
        if d.ended.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Err(e) = self.routing.lock().expect("routing lock").router.complete(&c) {
            self.policy_errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("serve: {e}");
        }
    }
}
