//! End-to-end load benchmark: the real server binary driven by keep-alive
//! HTTP clients and by MCP clients, and, in the same run, the baselines:
//! spawning the interpreter per request (`python -c`, with and without
//! `-I -S`), a cold `import numpy`, and a warm Jupyter kernel.
//!
//! `cargo bench --bench e2e`. Environment: `BENCH_SECONDS` per scenario
//! (default 5), `BENCH_POOL_SIZE` (default 4), `BENCH_SPAWNS` (default 200),
//! `BENCH_PYTHON` (default: the real interpreter behind `python3`),
//! `BENCH_CONDA_LAYOUT=1` (serve a Conda-layout copy of that interpreter
//! instead, and spawn it for the baselines), `BENCH_SANDBOX_TIER`
//! (`namespaces` or `container`: the server's sandbox tier), `BENCH_MCP_ONLY` (set: only the MCP comparison, in about `4 * BENCH_SECONDS`),
//! `BENCH_SERVER_BIN` (another build's `code-executor` to measure).
//! The numpy and Jupyter scenarios use venvs made by `tests/python_envs/setup.sh`.

#[path = "support/load.rs"]
mod load;
#[path = "../tests/integration/common/mcp.rs"]
#[allow(dead_code)]
mod mcp_client;
#[path = "support/server.rs"]
mod server;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use server::{Server, TreeCpu, env_or, real_python};

/// Rows of the MCP comparison (see [`mcp_comparison`]).
const BESIDE_MCP: &str = "HTTP /execute print(2+2), beside MCP";
const STREAMABLE: &str = "MCP streamable HTTP, plain client";
const STREAMABLE_RMCP: &str = "MCP streamable HTTP, rmcp client";
const STDIO: &str = "MCP stdio, rmcp client";
const SHARED: &str = "MCP stdio --shared (relayed), rmcp client";

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

async fn http_load(
    url: &str,
    code: &str,
    concurrency: usize,
    seconds: f64,
) -> (Vec<Duration>, Duration) {
    let body = json!({ "code": code }).to_string();
    http_load_bodies(url, vec![body; concurrency], seconds).await
}

/// One keep-alive client per body, each sending its body back to back for
/// `seconds` once warmed up (see [`Load`]): each run's latency, and the time
/// it all took.
async fn http_load_bodies(
    url: &str,
    bodies: Vec<String>,
    seconds: f64,
) -> (Vec<Duration>, Duration) {
    Load::warm(url, bodies).await.run(seconds).await
}

/// One keep-alive client per body, each to send its body in a loop.
struct Load {
    url: Arc<str>,
    clients: Vec<(reqwest::Client, Arc<str>)>,
}

impl Load {
    /// The clients, each connection opened and used ten times, so that
    /// every worker has run: what a measure taken after this (CPU from
    /// `/proc`) counts is the timed runs alone.
    async fn warm(url: &str, bodies: Vec<String>) -> Load {
        let clients: Vec<_> = load::clients(bodies.len())
            .into_iter()
            .zip(bodies.into_iter().map(Arc::from))
            .collect();
        for (client, body) in &clients {
            for _ in 0..10 {
                load::execute(client, url, body).await;
            }
        }
        Load {
            url: url.into(),
            clients,
        }
    }

    /// Every client sends its body back to back for `seconds`; each run's
    /// latency, and the time it all took.
    async fn run(self, seconds: f64) -> (Vec<Duration>, Duration) {
        let url = self.url;
        load::back_to_back(self.clients, seconds, move |(client, body)| {
            let url = url.clone();
            async move { load::execute(&client, &url, &body).await }
        })
        .await
    }
}

/// `GET /health` back to back on one keep-alive connection: what an HTTP
/// round trip to this server costs with no run behind it.
async fn health_load(url: &str, seconds: f64) -> (Vec<Duration>, Duration) {
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let url = format!("{url}/health");
    let get = || get_health(&client, &url);
    for _ in 0..50 {
        get().await;
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let t = Instant::now();
        get().await;
        latencies.push(t.elapsed());
    }
    (latencies, started.elapsed())
}

