//! What one GPU costs per hour, for `routelab plan`'s fleet costs.
//!
//! In order, the first that names the GPU:
//! 1. `--prices GPU=PRICE,…` (any currency; the dispatch world's servers are `server`);
//! 2. the workload: a `cluster.pools` entry on that GPU with its `cost_per_hour` (÷ its `tp`:
//!    a pool's price is per replica), or the cluster's own `cost_per_hour` (÷ `tp`) when the
//!    GPU is the cluster's `gpu`;
//! 3. [`DEFAULTS`]: on-demand list prices in US dollars per GPU-hour;
//! 4. the dispatch world: 1 per server-hour (a fleet's cost is then its server count).
//!
//! A GPU none of these prices (`b200`, `rtx-pro-6000`, `rtx4090`, a custom mapping) is bad input naming
//! `--prices`.

/// On-demand list prices, US dollars per GPU-hour, single-GPU instances, as published in May
/// 2026. They differ two- to three-fold between providers (hyperscalers above specialists), so
/// they set the *ratio* between GPUs a plan trades off; pass your own with `--prices`.
/// - `a100-40` 1.48, `h100` 3.78 (H100 SXM): Lambda's on-demand list, as quoted with Modal's
///   and Replicate's by techbytes.app, "Serverless GPU Pricing Matrix [2026]", prices verified
///   2026-05-07 (<https://techbytes.app/posts/serverless-gpu-pricing-matrix-modal-replicate-lambda-2026/>);
/// - `a100-80` 2.50 (2.4984), `l40s` 1.95 (1.9512): Modal's list, same page and date;
/// - `h200` 4.00: the middle of the specialty providers' on-demand band $3.50–4.50 in
///   mercatus-ai.com, "Cloud GPU pricing" (May 2026, <https://www.mercatus-ai.com/blog/cloud-gpu-pricing>);
/// - `a6000` 0.80: Lambda's 1× RTX A6000 on-demand list price (the figure
///   `workloads/cluster/mixed_gpus.yaml` also uses).
pub const DEFAULTS: &[(&str, f64)] =
    [("a6000", 0.80), ("a100-40", 1.48), ("a100-80", 2.50), ("h100", 3.78), ("h200", 4.00), ("l40s", 1.95)].as_slice();

/// The GPUs [`DEFAULTS`] prices.
pub fn names() -> Vec<&'static str> {
    DEFAULTS.iter().map(|(n, _)| *n).collect()
}

/// The name the dispatch world's servers are priced under.
pub const SERVER: &str = "server";

/// Where a price came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Flag,
    Workload,
    Default,
}

/// Parses `--prices`: `GPU=PRICE` pairs, comma-separated; `Err((the item, why))`.
pub fn parse(text: &str) -> Result<Vec<(String, f64)>, (String, String)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((name, price)) = item.split_once('=') else {
            return Err((item.into(), "is not GPU=PRICE".into()));
        };
        let name = name.trim().to_lowercase();
        let price: f64 = price.trim().parse().map_err(|_| (item.to_string(), "the price is not a number".into()))?;
        if !(price.is_finite() && price >= 0.0) {
            return Err((item.into(), format!("the price must be ≥ 0 (got {price})")));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err((item.into(), format!("prices `{name}` twice")));
        }
        out.push((name, price));
    }
    Ok(out)
}

/// One GPU's price per GPU-hour, and where it came from; `None` when nothing prices it.
pub fn of(gpu: &str, flag: &[(String, f64)], w: &routelab_core::workload::Workload) -> Option<(f64, Source)> {
    if let Some((_, p)) = flag.iter().find(|(n, _)| n == gpu) {
        return Some((*p, Source::Flag));
    }
    if let Some(c) = &w.cluster {
        let named = |g: &routelab_core::step_model::Choice<routelab_core::step_model::Gpu>| match g {
            routelab_core::step_model::Choice::Name(n) => n == gpu,
            routelab_core::step_model::Choice::Custom(g) => g.name == gpu,
        };
        for p in &c.pools {
            if let (true, Some(cost)) = (named(&p.gpu), p.cost_per_hour) {
                return Some((cost / f64::from(p.tp.unwrap_or(c.tp).max(1)), Source::Workload));
            }
        }
        if let (true, Some(cost)) = (named(&c.gpu), c.cost_per_hour) {
            return Some((cost / f64::from(c.tp.max(1)), Source::Workload));
        }
    }
    if let Some((_, p)) = DEFAULTS.iter().find(|(n, _)| *n == gpu) {
        return Some((*p, Source::Default));
    }
    (gpu == SERVER).then_some((1.0, Source::Default))
}
