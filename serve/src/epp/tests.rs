//! The picker on loopback, spoken to by a tonic client as Envoy speaks ext_proc: two emulated
//! engines behind it, `least_requests` as its policy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::Streaming;
use tonic::transport::Channel;

use super::pb::{
    self, HeaderMap, HeaderValue, HttpBody, HttpHeaders, Metadata, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration, body_mutation::Mutation, body_send_mode, processing_request::Request as In,
    processing_response::Response as Out,
};
use super::{Picker, service};
use crate::gateway::{Gateway, ServeArgs};

async fn emulator() -> SocketAddr {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: crate::emulate::EmulateArgs,
    }
    let args = Cli::try_parse_from(["emulate", "--listen", "127.0.0.1:0"]).expect("parses").args;
    let prepared = crate::emulate::Prepared::new(&args).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(prepared.run(l, std::future::pending()));
    addr
}

/// A picker in front of two emulated engines; it, its address, and the engines' endpoints.
async fn picker() -> (Arc<Picker>, SocketAddr, Vec<String>) {
    let engines = [emulator().await, emulator().await];
    let urls: Vec<String> = engines.iter().map(|a| format!("http://{a}")).collect();
    let gw = Arc::new(Gateway::new(ServeArgs::with_backends(&urls)).unwrap());
    let picker = Arc::new(Picker::new(gw, "x-gateway-destination-endpoint", "envoy.lb"));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(super::run(picker.clone(), l, std::future::pending()));
    (picker, addr, engines.iter().map(ToString::to_string).collect())
}

/// One ext_proc stream, as Envoy holds it for one HTTP request.
struct Stream {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: Streaming<ProcessingResponse>,
}

impl Stream {
    async fn open(addr: SocketAddr) -> Self {
        let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let (tx, rx) = mpsc::channel(16);
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(service::PROCESS_PATH);
        let codec = tonic_prost::ProstCodec::<ProcessingRequest, ProcessingResponse>::default();
        let rx = grpc.streaming(tonic::Request::new(ReceiverStream::new(rx)), path, codec).await.unwrap().into_inner();
        Self { tx, rx }
    }

    async fn send(&self, msg: ProcessingRequest) {
        self.tx.send(msg).await.unwrap();
    }

    async fn recv(&mut self) -> Out {
        let m = tokio::time::timeout(Duration::from_secs(10), self.rx.message()).await.expect("an answer within 10 s");
        m.unwrap().expect("an answer, not the stream's end").response.expect("a response")
    }

    async fn recv_whole(&mut self) -> ProcessingResponse {
        let m = tokio::time::timeout(Duration::from_secs(10), self.rx.message()).await.expect("an answer within 10 s");
        m.unwrap().expect("an answer, not the stream's end")
    }

