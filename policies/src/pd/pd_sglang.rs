//! `pd_sglang`: prefill and decode instances chosen independently, each by its own router — any
//! built-in router, with its config (`pd_sglang{prefill: sglang_cache_aware, decode: power_of_two}`).
//!
//! Algorithm: the prefill router routes over the prefill pool, the decode router over the decode
//! pool; neither sees the other's choice (there is no joint pairing), and the prefill pool is
//! never skipped. Each child is told about its own pool only: at creation (a context with its
//! pool's size, KV capacity and cost model, and a seed of its own), and after each decision —
//! `on_dispatch` with its own pick, `on_complete` when the request leaves its pool (the prefill
//! child at the end of the prefill, the decode child at the end of the request), `on_evict` for
//! its own instances. The engine signals asked for are the union of the children's; each child
//! sees its own columns in its own order. Figures are reported as `prefill_<name>` and
//! `decode_<name>`.
//! Parameters: `prefill`, `decode`: a router spec, `name` or `"name{key: value}"` (quote it in
//! YAML when it has braces); both default to `sglang_cache_aware` (SGLang's `--policy` default).
//! Source: SGLang router PD mode, `select_pd_pair` with `prefill_policy` / `decode_policy` both
//! defaulting to `--policy` (`sgl-router/src/routers/http/pd_router.rs`, PR #8395; smg 1.13.0
//! `src/routers/http/pd_router.rs`).

use routelab_policy_api::abi_stable::std_types::{ROption, RResult, RSlice};
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The prefill pool's router: `name` or `name{key: value}`.
    pub prefill: String,
    /// The decode pool's router.
    pub decode: String,
}

impl Default for Config {
    fn default() -> Self {
        Self { prefill: "sglang_cache_aware".into(), decode: "sglang_cache_aware".into() }
    }
}

/// One child router and where its signal columns are in the union.
struct Child {
    router: RouterBox,
    columns: Vec<usize>,
    scratch: Vec<f64>,
}

impl Child {
    fn new(spec: &str, ctx: &RouterContext, role: &str) -> Result<Self, String> {
        let (name, config) = match spec.find('{') {
            Some(i) => (spec[..i].trim(), &spec[i..]),
            None => (spec.trim(), ""),
        };
        let entry = crate::registry()
            .into_iter()
            .find(|e| e.name == name && e.kind() == PolicyKind::Router)
            .ok_or_else(|| format!("{role}: no built-in router named '{name}'"))?;
        let Maker::Router(make) = entry.make else { unreachable!("kind checked") };
        let router = make(config, ctx).map_err(|e| format!("{role}: {}", e.message))?;
        let caps = router.capabilities().into_result().map_err(|e| format!("{role}: {}", e.message))?;
        if caps.disaggregated() {
            return Err(format!("{role}: '{name}' is itself a PD router; give an aggregated router such as round_robin"));
        }
        Ok(Self { router, columns: Vec::new(), scratch: Vec::new() })
    }

    fn route(&mut self, req: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let k = self.columns.len();
        let view = if k == 0 {
            Replicas::new(replicas.views())
        } else {
            self.scratch.clear();
            for i in 0..replicas.len() {
                let row = replicas.signals_of(i);
                self.scratch.extend(self.columns.iter().map(|&c| row[c]));
            }
            Replicas::with_signals(replicas.views(), &self.scratch, k as u32)
        };
        // A child's failure is a failure of this policy (the host names it and its method).
        self.router.route(req, view).into_result().unwrap_or_else(|e| panic!("{}", e.message)) as usize
    }
}

pub struct PdSglang {
    prefill: Child,
    decode: Child,
    signals: Vec<String>,
    /// Prefill instances: evictions from `replica ≥ split` belong to the decode pool.
    split: u32,
}

impl Policy for PdSglang {
    const NAME: &'static str = "pd_sglang";
    const DESCRIPTION: &'static str = "disaggregated: prefill and decode chosen independently by any two routers (SGLang PD)";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        let pd = ctx.disaggregation.into_option().ok_or("pd_sglang runs on a disaggregated cluster")?;
        let prefill_ctx = RouterContext {
            replicas: pd.prefill_replicas,
            seed: ctx.seed ^ 0x9E37_79B9_7F4A_7C15,
            kv_capacity_tokens: pd.prefill_kv_capacity_tokens,
            cost: pd.prefill_cost,
            disaggregation: ROption::RNone,
            ..*ctx
        };
        let decode_ctx = RouterContext { disaggregation: ROption::RNone, ..*ctx };
        let mut prefill = Child::new(&cfg.prefill, &prefill_ctx, "prefill")?;
        let mut decode = Child::new(&cfg.decode, &decode_ctx, "decode")?;
        let mut signals: Vec<String> = Vec::new();
        for child in [&mut prefill, &mut decode] {
            let names = child.router.signals().into_result().map_err(|e| e.message.to_string())?;
            for n in names.iter() {
                let at = signals.iter().position(|s| s == n.as_str()).unwrap_or_else(|| {
                    signals.push(n.to_string());
                    signals.len() - 1
                });
                child.columns.push(at);
            }
        }
        Ok(Self { prefill, decode, signals, split: pd.prefill_replicas })
    }
}

fn ok<T>(r: RResult<T, PolicyError>) -> T {
    r.into_result().unwrap_or_else(|e| panic!("{}", e.message))
}

impl RouterPolicy for PdSglang {
    fn capabilities(&self) -> Capabilities {
        let known = |c: &Child| c.router.capabilities().into_result().unwrap_or(Capabilities::NONE);
        super::PD | known(&self.prefill) | known(&self.decode)
    }
    fn signals(&self) -> Vec<String> {
        self.signals.clone()
    }
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.decode.route(request, replicas)
    }
    fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdDecision {
        let p = self.prefill.route(request, prefill);
        PdDecision::pair(p as u32, self.decode.route(request, decode) as u32)
    }
    fn on_dispatch_pair(&mut self, request: &Request<'_>, decision: PdDecision) {
        if decision.action == PdDecision::DISAGGREGATE {
            ok(self.prefill.router.on_dispatch(request, decision.prefill));
        }
        if decision.action != PdDecision::REJECT {
            ok(self.decode.router.on_dispatch(request, decision.decode));
        }
    }
    fn on_prefill_complete(&mut self, completion: &Completion) {
        ok(self.prefill.router.on_complete(completion));
    }
    fn on_complete(&mut self, completion: &Completion) {
        ok(self.decode.router.on_complete(completion));
    }
    fn on_evict(&mut self, eviction: &Eviction<'_>) {
        if eviction.replica < self.split {
            ok(self.prefill.router.on_evict(eviction));
        } else {
            let e = Eviction { replica: eviction.replica - self.split, path: RSlice::from_slice(eviction.path.as_slice()), ..*eviction };
            ok(self.decode.router.on_evict(&e));
        }
    }
    fn report(&self) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for (role, child) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            for s in ok(child.router.report()) {
                out.push((format!("{role}_{}", s.name), s.value));
            }
        }
        out
    }
}
