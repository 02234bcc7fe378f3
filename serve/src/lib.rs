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

pub mod emulate;
pub mod engine;
pub mod gateway;
pub mod prom;
pub mod proxy;
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
use hyper_util::rt::TokioIo;
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

/// A streamed response (`text/event-stream`) fed by the returned sender.
pub fn sse() -> (mpsc::Sender<Bytes>, Response<OutBody>) {
    let (tx, rx) = mpsc::channel(64);
    let mut r = Response::new(OutBody::Stream(rx));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut().insert("cache-control", HeaderValue::from_static("no-cache"));
    (tx, r)
}

/// Reads a request body, at most [`MAX_BODY_BYTES`].
pub async fn read_body(req: Request<Incoming>) -> Result<Bytes, Response<OutBody>> {
    use http_body_util::{BodyExt, Limited};
    match Limited::new(req.into_body(), MAX_BODY_BYTES).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => Err(error(StatusCode::BAD_REQUEST, "invalid_request_error", format!("reading the body: {e}"))),
    }
}

/// Binds `addr` (prints `listening on http://ADDR`, the line tests and scripts wait for) and
/// serves `handle` until `shutdown` resolves; then stops accepting and lets open connections —
/// streams included — finish, for at most `drain`.
pub async fn serve<H, F>(
    listener: TcpListener,
    handle: H,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<OutBody>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let h = handle.clone();
                let service = service_fn(move |req| {
                    let f = h(req);
                    async move { Ok::<_, Infallible>(f.await) }
                });
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
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
