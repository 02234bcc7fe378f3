//! `routelab bench`'s "router memory" section: the heap a router keeps per prompt it remembers.
//!
//! Each router is made for a cluster of 8 Mistral-7B replicas on A6000s and sent `PROMPTS` requests shaped like tool_use's (a
//! 300-token system prompt every request shares, then a 200-token question of its own), each
//! routed and dispatched, none completed; the heap in use (glibc's `mallinfo2`: bytes handed out
//! by `malloc`, mapped blocks included) is read before the router is made and after the last
//! dispatch, and the difference divided by the prompts. Prefix routers remember every distinct
//! prompt until their bound (none reached here), so this is their memory per remembered prefix;
//! a router that keeps no per-prompt state shows ≈ 0. Where the router reports its tree's nodes
//! (`router_trie_nodes`), the bytes per node follow. Not timed, and the same every run (the
//! allocator's rounding aside). Without glibc the section says that it cannot measure.

use anyhow::Result;
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_policy_api::{Replicas, Request, Segment};

use super::{Recorder, views};

/// Requests per router and run.
const PROMPTS: u64 = 100_000;

/// Bytes the process's heap has handed out and not taken back, if this platform says.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn heap_in_use() -> Option<u64> {
    // SAFETY: `mallinfo2` only reads the allocator's counters (glibc ≥ 2.33).
    let m = unsafe { libc::mallinfo2() };
    Some(m.uordblks as u64 + m.hblkhd as u64)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn heap_in_use() -> Option<u64> {
    None
}

/// One run: heap bytes per prompt after `PROMPTS` dispatches, and the router's node count if it
/// reports one.
fn sample(loader: &mut Loader, policy: &str) -> Result<Option<(f64, Option<f64>)>> {
    let Some(before) = heap_in_use() else { return Ok(None) };
    let sm = routelab_core::step_model::StepModel::from_catalog("a6000", "mistral-7b", 1, 0.9)
        .map_err(|e| anyhow::anyhow!("the bench's step model: {e}"))?;
    let ctx = routelab_core::sim::cluster::router_context(&sm, 8, 7);
    let mut router = loader.router(&PolicySpec::parse(policy)?, &ctx)?;
    let v = views(8);
    let system = Segment { id: 1, tokens: 300 };
    for i in 0..PROMPTS {
        let prompt = [system, Segment { id: 1_000_000 + i, tokens: 200 }];
        let req = Request::new(i, i as f64 * 1e-3, 500).with_segments(&prompt);
        let r = router.route(&req, Replicas::new(&v)).into_result().map_err(|e| anyhow::anyhow!("{policy}: {e}"))?;
        router.on_dispatch(&req, r).into_result().map_err(|e| anyhow::anyhow!("{policy}: {e}"))?;
    }
    let after = heap_in_use().unwrap_or(before);
    let stats = router.report().into_result().map_err(|e| anyhow::anyhow!("{policy}: {e}"))?;
    let nodes = stats.iter().find(|s| s.name.as_str() == "router_trie_nodes").map(|s| s.value);
    drop(router);
    Ok(Some((after.saturating_sub(before) as f64 / PROMPTS as f64, nodes)))
}

/// The section, for `routers`.
pub(super) fn memory_section(loader: &mut Loader, rec: &mut Recorder, routers: &[impl AsRef<str>]) -> Result<()> {
    rec.section(
        "router_memory",
        &format!(
            "router memory: heap bytes per remembered prompt after {PROMPTS} tool_use-shaped prompts on 8 replicas \
             (300 shared + 200 unique tokens each):"
        ),
    );
    if heap_in_use().is_none() {
        rec.line("  not measured: this platform's allocator does not report its heap (glibc's mallinfo2)");
        return Ok(());
    }
    for policy in routers {
        let policy = policy.as_ref();
        let mut nodes = None;
        let f = rec.measure(policy, "bytes/prompt", || {
            let (bytes, n) = sample(loader, policy)?.expect("measurable: checked above");
            nodes = n;
            Ok(bytes)
        })?;
        let per_node = match nodes {
            Some(n) if n > 0.0 => format!(" ({:.0} nodes, {:.0} bytes a node)", n, f.median * PROMPTS as f64 / n),
            _ => String::new(),
        };
        rec.line(format!("  {policy:<20} {:>10} bytes/prompt{per_node}", f.show(1.0, 0)));
    }
    Ok(())
}
