//! `routelab export-trace`: a cluster workload's request stream as a Mooncake-format trace
//! (JSON Lines, the format [`super::mooncake`] replays), so a workload moves between routelab and
//! other simulators that read `hash_ids` block traces.
//!
//! Each request becomes one line, `{"timestamp": ms, "input_length": tokens, "output_length":
//! tokens, "hash_ids": [...]}`: the prompt is cut into 512-token blocks (the last one partial) and
//! each block gets an id that names its whole prefix — the chain of every (segment, offset,
//! length) piece from the prompt's start to the block's end, hashed to 64 bits, then numbered
//! 0, 1, 2, … in order of first appearance. Equal prefixes therefore give equal ids, and a partial
//! block never shares an id with a block of another length. Timestamps are the arrivals rounded
//! to the millisecond.
//!
//! What a replay of the file keeps and loses: arrivals (to 1 ms, measured from the first
//! request), prompt and output lengths exactly, and prefix sharing at 512-token granularity —
//! two prompts that agree on 1,600 tokens share 3 blocks (1,536 tokens) in the replay. A
//! multi-turn conversation's earlier answers appear in later prompts as blocks like any other,
//! but the replay does not know they were generated (routelab keeps an answer cached after a turn
//! completes; a replayed trace has no such link).
//!
//! Agent sessions (`generator.session`) carry their graph in the format's session fields
//! ([`super::mooncake`]): `session_id` (the session's number), `call_index` (its calls in stream
//! order), `parents` (the calls it waits for, written when they are not just the previous call:
//! sub-agents, and the call that joins them) and `wait_s` (the tool's run after the last parent
//! completes, exact to the nanosecond tick). A replay sends each call when its parents complete,
//! as the run did, so the per-request stream — who waits for whom, for how long, with which
//! prompt and output lengths — is the same. A stream with LoRA adapters (`cluster.lora`) writes
//! every row's `adapter` (`null`: the base model), which the replay keeps instead of drawing. A
//! workload with `classes:` or `tenants:` writes every row's `class` and `tenant` (indices into
//! them), with which a replay of the file under the same workload labels its requests.
//! Turn groups (`turns`, `think_time_s`) are open-loop in routelab — a turn arrives at its time
//! whatever the previous answer did — so their timestamps alone replay them.

use std::collections::HashMap;
use std::io::{self, Write};

use routelab_policy_api::{Segment, mix64};

use super::generate::RequestStream;
use super::mooncake::BLOCK_TOKENS;
use crate::time::{SimTime, seconds};

/// The chain key of the empty prefix.
const ROOT_KEY: u64 = 0x6a09_e667_f3bc_c908;

/// Extends a prefix key by `take` tokens of segment `s` starting at `offset`.
#[inline]
fn extend(key: u64, s: Segment, offset: u32, take: u32) -> u64 {
    mix64(key.rotate_left(23) ^ mix64(s.id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((offset as u64) << 32 | take as u64)))
}

/// Numbers prefix keys in order of first appearance.
#[derive(Default)]
pub struct BlockIds {
    ids: HashMap<u64, u64>,
}

impl BlockIds {
    /// The `hash_ids` of a prompt, into `out` (cleared first).
    pub fn of(&mut self, prompt: &[Segment], out: &mut Vec<u64>) {
        out.clear();
        let mut key = ROOT_KEY;
        let mut fill = 0;
        for &s in prompt {
            let mut offset = 0;
            while offset < s.tokens {
                let take = (BLOCK_TOKENS - fill).min(s.tokens - offset);
                key = extend(key, s, offset, take);
                fill += take;
                offset += take;
                if fill == BLOCK_TOKENS {
                    out.push(self.id(key));
                    fill = 0;
                }
            }
        }
        if fill > 0 {
            // A partial block: marked, so it never takes the id of a full block.
            out.push(self.id(mix64(key ^ 0x5a5a_0000 ^ fill as u64)));
        }
    }

    fn id(&mut self, key: u64) -> u64 {
        let next = self.ids.len() as u64;
        *self.ids.entry(key).or_insert(next)
    }

    /// Distinct blocks numbered so far.
    pub fn distinct(&self) -> usize {
        self.ids.len()
    }
}