/// One `GET` of `url` (a `/health` URL), its answer read whole.
async fn get_health(client: &reqwest::Client, url: &str) {
    let resp = client.get(url).send().await.unwrap();
    assert!(
        resp.status().is_success(),
        "/health answered {}",
        resp.status()
    );
    resp.bytes().await.unwrap();
}

/// How long a paced client waits after each answer (see [`in_turns_with_health`]).
const PACE: Duration = Duration::from_millis(50);
const PACED_RUN: &str = "HTTP /execute print(2+2), 50 ms apart";
const PACED_HEALTH: &str = "floor: HTTP GET /health, 50 ms apart";
const SESSION_TURNS: &str = "HTTP session print(2+2), in turns with GET /health";
const SESSION_START: &str = "HTTP POST /sessions + first call, 200 ms apart";
/// How long the session-start client waits after closing a session: the
/// pool replaces the session's worker meanwhile, as it does between an
/// agent's conversations.
const SESSION_PAUSE: Duration = Duration::from_millis(200);
const HEALTH_TURNS: &str = "floor: HTTP GET /health, in turns with a session call";

/// `POST /execute` with `body` and `GET /health` in turns on one keep-alive
/// connection from one client task, each call `pause` after the last answer
/// (none: back to back), after `warm_up` turns. With a pause the client
/// is an agent's tool loop: meanwhile every process on a call's path goes
/// idle, and so may the machine's CPUs. Back to back with a session call,
/// it shows what the call costs against the HTTP round trip it rides on,
/// with the client, its connection and the server's state the same for
/// both. The latencies of the `/execute` and of the `GET /health` calls,
/// and the time it all took.
async fn in_turns_with_health(
    url: &str,
    body: &str,
    pause: Duration,
    warm_up: usize,
    seconds: f64,
) -> (Vec<Duration>, Vec<Duration>, Duration) {
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let health = format!("{url}/health");
    for _ in 0..warm_up {
        load::execute(&client, url, body).await;
        get_health(&client, &health).await;
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let (mut runs, mut gets) = (Vec::new(), Vec::new());
    while Instant::now() < deadline {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let t = Instant::now();
        load::execute(&client, url, body).await;
        runs.push(t.elapsed());
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let t = Instant::now();
        get_health(&client, &health).await;
        gets.push(t.elapsed());
    }
    (runs, gets, started.elapsed())
}

/// Sessions opened one at a time, `SESSION_PAUSE` apart: the time from
/// `POST /sessions` to the answer of the session's first call (each then
/// closed), and the time it all took.
async fn session_starts(url: &str, code: &str, seconds: f64) -> (Vec<Duration>, Duration) {
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut starts = Vec::new();
    while Instant::now() < deadline {
        tokio::time::sleep(SESSION_PAUSE).await;
        let t = Instant::now();
        let id = create_session(&client, url).await;
        let body = json!({ "code": code, "session": id }).to_string();
        load::execute(&client, url, &body).await;
        starts.push(t.elapsed());
        let resp = client
            .delete(format!("{url}/sessions/{id}"))
            .send()
            .await
            .expect("session closed");
        assert!(resp.status().is_success(), "{}", resp.status());
    }
    (starts, started.elapsed())
}

/// `POST /sessions`; the new session's id.
async fn create_session(client: &reqwest::Client, url: &str) -> String {
    let resp = client
        .post(format!("{url}/sessions"))
        .json(&json!({}))
        .send()
        .await
        .expect("session created");
    assert_eq!(resp.status(), 201);
    let info: serde_json::Value = resp.json().await.unwrap();
    info["id"].as_str().unwrap().to_string()
}

/// A plain MCP client over streamable HTTP, as lean as the `/execute`
/// client: one keep-alive connection, one request at a time, each response
/// body read whole and its SSE events (or JSON body) parsed in place. It
/// speaks the protocol a real client does (initialize, session id, protocol
/// version header) and checks every result; what it leaves out is the SDK's
/// own machinery, which the rmcp client rows measure.
struct PlainMcpClient {
    client: reqwest::Client,
    url: String,
    /// `Mcp-Session-Id` from the `initialize` response.
    session: String,
    /// The negotiated protocol version, sent as `MCP-Protocol-Version`.
    version: String,
    next_id: u64,
}

impl PlainMcpClient {
    async fn connect(url: &str) -> PlainMcpClient {
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .build()
            .unwrap();
        let init = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": { "name": "e2e-bench", "version": "0" },
            },
        });
        let resp = client
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .json(&init)
            .send()
            .await
            .expect("initialize answered");
        let session = resp.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        let reply = response_to(resp, 0).await;
        let version = reply["result"]["protocolVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let plain = PlainMcpClient {
            client,
            url: url.to_string(),
            session,
            version,
            next_id: 1,
        };
        let resp = plain
            .post(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
            .await;
        assert_eq!(resp.status(), 202);
        plain
    }

    async fn post(&self, message: &serde_json::Value) -> reqwest::Response {
        self.client
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", &self.version)
            .json(message)
            .send()
            .await
            .expect("MCP request answered")
    }

    async fn execute_code(&mut self, args: &serde_json::Value) -> rmcp::model::CallToolResult {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": "execute_code", "arguments": args },
        });
        let reply = response_to(self.post(&request).await, id).await;
        serde_json::from_value(reply["result"].clone()).expect("a tool result")
    }
}

