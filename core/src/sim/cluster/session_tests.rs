//! Agent sessions: the generated graph and its closed-loop timing, traced by hand.

use routelab_policy_api::StepShape;

use super::sessions::session_times;
use super::tests::run_named;
use super::*;
use crate::time::{SimTime, seconds, ticks};
use crate::workload::generate::{apply_hints, generate};

fn spec(yaml: &str) -> ClusterSpec {
    let s: ClusterSpec = serde_norway::from_str(yaml).unwrap();
    s.validate().unwrap();
    s
}

/// 1 replica; a 100-token system prompt, a 100-token task, 1 output token per call (so a call
/// ends with its prefill step), tools returning 50 tokens after 2 s.
fn agent(session: &str, replicas: u32) -> ClusterSpec {
    spec(&format!(
        "replicas: {replicas}\nchunk_tokens: 4096\n\
         generator: {{system_prompt_tokens: 100, suffix_tokens: 100, output_tokens: 1, session: {session}}}\n\
         arrivals: {{poisson: {{rate: 0.001}}}}\nrequests: 1\n"
    ))
}

/// A root loop of 2 calls that spawns a burst of 2 sub-agents of 2 calls each: the calls in
/// generation order are R1, X1, X2, Y1, Y2, R2. X1 and Y1 wait for R1 (no pause: spawning is
/// instant), X2 for X1 and Y2 for Y1 (their tools: 2 s), R2 for the last calls of both
/// sub-agents (the join, no pause). Prompts: R1 = system + task (200); X1 = R1 + R1's output + a
/// 20-token task (221); X2 = X1 + X1's output + a 50-token tool result (272); R2 = R1 + R1's
/// output + the 50-token results segment (251).
#[test]
fn a_burst_of_sub_agents_waits_and_joins_as_traced_by_hand() {
    let s = agent(
        "{steps: 2, tool_tokens: 50, tool_pause_s: 2, subagents: {probability: 1, burst: 2, depth: 1, steps: 2, task_tokens: 20}}",
        2,
    );
    let st = generate(&s, None, 1).unwrap();
    let g = st.sessions.as_ref().unwrap();
    let parents: Vec<&[u32]> = (0..st.requests.len()).map(|i| g.parents(i)).collect();
    assert_eq!(parents, [&[][..], &[0], &[1], &[0], &[3], &[2, 4]]);
    let pauses: Vec<SimTime> = g.pause.clone();
    assert_eq!(pauses, [SimTime::ZERO, SimTime::ZERO, ticks(2.0), SimTime::ZERO, ticks(2.0), SimTime::ZERO]);
    let prompts: Vec<u32> = st.requests.iter().map(|r| r.prompt_tokens).collect();
    assert_eq!(prompts, [200, 221, 272, 221, 272, 251]);
    assert_eq!(st.prompt(1)[..3], st.prompt(5)[..3], "the sub-agent shares the root's context and output");
    assert_eq!(g.count, 1);
    // Each call is sent exactly when the last of its parents completed, plus its pause; the
    // session's makespan runs from R1's arrival to R2's completion.
    let out = run_named(&s, None, "round_robin", 1).unwrap();
    let r = &out.records;
    assert_eq!(out.metrics.get("completed"), Some(6.0));
    for (i, ps) in parents.iter().enumerate().skip(1) {
        let last = ps.iter().map(|&p| ticks(r[p as usize].completed_at_s)).max().unwrap();
        assert_eq!(ticks(r[i].arrived_at_s), last + pauses[i], "call {i}");
    }
    let makespan = r[5].completed_at_s - r[0].arrived_at_s;
    assert_eq!(out.metrics.get("session_makespan_mean_s"), Some(makespan));
    // The sub-agents' tools overlap each other's calls: only the stretch when both tools run and
    // no call is in flight counts as tool time; it is under the 2 s each tool takes.
    let tool = out.metrics.get("session_tool_mean_s").unwrap();
    assert!(tool > 0.0 && tool <= 2.0, "{tool}");
    assert_eq!(out.metrics.get("sessions_completed"), Some(1.0));
}

