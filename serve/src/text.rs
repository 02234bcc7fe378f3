//! From an OpenAI-style request body to the cluster world's request view: the prompt text, its
//! token count, and its segments (the blocks a prefix cache shares), plus the inverse used by the
//! load generator (a generated request stream written out as text with the same prefix structure).
//!
//! Tokenisation is the documented byte-level fallback, the same in the gateway and the emulated
//! engine: every [`BYTES_PER_TOKEN`] bytes of the prompt's UTF-8 are one token (≈ what BPE
//! tokenisers average on English text), and every [`BLOCK_TOKENS`] tokens form one segment whose
//! id chains the previous block's id with this block's bytes — vLLM's block hashing, so two
//! prompts share exactly the segments of their common leading blocks. The last, partial block is
//! its own segment.
//!
//! With `--tokenizer tokenizer.json` (`Tokenizer::Hf`, the `tokenizers` crate, in a build with
//! the `tokenizer` feature; without it the flag is refused with how to turn it on) the prompt is
//! the engine's token ids instead (special tokens added, as vLLM's completions encode it), and
//! a segment is every [`BLOCK_TOKENS`] ids, its id chained over the ids: blocks fall where the
//! engine's KV blocks fall, and prompts that tokenise alike share blocks even where their bytes
//! differ (and the other way round). Chat prompts are the flattened text below, not the
//! engine's chat template, so their counts are close rather than exact.
//!
//! Chat requests are flattened to `role: content\n` lines in order, so conversations that extend
//! the same history share its blocks.

use routelab_policy_api::Segment;
use serde_json::Value;

use routelab_core::seeds::mix;
use routelab_core::workload::generate::RequestStream;

/// Bytes of UTF-8 per token in the byte-level fallback.
pub const BYTES_PER_TOKEN: usize = 4;
/// Tokens per segment (vLLM's default KV block is 16 tokens).
pub const BLOCK_TOKENS: usize = 16;
/// Output tokens when a request gives no `max_tokens` (as vLLM's completions default).
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// What the gateway and the engine need of a completion request.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    pub chat: bool,
    pub model: Option<String>,
    pub stream: bool,
    /// `max_tokens` (or `max_completion_tokens`), [`DEFAULT_MAX_TOKENS`] when absent.
    pub max_tokens: u32,
    /// Whether the request gave it: engines generate until EOS or the context's end without one.
    pub max_tokens_given: bool,
    pub prompt: String,
}

/// A request body the gateway refuses: the message of an OpenAI-style `invalid_request_error`.
#[derive(Clone, Debug, PartialEq)]
pub struct InvalidRequest(pub String);

impl std::fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidRequest {}

impl From<&str> for InvalidRequest {
    fn from(message: &str) -> Self {
        InvalidRequest(message.to_string())
    }
}

/// Parses a `/v1/completions` (`chat` false) or `/v1/chat/completions` body; an
/// [`InvalidRequest`] says what is wrong with it.
pub fn parse_request(body: &[u8], chat: bool) -> Result<Parsed, InvalidRequest> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| InvalidRequest(format!("request body is not JSON: {e}")))?;
    let obj = v.as_object().ok_or("request body must be a JSON object")?;
    let prompt = if chat {
        let msgs = obj.get("messages").and_then(Value::as_array).ok_or("'messages' must be an array of messages")?;
        let mut text = String::new();
        for m in msgs {
            let Some(m) = m.as_object() else {
                return Err("each of 'messages' must be an object {\"role\", \"content\"}".into());
            };
            let role = match m.get("role") {
                None => "user",
                Some(Value::String(r)) => r,
                Some(_) => return Err("a message's 'role' must be a string".into()),
            };
            text.push_str(role);
            text.push_str(": ");
            match m.get("content") {
                Some(Value::String(s)) => text.push_str(s),
                // Content parts: the text parts in order.
                Some(Value::Array(parts)) => {
                    for p in parts {
                        if let Some(t) = p.get("text").and_then(Value::as_str) {
                            text.push_str(t);
                        }
                    }
                }
                None | Some(Value::Null) => {}
                Some(_) => return Err("a message's 'content' must be a string or an array of parts".into()),
            }
            text.push('\n');
        }
        text
    } else {
        match obj.get("prompt") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
            Some(_) => return Err("'prompt' must be a string (batched and token-id prompts are not supported)".into()),
            None => return Err("'prompt' is required".into()),
        }
    };
    // An engine cannot schedule a request with no prompt token (vLLM refuses it too): it would
    // hold a batch slot and never finish.
    if prompt.is_empty() {
        return Err(if chat { "'messages' must not be empty" } else { "'prompt' must not be empty" }.into());
    }
    let given = obj.get("max_tokens").or_else(|| obj.get("max_completion_tokens")).filter(|v| !v.is_null());
    let max_tokens = match given {
        None => DEFAULT_MAX_TOKENS,
        Some(n) => match n.as_u64() {
            Some(n) if (1..=1_000_000).contains(&n) => n as u32,
            _ => return Err("'max_tokens' must be an integer from 1 to 1000000".into()),
        },
    };
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(_) => return Err("'model' must be a string".into()),
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("'stream' must be true or false".into()),
    };
    Ok(Parsed { chat, model, stream, max_tokens, max_tokens_given: given.is_some(), prompt })
}

