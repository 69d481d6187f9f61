//! End-to-end load benchmark: the real server binary, keep-alive HTTP clients,
//! and in the same run the baseline of spawning the interpreter per request.
//!
//! `cargo bench --bench e2e` (env: `BENCH_SECONDS` per scenario, default 5;
//! `BENCH_POOL_SIZE`, default 4; `BENCH_PYTHON`, default the real `python3`).

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
    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[idx]
    }

    fn row(&self) -> String {
        format!(
            "| {:<34} | {:>3} | {:>9.3} | {:>9.3} | {:>9.0} |",
            self.name,
            self.concurrency,
            self.percentile(0.50).as_secs_f64() * 1e3,
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

fn real_python() -> String {
    if let Ok(p) = std::env::var("BENCH_PYTHON") {
        return p;
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on PATH");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Start `code-executor serve` and return it with its base URL.
async fn start_server(python: &str, pool_size: usize) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_code-executor"))
        .args(["serve", "--port", "0", "--python", python])
        .args(["--pool-size", &pool_size.to_string()])
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
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("http://{address}"))
}

async fn http_load(url: &str, code: &str, concurrency: usize, seconds: f64) -> Stats {
    let body = json!({ "code": code }).to_string();
    http_load_bodies(url, vec![body; concurrency], seconds).await
}

/// One keep-alive client per body, each sending its body in a loop.
async fn http_load_bodies(url: &str, bodies: Vec<String>, seconds: f64) -> Stats {
    let concurrency = bodies.len();
    let clients: Vec<reqwest::Client> = (0..concurrency)
        .map(|_| {
            reqwest::Client::builder()
                .tcp_nodelay(true)
                .build()
                .unwrap()
        })
        .collect();
    // Warm-up: every connection opened, every worker used once.
    for (client, body) in clients.iter().zip(&bodies) {
        for _ in 0..20 {
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
    Stats {
        name: String::new(),
        concurrency,
        latencies,
        elapsed: started.elapsed(),
    }
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

fn spawn_load(python: &str, args: &[&str], count: usize) -> Stats {
    let started = Instant::now();
    let mut latencies = Vec::new();
    for _ in 0..count {
        let t = Instant::now();
        let out = std::process::Command::new(python)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"4\n");
        latencies.push(t.elapsed());
    }
    Stats {
        name: String::new(),
        concurrency: 1,
        latencies,
        elapsed: started.elapsed(),
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; a plain `cargo test --benches` passes
    // nothing and should not run the load.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let seconds: f64 = env_or("BENCH_SECONDS", 5.0);
    let pool_size: usize = env_or("BENCH_POOL_SIZE", 4);
    let python = real_python();
    let code = "print(2+2)";

    let ready_started = Instant::now();
    let (mut server, url) = start_server(&python, pool_size).await;
    let ready = ready_started.elapsed();

    let mut rows = Vec::new();
    for concurrency in [1, 8, 32] {
        let mut stats = http_load(&url, code, concurrency, seconds).await;
        stats.name = "HTTP /execute print(2+2)".into();
        rows.push(stats);
    }
    // Sessions: each client has its own session (calls to one session run
    // one at a time, so more clients on one session would only queue).
    for concurrency in [1, 4] {
        let mut bodies = Vec::new();
        for _ in 0..concurrency {
            let id = create_session(&url).await;
            bodies.push(json!({ "code": code, "session": id }).to_string());
        }
        let mut stats = http_load_bodies(&url, bodies, seconds).await;
        stats.name = "HTTP session print(2+2)".into();
        rows.push(stats);
    }
    let _ = server.kill().await;

    let spawn_count = env_or("BENCH_SPAWNS", 200);
    let mut plain = spawn_load(&python, &["-c", code], spawn_count);
    plain.name = "baseline: python -c".into();
    let mut isolated = spawn_load(&python, &["-I", "-S", "-c", code], spawn_count);
    isolated.name = "baseline: python -I -S -c".into();

    println!("\ninterpreter: {python}; pool size {pool_size}; {seconds} s per HTTP scenario");
    println!(
        "server start to ready ({pool_size} workers): {:.0} ms\n",
        ready.as_secs_f64() * 1e3
    );
    println!("| scenario                           |   c |  p50 (ms) |  p99 (ms) |    runs/s |");
    println!("|------------------------------------|-----|-----------|-----------|-----------|");
    for row in rows.iter().chain([&plain, &isolated]) {
        println!("{}", row.row());
    }
    let p50 = rows[0].percentile(0.5).as_secs_f64();
    println!(
        "\nHTTP c=1 p50 is {:.1}x faster than `python -c` and {:.1}x faster than `python -I -S -c`",
        plain.percentile(0.5).as_secs_f64() / p50,
        isolated.percentile(0.5).as_secs_f64() / p50
    );
}