/// A plain loop of 3 calls with 2 s tools on one replica, timed by hand with the step model:
/// R1 prefills 200 tokens; R2 (sent 2 s after R1's end) 50 new tokens on top of the 201 cached
/// (R1's prompt and output); R3 50 on top of 252. Makespan = the three steps + 4 s of tools, of
/// which the LLM held the session for the three steps.
#[test]
fn a_tool_loop_makespan_is_its_steps_plus_its_pauses() {
    let s = agent("{steps: 3, tool_tokens: 50, tool_pause_s: 2}", 1);
    let c = s.step_model().unwrap().cost;
    let p = |n, ctx| ticks(c.shape_time_s(&StepShape::prefill(n, ctx))).max(SimTime::TICK);
    let st = generate(&s, None, 1).unwrap();
    let out = run_sim(&s, &st);
    let t0 = ticks(out.records[0].arrived_at_s);
    let t1 = t0 + p(200, 0);
    let t2 = t1 + ticks(2.0) + p(50, 201);
    let t3 = t2 + ticks(2.0) + p(50, 252);
    let done: Vec<f64> = out.records.iter().map(|r| r.completed_at_s).collect();
    assert_eq!(done, [seconds(t1), seconds(t2), seconds(t3)]);
    assert_eq!(out.metrics.get("session_makespan_mean_s"), Some(seconds(t3) - seconds(t0)));
    let llm = out.metrics.get("session_llm_mean_s").unwrap();
    assert!((llm - (seconds(t3) - seconds(t0) - 4.0)).abs() < 1e-9, "{llm}");
    assert!((out.metrics.get("session_tool_mean_s").unwrap() - 4.0).abs() < 1e-9);
}

fn run_sim(s: &ClusterSpec, st: &crate::workload::generate::RequestStream) -> RunOutcome {
    let resolved = StepModels::resolve(s).unwrap();
    let r = crate::plugin::Loader::new()
        .router(&crate::plugin::PolicySpec::parse("round_robin").unwrap(), &router_context_for(s, &resolved, 1))
        .unwrap();
    crate::runner::run_cluster(s, st, r, "round_robin", 1).unwrap()
}

#[test]
fn llm_time_is_the_union_of_the_calls_spans() {
    let rec = |a: f64, b: f64| RequestRecord {
        replica: 0,
        arrived_at_s: a,
        queued_at_s: a,
        admitted_at_s: a,
        first_token_at_s: b,
        completed_at_s: b,
        prompt_tokens: 1,
        cached_tokens: 0,
        output_tokens: 1,
        preemptions: 0,
        class: 0,
        model: 0,
        tenant: 0,
        end: End::Served,
        dispatched_at_s: a,
    };
    // [0, 1] and [0.5, 2] overlap (2 s), then a gap of 3 s, then [5, 6].
    let calls = [rec(0.0, 1.0), rec(5.0, 6.0), rec(0.5, 2.0)];
    let refs: Vec<&RequestRecord> = calls.iter().collect();
    assert_eq!(session_times(&refs), Some((6.0, 3.0)));
    let unfinished = [rec(0.0, f64::NAN)];
    assert_eq!(session_times(&[&unfinished[0]]), None);
}

