//! `--report`: one self-contained HTML page, read as text and rendered by a real browser
//! (headless Chromium; `.ci/run` installs it, and the browser test says why it skips without).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::*;

fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

fn scratch(name: &str) -> PathBuf {
    fixture("report", name)
}

const DISPATCH: &str = "name: rep_dispatch\ndispatch: {servers: 4, utilisation: 0.7, requests: 4000}\nseeds: 2\n";
const CLUSTER: &str = "name: rep_cluster\ncluster:\n  replicas: 2\n  generator: {output_tokens: 16}\n  \
arrivals: {poisson: {rate: 1.0}}\n  requests: 60\n";
const POLICIES: [&str; 3] = ["random", "round_robin", "least_work_left"];

/// Runs `args` (a `--report` among them) and returns the page.
fn report(args: &[&str], page: &Path) -> String {
    let _ = std::fs::remove_file(page);
    let out = routelab(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(page).expect("the report was written")
}

/// The two workloads compared by every policy, with a report; returns the page.
fn compare_report(page: &Path) -> String {
    // Files of their own per page: the tests run in parallel.
    let stem = page.file_stem().unwrap().to_string_lossy();
    let (d, c) = (scratch(&format!("{stem}-dispatch.yaml")), scratch(&format!("{stem}-cluster.yaml")));
    std::fs::write(&d, DISPATCH).unwrap();
    std::fs::write(&c, CLUSTER).unwrap();
    let policies = POLICIES.join(",");
    let args = ["compare", d.to_str().unwrap(), c.to_str().unwrap(), "--policies", &policies, "--report"];
    report(&[&args[..], &[page.to_str().unwrap()]].concat(), page)
}

/// What makes a page depend on anything but itself.
fn assert_self_contained(html: &str) {
    for outside in ["<script", "<link", "<img", "<iframe", "src=", "url(", "@import", "https:"] {
        assert!(!html.contains(outside), "the page loads something ({outside})");
    }
    // The only address is SVG's namespace name, which is never fetched.
    let addresses = html.matches("http:").count();
    assert_eq!(addresses, html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count());
}

#[test]
fn compare_report_has_every_table_chart_and_workload_and_needs_nothing_else() {
    let page = scratch("compare.html");
    let html = compare_report(&page);
    assert_self_contained(&html);
    assert!(html.contains(&format!("routelab {}", env!("CARGO_PKG_VERSION"))));
    // The command that reproduces it, as typed (the program shown as `routelab`).
    assert!(html.contains("<code>routelab compare "), "{}", &html[..600]);
    assert!(html.contains("--policies random,round_robin,least_work_left"));
    for w in ["rep_dispatch", "rep_cluster"] {
        // A table row per policy, a latency CDF and an in-flight timeline per policy.
        assert!(html.contains(&format!("<h2 id=\"{w}\">{w}</h2>")), "{w}");
        assert!(html.contains(&format!("id=\"{w}_latency_cdf\"")), "{w}");
        for p in POLICIES {
            assert!(html.contains(&format!("<tr><td>{p}</td><td class=\"num\">")), "{w} {p}");
            assert!(html.contains(&format!("id=\"{w}_inflight_{p}\"")), "{w} {p}");
        }
    }
    assert!(html.contains("id=\"rep_dispatch_response_mean\"") && html.contains("id=\"rep_cluster_latency_mean_s\""));
    // The workloads as run, every default filled in, and the seeds.
    assert!(html.contains("utilisation: 0.7") && html.contains("replicas: 2"));
    assert!(html.contains("rep_dispatch [dispatch world, seeds 1..2 (2 runs, mean ± 95% CI)]"));
}

/// Under `--isolate` the children send their first seed's detail: the page still has the CDF and
/// the in-flight charts.
#[test]
fn isolated_runs_keep_their_cdf_and_timeline() {
    let w = scratch("isolated.yaml");
    std::fs::write(&w, CLUSTER.replace("rep_cluster", "rep_isolated")).unwrap();
    let page = scratch("isolated.html");
    let html = report(
        &[
            "compare",
            w.to_str().unwrap(),
            "--policies",
            "random,round_robin",
            "--isolate",
            "--report",
            page.to_str().unwrap(),
        ],
        &page,
    );
    assert!(html.contains("id=\"rep_isolated_latency_cdf\""));
    assert!(html.contains("id=\"rep_isolated_inflight_round_robin\""));
}

/// A report names the output path checks like the other outputs: a folder is bad input.
#[test]
fn report_path_is_checked_before_running() {
    let dir = scratch("a-folder");
    std::fs::create_dir_all(&dir).unwrap();
    let out = routelab(&["compare", "exp_rho09", "--policies", "random", "--report", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--report") && err.contains("is a folder"), "{err}");
}

/// The installed Chromium, if any (`ROUTELAB_CHROMIUM` names another).
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ROUTELAB_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n))).find(|p| p.is_file())
}