    /// Sends a request's headers and body in `mode`, with `metadata`.
    async fn request(&self, mode: i32, body: &[u8], metadata: Option<Metadata>) {
        let headers = HeaderMap {
            headers: vec![
                HeaderValue::raw(":method", "POST"),
                HeaderValue::raw(":path", "/v1/completions"),
                HeaderValue::raw("content-type", "application/json"),
            ],
        };
        self.send(ProcessingRequest {
            request: Some(In::RequestHeaders(HttpHeaders { headers: Some(headers), end_of_stream: false })),
            metadata_context: metadata,
            protocol_config: Some(ProtocolConfiguration {
                request_body_mode: mode,
                response_body_mode: mode,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await;
        // Two chunks: the picker must read the whole body before it routes.
        let (a, b) = body.split_at(body.len() / 2);
        for (chunk, end) in [(a, false), (b, true)] {
            let body = HttpBody { body: chunk.to_vec(), end_of_stream: end };
            self.send(ProcessingRequest { request: Some(In::RequestBody(body)), ..Default::default() }).await;
        }
    }
}

const BODY: &[u8] = br#"{"model": "m", "prompt": "the quick brown fox jumps over the lazy dog", "max_tokens": 8}"#;

fn header<'a>(r: &'a pb::HeadersResponse, key: &str) -> Option<String> {
    let m = r.response.as_ref()?.header_mutation.as_ref()?;
    let h: &'a HeaderValue = m.set_headers.iter().filter_map(|o| o.header.as_ref()).find(|h| h.key == key)?;
    Some(h.text().into_owned())
}

fn metadata_endpoint(s: &Struct) -> Option<String> {
    let Some(Kind::StructValue(inner)) = s.fields.get("envoy.lb")?.kind.as_ref() else { return None };
    match inner.fields.get("x-gateway-destination-endpoint")?.kind.as_ref()? {
        Kind::StringValue(v) => Some(v.clone()),
        _ => None,
    }
}

/// In `FULL_DUPLEX_STREAMED` mode: the request headers' answer names the endpoint (header and
/// metadata alike), the body comes back whole; a second request held open goes to the other
/// engine (least requests); the first one's response passes through chunk by chunk and its end
/// is a completion; the second one's stream closing early releases its engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_in_full_duplex_mode_and_follows_the_response() {
    let (picker, addr, endpoints) = picker().await;
    let duplex = body_send_mode::FULL_DUPLEX_STREAMED;

    let mut first = Stream::open(addr).await;
    first.request(duplex, BODY, None).await;
    let answer = first.recv_whole().await;
    let Some(Out::RequestHeaders(h)) = &answer.response else { panic!("{answer:?}") };
    let chosen = header(h, "x-gateway-destination-endpoint").expect("the destination header");
    assert!(endpoints.contains(&chosen), "{chosen} is not one of {endpoints:?}");
    assert_eq!(metadata_endpoint(answer.dynamic_metadata.as_ref().expect("metadata")), Some(chosen.clone()));
    assert_eq!(header(h, "content-length"), Some(BODY.len().to_string()));
    assert!(h.response.as_ref().unwrap().clear_route_cache);
    let Out::RequestBody(b) = first.recv().await else { panic!("the body's answer") };
    let Some(Mutation::StreamedResponse(s)) = b.response.unwrap().body_mutation.unwrap().mutation else {
        panic!("a streamed body")
    };
    assert_eq!((s.body.as_slice(), s.end_of_stream), (BODY, true));
    let k = endpoints.iter().position(|e| *e == chosen).unwrap();
    assert_eq!(picker.gw.backends[k].in_flight.load(Ordering::Relaxed), 1);

    let mut second = Stream::open(addr).await;
    second.request(duplex, BODY, None).await;
    let Out::RequestHeaders(h) = second.recv().await else { panic!("headers' answer") };
    let other = header(&h, "x-gateway-destination-endpoint").unwrap();
    assert_ne!(other, chosen, "least_requests sends the second request to the idle engine");
    let Out::RequestBody(_) = second.recv().await else { panic!("the body's answer") };

    // The first request's response: headers, a text event, then usage and [DONE].
    let resp_headers = HeaderMap {
        headers: vec![HeaderValue::raw(":status", "200"), HeaderValue::raw("content-type", "text/event-stream")],
    };
    first
        .send(ProcessingRequest {
            request: Some(In::ResponseHeaders(HttpHeaders { headers: Some(resp_headers), end_of_stream: false })),
            ..Default::default()
        })
        .await;
    assert!(matches!(first.recv().await, Out::ResponseHeaders(_)));
    let chunks: [&[u8]; 2] = [
        b"data: {\"choices\":[{\"index\":0,\"text\":\"hi\"}]}\n\n",
        b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
    ];
    for (i, chunk) in chunks.iter().enumerate() {
        let end = i == chunks.len() - 1;
        let body = HttpBody { body: chunk.to_vec(), end_of_stream: end };
        first.send(ProcessingRequest { request: Some(In::ResponseBody(body)), ..Default::default() }).await;
        let Out::ResponseBody(b) = first.recv().await else { panic!("the response body's answer") };
        let Some(Mutation::StreamedResponse(s)) = b.response.unwrap().body_mutation.unwrap().mutation else {
            panic!("a streamed body")
        };
        assert_eq!((s.body.as_slice(), s.end_of_stream), (*chunk, end), "passed back as it came");
    }
    let b = &picker.gw.backends[k];
    assert_eq!((b.ok.load(Ordering::Relaxed), b.in_flight.load(Ordering::Relaxed)), (1, 0), "completed");
    assert_eq!(b.ttft.count(), 1, "the first text event is the first token");

    // The second request's stream closes before any response: abandoned, its engine released.
    drop(second);
    let j = endpoints.iter().position(|e| *e == other).unwrap();
    let released = async {
        while picker.gw.backends[j].in_flight.load(Ordering::Relaxed) != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), released).await.expect("released within 10 s");
    assert_eq!(picker.gw.backends[j].ok.load(Ordering::Relaxed), 0);
}

/// In `BUFFERED` mode the headers are answered at once (nothing routed yet) and the body's answer
/// carries the destination.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_buffered_mode_the_body_answer_names_the_endpoint() {
    let (_picker, addr, endpoints) = picker().await;
    let mut s = Stream::open(addr).await;
    s.request(body_send_mode::BUFFERED, BODY, None).await;
    let Out::RequestHeaders(h) = s.recv().await else { panic!("headers' answer") };
    assert_eq!(header(&h, "x-gateway-destination-endpoint"), None, "not routed before the body");
    // The first chunk's answer (continue), then the last one's, which routes.
    let Out::RequestBody(b) = s.recv().await else { panic!("a body answer") };
    assert!(b.response.as_ref().and_then(|r| r.header_mutation.as_ref()).is_none());
    let answer = s.recv_whole().await;
    let Some(Out::RequestBody(b)) = &answer.response else { panic!("{answer:?}") };
    let set = &b.response.as_ref().unwrap().header_mutation.as_ref().unwrap().set_headers;
    let chosen = set[0].header.as_ref().unwrap().text().into_owned();
    assert!(endpoints.contains(&chosen));
    assert_eq!(metadata_endpoint(answer.dynamic_metadata.as_ref().unwrap()), Some(chosen));
}