/// Oracle hints are the true output lengths; noisy ones differ but keep the mean near it.
#[test]
fn oracle_hints_equal_the_true_lengths() {
    let mut s = tests::preset("tool_use");
    s.requests = Some(2000);
    s.hints = Some(serde_norway::from_str("{output_tokens: oracle}").unwrap());
    let mut st = generate(&s, None, 4).unwrap();
    apply_hints(&s, &mut st, 4);
    let infos = request_infos(&s, &st);
    assert_eq!(infos.len(), 2000);
    for (i, info) in infos.iter().enumerate() {
        assert_eq!(info.hint_output_tokens, st.requests[i].output_tokens as f64);
    }
    s.hints = Some(serde_norway::from_str("{output_tokens: {noisy: {cv: 0.5}}}").unwrap());
    apply_hints(&s, &mut st, 4);
    let (truth, hinted): (f64, f64) = st
        .requests
        .iter()
        .zip(&st.hints)
        .fold((0.0, 0.0), |(a, b), (r, &h)| (a + r.output_tokens as f64, b + h as f64));
    assert!(st.requests.iter().zip(&st.hints).filter(|(r, h)| r.output_tokens != **h).count() > 1000);
    assert!((hinted / truth - 1.0).abs() < 0.05, "{hinted} vs {truth}");
    s.hints = None;
    let mut plain = generate(&s, None, 4).unwrap();
    apply_hints(&s, &mut plain, 4);
    assert!(request_infos(&s, &plain)[0].hint_output_tokens.is_nan(), "no hint reads NaN");
}

/// A recorded agent trace (Mooncake rows with session fields) replays with its waits: session
/// `a`'s call 1 is sent 1.5 × time_scale 2 = 3 s after call 0 completes, whatever its own
/// timestamp says; the row without a session arrives at its timestamp; `requests: 1` keeps
/// session `a` whole (its first call is the one request asked for) and drops the rest.
#[test]
fn a_recorded_session_replays_with_its_waits() {
    let text = "\
{\"timestamp\": 0, \"input_length\": 300, \"output_length\": 1, \"hash_ids\": [5], \"session_id\": \"a\", \"call_index\": 0}
{\"timestamp\": 500, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [9]}
{\"timestamp\": 600, \"input_length\": 200, \"output_length\": 1, \"hash_ids\": [3], \"session_id\": 7, \"call_index\": 0}
{\"timestamp\": 900, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [8, 6], \"session_id\": \"a\", \"call_index\": 1, \"wait_s\": 1.5}
";
    let rows = crate::workload::mooncake::parse(text, std::path::Path::new("s.jsonl")).unwrap();
    let mut s = agent("{steps: 1}", 1);
    s.generator.session = None;
    s.requests = None;
    s.arrivals = crate::workload::cluster::Arrivals::Trace {
        path: "s.jsonl".into(),
        time_scale: 2.0,
        format: crate::workload::cluster::TraceFormat::Mooncake,
        spread_s: 0.0,
    };
    let st = crate::workload::generate::mooncake_stream(&s, &rows);
    let g = st.sessions.as_ref().unwrap();
    let parents: Vec<&[u32]> = (0..st.requests.len()).map(|i| g.parents(i)).collect();
    assert_eq!(parents, [&[][..], &[], &[], &[0]]);
    assert_eq!(g.pause, [SimTime::ZERO, SimTime::ZERO, SimTime::ZERO, ticks(3.0)]);
    assert_eq!((g.session.clone(), g.count), (vec![0, 1, 2, 0], 3));
    let out = run_sim(&s, &st);
    let r = &out.records;
    assert_eq!(out.metrics.get("completed"), Some(4.0));
    assert_eq!(ticks(r[3].arrived_at_s), ticks(r[0].completed_at_s) + ticks(3.0));
    assert_eq!((r[1].arrived_at_s, r[2].arrived_at_s), (1.0, 1.2), "single calls keep their timestamps");
    assert_eq!(out.metrics.get("session_makespan_p90_s"), Some(r[3].completed_at_s - r[0].arrived_at_s));
    s.requests = Some(1);
    let cut = crate::workload::generate::mooncake_stream(&s, &rows);
    let kept: Vec<u32> = cut.requests.iter().map(|q| q.prompt_tokens).collect();
    assert_eq!(kept, [300, 700], "session a whole, nothing after the limit");
    assert_eq!(cut.sessions.as_ref().unwrap().parents(1), [0]);
}
