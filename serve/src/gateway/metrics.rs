//! The gateway's own `/metrics`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Backend, Gateway, ScrapeFailure};
use crate::prom;

impl Gateway {
    /// The gateway's Prometheus text.
    pub fn metrics_text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let now = Instant::now();
        type Counter = fn(&Backend) -> i64;
        let per_backend: [(&str, &str, Counter); 5] = [
            ("routelab_gateway_routed_total", "counter", |b| b.dispatched.load(Ordering::Relaxed) as i64),
            ("routelab_gateway_requests_ok_total", "counter", |b| b.ok.load(Ordering::Relaxed) as i64),
            ("routelab_gateway_backend_failures_total", "counter", |b| b.failed.load(Ordering::Relaxed) as i64),
            ("routelab_gateway_in_flight", "gauge", |b| b.in_flight.load(Ordering::Relaxed)),
            // prompt + max_tokens of the requests in flight (the policy's `outstanding_work`).
            ("routelab_gateway_outstanding_work_tokens", "gauge", |b| b.outstanding_work.load(Ordering::Relaxed)),
        ];
        for (name, kind, get) in per_backend {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for b in &self.backends {
                let _ = writeln!(out, "{name}{{backend=\"{}\"}} {}", b.url, get(b));
            }
        }
        let _ = writeln!(out, "# TYPE routelab_gateway_circuit_open gauge");
        for (i, b) in self.backends.iter().enumerate() {
            let open = !self.healthy(i, now);
            let _ = writeln!(out, "routelab_gateway_circuit_open{{backend=\"{}\"}} {}", b.url, open as u8);
        }
        for (name, help) in [
            ("routelab_gateway_ttft_seconds", "time to first token"),
            ("routelab_gateway_latency_seconds", "request latency"),
        ] {
            let _ = writeln!(out, "# HELP {name} {help} through the gateway\n# TYPE {name} histogram");
            for b in &self.backends {
                let h = if name.contains("ttft") { &b.ttft } else { &b.latency };
                h.write(&mut out, name, &format!("backend=\"{}\"", b.url));
            }
        }
        let _ = writeln!(out, "# TYPE routelab_gateway_scrape_failures_total counter");
        for b in &self.backends {
            for why in ScrapeFailure::ALL {
                let n = b.scrape_failures[why as usize].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "routelab_gateway_scrape_failures_total{{backend=\"{}\",reason=\"{}\"}} {n}",
                    b.url,
                    why.label()
                );
            }
        }
        // The KV capacity the policy is told, and where it comes from (catalogue, flag or engine).
        let _ = writeln!(
            out,
            "# TYPE routelab_gateway_kv_capacity_tokens gauge\nroutelab_gateway_kv_capacity_tokens{{source=\"{}\"}} {}",
            self.kv_capacity_source.replace(['"', '\\'], "'"),
            self.kv_capacity_tokens
        );
        for (name, v) in [
            ("routelab_gateway_retries_total", &self.retries),
            ("routelab_gateway_policy_errors_total", &self.policy_errors),
            ("routelab_gateway_rerouted_total", &self.rerouted),
            ("routelab_gateway_resumed_streams_total", &self.resumed),
        ] {
            let _ = writeln!(out, "# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        }
        self.kv_events_metrics(&mut out);
        let r = self.routing.lock().expect("routing lock");
        if let Ok(stats) = r.router.report() {
            let _ = writeln!(out, "# TYPE routelab_gateway_policy_stat gauge");
            for (name, v) in stats {
                let _ = writeln!(out, "routelab_gateway_policy_stat{{name=\"{name}\"}} {}", prom::value(v));
            }
        }
        out
    }

    /// `--kv-events`: batches by outcome, blocks held, live or degraded (backends with events).
    fn kv_events_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        if self.kv_specs.iter().all(Option::is_none) {
            return;
        }
        let _ = writeln!(out, "# TYPE routelab_gateway_kv_events_total counter");
        for (b, stats) in self.backends.iter().zip(&self.kv_stats) {
            for o in super::kv_events::Outcome::ALL {
                let (url, label, n) = (&b.url, o.label(), stats.count(o));
                let _ = writeln!(out, "routelab_gateway_kv_events_total{{backend=\"{url}\",outcome=\"{label}\"}} {n}");
            }
        }
        // 1 while the SUB socket is connected (it reconnects by itself).
        let _ = writeln!(out, "# TYPE routelab_gateway_kv_events_connected gauge");
        for ((b, stats), spec) in self.backends.iter().zip(&self.kv_stats).zip(&self.kv_specs) {
            if spec.is_some() {
                let up = stats.connected.load(std::sync::atomic::Ordering::Relaxed) as u8;
                let _ = writeln!(out, "routelab_gateway_kv_events_connected{{backend=\"{}\"}} {up}", b.url);
            }
        }
        // Every batch below it applied (or found lost); −1 before the first.
        let _ = writeln!(out, "# TYPE routelab_gateway_kv_events_next_seq gauge");
        for ((b, stats), spec) in self.backends.iter().zip(&self.kv_stats).zip(&self.kv_specs) {
            if spec.is_some() {
                let next = stats.next_seq.load(std::sync::atomic::Ordering::Relaxed);
                let _ = writeln!(out, "routelab_gateway_kv_events_next_seq{{backend=\"{}\"}} {next}", b.url);
            }
        }
        let r = self.routing.lock().expect("routing lock");
        type Get = fn(&super::kv_events::View) -> usize;
        let gauges: [(&str, Get); 2] = [
            ("routelab_gateway_kv_blocks", |v| v.index.len()),
            ("routelab_gateway_kv_events_live", |v| v.live as usize),
        ];
        for (name, get) in gauges {
            let _ = writeln!(out, "# TYPE {name} gauge");
            for (b, view) in self.backends.iter().zip(&r.kv) {
                if let Some(v) = view {
                    let _ = writeln!(out, "{name}{{backend=\"{}\"}} {}", b.url, get(v));
                }
            }
        }
    }
}
