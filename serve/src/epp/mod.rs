//! `routelab epp`: a routelab policy as the Gateway API Inference Extension's endpoint picker
//! (EPP) — Envoy's external processing (`ext_proc`) gRPC service, which Envoy Gateway, kgateway,
//! Istio and GKE's gateway call for every request to an `InferencePool`, and which answers with
//! the endpoint to send it to (the `x-gateway-destination-endpoint` header and the same value in
//! the dynamic metadata's `envoy.lb` namespace, as the protocol asks).
//!
//! It is the gateway of `routelab serve` without the proxy: the same backends (`--backend`, one
//! per pool endpoint; the endpoint a decision names is the backend URL's `host:port`), the same
//! scrapes of their `/metrics`, circuit breaker, KV events, policy and request view; what differs
//! is who carries the bytes (Envoy) and how the picker hears of the response (the response's
//! headers and body pass through the stream: see [`exchange`]). The data plane's subset hint
//! (`envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset` in the request's metadata)
//! restricts the choice; a hint naming no known endpoint gets a 503.
//!
//! The gRPC health service (`grpc.health.v1.Health`) answers on the same port, `SERVING` for
//! `""`, `liveness`, `readiness` and `envoy.service.ext_proc.v3.ExternalProcessor`, as the
//! protocol's health section names them.
//!
//! Bounded: at most `--max-connections` connections, 1024 streams each (Envoy multiplexes every
//! request over a few connections), request bodies within the gateway's cap and its shared body
//! budget (`--max-buffered-mb`), a stream idle past `--generation-timeout-s` closed.
//!
//! Behind the `epp` feature (tonic and prost); without it the command exits 2 saying how to get
//! it.

use std::sync::Arc;

use crate::gateway::ServeArgs;

#[cfg(feature = "epp")]
pub mod exchange;
#[cfg(feature = "epp")]
pub mod pb;
#[cfg(feature = "epp")]
pub mod service;
#[cfg(all(test, feature = "epp"))]
mod tests;

#[derive(clap::Args, Debug, Clone)]
pub struct EppArgs {
    /// The gateway's arguments: `--listen` is the gRPC address (the inference extension's
    /// picker listens on 9002), `--backend` the pool's endpoints. The proxy's own flags
    /// (`--retries`, `--resume-streams`, `--record`, `--timeout-s`) do not apply: Envoy carries
    /// the requests.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// The header, and the metadata key, that name the destination endpoint.
    #[arg(long, default_value = "x-gateway-destination-endpoint")]
    pub destination_header: String,
    /// The dynamic metadata namespace the destination is written under.
    #[arg(long, default_value = "envoy.lb")]
    pub metadata_namespace: String,
}

/// The picker: the gateway's state and how answers name endpoints.
pub struct Picker {
    pub gw: Arc<crate::gateway::Gateway>,
    /// Each backend's `host:port`, as decisions name it.
    pub endpoints: Vec<String>,
    pub header: String,
    pub namespace: String,
    pub subset_namespace: String,
    pub subset_key: String,
}

impl Picker {
    pub fn new(gw: Arc<crate::gateway::Gateway>, header: &str, namespace: &str) -> Self {
        let endpoints = (gw.backends.iter())
            .map(|b| {
                let host = b.base.host().unwrap_or_default();
                let port = b.base.port_u16().unwrap_or(if b.base.scheme_str() == Some("https") { 443 } else { 80 });
                format!("{host}:{port}")
            })
            .collect();
        Self {
            gw,
            endpoints,
            header: header.to_string(),
            namespace: namespace.to_string(),
            subset_namespace: "envoy.lb.subset_hint".into(),
            subset_key: "x-gateway-destination-endpoint-subset".into(),
        }
    }

    /// The dynamic metadata naming `endpoint`.
    #[cfg(feature = "epp")]
    pub fn metadata(&self, endpoint: &str) -> prost_types::Struct {
        exchange::nested(&self.namespace, &self.header, endpoint)
    }
}

/// Refuses what the picker cannot honour, before anything starts (exit 2).
fn check(args: &EppArgs) -> Result<(), routelab_core::workload::InputError> {
    use routelab_core::workload::InputError;
    if args.serve.record.is_some() {
        return Err(InputError::command_line(
            "--record",
            "the picker never sees a request's text after routing",
            "record with `routelab serve`, or leave the flag out",
        ));
    }
    if args.serve.resume_streams {
        return Err(InputError::command_line(
            "--resume-streams",
            "Envoy carries the streams; the picker cannot resume one",
            "leave the flag out (configure retries in Envoy)",
        ));
    }
    let header_ok = |h: &str| !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !header_ok(&args.destination_header) {
        return Err(InputError::command_line(
            "--destination-header",
            format!("'{}' is not a header name", args.destination_header),
            "give letters, digits and dashes (the default is x-gateway-destination-endpoint)",
        ));
    }
    Ok(())
}

/// `routelab epp`: serves until Ctrl-C / SIGTERM.
#[cfg(feature = "epp")]
pub fn main(args: EppArgs) -> anyhow::Result<i32> {
    use anyhow::Context as _;
    check(&args).map_err(routelab_core::error::Error::from)?;
    super::runtime()?.block_on(async move {
        let gw = Arc::new(crate::gateway::Gateway::start(args.serve.clone()).await?);
        let picker = Arc::new(Picker::new(gw, &args.destination_header, &args.metadata_namespace));
        let listen = args.serve.listen;
        let listener = super::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
        eprintln!("epp: ext_proc on {} for {} endpoint(s)", listener.local_addr()?, picker.endpoints.len());
        run(picker, listener, super::shutdown_signal()).await?;
        Ok(0)
    })
}

/// Without the `epp` feature: refused, saying how to get it.
#[cfg(not(feature = "epp"))]
pub fn main(args: EppArgs) -> anyhow::Result<i32> {
    check(&args).map_err(routelab_core::error::Error::from)?;
    Err(routelab_core::error::Error::from(routelab_core::workload::InputError::command_line(
        "epp",
        "this routelab was built without the `epp` feature (Envoy's ext_proc protocol)",
        "build it with the feature (`cargo install --locked --path host --features epp`, or `cargo run \
         --features epp -- epp …` in the checkout)",
    ))
    .into())
}

/// Serves the picker on `listener` (the gateway's scrapes and KV events included) until
/// `shutdown` resolves.
#[cfg(feature = "epp")]
pub async fn run(
    picker: Arc<Picker>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    use tonic_health::ServingStatus;
    use tonic_health::pb::health_server::HealthServer;
    use tonic_health::server::{HealthReporter, HealthService};

    let gw = picker.gw.clone();
    let g = gw.clone();
    let scrapes = tokio::spawn(async move { g.scrape_loop().await });
    let events: Vec<_> = (gw.kv_specs.iter().enumerate())
        .filter_map(|(i, s)| Some(tokio::spawn(gw.clone().kv_events_loop(i, s.clone()?))))
        .collect();
    let reporter = HealthReporter::new();
    for name in ["", "liveness", "readiness", <service::ExtProc as tonic::server::NamedService>::NAME] {
        reporter.set_service_status(name, ServingStatus::Serving).await;
    }
    let health = HealthServer::new(HealthService::from_health_reporter(reporter));
    let (accepting, incoming) = service::limited(listener, gw.args.limits.max_connections);
    let served = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(1024))
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .serve_with_incoming_shutdown(service::ExtProc::new(picker, health), incoming, shutdown)
        .await;
    accepting.abort();
    scrapes.abort();
    events.iter().for_each(|e| e.abort());
    Ok(served?)
}