/// How prompts become tokens: the byte-level fallback, or a Hugging Face `tokenizer.json`.
#[derive(Clone, Default)]
pub enum Tokenizer {
    #[default]
    Bytes,
    #[cfg(feature = "tokenizer")]
    Hf(Box<tokenizers::Tokenizer>),
}

impl Tokenizer {
    /// `--tokenizer PATH` (`flag` names the option in the error), or the byte-level fallback.
    #[cfg(feature = "tokenizer")]
    pub fn load(path: Option<&std::path::Path>, flag: &str) -> Result<Self, routelab_core::workload::InputError> {
        let Some(path) = path else { return Ok(Tokenizer::Bytes) };
        tokenizers::Tokenizer::from_file(path).map(|t| Tokenizer::Hf(Box::new(t))).map_err(|e| {
            routelab_core::workload::InputError::command_line(
                flag,
                format!("{}: not a tokenizer.json that can be read: {e}", path.display()),
                "give the model's Hugging Face tokenizer.json (the file next to its weights), or leave it out for \
                 the byte-level fallback",
            )
        })
    }

    /// `--tokenizer PATH` in a build without the `tokenizer` feature: refused, saying how to get
    /// it (before anything starts, as a bad file is in a build with it).
    #[cfg(not(feature = "tokenizer"))]
    pub fn load(path: Option<&std::path::Path>, flag: &str) -> Result<Self, routelab_core::workload::InputError> {
        let Some(path) = path else { return Ok(Tokenizer::Bytes) };
        Err(routelab_core::workload::InputError::command_line(
            flag,
            format!(
                "{}: this routelab was built without the `tokenizer` feature, so it cannot read a tokenizer.json",
                path.display()
            ),
            "build it with the feature (`cargo install --locked --path host --features tokenizer`, or \
             `cargo run --features tokenizer -- …` in the checkout), or leave the flag out for the byte-level \
             fallback",
        ))
    }

    /// The prompt's segments: one per block of [`BLOCK_TOKENS`] tokens (the last may be shorter),
    /// ids chained over the blocks' bytes (fallback) or token ids (a tokenizer.json). An empty
    /// prompt has no segment; a prompt the tokenizer fails on falls back to bytes.
    pub fn segments(&self, prompt: &str, out: &mut Vec<Segment>) {
        self.segments_and_ids(prompt, out, None)
    }

    /// As [`Tokenizer::segments`], and with a tokenizer.json the prompt's token ids into `ids`
    /// (left empty by the byte-level fallback, which has none).
    pub fn segments_and_ids(&self, prompt: &str, out: &mut Vec<Segment>, ids: Option<&mut Vec<u32>>) {
        match self {
            Tokenizer::Bytes => {
                if let Some(ids) = ids {
                    ids.clear();
                }
                segments(prompt, out)
            }
            #[cfg(feature = "tokenizer")]
            Tokenizer::Hf(t) => {
                let enc = t.encode(prompt, true).ok();
                if let Some(ids) = ids {
                    ids.clear();
                    ids.extend_from_slice(enc.as_ref().map_or(&[][..], |e| e.get_ids()));
                }
                match enc {
                    Some(e) => segments_of_ids(e.get_ids(), out),
                    None => segments(prompt, out),
                }
            }
        }
    }
}

/// Segments of token ids: one per [`BLOCK_TOKENS`] ids (the last may be shorter).
#[cfg_attr(not(feature = "tokenizer"), allow(dead_code))]
fn segments_of_ids(ids: &[u32], out: &mut Vec<Segment>) {
    out.clear();
    let mut id = 0u64;
    for block in ids.chunks(BLOCK_TOKENS) {
        id = segment_id(id, block);
        out.push(Segment { id, tokens: block.len() as u32 });
    }
}

