//! The gRPC plumbing: `envoy.service.ext_proc.v3.ExternalProcessor/Process` (a bidirectional
//! stream per HTTP request, written as tonic's generated servers are, over the hand-declared
//! messages of [`super::pb`]), the gRPC health service on the same port, and a cap on open
//! connections.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{BoxFuture, Service, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::{Status, Streaming};
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;

use super::Picker;
use super::exchange::Exchange;
use super::pb::{ProcessingRequest, ProcessingResponse};

pub const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";
/// Largest ext_proc message taken: a body chunk (Envoy's buffer limit is 1 MiB by default), or a
/// whole buffered body up to the gateway's cap.
const MAX_MESSAGE_BYTES: usize = crate::MAX_BODY_BYTES + (64 << 10);

/// The ext_proc service and, under `/grpc.health.v1.Health/`, the health service.
#[derive(Clone)]
pub struct ExtProc {
    picker: Arc<Picker>,
    health: HealthServer<HealthService>,
}

impl ExtProc {
    pub fn new(picker: Arc<Picker>, health: HealthServer<HealthService>) -> Self {
        Self { picker, health }
    }
}

impl NamedService for ExtProc {
    const NAME: &'static str = "envoy.service.ext_proc.v3.ExternalProcessor";
}

impl<B> Service<http::Request<B>> for ExtProc
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            PROCESS_PATH => {
                let svc = Process(self.picker.clone());
                Box::pin(async move {
                    let mut grpc = Grpc::new(tonic_prost::ProstCodec::default())
                        .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), None);
                    Ok(grpc.streaming(svc, req).await)
                })
            }
            p if p.starts_with("/grpc.health.v1.Health/") => self.health.call(req),
            _ => Box::pin(async move {
                let mut response = http::Response::new(tonic::body::Body::default());
                let headers = response.headers_mut();
                headers.insert(Status::GRPC_STATUS, (tonic::Code::Unimplemented as i32).into());
                headers.insert(http::header::CONTENT_TYPE, tonic::metadata::GRPC_CONTENT_TYPE);
                Ok(response)
            }),
        }
    }
}

struct Process(Arc<Picker>);

impl StreamingService<ProcessingRequest> for Process {
    type Response = ProcessingResponse;
    type ResponseStream = ReceiverStream<Result<ProcessingResponse, Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<ProcessingRequest>>) -> Self::Future {
        let picker = self.0.clone();
        Box::pin(async move {
            let (tx, rx) = mpsc::channel(8);
            tokio::spawn(exchange(picker, request.into_inner(), tx));
            Ok(tonic::Response::new(ReceiverStream::new(rx)))
        })
    }
}

/// Runs one stream until Envoy closes it, the picker is done, or it idles past the gateway's
/// generation timeout (a stream held open forever would hold its backend's in-flight count).
async fn exchange(
    picker: Arc<Picker>,
    mut inbound: Streaming<ProcessingRequest>,
    tx: mpsc::Sender<Result<ProcessingResponse, Status>>,
) {
    let idle = Duration::from_secs_f64(picker.gw.args.generation_timeout_s);
    let mut ex = Exchange::new(picker);
    loop {
        let msg = match tokio::time::timeout(idle, inbound.message()).await {
            Ok(Ok(Some(m))) => m,
            // Closed, reset, a malformed message, or idle: the request is abandoned if unfinished.
            _ => return,
        };
        for answer in ex.on(msg) {
            if tx.send(Ok(answer)).await.is_err() {
                return;
            }
        }
        if ex.done {
            return;
        }
    }
}

/// A connection that holds one of the server's connection permits.
pub struct Limited {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Accepts connections from `listener`, at most `max` open at once (more wait in the listen
/// backlog); the accepting task, to abort at shutdown, and the stream of connections.
pub fn limited(
    listener: TcpListener,
    max: usize,
) -> (tokio::task::JoinHandle<()>, ReceiverStream<std::io::Result<Limited>>) {
    let (tx, rx) = mpsc::channel(1);
    let permits = Arc::new(Semaphore::new(max.max(1)));
    let task = tokio::spawn(async move {
        loop {
            let Ok(permit) = permits.clone().acquire_owned().await else { return };
            match listener.accept().await {
                Ok((io, _)) => {
                    let _ = io.set_nodelay(true);
                    if tx.send(Ok(Limited { io, _permit: permit })).await.is_err() {
                        return;
                    }
                }
                // Out of file descriptors and the like: not the server's end (tonic would stop
                // on an error from its incoming stream); wait a little rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    (task, ReceiverStream::new(rx))
}
