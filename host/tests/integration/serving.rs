//! `routelab serve` in front of `routelab emulate`, on loopback only: four emulated engines as
//! child processes of the built binary, the gateway as another, and a bounded open-loop replay
//! of a short prefix-heavy tool-use stream through a real HTTP client (the engines run ten times
//! faster than the modelled GPU). Every request is bounded by the replay's wall limit.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use routelab_serve::replay::{self, ReplayReport};

/// A prefix-heavy tool-use stream: few tools, hot ones shared by many requests.
const WORKLOAD: &str = "\
name: serving_tool_use
seed: 7
seeds: 1
cluster:
  replicas: 4
  generator:
    system_prompt_tokens: 300
    contexts:
      count: 40
      tokens: {lognormal: {mean: 1300, cv: 0.25, max: 3000}}
      popularity: {zipf: {s: 1.1}}
    suffix_tokens: {uniform: {min: 50, max: 150}}
    output_tokens: {uniform: {min: 5, max: 30}}
  arrivals:
    poisson: {rate: 30.0}
  requests: 240
";

const TIME_SCALE: f64 = 0.1;

/// Child processes killed when dropped (a failed assertion must not leave servers running).
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `routelab ARGS` and returns its URL, read from its `listening on URL` line.
fn start(procs: &mut Procs, args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .env("RUST_BACKTRACE", "0")
        .spawn()
        .expect("spawn routelab");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read the listening line");
    procs.0.push(child);
    line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}")).to_string()
}

fn engines(procs: &mut Procs) -> Vec<String> {
    let scale = TIME_SCALE.to_string();
    (0..4).map(|_| start(procs, &["emulate", "--listen", "127.0.0.1:0", "--time-scale", &scale])).collect()
}

fn gateway(procs: &mut Procs, backends: &[String], policy: &str) -> String {
    let mut args =
        vec!["serve", "--listen", "127.0.0.1:0", "--policy", policy, "--resume-streams", "--timeout-s", "20"];
    for b in backends {
        args.extend(["--backend", b.as_str()]);
    }
    start(procs, &args)
}

