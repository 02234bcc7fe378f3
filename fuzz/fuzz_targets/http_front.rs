//! Any bytes as what the HTTP front ends read from the network (issue 26):
//! - a completion request body, as `serve` (the gateway's proxy) and `emulate` (the engine's
//!   server) both parse it: an error, or a request the engine can schedule (a prompt of at least
//!   one token, 1 ≤ max_tokens ≤ 10^6) whose segments add up to its token count;
//! - an engine's `/metrics` text, as the gateway scrapes it: a load it can route on (finite,
//!   ≥ 0, and below the "full" mark an open circuit gets, so sums of views cannot overflow), or
//!   none;
//! - a backend's SSE stream cut into frames anywhere, as the gateway relays it: the incremental
//!   search finds exactly the events a plain search of the whole stream finds.
//!
//! The first byte chooses chat or completions and how the stream is cut.
#![no_main]

use libfuzzer_sys::fuzz_target;
use routelab_serve::{prom, proxy, text};

fuzz_target!(|data: &[u8]| {
    let Some((&control, body)) = data.split_first() else { return };
    request(body, control & 1 == 1);
    if let Ok(t) = std::str::from_utf8(body) {
        scrape(t);
    }
    sse(body, 1 + (control >> 1) as usize);
});

fn request(body: &[u8], chat: bool) {
    let Ok(p) = text::parse_request(body, chat) else { return };
    assert!(!p.prompt.is_empty(), "an empty prompt holds an engine slot for ever");
    assert!((1..=1_000_000).contains(&p.max_tokens), "{}", p.max_tokens);
    assert_eq!(p.chat, chat);
    let mut segments = Vec::new();
    text::segments(&p.prompt, &mut segments);
    let tokens = text::tokens_of(&segments);
    assert_eq!(tokens as usize, p.prompt.len().div_ceil(text::BYTES_PER_TOKEN));
    assert!(segments.iter().all(|s| (1..=text::BLOCK_TOKENS as u32).contains(&s.tokens)));
    assert_eq!(text::parse_request(body, chat).as_ref(), Ok(&p), "a function of the body");
}

fn scrape(t: &str) {
    let Some(load) = prom::engine_load(t) else { return };
    for (name, v) in [("waiting", load.waiting), ("running", load.running)] {
        assert!(v.is_finite() && (0.0..=(u32::MAX / 4) as f64).contains(&v), "{name} = {v}");
    }
    assert!((0.0..=1.0).contains(&load.kv_usage), "kv_usage = {}", load.kv_usage);
}

/// The events of `stream` as found one frame at a time (the gateway's `pump`), against a plain
/// search of the whole.
fn sse(stream: &[u8], frame: usize) {
    let mut whole = Vec::new();
    let mut at = 0;
    while let Some(end) = reference_end(&stream[at..]) {
        whole.push(&stream[at..at + end]);
        at += end;
    }
    let mut found: Vec<Vec<u8>> = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut scanned = 0;
    for chunk in stream.chunks(frame) {
        buf.extend_from_slice(chunk);
        while let Some(end) = proxy::event_end(&buf, scanned) {
            scanned = 0;
            let event: Vec<u8> = buf.drain(..end).collect();
            let _ = proxy::sse_data(&event);
            found.push(event);
        }
        scanned = buf.len();
    }
    assert_eq!(found.len(), whole.len(), "frames of {frame}: {found:?} vs {whole:?}");
    assert!(found.iter().zip(&whole).all(|(a, b)| a == b));
}

/// Just past the first blank line ("\n\n" or "\n\r\n"), searched naively.
fn reference_end(s: &[u8]) -> Option<usize> {
    (0..s.len()).find_map(|i| {
        if s[i] != b'\n' {
            return None;
        }
        match &s[i + 1..] {
            [b'\n', ..] => Some(i + 2),
            [b'\r', b'\n', ..] => Some(i + 3),
            _ => None,
        }
    })
}
