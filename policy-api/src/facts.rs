//! Named facts: how contexts and requests grow without changing a layout.
//!
//! Engine signals ([`crate::signals`]) grow what a router sees of each *replica*; facts grow the
//! rest the same way:
//!
//! - **Request facts** ([`request`]): numbers about one request (its service time in the
//!   dispatch world; since 0.5.2 class, priority, tenant, SLO bounds and output length in the
//!   cluster world; since 0.5.3 an output-length hint and the agent session; since 0.5.5 the LoRA adapter; since 0.5.7 the model). A policy lists the names it
//!   wants ([`crate::RouterPolicy::request_facts`], [`crate::SchedulerPolicy::request_facts`]);
//!   the host reads the list once, at creation, refuses a name it does not provide (a
//!   configuration error naming it), and then hands the values over with every request, in the
//!   order asked: [`crate::Request::fact`], [`crate::Waiting::fact`].
//! - **Context facts** ([`context`]): numbers a policy is told once, at creation, in its
//!   context's `facts` list ([`crate::RouterContext::fact`]); a host gives every fact it knows
//!   for the world, and a policy reads the ones it wants (`None`: this host or world does not
//!   have it, so fall back to the config).
//!
//! Values are `f64`; a name is `snake_case`, grouped by a prefix. A later patch appends names to
//! these catalogues: plugins built before never ask for them, and a plugin that asks an older
//! host for a name it lacks gets a clear error at creation instead of a wrong value.

/// Request facts: per-request numbers a policy asks for by name.
pub mod request {
    /// The job's service time, in mean service times (dispatch world only: there the host knows
    /// each job's size, as an oracle router would; a cluster host refuses the name, since a real
    /// router cannot know how long a request will run).
    pub const SERVICE_TIME: &str = "service_time";

    // since 0.5.2 {
    /// The request's class: its 0-based index in the workload's `cluster.classes`, in the order
    /// written (0 when the workload has no classes; cluster world).
    pub const CLASS: &str = "class";
    /// The request's class priority: higher is more important, negative = sheddable (the Gateway
    /// API Inference Extension's convention; 0 without classes; cluster world).
    pub const PRIORITY: &str = "priority";
    /// The request's tenant: its 0-based index in `cluster.tenants` (0 without tenants).
    pub const TENANT: &str = "tenant";
    /// The request's TTFT bound in seconds (its class's SLO, else the cluster's; NaN: none).
    pub const SLO_TTFT_S: &str = "slo.ttft_s";
    /// The request's TPOT bound in seconds (NaN: none).
    pub const SLO_TPOT_S: &str = "slo.tpot_s";
    /// The request's output length in tokens (cluster world): an oracle figure, as
    /// `service_time` is in the dispatch world; what a length predictor would estimate.
    pub const OUTPUT_TOKENS: &str = "output_tokens";
    // } since 0.5.2

    // since 0.5.3 {
    /// The output length the request says to expect, in tokens (cluster world; NaN: no hint).
    /// What a client, an agent framework or a length predictor tells the router (Dynamo's agent
    /// hints); the workload's `hints:` makes it exact (`oracle`) or noisy.
    pub const HINT_OUTPUT_TOKENS: &str = "hint.output_tokens";
    /// The agent session the request belongs to: a 0-based index (cluster world; NaN when the
    /// workload has no sessions).
    pub const SESSION: &str = "session";
    // } since 0.5.3

    // since 0.5.5 {
    /// The request's LoRA adapter: its 0-based index in the workload's `cluster.lora` adapters
    /// (cluster world; NaN: the base model).
    pub const ADAPTER: &str = "adapter";
    // } since 0.5.5

    // since 0.5.7 {
    /// The model the request asks for: its 0-based index in the workload's `cluster.models`, in
    /// the order written (cluster world; 0 when the workload serves one model). A router is made
    /// per model and sees only that model's replicas, so it needs this only to tell its model.
    pub const MODEL: &str = "model";
    // } since 0.5.7

    /// Every request fact this version defines, with one line each.
    pub const CATALOGUE: &[(&str, &str)] = &[
        (SERVICE_TIME, "the job's service time (dispatch world)"),
        // since 0.5.2 {
        (CLASS, "the request's class index in cluster.classes (cluster world)"),
        (PRIORITY, "the class's priority; negative = sheddable (cluster world)"),
        (TENANT, "the request's tenant index in cluster.tenants (cluster world)"),
        (SLO_TTFT_S, "the request's TTFT bound in seconds, NaN for none (cluster world)"),
        (SLO_TPOT_S, "the request's TPOT bound in seconds, NaN for none (cluster world)"),
        (OUTPUT_TOKENS, "the request's output length in tokens, an oracle figure (cluster world)"),
        // } since 0.5.2
        // since 0.5.3 {
        (HINT_OUTPUT_TOKENS, "the output length the request says to expect, NaN for none (cluster world)"),
        (SESSION, "the request's agent session index, NaN without sessions (cluster world)"),
        // } since 0.5.3
        // since 0.5.5 {
        (ADAPTER, "the request's LoRA adapter index, NaN for the base model (cluster world)"),
        // } since 0.5.5
        // since 0.5.7 {
        (MODEL, "the request's model index in cluster.models, 0 for one model (cluster world)"),
        // } since 0.5.7
    ];
}

