//! Deliberately broken routers, for the loader's tests (never use them for anything else):
//! - `panics_in_route`: routes round robin, then panics on request `after` (default 100);
//! - `out_of_range`: answers a replica index one past the last;
//! - `panics_in_new`: panics in its constructor.

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
    fn route(&mut self, _: &Request<'_>, replicas: &[ReplicaView]) -> usize {
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
    fn route(&mut self, _: &Request<'_>, replicas: &[ReplicaView]) -> usize {
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
    fn route(&mut self, _: &Request<'_>, _: &[ReplicaView]) -> usize {
        0
    }
}

fn registry() -> Vec<Entry> {
    vec![router::<PanicsInRoute>(), router::<OutOfRange>(), router::<PanicsInNew>()]
}

export_policies!(registry);