/// Runs headless Chromium on `page` with `what` (`--dump-dom`, `--screenshot=…`); its stdout.
fn chromium_run(browser: &Path, page: &Path, what: &str) -> String {
    let profile = scratch(&format!("chromium-profile-{}", std::process::id()));
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            &format!("--user-data-dir={}", profile.display()),
            "--window-size=1200,3000",
            what,
            &format!("file://{}", page.display()),
        ])
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(out.status.success(), "chromium {what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The report with a probe appended: a script (in this test copy only; the report has none)
/// that writes each chart's rendered size, how much of each in-flight chart's height its lines
/// span as laid out (series are the 2-pixel polylines drawn before the legend's translucent
/// box), and the page's text into the DOM for `--dump-dom`.
fn probed(html: &str, probe_page: &Path) {
    let probe = "<pre id=\"probe\"></pre><script>\
        const sizes = [...document.querySelectorAll('figure svg')].map(s => {\
          const r = s.getBoundingClientRect(); return Math.round(r.width) + 'x' + Math.round(r.height); });\
        const spans = [...document.querySelectorAll('figure[id*=\"_inflight_\"]')].map(f => {\
          const svg = f.querySelector('svg'); let top = Infinity, bottom = -Infinity;\
          for (const e of svg.querySelectorAll('polyline, rect')) {\
            if (e.tagName === 'rect' && e.getAttribute('opacity') === '0.85') break;\
            if (e.tagName !== 'polyline' || e.getAttribute('stroke-width') !== '2') continue;\
            const r = e.getBoundingClientRect(); top = Math.min(top, r.top); bottom = Math.max(bottom, r.bottom); }\
          return f.id + '=' + ((bottom - top) / svg.getBoundingClientRect().height).toFixed(3); });\
        document.getElementById('probe').textContent = 'SIZES ' + sizes.join(' ') + ' END\\nSPANS ' +\
          spans.join(' ') + ' END\\nTEXT ' + document.body.innerText.replace(/\\s+/g, ' ');\
        </script></body>";
    std::fs::write(probe_page, html.replace("</body>", probe)).unwrap();
}

/// What Chromium laid out: each chart's size, each in-flight chart's id with the share of its
/// height its lines span, and the page's visible text.
struct Rendered {
    sizes: Vec<(u32, u32)>,
    spans: Vec<(String, f64)>,
    text: String,
}

fn rendered(browser: &Path, html: &str, name: &str) -> Rendered {
    let probe_page = scratch(&format!("{name}-probe.html"));
    probed(html, &probe_page);
    let dom = chromium_run(browser, &probe_page, "--dump-dom");
    let sizes = dom.split("SIZES ").nth(1).and_then(|s| s.split(" END").next()).expect("the probe ran");
    let sizes = sizes
        .split_whitespace()
        .map(|s| {
            let (w, h) = s.split_once('x').unwrap();
            (w.parse().unwrap(), h.parse().unwrap())
        })
        .collect();
    let spans = dom.split("SPANS ").nth(1).and_then(|s| s.split(" END").next()).expect("the probe ran");
    let spans = spans
        .split_whitespace()
        .map(|s| {
            let (id, share) = s.rsplit_once('=').unwrap();
            (id.to_string(), share.parse().unwrap_or(0.0))
        })
        .collect();
    let text = dom.split("TEXT ").nth(1).expect("the probe ran").to_string();
    Rendered { sizes, spans, text }
}

/// The screenshot's pixels: (width, height, RGBA bytes).
fn screenshot(browser: &Path, page: &Path) -> (u32, u32, Vec<u8>) {
    let png = scratch(&format!("{}.png", page.file_stem().unwrap().to_string_lossy()));
    let _ = std::fs::remove_file(&png);
    chromium_run(browser, page, &format!("--screenshot={}", png.display()));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).expect("a screenshot")));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let rgba: Vec<u8> = match info.color_type {
        png::ColorType::Rgba => buf[..info.buffer_size()].to_vec(),
        png::ColorType::Rgb => buf[..info.buffer_size()].chunks(3).flat_map(|p| [p[0], p[1], p[2], 255]).collect(),
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    (info.width, info.height, rgba)
}

