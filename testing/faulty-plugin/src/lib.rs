//! Deliberately broken routers, for the loader's tests (never use them for anything else):
//! - `panics_in_route`: routes round robin, then panics on request `after` (default 100);
//! - `out_of_range`: answers a replica index one past the last;
//! - `panics_in_new`: panics in its constructor;
//! - `panics_in_default`: its config's `Default` panics (listing and construction);
//! - `panics_in_drop`: routes round robin, panics when dropped at the end of a run;
//! - `panics_in_capabilities`: panics when the host asks what it needs;
//! - `huge_index`: answers 2^32 + 1, which a cast to `u32` would wrap to replica 1;
//! - `unknown_signal`: asks for an engine signal no host provides;
//! - `counts_in_flight` (not broken: a probe): fewest outstanding requests, ties in turn,
//!   reporting the requests it heard dispatched and not yet completed or abandoned (`in_flight`),
//!   so a test can see whether a host keeps the router's own counts straight.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct PanicConfig {
    pub after: u64,
}

impl Default for PanicConfig {
    fn default() -> Self {
        Self { after: 100 }
    }
}

pub struct PanicsInRoute {
    after: u64,
    seen: u64,
}

impl Policy for PanicsInRoute {
    const NAME: &'static str = "panics_in_route";
    const DESCRIPTION: &'static str = "round robin, then a panic on request `after` (test fixture)";
    type Config = PanicConfig;
    type Context = RouterContext;
    fn new(c: PanicConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self { after: c.after, seen: 0 })
    }
}

impl RouterPolicy for PanicsInRoute {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.seen += 1;
        if self.seen > self.after {
            panic!("deliberate panic on request {}", self.seen);
        }
        self.seen as usize % replicas.len()
    }
}

#[derive(Serialize, Deserialize, Default, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct NoConfig {}

pub struct OutOfRange;

impl Policy for OutOfRange {
    const NAME: &'static str = "out_of_range";
    const DESCRIPTION: &'static str = "answers replica N of N (test fixture)";
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self)
    }
}

impl RouterPolicy for OutOfRange {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        replicas.len()
    }
}

pub struct PanicsInNew;

impl Policy for PanicsInNew {
    const NAME: &'static str = "panics_in_new";
    const DESCRIPTION: &'static str = "panics in its constructor (test fixture)";
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        panic!("deliberate panic in the constructor")
    }
}

impl RouterPolicy for PanicsInNew {
    fn route(&mut self, _: &Request<'_>, _: &Replicas<'_>) -> usize {
        0
    }
}

/// A config whose `Default` panics.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PanickingConfig {}

impl Default for PanickingConfig {
    fn default() -> Self {
        panic!("deliberate panic in Default")
    }
}

pub struct PanicsInDefault;

impl Policy for PanicsInDefault {
    const NAME: &'static str = "panics_in_default";
    const DESCRIPTION: &'static str = "its config's Default panics (test fixture)";
    type Config = PanickingConfig;
    type Context = RouterContext;
    fn new(_: PanickingConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self)
    }
}

impl RouterPolicy for PanicsInDefault {
    fn route(&mut self, _: &Request<'_>, _: &Replicas<'_>) -> usize {
        0
    }
}

pub struct PanicsInDrop {
    seen: usize,
}

impl Policy for PanicsInDrop {
    const NAME: &'static str = "panics_in_drop";
    const DESCRIPTION: &'static str = "round robin, panics when dropped (test fixture)";
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self { seen: 0 })
    }
}

impl RouterPolicy for PanicsInDrop {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.seen += 1;
        self.seen % replicas.len()
    }
}

impl Drop for PanicsInDrop {
    fn drop(&mut self) {
        panic!("deliberate panic in Drop after {} requests", self.seen);
    }
}

pub struct PanicsInCapabilities;

impl Policy for PanicsInCapabilities {
    const NAME: &'static str = "panics_in_capabilities";
    const DESCRIPTION: &'static str = "panics in capabilities (test fixture)";
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self)
    }
}

impl RouterPolicy for PanicsInCapabilities {
    fn capabilities(&self) -> Capabilities {
        panic!("deliberate panic in capabilities")
    }
    fn route(&mut self, _: &Request<'_>, _: &Replicas<'_>) -> usize {
        0
    }
}

pub struct HugeIndex;

impl Policy for HugeIndex {
    const NAME: &'static str = "huge_index";
    const DESCRIPTION: &'static str = "answers replica 2^32 + 1 (test fixture)";
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self)
    }
}

impl RouterPolicy for HugeIndex {
    fn route(&mut self, _: &Request<'_>, _: &Replicas<'_>) -> usize {
        // On a 64-bit target; on 32 bits usize cannot hold it and the fixture answers usize::MAX.
        usize::try_from((1u64 << 32) + 1).unwrap_or(usize::MAX)
    }
}

pub struct UnknownSignal;

impl Policy for UnknownSignal {
    const NAME: &'static str = "unknown_signal";
    const DESCRIPTION: &'static str = "asks for an engine signal no host provides (test fixture)";
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self)
    }
}

impl RouterPolicy for UnknownSignal {
    fn signals(&self) -> Vec<String> {
        vec![signals::KV_UTILISATION.into(), "prefill_tokens_per_s".into()]
    }
    fn route(&mut self, _: &Request<'_>, _: &Replicas<'_>) -> usize {
        0
    }
}

#[derive(Default)]
pub struct CountsInFlight {
    in_flight: i64,
    /// Where the scan for the fewest starts: moves on every decision, so ties go round.
    next: usize,
}

impl Policy for CountsInFlight {
    const NAME: &'static str = "counts_in_flight";
    const DESCRIPTION: &'static str = "fewest outstanding requests; reports its own in-flight count";
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self::default())
    }
}

impl RouterPolicy for CountsInFlight {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let n = replicas.len();
        self.next = self.next.wrapping_add(1);
        (0..n).map(|k| (self.next + k) % n).min_by_key(|&i| replicas[i].outstanding_requests).unwrap_or(0)
    }
    fn on_dispatch(&mut self, _: &Request<'_>, _: usize) {
        self.in_flight += 1;
    }
    fn on_complete(&mut self, _: &Completion) {
        self.in_flight -= 1;
    }
    fn report(&self) -> Vec<(String, f64)> {
        vec![("in_flight".into(), self.in_flight as f64)]
    }
}

fn registry() -> Vec<Entry> {
    vec![
        router::<PanicsInRoute>(),
        router::<OutOfRange>(),
        router::<PanicsInNew>(),
        router::<PanicsInDefault>(),
        router::<PanicsInDrop>(),
        router::<PanicsInCapabilities>(),
        router::<HugeIndex>(),
        router::<UnknownSignal>(),
        router::<CountsInFlight>(),
    ]
}

export_policies!(registry);
