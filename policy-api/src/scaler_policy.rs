//! The plain-Rust side of the scaler kind (0.5.4): what an author implements
//! ([`ScalerPolicy`]), its panic-catching wrapper and its registry entry. The ABI side is in
//! [the `scaler` module](mod@crate::scaler).

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RResult, RSlice, RVec},
};

use crate::error::PolicyError;
use crate::policy::{Entry, Maker, Policy, build, default_config, guard, stats};
use crate::scaler::{Pool, Scaler, Scaler_TO, ScalerContext};
use crate::types::*;

/// A scaler in plain Rust. Panics are caught by the host-facing wrapper.
pub trait ScalerPolicy: Policy<Context = ScalerContext> {
    /// The desired replica count of each pool at `now` (one entry per pool; the host clamps
    /// each to the pool's `[min, max]`).
    fn desired(&mut self, now: f64, pools: &[Pool<'_>]) -> Vec<u32>;
    /// Named figures for the end-of-run report.
    fn report(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

impl<P: ScalerPolicy> Scaler for crate::policy::Guarded<P> {
    fn desired(&mut self, now: f64, pools: RSlice<'_, Pool<'_>>) -> RResult<RVec<u32>, PolicyError> {
        let p = self.get_mut();
        guard(P::NAME, "desired", || RVec::from(p.desired(now, pools.as_slice())))
    }
    fn report(&self) -> RResult<RVec<Stat>, PolicyError> {
        guard(P::NAME, "report", || stats(self.get().report()))
    }
}

/// Registry entry for a scaler type.
pub fn scaler<P: ScalerPolicy>() -> Entry {
    Entry {
        name: P::NAME,
        description: P::DESCRIPTION,
        default_config: default_config::<P>,
        make: Maker::Scaler(|config, ctx| {
            build::<P>(config, ctx).map(|p| Scaler_TO::from_value(crate::policy::Guarded::new(p), TD_Opaque))
        }),
    }
}
