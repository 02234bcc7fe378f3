//! Scraping the backends' `/metrics` (and `/health`): their load and whether they answer.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Uri;
use hyper::header::AUTHORIZATION;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use routelab_policy_api::ReplicaView;

use super::{Backend, Gateway};
use crate::prom::{self, EngineLoad};

/// Why a scrape gave no load (the `reason` label of `routelab_gateway_scrape_failures_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrapeFailure {
    /// No HTTP answer: refused, reset or timed out. Counts towards the backend being out.
    NoAnswer,
    /// `/metrics` answered 404 or 501 (llama.cpp without `--metrics`); `/health` answered 2xx, so
    /// the backend is live with unknown load.
    NoMetrics,
    /// `/metrics` and `/health` both answered non-2xx (a llama.cpp server still loading its model
    /// answers 503): the backend is out, as for `NoAnswer`.
    NotReady,
    /// Another status (401: give --scrape-api-key).
    Status,
    /// 200, but none of the gauges the gateway reads (an engine it does not know).
    Unrecognised,
    /// 200, but the body broke off or is over 4 MiB.
    Unreadable,
}

impl ScrapeFailure {
    pub const ALL: [ScrapeFailure; 6] = [
        ScrapeFailure::NoAnswer,
        ScrapeFailure::NoMetrics,
        ScrapeFailure::NotReady,
        ScrapeFailure::Status,
        ScrapeFailure::Unrecognised,
        ScrapeFailure::Unreadable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ScrapeFailure::NoAnswer => "no_answer",
            ScrapeFailure::NoMetrics => "no_metrics",
            ScrapeFailure::NotReady => "not_ready",
            ScrapeFailure::Status => "status",
            ScrapeFailure::Unrecognised => "unrecognised",
            ScrapeFailure::Unreadable => "unreadable",
        }
    }

    /// Whether the backend counts as unreachable (else: live, load unknown).
    fn is_down(self) -> bool {
        matches!(self, ScrapeFailure::NoAnswer | ScrapeFailure::NotReady)
    }
}
/// Largest `/metrics` body read from a backend.
pub const MAX_SCRAPE_BYTES: usize = 4 << 20;

/// What a scrape of a backend's `/metrics` got: a load, or why not (with a detail for the log).
type Scraped = Result<EngineLoad, (ScrapeFailure, String)>;

impl Gateway {
    /// Scrapes every backend's `/metrics` every `scrape_interval_s`, forever: the scraped load
    /// feeds the views and the `scraped.` signals. Scrapes and requests are counted apart: a
    /// scrape without an answer (or, where `/metrics` is absent, a `/health` that is not 2xx)
    /// counts towards `unanswered_scrapes`; any other scrape without a load leaves the load
    /// unknown (zero) and the backend usable; neither opens or closes the request circuit. Every
    /// scrape without a load is counted by reason, and a change of reason is logged once.
    pub async fn scrape_loop(&self) {
        let every = Duration::from_secs_f64(self.args.scrape_interval_s);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let scrapes = self.backends.iter().map(|b| self.scrape(b, every.max(Duration::from_millis(500))));
            let results = futures_join_all(scrapes).await;
            for (b, r) in self.backends.iter().zip(results) {
                let state = match &r {
                    Ok(_) => 0,
                    Err((why, _)) => *why as u8 + 1,
                };
                if b.scrape_state.swap(state, Ordering::Relaxed) != state {
                    match &r {
                        Ok(_) => eprintln!("serve: {}/metrics: scraped again", b.url),
                        Err((why, detail)) => {
                            let then = if why.is_down() {
                                "the backend is out after --breaker-failures of these in a row"
                            } else {
                                "its load is unknown (0) and it is still used"
                            };
                            eprintln!("serve: {}: {detail} ({}); {then}", b.url, why.label());
                        }
                    }
                }
                match r {
                    Ok(load) => *b.scraped.lock().expect("scrape lock") = load,
                    Err((why, _)) => {
                        b.scrape_failures[why as usize].fetch_add(1, Ordering::Relaxed);
                        *b.scraped.lock().expect("scrape lock") = EngineLoad::default();
                        if why.is_down() {
                            b.unanswered_scrapes.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    }
                }
                b.unanswered_scrapes.store(0, Ordering::Relaxed);
            }
            let mut r = self.routing.lock().expect("routing lock");
            if r.router.reads_scrapes() {
                let now = Instant::now();
                let views: Vec<ReplicaView> = (0..self.backends.len()).map(|i| self.view(i, now)).collect();
                r.router.scrape(&views, self.now_s());
            }
        }
    }

