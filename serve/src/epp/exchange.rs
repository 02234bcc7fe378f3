//! One HTTP request's ext_proc stream: the messages Envoy sends, the answers the picker owes.
//!
//! Request path. With the request body in `FULL_DUPLEX_STREAMED` mode (what the inference
//! extension configures, and the default when Envoy does not say), Envoy sends the headers and
//! then the body's chunks without waiting; the picker answers nothing until the body ends, then
//! routes and answers the headers (the destination header, `Content-Length` of the body it hands
//! back, `clear_route_cache`, and the destination in the dynamic metadata's `envoy.lb`) and then
//! the body (the same bytes, `end_of_stream`). With `BUFFERED` (or `STREAMED`) it answers the
//! headers at once (continue) and every body chunk, routing on the last one, whose answer carries
//! the header mutation and the metadata. A request without a body (`end_of_stream` on its
//! headers) is routed at its headers, as an empty prompt.
//!
//! Response path: the headers (`:status`, `content-type`) are answered with "continue"; the body
//! is passed back chunk by chunk in `FULL_DUPLEX_STREAMED` mode, or answered "continue" in the
//! others; the picker reads it as the gateway reads a backend's response: the first SSE event
//! carrying text is the first token (TTFT from routing), the `usage` of the body or of its last
//! event gives cached and output tokens, and the end of the body is the completion the policy
//! hears (`on_complete`). A 5xx counts as the backend's failure (its circuit); a stream that
//! closes before the response ends is abandoned (`on_abandon`, via [`Decision`]'s drop).
//!
//! Errors, as the protocol asks (an `ImmediateResponse`): 400 for a body that is not an OpenAI
//! request, 413 for one larger than the gateway takes, 503 when no backend (or none of the data
//! plane's subset hint) is eligible, or when the picker already holds its whole body budget.
//!
//! Source: kubernetes-sigs/gateway-api-inference-extension @ 0fc3b12525db0c2b1d17d1d326112bdee11819ef,
//! `docs/proposals/004-endpoint-picker-protocol/README.md` (destination header and metadata,
//! subset hint, 503/429), and @ 013954d3f1b86e766916572fd8430a9634099464,
//! `pkg/epp/handlers/server.go` (`Process`, `updateStateAndSendIfNeeded`: answer order header →
//! body, `populateRequestHeaderResponse`: header, `Content-Length`, `ClearRouteCache`, metadata;
//! response chunks echoed as `StreamedBodyResponse`; bad JSON → 400).
//! Deviations: one endpoint is named, not a fallback list (a retry is the data plane's
//! fallback policy); a request without a body is routed (upstream needs a body to read the model
//! from); 429 is never sent (the picker does no admission).

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use prost_types::{Struct, Value, value::Kind};

use super::Picker;
use super::pb::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeaderValue, HeaderValueOption, HeadersResponse,
    HttpStatus, ImmediateResponse, ProcessingRequest, ProcessingResponse, StreamedBodyResponse, TrailersResponse,
    body_mutation::Mutation, body_send_mode, processing_request::Request as In, processing_response::Response as Out,
};
use crate::bounded::Share;
use crate::gateway::Decision;
use crate::proxy::{classify, event_end, sse_data, usage};
use crate::text;

/// Longest SSE event read from a response (as the gateway's relay).
const MAX_EVENT_BYTES: usize = 1 << 20;
/// Most of a non-streamed response body kept for its `usage` (past it, usage is not read).
const MAX_JSON_BYTES: usize = 4 << 20;

