//! Request facts and context facts the host provides (`routelab_policy_api::facts`): what a
//! world knows of a request beyond the core fields, negotiated once per policy by name and then
//! written into a small buffer before each decision; and the named figures every context carries.
//! A policy that asks for no request facts costs nothing here.

use routelab_policy_api::{Fact, RString, RouterBox, SchedulerBox, World, facts};

/// What the host knows of one request beyond [`routelab_policy_api::Request`]'s core fields;
/// each world fills what it has (`None`: this world has no such figure).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestInfo {
    /// The job's service time (dispatch world).
    pub service_time: Option<f64>,
    /// The request's class index, its priority, its tenant index (cluster world).
    pub class: u16,
    pub priority: i32,
    pub tenant: u32,
    /// The request's SLO bounds in seconds (NaN: none).
    pub slo_ttft_s: f64,
    pub slo_tpot_s: f64,
    /// The request's output length in tokens (cluster world).
    pub output_tokens: u32,
    /// The output length the request says to expect (NaN: no hint), and its agent session
    /// (NaN: none).
    pub hint_output_tokens: f64,
    pub session: f64,
    /// The request's LoRA adapter index (NaN: the base model).
    pub adapter: f64,
    /// The request's model index in `cluster.models` (0 with one model).
    pub model: u16,
}

impl RequestInfo {
    /// A request with no class, tenant or SLO beyond the defaults (class 0, tenant 0, no bounds).
    pub fn plain() -> Self {
        Self {
            slo_ttft_s: f64::NAN,
            slo_tpot_s: f64::NAN,
            hint_output_tokens: f64::NAN,
            session: f64::NAN,
            adapter: f64::NAN,
            ..Self::default()
        }
    }
}

/// How the host reads one request fact.
type Column = fn(&RequestInfo) -> f64;

/// The request facts `world` provides, by name. Adding one here (and to the API's catalogue) is a
/// compatible change: no layout moves.
fn column(name: &str, world: World) -> Option<Column> {
    match (name, world) {
        (facts::request::SERVICE_TIME, World::Dispatch) => Some(|r| r.service_time.unwrap_or(0.0)),
        (facts::request::CLASS, World::Cluster) => Some(|r| r.class as f64),
        (facts::request::PRIORITY, World::Cluster) => Some(|r| r.priority as f64),
        (facts::request::TENANT, World::Cluster) => Some(|r| r.tenant as f64),
        (facts::request::SLO_TTFT_S, World::Cluster) => Some(|r| r.slo_ttft_s),
        (facts::request::SLO_TPOT_S, World::Cluster) => Some(|r| r.slo_tpot_s),
        (facts::request::OUTPUT_TOKENS, World::Cluster) => Some(|r| r.output_tokens as f64),
        (facts::request::HINT_OUTPUT_TOKENS, World::Cluster) => Some(|r| r.hint_output_tokens),
        (facts::request::SESSION, World::Cluster) => Some(|r| r.session),
        (facts::request::ADAPTER, World::Cluster) => Some(|r| r.adapter),
        (facts::request::MODEL, World::Cluster) => Some(|r| r.model as f64),
        _ => None,
    }
}

/// Most request facts a policy may ask for (bounds a bad answer).
const MAX_FACTS: usize = 256;