/// Without Chromium this test is ignored — counted so in `cargo test`'s summary, with the reason
/// — by the build script (host/build.rs), which looks when the tests are built.
#[test]
#[cfg_attr(
    routelab_no_chromium,
    ignore = "Chromium not found when the tests were built: install Debian's `chromium` package (as .ci/run \
              does) or set ROUTELAB_CHROMIUM"
)]
fn reports_render_in_chromium_with_every_policy_workload_and_chart() {
    let browser = chromium().expect(
        "Chromium was on PATH when the tests were built and is gone: the build script looks again when PATH or \
         ROUTELAB_CHROMIUM changes",
    );
    let _alone = cores_alone();
    let compare = scratch("browser-compare.html");
    let compare_html = compare_report(&compare);
    let sweep = scratch("browser-sweep.html");
    let d = scratch("browser-compare-dispatch.yaml");
    let sweep_html = report(
        &[
            "sweep",
            d.to_str().unwrap(),
            "--policies",
            "random,least_work_left",
            "--set",
            "utilisation=x0.5,x1",
            "--report",
            sweep.to_str().unwrap(),
        ],
        &sweep,
    );
    let run = scratch("browser-run.html");
    let run_html =
        report(&["run", d.to_str().unwrap(), "--policy", "round_robin", "--report", run.to_str().unwrap()], &run);
    let capacity = scratch("browser-capacity.html");
    let capacity_html = report(
        &[
            "capacity",
            "example_requests",
            "--slo",
            "ttft_p99_s<2",
            "--policies",
            "round_robin,least_requests",
            "--tolerance",
            "0.1",
            "--report",
            capacity.to_str().unwrap(),
        ],
        &capacity,
    );
    let cases: [(&str, &str, &[&str], &[&str]); 4] = [
        ("compare", &compare_html, &POLICIES, &["rep_dispatch", "rep_cluster"]),
        (
            "sweep",
            &sweep_html,
            &["random", "least_work_left"],
            &["rep_dispatch[utilisation=x0.5]", "rep_dispatch[utilisation=x1]"],
        ),
        ("run", &run_html, &["round_robin"], &["rep_dispatch"]),
        ("capacity", &capacity_html, &["round_robin", "least_requests"], &["example_requests"]),
    ];
    for (name, html, policies, workloads) in cases {
        assert_self_contained(html);
        let Rendered { sizes, text, .. } = rendered(&browser, html, name);
        assert_eq!(sizes.len(), html.matches("<svg").count(), "{name}: every chart is in the page");
        assert!(!sizes.is_empty(), "{name}: charts");
        for (w, h) in &sizes {
            assert!(*w > 100 && *h > 100, "{name}: a chart rendered {w}x{h}");
        }
        for p in policies {
            assert!(text.contains(p), "{name}: the page shows policy {p}");
        }
        for w in workloads {
            assert!(text.contains(w), "{name}: the page shows workload {w}");
        }
    }
    // The sweep's curves are drawn against the utilisation as run (0.35, 0.7), not the multipliers.
    let sweep_chart = sweep_html.split("id=\"rep_dispatch_sweep_utilisation_response_mean\"").nth(1).unwrap();
    let sweep_chart = sweep_chart.split("</svg>").next().unwrap();
    assert!(sweep_chart.contains("\n0.4\n") || sweep_chart.contains("\n0.5\n"), "ticks at utilisations");
    assert!(!sweep_chart.contains("x0.5"), "no multiplier on the axis");

    // An overloaded policy (vllm_prefix_aware on tool_use: ~15,000 requests queued on one replica)
    // does not flatten the contenders' in-flight charts: every chart's lines span a good part of
    // its height (a shared axis left the others' lines at 0), the overloaded one on its own axis.
    let overload = scratch("browser-overload.html");
    let overload_html = report(
        &[
            "compare",
            "tool_use",
            "--seeds",
            "1",
            "--policies",
            "least_work_left,round_robin,vllm_prefix_aware",
            "--report",
            overload.to_str().unwrap(),
        ],
        &overload,
    );
    assert!(overload_html.contains("overloaded"), "vllm_prefix_aware no longer overloads tool_use: pick another");
    let Rendered { spans, text, .. } = rendered(&browser, &overload_html, "overload");
    assert_eq!(spans.len(), 3, "{spans:?}");
    for (id, share) in &spans {
        assert!(*share > 0.2, "{id}: its lines span {share} of its height: flattened");
    }
    assert!(text.contains("own y axis: overloaded"), "the overloaded policy's chart says it has its own axis");

    // Each page's screenshot (compare, sweep, capacity) is a page, not a blank: many colours, none
    // covering nearly everything.
    for page in [&compare, &sweep, &capacity] {
        let (w, h, rgba) = screenshot(&browser, page);
        assert_eq!((w, h), (1200, 3000));
        let mut counts = std::collections::HashMap::new();
        for px in rgba.chunks(4) {
            *counts.entry([px[0], px[1], px[2]]).or_insert(0u64) += 1;
        }
        let most = counts.values().copied().max().unwrap();
        let name = page.display();
        assert!(counts.len() > 50, "{name}: {} colours", counts.len());
        assert!((most as f64) < 0.97 * (w * h) as f64, "{name}: one colour covers {most} of {} pixels", w * h);
    }
}