/// Each request's index among its session's calls (`None`: no agent sessions).
fn call_indexes(stream: &RequestStream) -> Option<Vec<u32>> {
    let s = stream.sessions.as_ref()?;
    let mut next = vec![0u32; s.count as usize];
    Some(
        s.session
            .iter()
            .map(|&k| {
                next[k as usize] += 1;
                next[k as usize] - 1
            })
            .collect(),
    )
}

/// Appends request `i`'s session, adapter, class and tenant fields (those it has) to `line`.
fn push_extensions(stream: &RequestStream, calls: Option<&[u32]>, i: usize, line: &mut String) {
    if let (Some(s), Some(calls)) = (stream.sessions.as_ref(), calls) {
        let call = calls[i];
        line.push_str(&format!(", \"session_id\": {}, \"call_index\": {call}", s.session[i]));
        let parents: Vec<u32> = s.parents(i).iter().map(|&p| calls[p as usize]).collect();
        if call > 0 {
            if parents != [call - 1] {
                let list: Vec<String> = parents.iter().map(u32::to_string).collect();
                line.push_str(&format!(", \"parents\": [{}]", list.join(", ")));
            }
            if s.pause[i] > SimTime::ZERO {
                line.push_str(&format!(", \"wait_s\": {}", seconds(s.pause[i])));
            }
        }
    }
    if !stream.adapters.is_empty() {
        match stream.adapter(i) {
            Some(a) => line.push_str(&format!(", \"adapter\": {a}")),
            None => line.push_str(", \"adapter\": null"),
        }
    }
    if !stream.labels.is_empty() {
        let l = stream.label(i);
        line.push_str(&format!(", \"class\": {}, \"tenant\": {}", l.class, l.tenant));
    }
}

/// Writes `stream` as Mooncake JSON Lines; returns the number of distinct blocks.
pub fn write_mooncake(stream: &RequestStream, out: &mut impl Write) -> io::Result<usize> {
    write_mooncake_with_models(stream, &[], out)
}

