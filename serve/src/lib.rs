//! Real HTTP in front of the same policies and the same replica model as the simulator:
//! `routelab serve` (an OpenAI-compatible routing gateway, [`gateway`] and [`proxy`]),
//! `routelab emulate` (one cluster-world replica as an OpenAI-compatible server in real time,
//! [`engine`] and [`emulate`]) and `routelab replay` (a bounded load generator replaying a
//! cluster workload's request stream over HTTP, [`replay`]). HTTP/1.1 on loopback or a private
//! network, no TLS. See docs/serving.md.
//!
//! routelab-serve sits on routelab-core (the replica, the loader, the router handle) and under
//! the `routelab` binary, which parses the arguments and calls [`proxy::main`],
//! [`emulate::main`] and [`replay::main`].

pub mod bounded;
pub mod emulate;
pub mod engine;
pub mod epp;
pub mod gateway;
pub mod kv_publish;
pub mod prom;
pub mod proxy;
pub mod record;
pub mod replay;
pub mod text;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Largest request body read (a long-context prompt is a few MB).
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// A response body: a whole buffer, or chunks (SSE events) as they come.
pub enum OutBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for OutBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            OutBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            OutBody::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, OutBody::Full(None))
    }
}

pub fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<OutBody> {
    let mut r = Response::new(OutBody::Full(Some(body.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub fn json(status: StatusCode, v: &serde_json::Value) -> Response<OutBody> {
    full(status, "application/json", v.to_string())
}

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}`.
pub fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response<OutBody> {
    json(
        status,
        &serde_json::json!({"error": {"message": message.into(), "type": kind, "param": null, "code": status.as_u16()}}),
    )
}

/// A 405 for a wrong method on a path both servers serve (`None`: an unknown path, a 404).
pub fn method_not_allowed(path: &str) -> Option<Response<OutBody>> {
    let allow = match path {
        "/health" | "/metrics" | "/v1/models" => "GET",
        "/v1/completions" | "/v1/chat/completions" => "POST",
        _ => return None,
    };
    let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", format!("{path} takes {allow}"));
    r.headers_mut().insert(hyper::header::ALLOW, HeaderValue::from_static(allow));
    Some(r)
}

/// A streamed response (`text/event-stream`) fed by the returned sender.
pub fn sse() -> (mpsc::Sender<Bytes>, Response<OutBody>) {
    let (tx, rx) = mpsc::channel(64);
    let mut r = Response::new(OutBody::Stream(rx));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut().insert("cache-control", HeaderValue::from_static("no-cache"));
    (tx, r)
}

/// What one client may hold of a server (`routelab serve` and `routelab emulate`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Seconds a client may take to send a request's headers, and to send its next request on an
    /// idle keep-alive connection; then the connection is closed.
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout_s: f64,
    /// Seconds a client may take to send a request's body (then a 408).
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout_s: f64,
    /// Most client connections open at once; more wait in the listen backlog until one closes.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// MiB of request and response bodies held in memory at once, over every request; a body
    /// past it is refused with a 503.
    #[arg(long, default_value_t = 256)]
    pub max_buffered_mb: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self { header_timeout_s: 10.0, body_timeout_s: 30.0, max_connections: 1024, max_buffered_mb: 256 }
    }
}

impl ConnLimits {
    pub fn check(&self) -> Result<(), routelab_core::workload::InputError> {
        use routelab_core::workload::InputError;
        for (flag, v) in [("--header-timeout-s", self.header_timeout_s), ("--body-timeout-s", self.body_timeout_s)] {
            if !(0.001..=86_400.0).contains(&v) {
                return Err(InputError::command_line(
                    flag,
                    format!("{v} is out of range"),
                    "give seconds in [0.001, 86400]",
                ));
            }
        }
        if !(1..=1 << 20).contains(&self.max_buffered_mb) {
            return Err(InputError::command_line(
                "--max-buffered-mb",
                format!("{} is out of range", self.max_buffered_mb),
                "give MiB from 1 to 1048576, above the largest request body",
            ));
        }
        if !(1..=1 << 20).contains(&self.max_connections) {
            return Err(InputError::command_line(
                "--max-connections",
                format!("{} is out of range", self.max_connections),
                "give a number from 1 to 1048576 (and a file-descriptor limit above it)",
            ));
        }
        Ok(())
    }

    /// The server's budget of bodies in memory.
    pub fn buffers(&self) -> bounded::Buffers {
        bounded::Buffers::new(self.max_buffered_mb << 20, Duration::from_secs_f64(self.body_timeout_s))
    }
}

/// Reads a request body: at most [`MAX_BODY_BYTES`], within the body timeout (a stalled client
/// gets a 408 and its connection is not held) and the server's budget (else a 503).
pub async fn read_body(req: Request<Incoming>, buffers: &bounded::Buffers) -> Result<bounded::Held, Response<OutBody>> {
    use bounded::Refused;
    buffers.collect(req.into_body(), MAX_BODY_BYTES, buffers.body_timeout).await.map_err(|e| {
        let status = match e {
            Refused::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Refused::OverBudget(_) => StatusCode::SERVICE_UNAVAILABLE,
            Refused::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
            Refused::Failed(_) => StatusCode::BAD_REQUEST,
        };
        error(status, "invalid_request_error", e.to_string())
    })
}

/// Serves `handle` on `listener` until `shutdown` resolves; then stops accepting and lets open
/// connections — streams included — finish, for at most `drain`. At most
/// `limits.max_connections` connections are open at once (the next waits in the backlog); a
/// client that does not send its request's headers within `limits.header_timeout_s` (or leaves
/// a keep-alive connection idle that long) is disconnected; a failed accept (at the
/// file-descriptor limit, say) is retried after a pause instead of spinning.
pub async fn serve<H, F>(
    listener: TcpListener,
    handle: H,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
    limits: ConnLimits,
) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<OutBody>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let header_timeout = Duration::from_secs_f64(limits.header_timeout_s);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = async {
                let slot = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
                (slot, listener.accept().await)
            } => {
                let stream = match accepted {
                    (slot, Ok((stream, _))) => (slot, stream),
                    (_, Err(_)) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (slot, stream) = stream;
                let _ = stream.set_nodelay(true);
                let h = handle.clone();
                let service = service_fn(move |req| {
                    let f = h(req);
                    async move { Ok::<_, Infallible>(f.await) }
                });
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(slot);
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(drain, graceful.shutdown()).await;
    Ok(())
}

/// Binds `addr` and prints the line `listening on http://ADDR` (with the port chosen when `addr`
/// has port 0).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(addr).await?;
    println!("listening on http://{}", l.local_addr()?);
    Ok(l)
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// A multi-threaded runtime for one command.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()
}