/// The state of one stream.
pub struct Exchange {
    picker: Arc<Picker>,
    /// The request body comes in `FULL_DUPLEX_STREAMED` mode (answers wait for its end).
    duplex_request: bool,
    /// The response body comes in `FULL_DUPLEX_STREAMED` mode (each chunk is handed back).
    duplex_response: bool,
    path: String,
    body: BytesMut,
    share: Share,
    /// The data plane's `x-gateway-destination-endpoint-subset`, if it sent one.
    subset: Option<Vec<String>>,
    decision: Option<Decision>,
    routed_at: Option<Instant>,
    prompt_tokens: u32,
    /// The response is an SSE stream.
    sse: bool,
    /// The response's status is a success.
    ok: bool,
    ttft_s: Option<f64>,
    usage: Option<(u32, u32, u32)>,
    /// Response bytes not yet read (an SSE event's beginning, or a JSON body).
    pending: BytesMut,
    /// The picker is done with this stream: an immediate response was sent, or the response ended.
    pub done: bool,
}

impl Exchange {
    pub fn new(picker: Arc<Picker>) -> Self {
        Self {
            picker,
            duplex_request: true,
            duplex_response: true,
            path: String::new(),
            body: BytesMut::new(),
            share: Share::default(),
            subset: None,
            decision: None,
            routed_at: None,
            prompt_tokens: 0,
            sse: false,
            ok: false,
            ttft_s: None,
            usage: None,
            pending: BytesMut::new(),
            done: false,
        }
    }

    /// The backend the request was routed to, if it was.
    pub fn backend(&self) -> Option<usize> {
        self.decision.as_ref().map(|d| d.backend)
    }