fn stream() -> routelab_core::workload::generate::RequestStream {
    let dir = std::env::temp_dir().join(format!("routelab-serving-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tool_use.yaml");
    std::fs::write(&file, WORKLOAD).unwrap();
    replay::load_stream(&file, &[]).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn run(policy: &str) -> ReplayReport {
    let mut procs = Procs(Vec::new());
    let engines = engines(&mut procs);
    let url = gateway(&mut procs, &engines, policy);
    let stream = stream();
    runtime().block_on(replay::replay(&url, &stream, TIME_SCALE, &engines, Duration::from_secs(120)))
}

#[test]
fn cache_aware_routing_beats_round_robin_on_hit_rate_and_every_stream_completes() {
    let rr = run("round_robin");
    let ca = run("sglang_cache_aware");
    for (name, r) in [("round_robin", &rr), ("sglang_cache_aware", &ca)] {
        assert_eq!(r.requests, 240, "{name}");
        assert_eq!(r.complete, r.requests, "{name}: {:?}", r.first_error);
        assert!(r.hit_rate.is_finite() && r.hit_rate > 0.0, "{name}: {r:?}");
    }
    eprintln!("round_robin {rr:?}\nsglang_cache_aware {ca:?}");
    assert!(ca.hit_rate > rr.hit_rate, "cache-aware {} vs round robin {}", ca.hit_rate, rr.hit_rate);
}

#[test]
fn a_backend_killed_mid_run_loses_no_request() {
    let mut procs = Procs(Vec::new());
    let engines = engines(&mut procs);
    let url = gateway(&mut procs, &engines, "round_robin");
    let stream = stream();
    let rt = runtime();
    let report = rt.block_on(async {
        let s = stream.clone();
        let (u, e) = (url.clone(), engines.clone());
        let run = tokio::spawn(async move { replay::replay(&u, &s, TIME_SCALE, &e, Duration::from_secs(120)).await });
        // A third of the way through the arrivals (240 requests at 30/s model time = 8 s).
        tokio::time::sleep(Duration::from_secs_f64(8.0 * TIME_SCALE / 3.0)).await;
        procs.0[0].kill().unwrap();
        procs.0[0].wait().unwrap();
        run.await.unwrap()
    });
    eprintln!("{report:?}");
    assert_eq!(report.complete, report.requests, "{:?}", report.first_error);
    let metrics = rt.block_on(replay::get_text(&replay::client(), &format!("{url}/metrics"))).unwrap();
    let failures = routelab_serve::prom::sum(
        &metrics,
        &format!("routelab_gateway_backend_failures_total{{backend=\"{}\"}}", engines[0]),
    );
    assert!(failures.unwrap_or(0.0) >= 1.0, "no failure recorded for the killed backend:\n{metrics}");
    let moved = routelab_serve::prom::sum(&metrics, "routelab_gateway_retries_total").unwrap_or(0.0)
        + routelab_serve::prom::sum(&metrics, "routelab_gateway_resumed_streams_total").unwrap_or(0.0)
        + routelab_serve::prom::sum(&metrics, "routelab_gateway_rerouted_total").unwrap_or(0.0);
    assert!(moved >= 1.0, "the killed backend's requests went nowhere else:\n{metrics}");
}

/// `n` requests of `prompt_tokens` and `output_tokens`, one every 10 ms of model time.
fn small_stream(n: usize, prompt_tokens: u32, output_tokens: u32) -> routelab_core::workload::generate::RequestStream {
    use routelab_core::workload::generate::{GeneratedRequest, RequestStream};
    let mut s = RequestStream::default();
    for i in 0..n {
        let from = s.segments.len() as u32;
        s.segments.push(routelab_policy_api::Segment { id: 1 << 40 | i as u64, tokens: prompt_tokens });
        s.requests.push(GeneratedRequest {
            arrived_at: routelab_core::time::SimTime::from_nanos(i as u64 * 10_000_000),
            prompt_tokens,
            output_tokens,
            segments: from..from + 1,
            output_segment: None,
        });
    }
    s
}

#[test]
fn a_panicking_policy_is_replaced_by_the_fallback_and_counted() {
    let lib = crate::common::plugins().faulty.display().to_string();
    let mut procs = Procs(Vec::new());
    let engines: Vec<String> = engines(&mut procs).into_iter().take(2).collect();
    let url = gateway(&mut procs, &engines, &format!("{lib}:panics_in_route{{after: 5}}"));
    let rt = runtime();
    let report = rt.block_on(replay::replay(&url, &small_stream(20, 100, 5), TIME_SCALE, &[], Duration::from_secs(60)));
    assert_eq!(report.complete, 20, "{:?}", report.first_error);
    let metrics = rt.block_on(replay::get_text(&replay::client(), &format!("{url}/metrics"))).unwrap();
    let errors = routelab_serve::prom::sum(&metrics, "routelab_gateway_policy_errors_total").unwrap();
    assert!(errors >= 1.0, "{metrics}");
}

#[test]
fn sigterm_stops_new_connections_and_drains_open_streams() {
    let mut procs = Procs(Vec::new());
    let engines: Vec<String> = engines(&mut procs).into_iter().take(1).collect();
    let url = gateway(&mut procs, &engines, "round_robin");
    let gateway_pid = procs.0.last().unwrap().id() as i32;
    let rt = runtime();
    let report = rt.block_on(async {
        // 100 tokens of 24 ms model time each: about a quarter of a second at TIME_SCALE.
        let u = url.clone();
        let run = tokio::spawn(async move {
            replay::replay(&u, &small_stream(1, 50, 100), 1.0, &[], Duration::from_secs(60)).await
        });
        tokio::time::sleep(Duration::from_millis(80)).await;
        // SAFETY: signalling a child process this test started.
        assert_eq!(unsafe { libc::kill(gateway_pid, libc::SIGTERM) }, 0);
        run.await.unwrap()
    });
    assert_eq!(report.complete, 1, "the open stream was cut: {:?}", report.first_error);
    let status = procs.0.last_mut().unwrap().wait().unwrap();
    assert!(status.success(), "{status:?}");
    let refused = rt.block_on(replay::get_text(&replay::client(), &format!("{url}/health")));
    assert!(refused.is_err(), "still serving after SIGTERM: {refused:?}");
}

/// A trace's rows as an order-free multiset: each row's lengths and, for each of its blocks, how
/// many rows hold that block (its prefix sharing, whatever the ids are numbered).
fn trace_shape(trace: &str) -> Vec<(u64, u64, Vec<usize>)> {
    let rows: Vec<serde_json::Value> = trace.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let ids = |r: &serde_json::Value| -> Vec<u64> {
        r["hash_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
    };
    let mut holders = std::collections::HashMap::<u64, usize>::new();
    for r in &rows {
        for id in ids(r) {
            *holders.entry(id).or_default() += 1;
        }
    }
    let mut shape: Vec<_> = rows
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap();
            (n("input_length"), n("output_length"), ids(r).iter().map(|id| holders[id]).collect())
        })
        .collect();
    shape.sort();
    shape
}

/// Issue 32: `serve --record` writes the request log `routelab import` reads, and the imported
/// trace is the replayed stream's: the same requests, lengths and prefix sharing (as
/// `export-trace` writes the stream), arriving at the replay's pace.
#[test]
fn traffic_recorded_by_the_gateway_imports_as_the_trace_it_replayed() {
    let dir = std::env::temp_dir().join(format!("routelab-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (recorded, imported) = (dir.join("recorded.jsonl"), dir.join("imported.jsonl"));
    let _ = std::fs::remove_file(&recorded);
    let mut procs = Procs(Vec::new());
    let engines = engines(&mut procs);
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--policy", "round_robin", "--timeout-s", "20"];
    args.extend(["--record", recorded.to_str().unwrap()]);
    for b in &engines {
        args.extend(["--backend", b.as_str()]);
    }
    let url = start(&mut procs, &args);
    let stream = stream();
    let report = runtime().block_on(replay::replay(&url, &stream, TIME_SCALE, &engines, Duration::from_secs(120)));
    assert_eq!(report.complete, stream.requests.len(), "{:?}", report.first_error);
    drop(procs);

    let out = Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args(["import", recorded.to_str().unwrap(), "--out", imported.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let got = std::fs::read_to_string(&imported).unwrap();
    let mut want = Vec::new();
    routelab_core::workload::export::write_mooncake(&stream, &mut want).unwrap();
    let want = String::from_utf8(want).unwrap();
    assert_eq!(trace_shape(&got), trace_shape(&want), "requests, lengths or prefix sharing differ");

    // Arrivals: the replay sends model time × TIME_SCALE; the trace is in ms from the first.
    let times = |t: &str| -> Vec<f64> {
        t.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["timestamp"].as_f64().unwrap())
            .collect()
    };
    let (got, want) = (times(&got), times(&want));
    let mut off: Vec<f64> = got.iter().zip(&want).map(|(g, w)| (g - w * TIME_SCALE).abs()).collect();
    off.sort_by(f64::total_cmp);
    assert!(off[off.len() / 2] < 100.0, "median arrival off by {} ms", off[off.len() / 2]);
}

/// Agent sessions over HTTP: every call that waits for others is sent only after the last of
/// them finished streaming, plus its tool pause × the time scale (here the generator's loops of
/// 3–4 calls with 0.5 s tools, and sub-agent bursts that join), against one emulated engine.
#[test]
fn a_session_replay_sends_each_call_after_its_parents_and_its_pause() {
    let mut procs = Procs(Vec::new());
    let scale = TIME_SCALE.to_string();
    let engine = start(&mut procs, &["emulate", "--listen", "127.0.0.1:0", "--time-scale", &scale]);
    let dir = std::env::temp_dir().join(format!("routelab-serving-sessions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sessions.yaml");
    std::fs::write(
        &file,
        "name: serving_sessions\nseed: 3\nseeds: 1\ncluster:\n  replicas: 1\n  generator:\n    \
         system_prompt_tokens: 200\n    suffix_tokens: 100\n    output_tokens: {uniform: {min: 5, max: 20}}\n    \
         session: {steps: {uniform: {min: 3, max: 4}}, tool_tokens: 50, tool_pause_s: 0.5, \
         subagents: {probability: 0.5, burst: 2, depth: 1, steps: 2, task_tokens: 30}}\n  \
         arrivals: {poisson: {rate: 2.0}}\n  requests: 30\n",
    )
    .unwrap();
    let stream = replay::load_stream(&file, &[]).unwrap();
    let sessions = stream.sessions.clone().expect("a session stream");
    let (report, timings) =
        runtime().block_on(replay::replay_timed(&engine, &stream, TIME_SCALE, &[], Duration::from_secs(120)));
    assert_eq!(report.complete, report.requests, "{:?}", report.first_error);
    let mut waited = 0;
    for (i, t) in timings.iter().enumerate() {
        let parents = sessions.parents(i);
        if parents.is_empty() {
            continue;
        }
        waited += 1;
        let last = parents.iter().map(|&p| timings[p as usize].done_s).fold(f64::MIN, f64::max);
        let pause = routelab_core::time::seconds(sessions.pause[i]) * TIME_SCALE;
        assert!(
            t.sent_s >= last + pause - 1e-6,
            "call {i} sent at {} s, its parents ended at {last} s + {pause} s",
            t.sent_s
        );
    }
    assert!(waited > 4, "{waited} calls waited for others");
}