    /// GETs `uri` with the scrape credential: the status and up to [`MAX_SCRAPE_BYTES`] of body.
    async fn scrape_get(&self, uri: &Uri) -> Result<(hyper::StatusCode, Option<Bytes>), String> {
        get_limited(&self.client, uri, self.args.scrape_api_key.as_deref()).await
    }

    async fn scrape(&self, b: &Backend, timeout: Duration) -> Scraped {
        let fetch = async {
            use hyper::StatusCode;
            let fail = |why, detail: String| Err((why, detail));
            let (status, body) = match self.scrape_get(&b.metrics_uri).await {
                Ok(r) => r,
                Err(e) => return fail(ScrapeFailure::NoAnswer, format!("/metrics got no answer: {e}")),
            };
            match status {
                s if s.is_success() => {}
                StatusCode::NOT_FOUND | StatusCode::NOT_IMPLEMENTED => {
                    // No /metrics (llama.cpp without --metrics answers 501): /health tells liveness.
                    return match self.scrape_get(&b.health_uri).await {
                        Ok((h, _)) if h.is_success() => fail(
                            ScrapeFailure::NoMetrics,
                            format!(
                                "/metrics answered {status} (llama.cpp: start it with --metrics); /health answered {h}"
                            ),
                        ),
                        Ok((h, _)) => {
                            fail(ScrapeFailure::NotReady, format!("/metrics answered {status} and /health {h}"))
                        }
                        Err(e) => fail(ScrapeFailure::NoAnswer, format!("/health got no answer: {e}")),
                    };
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    return fail(
                        ScrapeFailure::Status,
                        format!("/metrics answered {status} (an engine with --api-key: give --scrape-api-key)"),
                    );
                }
                _ => return fail(ScrapeFailure::Status, format!("/metrics answered {status}")),
            }
            let Some(body) = body else {
                return fail(
                    ScrapeFailure::Unreadable,
                    format!("/metrics broke off or is over {MAX_SCRAPE_BYTES} bytes"),
                );
            };
            // One stray byte does not void the scrape.
            prom::engine_load(&String::from_utf8_lossy(&body)).ok_or_else(|| {
                (
                    ScrapeFailure::Unrecognised,
                    "/metrics has none of the waiting gauges read (vllm:num_requests_waiting, \
                     sglang:num_queue_reqs, llamacpp:requests_deferred)"
                        .to_string(),
                )
            })
        };
        tokio::time::timeout(timeout, fetch)
            .await
            .unwrap_or_else(|_| Err((ScrapeFailure::NoAnswer, format!("no answer within {} s", timeout.as_secs_f64()))))
    }
}

/// Awaits every future, concurrently (a handful of scrapes; not worth a crate).
pub(super) async fn futures_join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in pinned.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    out.into_iter().map(|o| o.expect("every future finished")).collect()
}

/// GETs `uri` (with `Authorization: Bearer key` when given): the status, and for a 2xx up to
/// [`MAX_SCRAPE_BYTES`] of body (`None` when it broke off or is longer).
pub(super) async fn get_limited(
    client: &Client<HttpConnector, Full<Bytes>>,
    uri: &Uri,
    key: Option<&str>,
) -> Result<(hyper::StatusCode, Option<Bytes>), String> {
    let mut req = hyper::Request::get(uri);
    if let Some(k) = key {
        req = req.header(AUTHORIZATION, format!("Bearer {k}"));
    }
    let req = req.body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    if !status.is_success() {
        return Ok((status, None));
    }
    // At most MAX_SCRAPE_BYTES of it: an engine's /metrics is a few tens of KB.
    let body = Limited::new(resp.into_body(), MAX_SCRAPE_BYTES).collect().await.ok().map(|b| b.to_bytes());
    Ok((status, body))
}