/// The JSON-RPC response with `id` in `resp`'s body: a JSON body, or the
/// `data` of one event of an SSE body (priming events carry none,
/// notifications have no `id`).
async fn response_to(resp: reqwest::Response, id: u64) -> serde_json::Value {
    assert_eq!(resp.status(), 200);
    let sse = resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream");
    let body = resp.bytes().await.expect("response body");
    let messages = if sse {
        sse_data(&body)
            .iter()
            .map(|data| serde_json::from_str(data).expect("JSON-RPC message"))
            .collect()
    } else {
        vec![serde_json::from_slice(&body).expect("JSON-RPC message")]
    };
    messages
        .into_iter()
        .find(|m: &serde_json::Value| m["id"] == id)
        .expect("a response to the request")
}

/// The `data` of each event in an SSE body that has any.
fn sse_data(body: &[u8]) -> Vec<String> {
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    for line in std::str::from_utf8(body).unwrap().split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            events.extend(data.take().filter(|d| !d.is_empty()));
        } else if let Some(value) = line.strip_prefix("data:") {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            }
        }
    }
    events.extend(data.filter(|d| !d.is_empty()));
    events
}

/// rmcp's client over streamable HTTP on a keep-alive connection. Its
/// default HTTP client (`StreamableHttpClientTransport::from_config`) keeps
/// no idle connections, so every call would open a new TCP connection: a
/// cost of that client's setup, not of MCP, and one `/execute` is not
/// charged either. rmcp also attaches a progress token to every request, so
/// these calls stream their output as progress notifications.
async fn connect_rmcp_keep_alive(url: &str) -> mcp_client::McpClient {
    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let transport = StreamableHttpClientTransport::with_client(
        client,
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    ().serve(transport)
        .await
        .expect("MCP handshake over streamable HTTP")
}

/// One client of the MCP comparison.
enum Front<'a> {
    /// `POST /execute` with this body.
    Execute(reqwest::Client, String, String),
    Plain(PlainMcpClient),
    Rmcp(&'a mcp_client::McpClient),
}

impl Front<'_> {
    /// One call with `args` (`{"code": ...}`), its result checked.
    async fn call(&mut self, args: &serde_json::Value) {
        let result = match self {
            Front::Execute(client, url, body) => return load::execute(client, url, body).await,
            Front::Plain(client) => client.execute_code(args).await,
            Front::Rmcp(client) => mcp_client::execute_code(client, args.clone())
                .await
                .unwrap(),
        };
        assert_eq!(result.is_error, Some(false));
    }

    /// Calls until `until`, each timed.
    async fn calls(&mut self, args: &serde_json::Value, until: Instant) -> Vec<Duration> {
        let mut latencies = Vec::new();
        while Instant::now() < until {
            let t = Instant::now();
            self.call(args).await;
            latencies.push(t.elapsed());
        }
        latencies
    }
}

