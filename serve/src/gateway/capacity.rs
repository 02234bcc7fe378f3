//! The engines' KV capacity as they state it, read once at start when `--kv-capacity-tokens`
//! is not given (issue 25, defect 9: an engine the catalogue does not describe).
//!
//! Asked of every backend, first answer wins per backend:
//! - llama.cpp's `GET /props`: `default_generation_settings.n_ctx` (the context of one slot,
//!   `server_slot::n_ctx`, "context size per slot" in llama.cpp's tools/server/server-context.cpp)
//!   × `total_slots` (`-np`): `-c 8192 -np 2` answers n_ctx 4096 and 2 slots (llama-server
//!   b1-0c1e570, vendored in llama-cpp-python 0.3.36). With `--kv-unified` every slot may use the
//!   whole cache and this counts it once per slot: give `--kv-capacity-tokens` there.
//! - vLLM's `/metrics` gauge `vllm:cache_config_info`, whose labels hold the cache config
//!   (`num_gpu_blocks` × `block_size` is the whole KV cache, vllm/v1/metrics/loggers.py).
//! - vLLM's `GET /v1/models` `data[0].max_model_len`: the longest sequence, a lower bound of the
//!   cache (used only when the two above are absent).
//!
//! The policy gets the smallest capacity the backends state (one `RouterContext` for all);
//! a backend that states none leaves the catalogue's (`--gpu/--model/--tp`) in force when no
//! backend states one.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;

use super::scrape::get_limited;

/// Capacities past this are not believed (as `--kv-capacity-tokens`' range).
const MOST_TOKENS: u64 = 1 << 40;

/// A KV capacity an engine stated, and where.
#[derive(Clone, Debug, PartialEq)]
pub struct Stated {
    pub tokens: u64,
    pub source: String,
}

fn believable(t: u64) -> Option<u64> {
    (1..=MOST_TOKENS).contains(&t).then_some(t)
}

/// llama.cpp's `/props`: n_ctx of a slot × the slots.
pub fn from_props(props: &Value) -> Option<Stated> {
    let n_ctx = props["default_generation_settings"]["n_ctx"].as_u64().or_else(|| props["n_ctx"].as_u64())?;
    let slots = props["total_slots"].as_u64().unwrap_or(1).max(1);
    Some(Stated {
        tokens: believable(n_ctx.checked_mul(slots)?)?,
        source: format!("/props: n_ctx {n_ctx} × {slots} slots"),
    })
}

/// vLLM's `vllm:cache_config_info{…,block_size="16",…,num_gpu_blocks="N",…} 1`.
pub fn from_metrics(text: &str) -> Option<Stated> {
    let line = text.lines().find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let labels = &line[line.find('{')? + 1..line.rfind('}')?];
    let label = |name: &str| {
        labels.split(',').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k.trim() == name).then(|| v.trim().trim_matches('"').parse::<u64>().ok()).flatten()
        })
    };
    let (blocks, size) = (label("num_gpu_blocks")?, label("block_size")?);
    Some(Stated {
        tokens: believable(blocks.checked_mul(size)?)?,
        source: format!("/metrics: vllm:cache_config_info num_gpu_blocks {blocks} × block_size {size}"),
    })
}

/// vLLM's `/v1/models`: the first model's `max_model_len`.
pub fn from_models(models: &Value) -> Option<Stated> {
    let len = models["data"][0]["max_model_len"].as_u64()?;
    Some(Stated { tokens: believable(len)?, source: format!("/v1/models: max_model_len {len} (a lower bound)") })
}

/// What the engine at `base` states, within `timeout`; `None` when it states nothing usable.
async fn ask(
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    key: Option<&str>,
    timeout: Duration,
) -> Option<Stated> {
    let get = |path: &'static str| async move {
        let uri: Uri = format!("{base}{path}").parse().ok()?;
        let (_, body) = tokio::time::timeout(timeout, get_limited(client, &uri, key)).await.ok()?.ok()?;
        body
    };
    let json = |b: Bytes| serde_json::from_slice::<Value>(&b).ok();
    if let Some(s) = get("/props").await.and_then(json).as_ref().and_then(from_props) {
        return Some(s);
    }
    if let Some(s) = get("/metrics").await.and_then(|b| from_metrics(&String::from_utf8_lossy(&b))) {
        return Some(s);
    }
    get("/v1/models").await.and_then(json).as_ref().and_then(from_models)
}

/// The smallest capacity `backends` state (with the backend that stated it), or `None`.
/// Each backend is asked concurrently, each request within `timeout`.
pub async fn stated(backends: &[String], key: Option<&str>, timeout: Duration) -> Option<(Stated, String)> {
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
    let asks = backends.iter().map(|b| ask(&client, b.trim_end_matches('/'), key, timeout));
    let answers = super::scrape::futures_join_all(asks).await;
    let mut found: Vec<(Stated, String)> =
        answers.into_iter().zip(backends).filter_map(|(s, b)| Some((s?, b.clone()))).collect();
    let distinct: std::collections::BTreeSet<u64> = found.iter().map(|(s, _)| s.tokens).collect();
    if distinct.len() > 1 {
        eprintln!(
            "serve: the backends state different KV capacities ({distinct:?} tokens); the policy gets the smallest"
        );
    }
    found.sort_by_key(|(s, _)| s.tokens);
    found.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn llama_cpp_props_vllm_cache_config_and_max_model_len_are_read() {
        // As llama-server -c 8192 -np 2 answers (trimmed).
        let props = json!({"default_generation_settings": {"n_ctx": 4096, "params": {}}, "total_slots": 2});
        assert_eq!(from_props(&props).map(|s| s.tokens), Some(8192));
        assert_eq!(from_props(&json!({"total_slots": 2})), None);
        assert_eq!(from_props(&json!({"default_generation_settings": {"n_ctx": 0}, "total_slots": 2})), None);
        let metrics = "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",\
                       enable_prefix_caching=\"True\",num_gpu_blocks=\"27000\",num_cpu_blocks=\"None\"} 1.0\n";
        assert_eq!(from_metrics(metrics).map(|s| s.tokens), Some(432_000));
        assert_eq!(from_metrics("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n"), None);
        let models = json!({"object": "list", "data": [{"id": "m", "max_model_len": 32768}]});
        assert_eq!(from_models(&models).map(|s| s.tokens), Some(32768));
        assert_eq!(from_models(&json!({"data": []})), None);
    }
}