    /// Takes one message; the answers to send, in order. In observability mode nothing is
    /// answered (Envoy ignores answers), but the request is still routed and followed.
    pub fn on(&mut self, msg: ProcessingRequest) -> Vec<ProcessingResponse> {
        if let Some(c) = &msg.protocol_config {
            self.duplex_request = c.request_body_mode == body_send_mode::FULL_DUPLEX_STREAMED;
            self.duplex_response = c.response_body_mode == body_send_mode::FULL_DUPLEX_STREAMED;
        }
        if let Some(hint) = subset_hint(&msg, &self.picker.subset_namespace, &self.picker.subset_key) {
            self.subset = Some(hint);
        }
        let quiet = msg.observability_mode;
        let out = match msg.request {
            Some(In::RequestHeaders(h)) => {
                for v in h.headers.iter().flat_map(|m| &m.headers) {
                    if v.key == ":path" {
                        self.path = v.text().into_owned();
                    }
                }
                if h.end_of_stream {
                    self.route(false)
                } else if self.duplex_request {
                    Vec::new()
                } else {
                    vec![respond(Out::RequestHeaders(HeadersResponse::default()), None)]
                }
            }
            Some(In::RequestBody(b)) => self.request_body(&b.body, b.end_of_stream),
            Some(In::RequestTrailers(_)) => {
                // The body ended with trailers: route now if it has not been.
                let mut out = if self.decision.is_none() && !self.done { self.route(true) } else { Vec::new() };
                out.push(respond(Out::RequestTrailers(TrailersResponse::default()), None));
                out
            }
            Some(In::ResponseHeaders(h)) => {
                for v in h.headers.iter().flat_map(|m| &m.headers) {
                    match v.key.as_str() {
                        ":status" => self.status(v.text().trim().parse().unwrap_or(0)),
                        "content-type" => self.sse = v.text().contains("text/event-stream"),
                        _ => {}
                    }
                }
                if h.end_of_stream {
                    self.finish();
                }
                vec![respond(Out::ResponseHeaders(HeadersResponse::default()), None)]
            }
            Some(In::ResponseBody(b)) => {
                self.read_response(&b.body);
                if b.end_of_stream {
                    self.finish();
                }
                let common = if self.duplex_response {
                    CommonResponse {
                        body_mutation: Some(BodyMutation {
                            mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                                body: b.body,
                                end_of_stream: b.end_of_stream,
                            })),
                        }),
                        ..Default::default()
                    }
                } else {
                    CommonResponse::default()
                };
                vec![respond(Out::ResponseBody(BodyResponse { response: Some(common) }), None)]
            }
            Some(In::ResponseTrailers(_)) => {
                self.finish();
                vec![respond(Out::ResponseTrailers(TrailersResponse::default()), None)]
            }
            None => Vec::new(),
        };
        if quiet { Vec::new() } else { out }
    }

    fn request_body(&mut self, chunk: &[u8], end: bool) -> Vec<ProcessingResponse> {
        if self.done || self.decision.is_some() {
            // After an immediate response Envoy sends nothing more; a chunk past the routing
            // point (a body after a bodiless request) is passed on.
            return vec![respond(Out::RequestBody(BodyResponse::default()), None)];
        }
        if self.body.len() + chunk.len() > crate::MAX_BODY_BYTES {
            return self.immediate(413, format!("the request body is larger than {} bytes", crate::MAX_BODY_BYTES));
        }
        self.body.extend_from_slice(chunk);
        if let Err(e) = self.picker.gw.buffers.cover(&mut self.share, self.body.len()) {
            return self.immediate(503, e.to_string());
        }
        if end {
            self.route(true)
        } else if self.duplex_request {
            Vec::new()
        } else {
            vec![respond(Out::RequestBody(BodyResponse::default()), None)]
        }
    }

    /// Routes the request (its body read); the answers that name the destination.
    fn route(&mut self, had_body: bool) -> Vec<ProcessingResponse> {
        let gw = &self.picker.gw;
        let (segments, prompt_tokens, max_tokens) = if self.body.is_empty() {
            (Vec::new(), 0, text::DEFAULT_MAX_TOKENS)
        } else {
            let parsed = match text::parse_request(&self.body, self.path.ends_with("/chat/completions")) {
                Ok(p) => p,
                Err(e) => return self.immediate(400, e.0),
            };
            let mut segments = Vec::new();
            gw.tokenizer.segments(&parsed.prompt, &mut segments);
            let prompt = text::tokens_of(&segments);
            // Booked as the gateway books it: without max_tokens, up to the context's end.
            let max = if parsed.max_tokens_given {
                parsed.max_tokens
            } else {
                gw.kv_capacity_tokens.saturating_sub(prompt as u64).clamp(1, u32::MAX as u64) as u32
            };
            (segments, prompt, max)
        };
        let endpoints = &self.picker.endpoints;
        let mut excluded = vec![false; endpoints.len()];
        if let Some(subset) = &self.subset {
            for (i, e) in endpoints.iter().enumerate() {
                excluded[i] = !subset.iter().any(|s| s == e);
            }
        }
        let decision =
            if excluded.iter().all(|&x| x) { None } else { gw.route(&segments, prompt_tokens, max_tokens, &excluded) };
        let Some(d) = decision else {
            let why =
                if self.subset.is_some() { "no eligible backend in the subset hint" } else { "no healthy backend" };
            return self.immediate(503, why.to_string());
        };
        let endpoint = endpoints[d.backend].clone();
        self.prompt_tokens = prompt_tokens;
        self.decision = Some(d);
        self.routed_at = Some(Instant::now());
        let body = std::mem::take(&mut self.body).freeze();
        self.share = Share::default();
        let mut set = vec![HeaderValueOption { header: Some(HeaderValue::raw(&self.picker.header, &endpoint)) }];
        if had_body {
            set.push(HeaderValueOption { header: Some(HeaderValue::raw("content-length", &body.len().to_string())) });
        }
        let mutation = CommonResponse {
            header_mutation: Some(HeaderMutation { set_headers: set, remove_headers: Vec::new() }),
            clear_route_cache: true,
            ..Default::default()
        };
        let metadata = Some(self.picker.metadata(&endpoint));
        if !had_body {
            return vec![respond(Out::RequestHeaders(HeadersResponse { response: Some(mutation) }), metadata)];
        }
        if self.duplex_request {
            let echo = CommonResponse {
                body_mutation: Some(BodyMutation {
                    mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                        body: body.to_vec(),
                        end_of_stream: true,
                    })),
                }),
                ..Default::default()
            };
            vec![
                respond(Out::RequestHeaders(HeadersResponse { response: Some(mutation) }), metadata),
                respond(Out::RequestBody(BodyResponse { response: Some(echo) }), None),
            ]
        } else {
            vec![respond(Out::RequestBody(BodyResponse { response: Some(mutation) }), metadata)]
        }
    }

    fn status(&mut self, code: u16) {
        self.ok = (200..300).contains(&code);
        if code >= 500 {
            if let Some(d) = &self.decision {
                self.picker.gw.failure(d.backend);
            }
        }
    }

    /// Reads a chunk of the response: the first text event (TTFT) and the usage.
    fn read_response(&mut self, chunk: &[u8]) {
        if self.decision.is_none() || !self.ok {
            return;
        }
        if !self.sse {
            if self.pending.len() + chunk.len() <= MAX_JSON_BYTES {
                self.pending.extend_from_slice(chunk);
            }
            return;
        }
        self.pending.extend_from_slice(chunk);
        while let Some(end) = event_end(&self.pending, 0) {
            let event = self.pending.split_to(end);
            let kind = classify(sse_data(&event));
            if kind.usage.is_some() {
                self.usage = kind.usage;
            }
            if kind.text && self.ttft_s.is_none() {
                self.ttft_s = self.routed_at.map(|t| t.elapsed().as_secs_f64());
            }
        }
        if self.pending.len() > MAX_EVENT_BYTES {
            self.pending.clear();
        }
    }

    /// The response ended: the policy hears the completion (a success), and the decision is
    /// released.
    fn finish(&mut self) {
        self.done = true;
        let Some(d) = self.decision.take() else { return };
        if !self.ok {
            return;
        }
        if !self.sse {
            self.usage = usage(&self.pending);
        }
        let (p, cached, out) = self.usage.unwrap_or((self.prompt_tokens, 0, 0));
        // A non-streamed answer's first token comes with its last: no TTFT (the policy is told
        // the latency), as in the gateway.
        self.picker.gw.completed(&d, if self.sse { self.ttft_s } else { None }, p, cached, out);
    }

    fn immediate(&mut self, code: i32, details: String) -> Vec<ProcessingResponse> {
        self.done = true;
        let body = serde_json::json!({"error": {"message": details, "type": "routelab_epp"}}).to_string();
        vec![respond(
            Out::ImmediateResponse(ImmediateResponse {
                status: Some(HttpStatus { code }),
                headers: None,
                body: body.into_bytes(),
                details: format!("routelab_epp_{code}"),
            }),
            None,
        )]
    }
}

fn respond(r: Out, dynamic_metadata: Option<Struct>) -> ProcessingResponse {
    ProcessingResponse { response: Some(r), dynamic_metadata }
}

/// The endpoints of the data plane's subset hint (`filter_metadata[namespace][key]`, a list of
/// `ip:port` strings).
fn subset_hint(msg: &ProcessingRequest, namespace: &str, key: &str) -> Option<Vec<String>> {
    let fields = &msg.metadata_context.as_ref()?.filter_metadata.get(namespace)?.fields;
    let Some(Kind::ListValue(list)) = fields.get(key)?.kind.as_ref() else { return Some(Vec::new()) };
    Some(
        (list.values.iter())
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.trim().to_string()),
                _ => None,
            })
            .collect(),
    )
}

/// `{namespace: {key: value}}` as a protobuf `Struct`.
pub fn nested(namespace: &str, key: &str, value: &str) -> Struct {
    let inner = Struct {
        fields: [(key.to_string(), Value { kind: Some(Kind::StringValue(value.to_string())) })].into_iter().collect(),
    };
    Struct { fields: [(namespace.to_string(), Value { kind: Some(Kind::StructValue(inner)) })].into_iter().collect() }
}