/// [`write_mooncake`] naming every row's `model` by `models` (the workload's `cluster.models`
/// names, in order) when there are several; the replay keeps them.
pub fn write_mooncake_with_models(stream: &RequestStream, models: &[&str], out: &mut impl Write) -> io::Result<usize> {
    let mut ids = BlockIds::default();
    let mut hash_ids = Vec::new();
    let mut line = String::new();
    let calls = call_indexes(stream);
    for (i, r) in stream.requests.iter().enumerate() {
        ids.of(stream.prompt(i), &mut hash_ids);
        let ms = (seconds(r.arrived_at) * 1000.0).round() as u64;
        line.clear();
        line.push_str(&format!(
            "{{\"timestamp\": {ms}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [",
            r.prompt_tokens, r.output_tokens
        ));
        for (k, id) in hash_ids.iter().enumerate() {
            if k > 0 {
                line.push_str(", ");
            }
            line.push_str(&id.to_string());
        }
        line.push(']');
        push_extensions(stream, calls.as_deref(), i, &mut line);
        if models.len() > 1 {
            line.push_str(&format!(", \"model\": \"{}\"", models[stream.model(i) as usize]));
        }
        line.push_str("}\n");
        out.write_all(line.as_bytes())?;
    }
    Ok(ids.distinct())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::workload::cluster::ClusterSpec;
    use crate::workload::generate::{generate, mooncake_stream};
    use crate::workload::mooncake;

    fn seg(id: u64, tokens: u32) -> Segment {
        Segment { id, tokens }
    }

    /// The prompt token by token, each token named by (segment id, position in the segment).
    fn tokens(prompt: &[Segment]) -> Vec<(u64, u32)> {
        prompt.iter().flat_map(|s| (0..s.tokens).map(move |k| (s.id, k))).collect()
    }

    /// Blocks `k` of two prompts get the same id exactly when the prompts agree token for token
    /// up to the end of block `k` (and the block has the same length in both).
    #[test]
    fn equal_ids_exactly_for_equal_prefixes() {
        let prompts: Vec<Vec<Segment>> = vec![
            vec![seg(1, 300), seg(2, 1300), seg(100, 150)],
            vec![seg(1, 300), seg(2, 1300), seg(101, 250)],
            vec![seg(1, 300), seg(3, 1300), seg(102, 150)],
            vec![seg(1, 300), seg(2, 212)],
            vec![seg(1, 512), seg(2, 512)],
            vec![seg(1, 300), seg(2, 1300), seg(100, 150), seg(103, 40)],
            vec![seg(1, 100)],
        ];
        let mut ids = BlockIds::default();
        let all: Vec<Vec<u64>> = prompts
            .iter()
            .map(|p| {
                let mut out = Vec::new();
                ids.of(p, &mut out);
                out
            })
            .collect();
        for (a, pa) in prompts.iter().enumerate() {
            let (ta, ia) = (tokens(pa), &all[a]);
            assert_eq!(ia.len(), ta.len().div_ceil(512), "prompt {a}: one id per block");
            for (b, pb) in prompts.iter().enumerate() {
                let (tb, ib) = (tokens(pb), &all[b]);
                for k in 0..ia.len().min(ib.len()) {
                    let end_a = ((k + 1) * 512).min(ta.len());
                    let end_b = ((k + 1) * 512).min(tb.len());
                    let same = end_a == end_b && ta[..end_a] == tb[..end_b];
                    assert_eq!(ia[k] == ib[k], same, "prompts {a} and {b}, block {k}");
                }
            }
        }
        // Prompts 0 and 1 agree on 1,600 tokens: 3 blocks (1,536 tokens) shared.
        assert_eq!(all[0][..3], all[1][..3]);
        assert_ne!(all[0][3], all[1][3]);
    }

    /// Exporting a generated stream and replaying the file gives the same arrivals (to the
    /// millisecond, from the first), the same lengths, and prompts whose segments are the blocks.
    #[test]
    fn an_exported_stream_replays_with_the_same_arrivals_and_lengths() {
        let spec: ClusterSpec = serde_norway::from_str(
            "{replicas: 2, gpu: a6000, model: mistral-7b, generator: {system_prompt_tokens: 300, contexts: {count: 20, \
             tokens: {lognormal: {mean: 1300, cv: 0.25, max: 4000}}, popularity: {zipf: {s: 1.5}}}, suffix_tokens: \
             {uniform: {min: 100, max: 300}}, output_tokens: {uniform: {min: 10, max: 76}}, turns: {uniform: {min: 1, \
             max: 3}}}, arrivals: {poisson: {rate: 5.0}}, requests: 300}",
        )
        .unwrap();
        let stream = generate(&spec, None, 7).unwrap();
        let mut text = Vec::new();
        let blocks = write_mooncake(&stream, &mut text).unwrap();
        let rows = mooncake::parse(std::str::from_utf8(&text).unwrap(), Path::new("export.jsonl")).unwrap();
        let replay = mooncake_stream(&spec, &rows);
        assert_eq!(replay.requests.len(), stream.requests.len());
        let t0 = seconds(stream.requests[0].arrived_at);
        let mut ids = BlockIds::default();
        let mut want = Vec::new();
        for (i, (a, b)) in stream.requests.iter().zip(&replay.requests).enumerate() {
            let shift = seconds(a.arrived_at) - t0;
            assert!((seconds(b.arrived_at) - shift).abs() <= 0.001, "request {i}: arrival");
            assert_eq!((a.prompt_tokens, a.output_tokens), (b.prompt_tokens, b.output_tokens), "request {i}");
            ids.of(stream.prompt(i), &mut want);
            let got: Vec<u64> = replay.prompt(i).iter().map(|s| s.id - mooncake::HASH_ID_BASE).collect();
            assert_eq!(got, want, "request {i}: one segment per block, named by its id");
        }
        assert!(blocks < stream.requests.len() * 4, "shared prefixes share blocks ({blocks} blocks)");
    }

    /// An agentic stream with LoRA adapters (sub-agent bursts joined by one call, tool pauses,
    /// adapters per session) exported and replayed is the same per-request stream: the same
    /// session of every call, the same calls waited for and pauses (to the tick), the same
    /// session starts (to the millisecond), lengths and adapters.
    #[test]
    fn an_agentic_stream_with_adapters_replays_as_the_same_stream() {
        let spec: ClusterSpec = serde_norway::from_str(
            "{replicas: 2, gpu: a6000, model: mistral-7b, generator: {system_prompt_tokens: 700, suffix_tokens: \
             {uniform: {min: 100, max: 400}}, output_tokens: {uniform: {min: 10, max: 200}}, session: {steps: \
             {uniform: {min: 2, max: 5}}, tool_tokens: {uniform: {min: 50, max: 600}}, tool_pause_s: {lognormal: \
             {mean: 3, cv: 1.0, max: 30}}, subagents: {probability: 0.4, burst: {uniform: {min: 2, max: 5}}, depth: \
             1, steps: {uniform: {min: 1, max: 3}}, task_tokens: 80}}}, lora: {adapters: 6, popularity: {zipf: {s: \
             1.0}}, base_share: 0.2, max_loras: 2}, arrivals: {poisson: {rate: 1.0}}, requests: 150}",
        )
        .unwrap();
        spec.validate().unwrap();
        let mut stream = generate(&spec, None, 5).unwrap();
        crate::workload::generate::apply_lora(&spec, &mut stream, 5);
        let mut text = Vec::new();
        write_mooncake(&stream, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        let rows = mooncake::parse(&text, Path::new("agentic.jsonl")).unwrap();
        mooncake::check_adapters(&rows, spec.lora.as_ref(), Path::new("agentic.jsonl")).unwrap();
        // Another seed's draw must not matter: the trace's adapters are kept.
        let mut replay = mooncake_stream(&spec, &rows);
        crate::workload::generate::apply_lora(&spec, &mut replay, 99);

        let (a, b) = (stream.sessions.as_ref().unwrap(), replay.sessions.as_ref().unwrap());
        assert_eq!(replay.requests.len(), stream.requests.len());
        assert_eq!((a.count, &a.session), (b.count, &b.session), "every call in the same session");
        let t0 = seconds(stream.requests[0].arrived_at);
        let (mut joins, mut paused, mut on_adapter, mut on_base) = (0, 0, 0, 0);
        for i in 0..stream.requests.len() {
            let (x, y) = (&stream.requests[i], &replay.requests[i]);
            assert_eq!((x.prompt_tokens, x.output_tokens), (y.prompt_tokens, y.output_tokens), "request {i}");
            assert_eq!(a.parents(i), b.parents(i), "request {i}: the calls it waits for");
            assert_eq!(a.pause[i], b.pause[i], "request {i}: its tool pause, to the tick");
            if a.parents(i).is_empty() {
                let shift = seconds(x.arrived_at) - t0;
                assert!((seconds(y.arrived_at) - shift).abs() <= 0.001, "request {i}: session start");
            }
            assert_eq!(stream.adapter(i), replay.adapter(i), "request {i}: adapter");
            joins += (a.parents(i).len() > 1) as u32;
            paused += (a.pause[i] > SimTime::ZERO) as u32;
            on_adapter += stream.adapter(i).is_some() as u32;
            on_base += stream.adapter(i).is_none() as u32;
        }
        // The stream exercises what the fields carry: joins of bursts, pauses, both kinds of request.
        assert!(joins > 0 && paused > 0 && on_adapter > 0 && on_base > 0, "{joins} {paused} {on_adapter} {on_base}");
        // Exporting the replay writes the same file but for the time origin: the trace is a
        // fixed point of export → replay → export.
        let mut again = Vec::new();
        write_mooncake(&replay, &mut again).unwrap();
        let again = String::from_utf8(again).unwrap();
        let body = |t: &str| -> Vec<String> {
            t.lines().map(|l| l.split_once("\"input_length\"").unwrap().1.to_string()).collect()
        };
        assert_eq!(body(&again), body(&text));
    }

    /// A stream with classes and tenants, exported and replayed under the same workload, keeps
    /// every request's class and tenant (and is a fixed point of export → replay → export); the
    /// same file replayed by a workload without `classes:` or `tenants:` carries no labels, and a
    /// stream without them writes neither field.
    #[test]
    fn classes_and_tenants_survive_export_and_replay() {
        let spec: ClusterSpec = serde_norway::from_str(
            "{replicas: 2, gpu: a6000, model: mistral-7b, generator: {system_prompt_tokens: 300, suffix_tokens: \
             {uniform: {min: 50, max: 200}}, output_tokens: {uniform: {min: 10, max: 80}}, turns: {uniform: {min: 1, \
             max: 3}}}, classes: [{name: critical, share: 0.3, priority: 2, slo: {ttft_s: 1}}, {name: standard, share: \
             0.4}, {name: batch, share: 0.3, priority: -1, output_tokens: {uniform: {min: 200, max: 400}}}], tenants: \
             [{name: a, weight: 4}, {name: b, weight: 1}, {name: c, weight: 1}], arrivals: {poisson: {rate: 20}}, \
             requests: 400}",
        )
        .unwrap();
        spec.validate().unwrap();
        let stream = generate(&spec, None, 4).unwrap();
        let mut text = Vec::new();
        write_mooncake(&stream, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        let rows = mooncake::parse(&text, Path::new("classes.jsonl")).unwrap();
        mooncake::check_labels(&rows, &spec, Path::new("classes.jsonl")).unwrap();
        let replay = mooncake_stream(&spec, &rows);
        assert_eq!(replay.requests.len(), stream.requests.len());
        assert_eq!(replay.labels.len(), stream.requests.len());
        assert_eq!(replay.labels, stream.labels, "every request's class and tenant");
        for k in 0..3 {
            assert!(stream.labels.iter().any(|l| l.class == k), "class {k} appears");
            assert!(stream.labels.iter().any(|l| l.tenant == k as u32), "tenant {k} appears");
        }
        let mut again = Vec::new();
        write_mooncake(&replay, &mut again).unwrap();
        let body = |t: &str| -> Vec<String> {
            t.lines().map(|l| l.split_once("\"input_length\"").unwrap().1.to_string()).collect()
        };
        assert_eq!(body(&String::from_utf8(again).unwrap()), body(&text));
        // Without classes and tenants: no labels kept, no fields written.
        let mut plain = spec.clone();
        (plain.classes, plain.tenants) = (Vec::new(), Vec::new());
        assert!(mooncake_stream(&plain, &rows).labels.is_empty());
        let mut out = Vec::new();
        write_mooncake(&generate(&plain, None, 4).unwrap(), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(!out.contains("\"class\"") && !out.contains("\"tenant\""));
    }

    /// A call whose parents are not the previous call (a sub-agent's first call, a join) writes
    /// them; a chain does not.
    #[test]
    fn parents_are_written_only_when_not_the_previous_call() {
        let rows = mooncake::parse(
            "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2], \"session_id\": 0, \"call_index\": 0}\n\
             {\"timestamp\": 0, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 3], \"session_id\": 0, \"call_index\": 1}\n\
             {\"timestamp\": 0, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 4], \"session_id\": 0, \"call_index\": 2, \"parents\": [0]}\n\
             {\"timestamp\": 0, \"input_length\": 900, \"output_length\": 5, \"hash_ids\": [1, 5], \"session_id\": 0, \"call_index\": 3, \"parents\": [1, 2], \"wait_s\": 0.25}\n",
            Path::new("p.jsonl"),
        )
        .unwrap();
        let spec: ClusterSpec = serde_norway::from_str(
            "{replicas: 1, gpu: a6000, model: mistral-7b, generator: {suffix_tokens: 1, output_tokens: 1}, arrivals: \
             {poisson: {rate: 1}}}",
        )
        .unwrap();
        let st = mooncake_stream(&spec, &rows);
        let s = st.sessions.as_ref().unwrap();
        assert_eq!([s.parents(1), s.parents(2), s.parents(3)], [&[0][..], &[0], &[1, 2]]);
        assert_eq!(s.pause[3], SimTime::from_nanos(250_000_000));
        let mut out = Vec::new();
        write_mooncake(&st, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(!lines[1].contains("parents"), "{}", lines[1]);
        assert!(lines[2].ends_with("\"call_index\": 2, \"parents\": [0]}"), "{}", lines[2]);
        assert!(lines[3].ends_with("\"parents\": [1, 2], \"wait_s\": 0.25}"), "{}", lines[3]);
    }
}
