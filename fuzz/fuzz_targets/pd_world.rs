//! Bytes as the choices of a small P/D workload (issue 26): pools of every shape, pool GPUs and
//! tp, the link, transfer and shared-KV settings, prompts, outputs and loads — numbers drawn
//! either from sensible values or from any 8 bytes as an f64 (NaN, 1e-300, 1e300 …). Validation
//! must refuse it with an error, or every P/D router must run it to the end: every request ends
//! exactly once (served, rejected by the router, or unfinished when the run stops), no time runs
//! backwards or past the clock.
//! Build with debug assertions (`-a`): the simulator's own clock and completion checks then run.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::runner;
use routelab_core::sim::cluster::router_context_for;

const CLOCK_S: f64 = u64::MAX as f64 / 1e9;
const ROUTERS: &[&str] = &["pd_least_loaded", "pd_round_robin", "pd_sglang", "pd_dynamo", "pd_mooncake", "pd_llm_d"];

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }
    fn pick<'b, T>(&mut self, xs: &'b [T]) -> &'b T {
        &xs[self.byte() as usize % xs.len()]
    }
    /// One of `usual`, or (one time in 8) any f64.
    fn number(&mut self, usual: &[f64]) -> f64 {
        if self.byte() % 8 != 0 {
            return *self.pick(usual);
        }
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.byte();
        }
        f64::from_le_bytes(b)
    }
}

/// YAML shows an f64 as a number it reads back (`.nan`, `.inf`, or the shortest round trip).
fn yaml(x: f64) -> String {
    if x.is_nan() {
        ".nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { ".inf".into() } else { "-.inf".into() }
    } else {
        format!("{x:?}")
    }
}

fn workload(b: &mut Bytes) -> String {
    let gpus = ["a6000", "a100-80", "h100", "l40s", "rtx4090"];
    let pool = |b: &mut Bytes, n: u32| {
        let mut s = format!("{{instances: {n}");
        if b.byte() % 4 == 0 {
            s += &format!(", gpu: {}", b.pick(&gpus));
        }
        if b.byte() % 4 == 0 {
            s += &format!(", tp: {}", b.pick(&[1u32, 2, 3, 4, 8]));
        }
        s + "}"
    };
    let (p, d, m) = (1 + b.byte() as u32 % 3, 1 + b.byte() as u32 % 3, *b.pick(&[0u32, 0, 1, 2]));
    let (prefill, decode) = (pool(b, p), pool(b, d));
    let mixed = if m > 0 { format!("    mixed: {}\n", pool(b, m)) } else { String::new() };
    let bandwidth = b.number(&[0.01, 1.0, 100.0, 1e4]);
    let latency = b.number(&[0.0, 0.001, 0.5]);
    let layerwise = b.byte() % 3 == 0;
    let transfer = b.pick(&["missing", "full_prompt"]);
    let shared = if b.byte() % 4 == 0 {
        format!(
            "    shared_kv: {{capacity_gb: {}, bandwidth_gbps: {}}}\n",
            yaml(b.number(&[1.0, 100.0])),
            yaml(b.number(&[1.0, 50.0]))
        )
    } else {
        String::new()
    };
    let system = b.pick(&[0u32, 16, 2000]);
    let (lo, hi) = *b.pick(&[(1u32, 1u32), (1, 40), (100, 3000), (4000, 30000)]);
    let (olo, ohi) = *b.pick(&[(1u32, 1u32), (1, 16), (50, 300)]);
    let rate = b.number(&[0.01, 2.0, 50.0, 1e5]);
    let requests = 1 + b.byte() as u32 % 40;
    format!(
        "name: pd_fuzz\nseed: {seed}\ncluster:\n  replicas: {replicas}\n  gpu: {gpu}\n  model: {model}\n  \
         disaggregation:\n    prefill: {prefill}\n    decode: {decode}\n{mixed}    \
         link: {{bandwidth_gbps: {bw}, base_latency_s: {lat}, layerwise: {layerwise}}}\n    \
         transfer: {transfer}\n{shared}  generator:\n    system_prompt_tokens: {system}\n    \
         suffix_tokens: {{uniform: {{min: {lo}, max: {hi}}}}}\n    \
         output_tokens: {{uniform: {{min: {olo}, max: {ohi}}}}}\n  arrivals:\n    poisson: {{rate: {rate}}}\n  \
         requests: {requests}\n",
        seed = b.byte(),
        replicas = p + d + m,
        gpu = b.pick(&gpus),
        model = b.pick(&["mistral-7b", "llama-3-8b"]),
        bw = yaml(bandwidth),
        lat = yaml(latency),
        rate = yaml(rate),
    )
}

fuzz_target!(|data: &[u8]| {
    let text = workload(&mut Bytes(data));
    // Replaying a crash: `PD_WORLD_PRINT=1 target/…/pd_world artifacts/pd_world/crash-…` shows
    // the workload, to run with `routelab compare`.
    if std::env::var_os("PD_WORLD_PRINT").is_some() {
        eprintln!("{text}");
    }
    let file = Path::new("pd_fuzz.yaml");
    let Ok(w) = routelab_core::workload::parse(&text, file) else { return };
    let Ok(prepared) = runner::prepare(w, file) else { return };
    let Ok(input) = prepared.seed_input(0) else { return };
    let c = prepared.workload.cluster.as_ref().expect("cluster");
    let sm = c.step_model().expect("prepared");
    let stream = input.stream().expect("cluster");
    let n = stream.requests.len();
    let mut loader = Loader::new();
    for name in ROUTERS {
        let router = loader.router(&PolicySpec::parse(name).unwrap(), &router_context_for(c, &sm, input.seed)).unwrap();
        let out = match runner::run_cluster(c, stream, router, name, input.seed) {
            Ok(out) => out,
            // A refusal at set-up is bad input; a run that fails is a finding.
            Err(e) if e.exit_code() == 2 => return,
            Err(e) => panic!("{name} failed: {e}\n{text}"),
        };
        assert_eq!(out.records.len(), n);
        let mut served = 0;
        for r in &out.records {
            if r.completed_at_s.is_nan() {
                continue;
            }
            served += 1;
            assert!(
                r.arrived_at_s <= r.admitted_at_s
                    && r.admitted_at_s <= r.first_token_at_s
                    && r.first_token_at_s <= r.completed_at_s
                    && r.completed_at_s < CLOCK_S,
                "{name}: {r:?}\n{text}"
            );
        }
        let m = |k: &str| out.metrics.get(k).unwrap_or_else(|| panic!("{name}: no {k}\n{text}"));
        // Served, rejected, or unfinished when the run stopped `drain_s` after the last arrival.
        let (rejected, unfinished) = (m("rejected") as usize, m("unfinished") as usize);
        assert_eq!(served + rejected + unfinished, n, "{name}: every request ends once\n{text}");
        assert!(unfinished == 0 || m("overloaded") == 1.0, "{name}\n{text}");
        assert_eq!(m("completed") as usize, served, "{name}\n{text}");
    }
});