/// Why what a policy asks of the host (engine signals, request facts) cannot be had. The
/// message reads after the policy's name ("policy 'x' asks for …").
#[derive(Clone, Debug, PartialEq)]
pub enum NegotiationError {
    /// The policy's own `signals()` or `request_facts()` failed with this message.
    Erred(String),
    /// It asks for `asked` of `what` (`"request facts"`, `"engine signals"`); at most `limit`.
    TooMany { what: &'static str, asked: usize, limit: usize },
    /// It asks for request fact `name`, which `world` does not have; `provided` lists those it has.
    UnknownFact { name: String, world: World, provided: Vec<&'static str> },
    /// It asks for engine signal `name`, which this host does not have; `provided` lists those it has.
    UnknownSignal { name: String, provided: Vec<&'static str> },
}

impl std::fmt::Display for NegotiationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let version = routelab_policy_api::API_VERSION;
        match self {
            NegotiationError::Erred(message) => f.write_str(message),
            NegotiationError::TooMany { what, asked, limit } => {
                write!(f, "asks for {asked} {what}; at most {limit} are allowed")
            }
            NegotiationError::UnknownFact { name, world, provided } => write!(
                f,
                "asks for request fact '{name}', which this routelab (policy-api {version}) does not provide in the {} \
                 world; it provides: {}",
                world_name(*world),
                if provided.is_empty() { "none".to_string() } else { provided.join(", ") }
            ),
            NegotiationError::UnknownSignal { name, provided } => write!(
                f,
                "asks for engine signal '{name}', which this routelab (policy-api {version}) does not provide; it \
                 provides: {}",
                provided.join(", ")
            ),
        }
    }
}

impl std::error::Error for NegotiationError {}

/// One policy's negotiated request facts and the buffer their values are written to.
#[derive(Default)]
pub struct RequestFacts {
    columns: Vec<Column>,
    values: Vec<f64>,
}

impl RequestFacts {
    /// The columns for `names` in `world`; an unknown name, or one this world does not have, is
    /// an error naming it and listing what the world provides.
    pub fn negotiate(names: &[RString], world: World) -> Result<Self, NegotiationError> {
        if names.len() > MAX_FACTS {
            return Err(NegotiationError::TooMany { what: "request facts", asked: names.len(), limit: MAX_FACTS });
        }
        let columns = names
            .iter()
            .map(|n| {
                column(n.as_str(), world).ok_or_else(|| NegotiationError::UnknownFact {
                    name: n.to_string(),
                    world,
                    provided: facts::request::CATALOGUE
                        .iter()
                        .map(|(n, _)| *n)
                        .filter(|n| column(n, world).is_some())
                        .collect(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { columns, values: Vec::new() })
    }

    /// Whether the policy asked for nothing.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// The values for `info`, one per negotiated name, in order.
    pub fn fill(&mut self, info: &RequestInfo) -> &[f64] {
        self.values.clear();
        self.values.extend(self.columns.iter().map(|c| c(info)));
        &self.values
    }

    /// Appends the values for `info` to `table` (a row of a scheduler's fact table).
    pub fn append(&self, info: &RequestInfo, table: &mut Vec<f64>) {
        table.extend(self.columns.iter().map(|c| c(info)));
    }

    /// How many facts were negotiated.
    pub fn len(&self) -> usize {
        self.columns.len()
    }
}

/// The request facts `router` asks for, checked against what `world` provides.
pub fn negotiate_facts(router: &RouterBox, world: World) -> Result<RequestFacts, NegotiationError> {
    let names = router.request_facts().into_result().map_err(|e| NegotiationError::Erred(e.into()))?;
    RequestFacts::negotiate(&names, world)
}

/// The request facts a scheduler asks for, checked against what the cluster world provides.
pub fn negotiate_scheduler_facts(scheduler: &SchedulerBox) -> Result<RequestFacts, NegotiationError> {
    let names = scheduler.request_facts().into_result().map_err(|e| NegotiationError::Erred(e.into()))?;
    RequestFacts::negotiate(&names, World::Cluster)
}

fn world_name(world: World) -> &'static str {
    match world {
        World::Dispatch => "dispatch",
        World::Cluster => "cluster",
    }
}

/// The context facts of a cluster: the engine's knobs a router operator knows, and how many
/// classes and tenants the workload has.
pub fn cluster_context(chunk_tokens: u32, max_step_tokens: u32, max_batch_requests: u32, scrape_s: f64) -> Vec<Fact> {
    cluster_context_with(chunk_tokens, max_step_tokens, max_batch_requests, scrape_s, 1, 1, 1)
}

/// [`cluster_context`] with the workload's class, tenant and model counts.
pub fn cluster_context_with(
    chunk_tokens: u32,
    max_step_tokens: u32,
    max_batch_requests: u32,
    scrape_s: f64,
    classes: usize,
    tenants: usize,
    models: usize,
) -> Vec<Fact> {
    use facts::context::*;
    vec![
        Fact::new(ENGINE_CHUNK_TOKENS, chunk_tokens as f64),
        Fact::new(ENGINE_MAX_STEP_TOKENS, max_step_tokens as f64),
        Fact::new(ENGINE_MAX_BATCH_REQUESTS, max_batch_requests as f64),
        Fact::new(METRICS_SCRAPE_INTERVAL_S, scrape_s),
        Fact::new(CLASSES_COUNT, classes.max(1) as f64),
        Fact::new(TENANTS_COUNT, tenants.max(1) as f64),
        Fact::new(MODELS_COUNT, models.max(1) as f64),
    ]
}

/// The context facts a gateway knows of the engines behind it: how often it scrapes them, and
/// one class, tenant and model (it serves no classes, tenants or several models). The engines'
/// step budgets are theirs, not the gateway's: it does not list them.
pub fn gateway_context(scrape_s: f64) -> Vec<Fact> {
    use facts::context::*;
    vec![
        Fact::new(METRICS_SCRAPE_INTERVAL_S, scrape_s),
        Fact::new(CLASSES_COUNT, 1.0),
        Fact::new(TENANTS_COUNT, 1.0),
        Fact::new(MODELS_COUNT, 1.0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fact_is_provided_only_where_the_world_has_it() {
        let names: Vec<RString> = vec![facts::request::SERVICE_TIME.into()];
        let mut t = RequestFacts::negotiate(&names, World::Dispatch).unwrap();
        assert_eq!(t.fill(&RequestInfo { service_time: Some(2.5), ..RequestInfo::plain() }), &[2.5]);
        let e = RequestFacts::negotiate(&names, World::Cluster).err().unwrap().to_string();
        assert!(e.contains("'service_time'") && e.contains("cluster world") && e.contains("class"), "{e}");
        let e = RequestFacts::negotiate(&[facts::request::TENANT.into()], World::Dispatch).err().unwrap().to_string();
        assert!(e.contains("'tenant'") && e.contains("dispatch world") && e.contains("service_time"), "{e}");
        let e = RequestFacts::negotiate(&["nope".into()], World::Dispatch).err().unwrap().to_string();
        assert!(e.contains("'nope'") && e.contains("service_time"), "{e}");
        assert!(RequestFacts::negotiate(&[], World::Cluster).unwrap().is_empty());
    }

    /// The class, priority, tenant and SLO facts come out of the request's info in the order
    /// the policy asked, whatever that order.
    #[test]
    fn class_facts_arrive_in_the_order_asked() {
        use facts::request::*;
        let names: Vec<RString> = [SLO_TTFT_S, TENANT, PRIORITY, CLASS, OUTPUT_TOKENS].map(RString::from).into();
        let mut t = RequestFacts::negotiate(&names, World::Cluster).unwrap();
        let info = RequestInfo {
            class: 2,
            priority: -1,
            tenant: 7,
            slo_ttft_s: 0.5,
            output_tokens: 90,
            ..RequestInfo::plain()
        };
        assert_eq!(t.fill(&info), &[0.5, 7.0, -1.0, 2.0, 90.0]);
        let mut row = Vec::new();
        t.append(&info, &mut row);
        assert_eq!(row, [0.5, 7.0, -1.0, 2.0, 90.0]);
        let mut t = RequestFacts::negotiate(&[SLO_TPOT_S.into()], World::Cluster).unwrap();
        assert!(t.fill(&RequestInfo::plain())[0].is_nan(), "no bound reads as NaN");
    }

    #[test]
    fn every_catalogued_context_fact_is_given_on_a_cluster() {
        let given = cluster_context(512, 8192, 256, 0.0);
        for (name, _) in facts::context::CATALOGUE {
            assert!(given.iter().any(|f| f.name == *name), "{name}");
        }
    }
}