/// The MCP overhead, measured fairly on a shared machine: `fronts` (one
/// client each, one call at a time) take turns in `ROUNDS` slices of
/// `seconds / ROUNDS` each, so that load from elsewhere falls on all alike.
async fn mcp_comparison(
    fronts: &mut [Front<'_>],
    code: &str,
    seconds: f64,
) -> Vec<(Vec<Duration>, Duration)> {
    const ROUNDS: u32 = 10;
    let args = json!({ "code": code });
    // Warm-up: connections opened, every worker used.
    for front in fronts.iter_mut() {
        front
            .calls(&args, Instant::now() + Duration::from_millis(200))
            .await;
    }
    let slice = Duration::from_secs_f64(seconds / f64::from(ROUNDS));
    let mut out = vec![(Vec::new(), Duration::ZERO); fronts.len()];
    for _ in 0..ROUNDS {
        for (front, (latencies, elapsed)) in fronts.iter_mut().zip(&mut out) {
            let t = Instant::now();
            latencies.extend(front.calls(&args, t + slice).await);
            *elapsed += t.elapsed();
        }
    }
    out
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

/// numpy preloaded in the workers, then the baselines without a server.
async fn other_scenarios(
    python: &Path,
    pool: &str,
    code: &str,
    seconds: f64,
    spawns: usize,
    rows: &mut Vec<Stats>,
) {
    let numpy_python = venv_python("plot", python);
    let numpy_code = "import numpy; numpy.arange(10).sum()";
    let server = Server::start(&[
        "--python",
        numpy_python.to_str().unwrap(),
        "--pool-size",
        pool,
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

    // A stdlib module no start-up imports, which every run imports: the
    // zygotes learn it after a few runs (see "Learned imports" in README).
    let server = Server::start(&["--python", python.to_str().unwrap(), "--pool-size", pool]).await;
    let (latencies, elapsed) = http_load(
        &server.url,
        "import statistics; statistics.mean([1, 2, 3])",
        1,
        seconds,
    )
    .await;
    rows.push(Stats::new(
        "HTTP /execute import statistics",
        1,
        latencies,
        elapsed,
    ));
    drop(server);

    // Baselines.
    let (latencies, elapsed) = spawn_load(python, &["-c", code], spawns, b"4\n");
    rows.push(Stats::new(
        "baseline: python -c print(2+2)",
        1,
        latencies,
        elapsed,
    ));
    let (latencies, elapsed) = spawn_load(python, &["-I", "-S", "-c", code], spawns, b"4\n");
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
    let jupyter_python = venv_python("jupyter", python);
    let (latencies, elapsed) = jupyter_load(&jupyter_python, code, seconds);
    rows.push(Stats::new(
        "baseline: warm Jupyter kernel print(2+2)",
        1,
        latencies,
        elapsed,
    ));
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
    // Only the MCP comparison (a quick check of the MCP overhead).
    let mcp_only = std::env::var_os("BENCH_MCP_ONLY").is_some();
    let mut rows: Vec<Stats> = Vec::new();

    // Clean-state print(2+2) over HTTP.
    let server = Server::start(&["--python", python.to_str().unwrap(), "--pool-size", &pool]).await;
    let ready = server.ready_after;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle = server.rss_kib();
    let mut rss_load = 0;
    // CPU of the server and everything under it per clean run, by concurrency.
    let mut cpu_per_run: Vec<(usize, TreeCpu)> = Vec::new();
    if !mcp_only {
        for concurrency in [1, 8, 32] {
            let body = json!({ "code": code }).to_string();
            let load = Load::warm(&server.url, vec![body; concurrency]).await;
            let cpu_before = server.tree_cpu();
            let sampler = async {
                let mut max = 0;
                for _ in 0..(seconds * 10.0) as usize {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    max = max.max(server.rss_kib());
                }
                max
            };
            let ((latencies, elapsed), max) = tokio::join!(load.run(seconds), sampler);
            rss_load = rss_load.max(max);
            let cpu = server.tree_cpu().per_run(&cpu_before, latencies.len());
            cpu_per_run.push((concurrency, cpu));
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
                let id = create_session(&reqwest::Client::new(), &server.url).await;
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
        let (latencies, elapsed) = health_load(&server.url, seconds).await;
        rows.push(Stats::new("floor: HTTP GET /health", 1, latencies, elapsed));
        let id = create_session(&reqwest::Client::new(), &server.url).await;
        let body = json!({ "code": code, "session": id }).to_string();
        let (calls, gets, elapsed) =
            in_turns_with_health(&server.url, &body, Duration::ZERO, 50, seconds).await;
        rows.push(Stats::new(SESSION_TURNS, 1, calls, elapsed));
        rows.push(Stats::new(HEALTH_TURNS, 1, gets, elapsed));
        let body = json!({ "code": code }).to_string();
        let (runs, gets, elapsed) =
            in_turns_with_health(&server.url, &body, PACE, 5, seconds).await;
        rows.push(Stats::new(PACED_RUN, 1, runs, elapsed));
        rows.push(Stats::new(PACED_HEALTH, 1, gets, elapsed));
        let (starts, elapsed) = session_starts(&server.url, code, seconds).await;
        rows.push(Stats::new(SESSION_START, 1, starts, elapsed));
    }

    // The same over MCP: streamable HTTP on the same server (a plain client
    // and rmcp's), and stdio (rmcp's client); with /execute, in turns.
    let mcp_url = format!("{}/mcp", server.url);
    let rmcp_http = connect_rmcp_keep_alive(&mcp_url).await;
    let (rmcp_stdio, _stdio_server) = mcp_client::connect_stdio(
        &server::server_binary(),
        &["--python", python.to_str().unwrap(), "--pool-size", &pool],
        &[],
    )
    .await;
    let shared_runtime = tempfile::tempdir().unwrap();
    let (rmcp_shared, mut shared_relay) = mcp_client::connect_stdio(
        &server::server_binary(),
        &[
            "--shared",
            "--python",
            python.to_str().unwrap(),
            "--pool-size",
            &pool,
        ],
        &[("XDG_RUNTIME_DIR", shared_runtime.path())],
    )
    .await;
    let execute = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let mut fronts = [
        Front::Execute(
            execute,
            server.url.clone(),
            json!({ "code": code }).to_string(),
        ),
        Front::Plain(PlainMcpClient::connect(&mcp_url).await),
        Front::Rmcp(&rmcp_http),
        Front::Rmcp(&rmcp_stdio),
        Front::Rmcp(&rmcp_shared),
    ];
    let measured = mcp_comparison(&mut fronts, code, 4.0 * seconds).await;
    for (name, (latencies, elapsed)) in [BESIDE_MCP, STREAMABLE, STREAMABLE_RMCP, STDIO, SHARED]
        .into_iter()
        .zip(measured)
    {
        rows.push(Stats::new(name, 1, latencies, elapsed));
    }
    drop(fronts);
    drop(rmcp_http);
    drop(rmcp_stdio);
    // The launch exits once its client has gone; stopped before that, its
    // server would take it down with an error.
    let _ = rmcp_shared.cancel().await;
    let _ = tokio::time::timeout(Duration::from_secs(10), shared_relay.wait()).await;
    stop_shared_servers(shared_runtime.path());
    // Cold start as an MCP client meets it: spawn `code-executor mcp`,
    // initialize, call execute_code once; beside spawning `python -c`.
    let mut cold = Vec::new();
    let mut spawn = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        let (client, mut child) = mcp_client::connect_stdio(
            &server::server_binary(),
            &["--python", python.to_str().unwrap(), "--pool-size", &pool],
            &[],
        )
        .await;
        let out = mcp_client::execute_code(&client, json!({ "code": code }))
            .await
            .expect("first call answered");
        cold.push(t.elapsed());
        assert_eq!(mcp_client::text(&out), "4\n[exit code 0]");
        drop(client);
        let _ = child.kill().await;
        // The kernel tears the killed workers' network namespaces down after
        // they exit; a start meanwhile waits for that (~40 ms here).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let t = Instant::now();
        let out = std::process::Command::new(&python)
            .args(["-c", code])
            .output()
            .unwrap();
        spawn.push(t.elapsed());
        assert_eq!(out.stdout, b"4\n");
    }
    cold.sort();
    spawn.sort();
    let cold_start = (cold[cold.len() / 2], spawn[spawn.len() / 2]);
    let shared = shared_launches(&python, &pool, code).await;
    drop(server);
    if !mcp_only {
        other_scenarios(&python, &pool, code, seconds, spawns, &mut rows).await;
    }
    println!(
        "\ninterpreter: {}; pool size {pool_size}; {seconds} s per scenario",
        python.display()
    );
    println!(
        "MCP stdio cold start (spawn, initialize, first execute_code; median of 10): {:.1} ms; \
         python -c spawn: {:.1} ms",
        cold_start.0.as_secs_f64() * 1e3,
        cold_start.1.as_secs_f64() * 1e3
    );
    println!(
        "MCP stdio --shared (spawn, initialize, first execute_code): first launch {:.1} ms; \
         later launches, the server warm: {:.1} ms (median of 10) = {:.2}x the python -c spawn",
        shared.0.as_secs_f64() * 1e3,
        shared.1.as_secs_f64() * 1e3,
        shared.1.as_secs_f64() / cold_start.1.as_secs_f64()
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
    // p50 of the row named `name` at concurrency 1, if it ran.
    let p50 = |name: &str| {
        rows.iter()
            .find(|r| r.name == name && r.concurrency == 1)
            .map(Stats::p50_ms)
    };
    let faster = |label: &str, slow: &str, fast: &str| {
        if let (Some(slow), Some(fast)) = (p50(slow), p50(fast)) {
            println!("{label}: {:.1}x faster", slow / fast);
        }
    };
    println!();
    println!(
        "server start to ready ({pool_size} workers): {:.0} ms",
        ready.as_secs_f64() * 1e3
    );
    if !mcp_only {
        println!(
            "server RSS: {:.1} MiB idle, {:.1} MiB max under load",
            rss_idle as f64 / 1024.0,
            rss_load as f64 / 1024.0
        );
    }
    if !cpu_per_run.is_empty() {
        let floors = server::fork_floors(&python);
        for (concurrency, cpu) in &cpu_per_run {
            let ms = cpu.total() * 1e3;
            let mut line = format!(
                "CPU per clean run at c={concurrency} (server, workers, zygotes, children): {ms:.2} ms"
            );
            if let Some((worker_sized, bare)) = floors {
                line += &format!(
                    " = {:.1}x the fork floor of a worker-sized process ({:.2} ms), {:.1}x the bare interpreter's ({:.2} ms)",
                    ms / (worker_sized / 1e3),
                    worker_sized / 1e3,
                    ms / (bare / 1e3),
                    bare / 1e3
                );
            }
            line += &format!(
                "; by process: server {:.2}, workers {:.2}, zygotes {:.2}, runs {:.2} ms",
                cpu.server * 1e3,
                cpu.workers * 1e3,
                cpu.zygotes * 1e3,
                cpu.runs * 1e3
            );
            println!("{line}");
        }
    }
    if let (Some(session), Some(floor)) = (p50(SESSION_TURNS), p50(HEALTH_TURNS)) {
        println!(
            "session call c=1 p50 / GET /health p50: {:.2}x ({session:.3} ms / {floor:.3} ms; \
             one keep-alive connection, in turns)",
            session / floor
        );
    }
    let session = rows
        .iter()
        .find(|r| r.name == "HTTP session print(2+2)" && r.concurrency == 1)
        .map(Stats::p50_ms);
    if let (Some(session), Some(floor)) = (session, p50("floor: HTTP GET /health")) {
        println!(
            "session call c=1 p50 / GET /health p50, each back to back on its own connection: \
             {:.2}x ({session:.3} ms / {floor:.3} ms)",
            session / floor
        );
    }
    if let (Some(run), Some(get), Some(run_b2b), Some(get_b2b)) = (
        p50(PACED_RUN),
        p50(PACED_HEALTH),
        p50("HTTP /execute print(2+2)"),
        p50("floor: HTTP GET /health"),
    ) {
        println!(
            "calls 50 ms apart: /execute p50 {run:.3} ms = {:.2}x back to back; \
             GET /health p50 {get:.3} ms = {:.2}x back to back",
            run / run_b2b,
            get / get_b2b
        );
    }
    let http = "HTTP /execute print(2+2)";
    faster(
        "HTTP c=1 p50 vs python -c",
        "baseline: python -c print(2+2)",
        http,
    );
    faster(
        "HTTP c=1 p50 vs python -I -S -c",
        "baseline: python -I -S -c print(2+2)",
        http,
    );
    faster(
        "HTTP c=1 p50 vs warm Jupyter kernel",
        "baseline: warm Jupyter kernel print(2+2)",
        http,
    );
    faster(
        "numpy preloaded p50 vs cold numpy start",
        "baseline: python -c numpy (cold)",
        "HTTP /execute numpy (preloaded)",
    );
    let beside = p50(BESIDE_MCP).unwrap();
    for (label, name) in [
        ("MCP streamable HTTP, plain client,", STREAMABLE),
        ("MCP streamable HTTP, rmcp client,", STREAMABLE_RMCP),
        ("MCP stdio, rmcp client,", STDIO),
        ("MCP stdio --shared, rmcp client,", SHARED),
    ] {
        println!(
            "{label} adds {:+.3} ms p50 over /execute (measured in the same slices of time)",
            p50(name).unwrap() - beside
        );
    }
}

/// `code-executor mcp --shared` as a client meets it: spawn, initialize,
/// one execute_code. The first launch starts the shared server; the next
/// ten find it warm. The first launch's time and the median of the rest.
async fn shared_launches(python: &Path, pool: &str, code: &str) -> (Duration, Duration) {
    let runtime = tempfile::tempdir().unwrap();
    let args = [
        "--shared",
        "--python",
        python.to_str().unwrap(),
        "--pool-size",
        pool,
    ];
    let mut times = Vec::new();
    for _ in 0..11 {
        let t = Instant::now();
        let (client, mut child) = mcp_client::connect_stdio(
            &server::server_binary(),
            &args,
            &[("XDG_RUNTIME_DIR", runtime.path())],
        )
        .await;
        let out = mcp_client::execute_code(&client, json!({ "code": code }))
            .await
            .expect("first call answered");
        times.push(t.elapsed());
        assert_eq!(mcp_client::text(&out), "4\n[exit code 0]");
        let _ = client.cancel().await;
        let _ = child.wait().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_shared_servers(runtime.path());
    let first = times.remove(0);
    times.sort();
    (first, times[times.len() / 2])
}

/// SIGTERM the shared servers under the runtime directory `runtime`: the
/// processes listening on its sockets.
fn stop_shared_servers(runtime: &Path) {
    let Ok(entries) = std::fs::read_dir(runtime.join("code-executor")) else {
        return;
    };
    for socket in entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "sock"))
    {
        let Ok(stream) = std::os::unix::net::UnixStream::connect(socket.path()) else {
            continue;
        };
        if let Ok(peer) =
            nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(peer.pid()),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
}