/// The id of a segment of token ids after the segment `prev` (0 for the first): the chaining
/// [`Tokenizer::segments`] uses, shared with the KV events' blocks so the two match.
pub fn segment_id(prev: u64, ids: &[u32]) -> u64 {
    let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    mix(prev ^ fnv1a(&bytes))
}

/// The byte-level fallback's segments: one per block of [`BLOCK_TOKENS`] tokens (the last may be
/// shorter), ids chained over the blocks' bytes. An empty prompt has no segment.
pub fn segments(prompt: &str, out: &mut Vec<Segment>) {
    out.clear();
    let block_bytes = BLOCK_TOKENS * BYTES_PER_TOKEN;
    let mut id = 0u64;
    for block in prompt.as_bytes().chunks(block_bytes) {
        id = mix(id ^ fnv1a(block));
        out.push(Segment { id, tokens: block.len().div_ceil(BYTES_PER_TOKEN) as u32 });
    }
}

/// Tokens of a prompt (the sum of its segments' tokens).
pub fn tokens_of(segments: &[Segment]) -> u32 {
    segments.iter().map(|s| s.tokens).sum()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Request `i` of a generated stream as prompt text: each segment becomes
/// `tokens × BYTES_PER_TOKEN` bytes of lowercase letters drawn from its id, so requests that share
/// leading segments share leading text (and hence, block-aligned, leading cache blocks).
pub fn prompt_text(stream: &RequestStream, i: usize) -> String {
    let mut text = String::new();
    for s in stream.prompt(i) {
        let mut x = s.id;
        for _ in 0..s.tokens as usize * BYTES_PER_TOKEN {
            x = mix(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
            text.push((b'a' + (x % 26) as u8) as char);
        }
    }
    text
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use routelab_core::workload::generate::GeneratedRequest;

    #[test]
    fn shared_leading_text_shares_leading_segments() {
        let shared = "s".repeat(200);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        segments(&format!("{shared}first question"), &mut a);
        segments(&format!("{shared}second one, longer"), &mut b);
        // 200 shared bytes = 3 whole 64-byte blocks; the fourth block differs.
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
        assert_eq!(tokens_of(&a), (200 + 14usize).div_ceil(4) as u32);
        segments("", &mut a);
        assert!(a.is_empty());
    }

    #[test]
    fn requests_parse_and_bad_ones_say_why() {
        let p = parse_request(br#"{"model":"m","prompt":"hi","max_tokens":5,"stream":true}"#, false).unwrap();
        assert_eq!((p.stream, p.max_tokens, p.prompt.as_str(), p.model.as_deref()), (true, 5, "hi", Some("m")));
        let c = parse_request(br#"{"messages":[{"role":"system","content":"a"},{"role":"user","content":"b"}]}"#, true)
            .unwrap();
        assert_eq!((c.prompt.as_str(), c.max_tokens, c.stream), ("system: a\nuser: b\n", DEFAULT_MAX_TOKENS, false));
        assert!(p.max_tokens_given && !c.max_tokens_given);
        assert!(parse_request(b"{", false).unwrap_err().0.contains("not JSON"));
        assert!(parse_request(br#"{"prompt":"x","max_tokens":0}"#, false).unwrap_err().0.contains("max_tokens"));
        assert!(parse_request(br#"{"prompt":[1,2]}"#, false).unwrap_err().0.contains("prompt"));
        assert!(parse_request(br#"{"prompt":"x"}"#, true).unwrap_err().0.contains("messages"));
    }

    #[test]
    fn fields_of_the_wrong_type_are_refused() {
        assert!(parse_request(br#"{"messages":[1,2]}"#, true).unwrap_err().0.contains("messages"));
        assert!(parse_request(br#"{"messages":[{"role":5,"content":"a"}]}"#, true).unwrap_err().0.contains("role"));
        assert!(parse_request(br#"{"messages":[{"content":7}]}"#, true).unwrap_err().0.contains("content"));
        assert!(parse_request(br#"{"prompt":"x","stream":"yes"}"#, false).unwrap_err().0.contains("stream"));
        assert!(parse_request(br#"{"prompt":"x","model":5}"#, false).unwrap_err().0.contains("model"));
        assert!(parse_request(br#"{"prompt":"x","model":null,"stream":null}"#, false).is_ok());
    }

    #[test]
    fn a_streams_shared_segments_become_shared_leading_blocks() {
        // Two prompts: the same 64-token system segment, then different 20-token queries.
        let mut s = RequestStream {
            requests: Vec::new(),
            segments: vec![
                Segment { id: 1, tokens: 64 },
                Segment { id: 7, tokens: 20 },
                Segment { id: 1, tokens: 64 },
                Segment { id: 8, tokens: 20 },
            ],
            labels: Vec::new(),
            ..Default::default()
        };
        for k in 0..2u32 {
            s.requests.push(GeneratedRequest {
                arrived_at: routelab_core::time::SimTime::ZERO,
                prompt_tokens: 84,
                output_tokens: 1,
                segments: 2 * k..2 * k + 2,
                output_segment: None,
            });
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        segments(&prompt_text(&s, 0), &mut a);
        segments(&prompt_text(&s, 1), &mut b);
        assert_eq!((tokens_of(&a), tokens_of(&b)), (84, 84), "token counts survive the round trip");
        assert_eq!(a[..4], b[..4], "the 64 shared tokens are 4 shared blocks");
        assert_ne!(a[4], b[4]);
    }

    /// A word-level tokenizer.json: one id per whitespace-separated word of `words`, `[UNK]` 0.
    #[cfg(feature = "tokenizer")]
    pub fn word_level(words: &[&str]) -> String {
        let vocab: serde_json::Map<String, Value> = std::iter::once("[UNK]")
            .chain(words.iter().copied())
            .enumerate()
            .map(|(i, w)| (w.to_string(), Value::from(i)))
            .collect();
        serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
            "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
        })
        .to_string()
    }

    #[cfg(feature = "tokenizer")]
    #[test]
    fn a_tokenizer_json_puts_block_boundaries_at_every_16_token_ids() {
        let words: Vec<String> = (0..40).map(|i| format!("w{}", "x".repeat(i % 7) + &i.to_string())).collect();
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        let path = std::env::temp_dir().join(format!("routelab-tokenizer-{}.json", std::process::id()));
        std::fs::write(&path, word_level(&refs)).unwrap();
        let tok = Tokenizer::load(Some(&path), "--tokenizer").expect("loads");
        let _ = std::fs::remove_file(&path);
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        // 20 words: 20 ids, blocks of 16 and 4, whatever the words' byte lengths.
        let first: Vec<&str> = refs[..20].to_vec();
        tok.segments(&first.join(" "), &mut a);
        assert_eq!(a.iter().map(|s| s.tokens).collect::<Vec<_>>(), [16, 4]);
        // The same 16 leading ids spaced differently: the same first block (not so by bytes).
        let spaced = format!("{}   {}", refs[..16].join("  "), refs[30..34].join(" "));
        tok.segments(&spaced, &mut b);
        assert_eq!((b.len(), a[0], b[1].tokens), (2, b[0], 4));
        assert_ne!(a[1], b[1], "the second block's ids differ");
        segments(&first.join(" "), &mut c);
        let mut d = Vec::new();
        segments(&spaced, &mut d);
        assert_ne!(c[0], d[0], "by bytes the two prompts share no block");
        // Unknown words are id 0 and still count as tokens.
        tok.segments("nothing known here", &mut c);
        assert_eq!(tokens_of(&c), 3);
        // A file that is no tokenizer is refused, naming the option and the file.
        let bad = std::env::temp_dir().join(format!("routelab-not-a-tokenizer-{}.json", std::process::id()));
        std::fs::write(&bad, "{}").unwrap();
        let e = Tokenizer::load(Some(&bad), "--tokenizer").err().expect("refused").to_string();
        let _ = std::fs::remove_file(&bad);
        assert!(e.contains("--tokenizer") && e.contains("routelab-not-a-tokenizer"), "{e}");
    }

    #[cfg(not(feature = "tokenizer"))]
    #[test]
    fn without_the_feature_a_tokenizer_is_refused_saying_how_to_build_it() {
        let path = std::path::Path::new("/models/tokenizer.json");
        let e = Tokenizer::load(Some(path), "--tokenizer").err().expect("refused").to_string();
        assert!(
            e.contains("--tokenizer") && e.contains("/models/tokenizer.json") && e.contains("--features tokenizer"),
            "{e}"
        );
        assert!(matches!(Tokenizer::load(None, "--tokenizer"), Ok(Tokenizer::Bytes)));
    }
}