/// Context facts: numbers a policy is told at creation.
pub mod context {
    /// Most prompt tokens one prefill chunk computes (cluster world: the engine's chunked-prefill
    /// size).
    pub const ENGINE_CHUNK_TOKENS: &str = "engine.chunk_tokens";
    /// The token budget of one engine step (cluster world).
    pub const ENGINE_MAX_STEP_TOKENS: &str = "engine.max_step_tokens";
    /// Most requests in one running batch (cluster world).
    pub const ENGINE_MAX_BATCH_REQUESTS: &str = "engine.max_batch_requests";
    /// Seconds between metrics scrapes (the age bound of the `scraped.*` signals; 0: live).
    pub const METRICS_SCRAPE_INTERVAL_S: &str = "metrics.scrape_interval_s";

    // since 0.5.2 {
    /// How many request classes the workload has (1 without `classes:`); the request fact
    /// `class` indexes them.
    pub const CLASSES_COUNT: &str = "classes.count";
    /// How many tenants the workload has (1 without `tenants:`); the request fact `tenant`
    /// indexes them.
    pub const TENANTS_COUNT: &str = "tenants.count";
    // } since 0.5.2

    // since 0.5.7 {
    /// How many models the workload serves (1 without `cluster.models`); the request fact
    /// `model` indexes them.
    pub const MODELS_COUNT: &str = "models.count";
    // } since 0.5.7

    /// Every context fact this version defines, with one line each.
    pub const CATALOGUE: &[(&str, &str)] = &[
        (ENGINE_CHUNK_TOKENS, "prompt tokens per prefill chunk (cluster world)"),
        (ENGINE_MAX_STEP_TOKENS, "token budget of one engine step (cluster world)"),
        (ENGINE_MAX_BATCH_REQUESTS, "most requests in one running batch (cluster world)"),
        (METRICS_SCRAPE_INTERVAL_S, "seconds between metrics scrapes (cluster world; 0: live)"),
        // since 0.5.2 {
        (CLASSES_COUNT, "request classes in the workload (cluster world)"),
        (TENANTS_COUNT, "tenants in the workload (cluster world)"),
        // } since 0.5.2
        // since 0.5.7 {
        (MODELS_COUNT, "models the workload serves (cluster world)"),
        // } since 0.5.7
    ];
}

// since 0.5.4 {
/// Fleet facts (0.5.4): what a scaler ([the `scaler` module](mod@crate::scaler)) is told about each pool at every
/// decision ([`crate::scaler::Pool::fact`]). Windowed figures cover the interval since the
/// previous decision (NaN when nothing happened in it).
pub mod fleet {
    /// The pool's replicas: ready + loading (what the last decision asked for, as it stands).
    pub const REPLICAS: &str = "replicas";
    /// Replicas taking requests.
    pub const READY_REPLICAS: &str = "ready_replicas";
    /// Replicas started and still loading the model (not yet routable).
    pub const LOADING_REPLICAS: &str = "loading_replicas";
    /// Replicas draining: no new requests, finishing what they have.
    pub const DRAINING_REPLICAS: &str = "draining_replicas";
    /// The pool's bounds (the host clamps every answer to them).
    pub const MIN_REPLICAS: &str = "min_replicas";
    /// See [`MIN_REPLICAS`].
    pub const MAX_REPLICAS: &str = "max_replicas";
    /// Requests waiting in the ready replicas' queues, summed.
    pub const WAITING: &str = "waiting";
    /// Requests in the ready replicas' running batches, summed.
    pub const RUNNING: &str = "running";
    /// KV tokens in use over KV capacity, averaged over ready replicas (0..1).
    pub const KV_UTILISATION: &str = "kv_utilisation";
    /// Arrivals per second over the last interval.
    pub const ARRIVAL_RATE: &str = "arrival_rate";
    /// Mean prompt tokens of the last interval's arrivals.
    pub const PROMPT_TOKENS_MEAN: &str = "prompt_tokens_mean";
    /// Mean output tokens of the last interval's arrivals (what the client asked for).
    pub const OUTPUT_TOKENS_MEAN: &str = "output_tokens_mean";
    /// Mean TTFT of the requests that finished in the last interval, seconds.
    pub const TTFT_MEAN_S: &str = "ttft_mean_s";
    /// Mean TPOT (inter-token latency) of the requests that finished in the last interval.
    pub const TPOT_MEAN_S: &str = "tpot_mean_s";
    /// Share of the requests finished so far that met the workload's SLO (NaN without one).
    pub const SLO_ATTAINMENT: &str = "slo_attainment";

    /// Every fleet fact this version defines, with one line each.
    pub const CATALOGUE: &[(&str, &str)] = &[
        (REPLICAS, "the pool's replicas: ready + loading"),
        (READY_REPLICAS, "replicas taking requests"),
        (LOADING_REPLICAS, "replicas loading the model, not yet routable"),
        (DRAINING_REPLICAS, "replicas finishing what they have, taking nothing new"),
        (MIN_REPLICAS, "the pool's lower bound"),
        (MAX_REPLICAS, "the pool's upper bound"),
        (WAITING, "requests waiting on ready replicas"),
        (RUNNING, "requests running on ready replicas"),
        (KV_UTILISATION, "KV used / capacity, mean over ready replicas"),
        (ARRIVAL_RATE, "arrivals per second over the last interval"),
        (PROMPT_TOKENS_MEAN, "mean prompt tokens of the last interval's arrivals"),
        (OUTPUT_TOKENS_MEAN, "mean output tokens of the last interval's arrivals"),
        (TTFT_MEAN_S, "mean TTFT of the last interval's completions"),
        (TPOT_MEAN_S, "mean TPOT of the last interval's completions"),
        (SLO_ATTAINMENT, "share of finished requests meeting the SLO so far"),
    ];
}
// } since 0.5.4
