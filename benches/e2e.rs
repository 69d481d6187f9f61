//! End-to-end load benchmark: the real server binary driven by keep-alive
//! HTTP clients and by MCP clients, and, in the same run, the baselines:
//! spawning the interpreter per request (`python -c`, with and without
//! `-I -S`), a cold `import numpy`, and a warm Jupyter kernel.
//!
//! `cargo bench --bench e2e`. Environment: `BENCH_SECONDS` per scenario
//! (default 5), `BENCH_POOL_SIZE` (default 4), `BENCH_SPAWNS` (default 200),
//! `BENCH_PYTHON` (default: the real interpreter behind `python3`).
//! The numpy and Jupyter scenarios use venvs made by `tests/python_envs/setup.sh`.

#[path = "../tests/integration/common/mcp.rs"]
#[allow(dead_code)]
mod mcp_client;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

struct Stats {
    name: String,
    concurrency: usize,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Stats {
    fn new(name: &str, concurrency: usize, latencies: Vec<Duration>, elapsed: Duration) -> Stats {
        let mut latencies = latencies;
        latencies.sort();
        Stats {
            name: name.to_string(),
            concurrency,
            latencies,
            elapsed,
        }
    }

    fn percentile(&self, p: f64) -> Duration {
        let idx = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[idx]
    }

    fn p50_ms(&self) -> f64 {
        self.percentile(0.5).as_secs_f64() * 1e3
    }

    fn row(&self) -> String {
        format!(
            "| {:<44} | {:>3} | {:>9.3} | {:>9.3} | {:>9.0} |",
            self.name,
            self.concurrency,
            self.p50_ms(),
            self.percentile(0.99).as_secs_f64() * 1e3,
            self.latencies.len() as f64 / self.elapsed.as_secs_f64(),
        )
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn real_python() -> PathBuf {
    if let Ok(p) = std::env::var("BENCH_PYTHON") {
        return p.into();
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on PATH");
    String::from_utf8(out.stdout).unwrap().trim().into()
}

/// A venv from `tests/python_envs/NAME.txt`, created on first use.
fn venv_python(name: &str, base: &Path) -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-venv"));
    let out = std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python_envs/setup.sh"
        ))
        .arg(name)
        .arg(&venv)
        .env("TEST_PYTHON", base)
        .stderr(Stdio::inherit())
        .output()
        .expect("bash runs setup.sh");
    assert!(out.status.success(), "setting up the {name} venv failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .trim()
        .into()
}

/// A running `code-executor serve`.
struct Server {
    child: tokio::process::Child,
    url: String,
    ready_after: Duration,
}

impl Server {
    async fn start(args: &[&str]) -> Server {
        let started = Instant::now();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_code-executor"))
            .args(["serve", "--port", "0"])
            .args(args)
            .env("CODE_EXECUTOR_LOG", "warn,code_executor=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("server binary starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let address = loop {
            let line = lines.next_line().await.unwrap().expect("server ready line");
            if let Some(rest) = line.split("address=").nth(1) {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        let ready_after = started.elapsed();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Server {
            child,
            url: format!("http://{address}"),
            ready_after,
        }
    }

    /// Resident set size of the server process itself (not its workers), KiB.
    fn rss_kib(&self) -> u64 {
        let pid = self.child.id().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
}

async fn http_load(
    url: &str,
    code: &str,
    concurrency: usize,
    seconds: f64,
) -> (Vec<Duration>, Duration) {
    let body = json!({ "code": code }).to_string();
    http_load_bodies(url, vec![body; concurrency], seconds).await
}

/// One keep-alive client per body, each sending its body in a loop.
async fn http_load_bodies(
    url: &str,
    bodies: Vec<String>,
    seconds: f64,
) -> (Vec<Duration>, Duration) {
    let clients: Vec<reqwest::Client> = bodies
        .iter()
        .map(|_| {
            reqwest::Client::builder()
                .tcp_nodelay(true)
                .build()
                .unwrap()
        })
        .collect();
    // Warm-up: every connection opened, every worker used.
    for (client, body) in clients.iter().zip(&bodies) {
        for _ in 0..10 {
            send(client, url, body).await;
        }
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let tasks = clients.into_iter().zip(bodies).map(|(client, body)| {
        let url = url.to_string();
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                send(&client, &url, &body).await;
                latencies.push(t.elapsed());
            }
            latencies
        })
    });
    let mut latencies = Vec::new();
    for task in futures_util::future::join_all(tasks).await {
        latencies.extend(task.unwrap());
    }
    (latencies, started.elapsed())
}

/// `POST /sessions`; the new session's id.
async fn create_session(url: &str) -> String {
    let resp = reqwest::Client::new()
        .post(format!("{url}/sessions"))
        .json(&json!({}))
        .send()
        .await
        .expect("session created");
    assert_eq!(resp.status(), 201);
    let info: serde_json::Value = resp.json().await.unwrap();
    info["id"].as_str().unwrap().to_string()
}

async fn send(client: &reqwest::Client, url: &str, body: &str) {
    let resp = client
        .post(format!("{url}/execute"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request answered");
    assert_eq!(resp.status(), 200);
    let result: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(result["exit_code"], 0, "{result}");
}

async fn mcp_load(
    client: &mcp_client::McpClient,
    code: &str,
    seconds: f64,
) -> (Vec<Duration>, Duration) {
    let args = json!({ "code": code });
    for _ in 0..20 {
        mcp_client::execute_code(client, args.clone())
            .await
            .unwrap();
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    while started.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        let result = mcp_client::execute_code(client, args.clone())
            .await
            .unwrap();
        latencies.push(t.elapsed());
        assert_eq!(result.is_error, Some(false));
    }
    (latencies, started.elapsed())
}

fn spawn_load(
    python: &Path,
    args: &[&str],
    count: usize,
    expect: &[u8],
) -> (Vec<Duration>, Duration) {
    let started = Instant::now();
    let mut latencies = Vec::new();
    for _ in 0..count {
        let t = Instant::now();
        let out = std::process::Command::new(python)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            out.stdout,
            expect,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        latencies.push(t.elapsed());
    }
    (latencies, started.elapsed())
}

fn jupyter_load(python: &Path, code: &str, seconds: f64) -> (Vec<Duration>, Duration) {
    let out = std::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/support/jupyter_baseline.py"
        ))
        .arg(seconds.to_string())
        .arg(code)
        .stderr(Stdio::inherit())
        .output()
        .expect("jupyter baseline runs");
    assert!(out.status.success(), "jupyter baseline failed");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let latencies = report["latencies_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| Duration::from_secs_f64(v.as_f64().unwrap() / 1e3))
        .collect();
    (
        latencies,
        Duration::from_secs_f64(report["elapsed_s"].as_f64().unwrap()),
    )
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and
    // should not run the load.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let seconds: f64 = env_or("BENCH_SECONDS", 5.0);
    let pool_size: usize = env_or("BENCH_POOL_SIZE", 4);
    let spawns: usize = env_or("BENCH_SPAWNS", 200);
    let python = real_python();
    let pool = pool_size.to_string();
    let code = "print(2+2)";
    let mut rows: Vec<Stats> = Vec::new();

    // Clean-state print(2+2) over HTTP.
    let server = Server::start(&["--python", python.to_str().unwrap(), "--pool-size", &pool]).await;
    let ready = server.ready_after;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle = server.rss_kib();
    let mut rss_load = 0;
    for concurrency in [1, 8, 32] {
        let sampler = async {
            let mut max = 0;
            for _ in 0..(seconds * 10.0) as usize {
                tokio::time::sleep(Duration::from_millis(100)).await;
                max = max.max(server.rss_kib());
            }
            max
        };
        let ((latencies, elapsed), max) =
            tokio::join!(http_load(&server.url, code, concurrency, seconds), sampler);
        rss_load = rss_load.max(max);
        rows.push(Stats::new(
            "HTTP /execute print(2+2)",
            concurrency,
            latencies,
            elapsed,
        ));
    }

    // Sessions: each client has its own session (calls to one session run
    // one at a time, so more clients on one session would only queue).
    for concurrency in [1, 4] {
        let mut bodies = Vec::new();
        for _ in 0..concurrency {
            let id = create_session(&server.url).await;
            bodies.push(json!({ "code": code, "session": id }).to_string());
        }
        let (latencies, elapsed) = http_load_bodies(&server.url, bodies, seconds).await;
        rows.push(Stats::new(
            "HTTP session print(2+2)",
            concurrency,
            latencies,
            elapsed,
        ));
    }

    // The same over MCP: streamable HTTP on the same server, and stdio.
    let client = mcp_client::connect_http(&format!("{}/mcp", server.url), None).await;
    let (latencies, elapsed) = mcp_load(&client, code, seconds).await;
    rows.push(Stats::new(
        "MCP streamable HTTP execute_code print(2+2)",
        1,
        latencies,
        elapsed,
    ));
    drop(client);
    drop(server);
    let (client, _stdio_server) = mcp_client::connect_stdio(
        Path::new(env!("CARGO_BIN_EXE_code-executor")),
        &["--python", python.to_str().unwrap(), "--pool-size", &pool],
        &[],
    )
    .await;
    let (latencies, elapsed) = mcp_load(&client, code, seconds).await;
    rows.push(Stats::new(
        "MCP stdio execute_code print(2+2)",
        1,
        latencies,
        elapsed,
    ));
    drop(client);

    // numpy preloaded in the workers.
    let numpy_python = venv_python("plot", &python);
    let numpy_code = "import numpy; numpy.arange(10).sum()";
    let server = Server::start(&[
        "--python",
        numpy_python.to_str().unwrap(),
        "--pool-size",
        &pool,
        "--preload",
        "numpy",
    ])
    .await;
    let (latencies, elapsed) = http_load(&server.url, numpy_code, 1, seconds).await;
    rows.push(Stats::new(
        "HTTP /execute numpy (preloaded)",
        1,
        latencies,
        elapsed,
    ));
    drop(server);

    // Baselines.
    let (latencies, elapsed) = spawn_load(&python, &["-c", code], spawns, b"4\n");
    rows.push(Stats::new(
        "baseline: python -c print(2+2)",
        1,
        latencies,
        elapsed,
    ));
    let (latencies, elapsed) = spawn_load(&python, &["-I", "-S", "-c", code], spawns, b"4\n");
    rows.push(Stats::new(
        "baseline: python -I -S -c print(2+2)",
        1,
        latencies,
        elapsed,
    ));
    let cold_numpy = "import numpy; print(numpy.arange(10).sum())";
    let (latencies, elapsed) = spawn_load(&numpy_python, &["-c", cold_numpy], spawns / 4, b"45\n");
    rows.push(Stats::new(
        "baseline: python -c numpy (cold)",
        1,
        latencies,
        elapsed,
    ));
    let jupyter_python = venv_python("jupyter", &python);
    let (latencies, elapsed) = jupyter_load(&jupyter_python, code, seconds);
    rows.push(Stats::new(
        "baseline: warm Jupyter kernel print(2+2)",
        1,
        latencies,
        elapsed,
    ));

    println!(
        "\ninterpreter: {}; pool size {pool_size}; {seconds} s per scenario",
        python.display()
    );
    println!(
        "| scenario                                     |   c |  p50 (ms) |  p99 (ms) |    runs/s |"
    );
    println!(
        "|----------------------------------------------|-----|-----------|-----------|-----------|"
    );
    for row in &rows {
        println!("{}", row.row());
    }
    let find = |name: &str| rows.iter().find(|r| r.name.starts_with(name)).unwrap();
    let http = find("HTTP /execute print").p50_ms();
    println!();
    println!(
        "server start to ready ({pool_size} workers): {:.0} ms",
        ready.as_secs_f64() * 1e3
    );
    println!(
        "server RSS: {:.1} MiB idle, {:.1} MiB max under load",
        rss_idle as f64 / 1024.0,
        rss_load as f64 / 1024.0
    );
    println!(
        "HTTP c=1 p50 vs python -c: {:.1}x faster",
        find("baseline: python -c print").p50_ms() / http
    );
    println!(
        "HTTP c=1 p50 vs python -I -S -c: {:.1}x faster",
        find("baseline: python -I -S").p50_ms() / http
    );
    println!(
        "HTTP c=1 p50 vs warm Jupyter kernel: {:.1}x faster",
        find("baseline: warm Jupyter").p50_ms() / http
    );
    println!(
        "numpy preloaded p50 vs cold numpy start: {:.1}x faster",
        find("baseline: python -c numpy").p50_ms() / find("HTTP /execute numpy").p50_ms()
    );
    println!(
        "MCP streamable HTTP adds {:+.3} ms p50 over /execute",
        find("MCP streamable").p50_ms() - http
    );
    println!(
        "MCP stdio adds {:+.3} ms p50 over /execute",
        find("MCP stdio").p50_ms() - http
    );
}