fn subset(endpoints: &[&str]) -> Metadata {
    let list = ListValue {
        values: endpoints.iter().map(|e| Value { kind: Some(Kind::StringValue(e.to_string())) }).collect(),
    };
    let inner = Struct {
        fields: [("x-gateway-destination-endpoint-subset".to_string(), Value { kind: Some(Kind::ListValue(list)) })]
            .into_iter()
            .collect(),
    };
    Metadata { filter_metadata: [("envoy.lb.subset_hint".to_string(), inner)].into_iter().collect() }
}

fn immediate_code(out: &Out) -> Option<i32> {
    match out {
        Out::ImmediateResponse(r) => r.status.as_ref().map(|s| s.code),
        _ => None,
    }
}

/// The data plane's subset hint binds (every request held open still goes to the one endpoint
/// it names, though least-requests would spread them); a hint naming no endpoint, or a body that
/// is not an OpenAI request, gets the immediate response the protocol asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subset_hint_binds_and_errors_are_immediate_responses() {
    let (picker, addr, endpoints) = picker().await;
    let duplex = body_send_mode::FULL_DUPLEX_STREAMED;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = Stream::open(addr).await;
        s.request(duplex, BODY, Some(subset(&[endpoints[1].as_str()]))).await;
        let Out::RequestHeaders(h) = s.recv().await else { panic!("headers' answer") };
        assert_eq!(header(&h, "x-gateway-destination-endpoint").as_deref(), Some(endpoints[1].as_str()));
        held.push(s);
    }
    assert_eq!(picker.gw.backends[1].in_flight.load(Ordering::Relaxed), 3);

    let mut s = Stream::open(addr).await;
    s.request(duplex, BODY, Some(subset(&["10.0.0.1:8000"]))).await;
    assert_eq!(immediate_code(&s.recv().await), Some(503));

    let mut s = Stream::open(addr).await;
    s.request(duplex, b"{not json", None).await;
    assert_eq!(immediate_code(&s.recv().await), Some(400));
}

/// The gRPC health service answers SERVING for the names the protocol gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_answer_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let (_picker, addr, _) = picker().await;
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut client = HealthClient::new(channel);
    for name in ["liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"] {
        let r = client.check(HealthCheckRequest { service: name.into() }).await.unwrap().into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{name}");
    }
}
