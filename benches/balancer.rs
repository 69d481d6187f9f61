//! Three replicas behind HAProxy against one replica alone, on this machine:
//! `POST /execute print(2+2)` at c=1 and c=16 (p50, p99, runs/s), and the
//! balancer's own overhead in the same run (`GET /livez` through HAProxy
//! against the same request sent to a replica directly). Direct and balanced
//! take turns in `BENCH_ROUNDS` rounds of `BENCH_SECONDS` each, so that both
//! see the same machine.
//!
//!   cargo bench --bench balancer
//!
//! HAProxy runs with deploy/haproxy/haproxy.cfg, its addresses replaced by
//! the replicas' loopback ones; it is installed from Debian's package when
//! missing, as the tests do (tests/integration/common/cluster.rs).
//! `BENCH_POOL_SIZE` (default 4) sets each replica's pool.

#[path = "support/load.rs"]
#[allow(dead_code)] // execute: the balancer sends its own requests
mod load;
#[allow(dead_code)] // the other benches use the rest of it
#[path = "support/server.rs"]
mod server;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use server::{Server, env_or, real_python};

struct Sample {
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Sample {
    fn add(&mut self, (latencies, elapsed): (Vec<Duration>, Duration)) {
        self.latencies.extend(latencies);
        self.elapsed += elapsed;
    }

    fn ms(&mut self, p: f64) -> f64 {
        self.latencies.sort();
        let idx = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[idx].as_secs_f64() * 1e3
    }

    fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// `concurrency` keep-alive clients, each sending `request` back to back for
/// `seconds`; every answer must be 200.
async fn load(
    url: &str,
    post: Option<&str>,
    concurrency: usize,
    seconds: f64,
) -> (Vec<Duration>, Duration) {
    let url: Arc<str> = url.into();
    let body: Option<Arc<str>> = post.map(|code| json!({ "code": code }).to_string().into());
    let send = move |client: reqwest::Client| {
        let (url, body) = (url.clone(), body.clone());
        async move {
            let req = match &body {
                Some(b) => client
                    .post(&*url)
                    .header("content-type", "application/json")
                    .body(b.to_string()),
                None => client.get(&*url),
            };
            let resp = req.send().await.expect("answered");
            assert_eq!(resp.status(), 200, "{url}");
            resp.bytes().await.unwrap();
        }
    };
    let clients = load::clients(concurrency);
    // Warm-up: every connection opened.
    for client in &clients {
        for _ in 0..5 {
            send(client.clone()).await;
        }
    }
    load::back_to_back(clients, seconds, send).await
}

/// The `haproxy` binary, installed from Debian's package when missing.
fn haproxy() -> String {
    let out = std::process::Command::new("bash")
        .args([
            "-c",
            "exec 9>/tmp/code-executor-haproxy-install.lock; flock 9; \
             command -v haproxy >/dev/null 2>&1 || { apt-get update -q >&2 && \
             DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >&2; }; command -v haproxy",
        ])
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "haproxy is needed: apt-get install haproxy"
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// HAProxy with the shipped configuration in front of `replicas`.
fn start_haproxy(replicas: &[String], dir: &std::path::Path) -> (tokio::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/haproxy/haproxy.cfg"
    ))
    .unwrap();
    let mut next = replicas.iter();
    let config: Vec<String> = shipped
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if trimmed == "bind :8080" {
                format!("    bind 127.0.0.1:{port}")
            } else if let Some(rest) = trimmed.strip_prefix("server ") {
                let mut words: Vec<&str> = rest.split_whitespace().collect();
                words[1] = next.next().expect("a replica per server line");
                format!("    server {}", words.join(" "))
            } else {
                line.to_string()
            }
        })
        .collect();
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config.join("\n") + "\n").unwrap();
    let child = tokio::process::Command::new(haproxy())
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("haproxy starts");
    (child, format!("http://127.0.0.1:{port}"))
}

#[tokio::main]
async fn main() {
    let seconds: f64 = env_or("BENCH_SECONDS", 3.0);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let pool: usize = env_or("BENCH_POOL_SIZE", 4);
    let python = real_python();
    let pool_arg = pool.to_string();
    let mut replicas = Vec::new();
    for id in ["r1", "r2", "r3"] {
        replicas.push(
            Server::start(&[
                "--pool-size",
                &pool_arg,
                "--replica-id",
                id,
                "--python",
                python.to_str().unwrap(),
            ])
            .await,
        );
    }
    let addresses: Vec<String> = replicas
        .iter()
        .map(|r| r.url.trim_start_matches("http://").to_string())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (_haproxy, balancer) = start_haproxy(&addresses, dir.path());
    // Every replica answers through it.
    let client = reqwest::Client::new();
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "HAProxy did not reach every replica"
        );
        if let Ok(resp) = client.get(format!("{balancer}/livez")).send().await
            && let Some(id) = resp.headers().get("x-replica")
        {
            seen.insert(id.to_str().unwrap().to_string());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let alone = replicas[0].url.clone();
    let code = Some("print(2+2)");
    let scenarios: Vec<(&str, Option<&str>, usize)> = vec![
        ("GET /livez", None, 1),
        ("POST /execute print(2+2)", code, 1),
        ("POST /execute print(2+2)", code, 16),
    ];
    let empty = || Sample {
        latencies: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let mut results: Vec<(Sample, Sample)> = scenarios.iter().map(|_| (empty(), empty())).collect();
    for round in 0..rounds {
        for ((_, post, c), (direct, balanced)) in scenarios.iter().zip(results.iter_mut()) {
            // Alternate which goes first, so that neither always follows the other.
            if round % 2 == 0 {
                direct.add(load(&format!("{alone}{}", path(*post)), *post, *c, seconds).await);
                balanced.add(load(&format!("{balancer}{}", path(*post)), *post, *c, seconds).await);
            } else {
                balanced.add(load(&format!("{balancer}{}", path(*post)), *post, *c, seconds).await);
                direct.add(load(&format!("{alone}{}", path(*post)), *post, *c, seconds).await);
            }
        }
    }
    println!(
        "\n3 replicas (pool {pool} each) behind HAProxy vs one replica alone; {rounds} rounds x {seconds} s each, in turns\n"
    );
    println!(
        "| scenario | c | one replica: p50 (ms) | p99 | req/s | HAProxy + 3 replicas: p50 (ms) | p99 | req/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut overhead = Vec::new();
    for ((name, _, c), (direct, balanced)) in scenarios.iter().zip(results.iter_mut()) {
        let (d50, d99, b50, b99) = (
            direct.ms(0.5),
            direct.ms(0.99),
            balanced.ms(0.5),
            balanced.ms(0.99),
        );
        println!(
            "| {name} | {c} | {d50:.3} | {d99:.3} | {:.0} | {b50:.3} | {b99:.3} | {:.0} |",
            direct.per_second(),
            balanced.per_second()
        );
        overhead.push((format!("{name}, c={c}"), b50 - d50));
    }
    println!();
    for (name, extra) in overhead {
        println!("* HAProxy's p50 cost, {name}: {:+.3} ms", extra);
    }
    for replica in &replicas {
        let text = client
            .get(format!("{}/metrics", replica.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let served = text
            .lines()
            .find(|l| l.starts_with(r#"code_executor_http_requests_total{method="POST",route="/execute",status="200"}"#))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or("0");
        println!("* {}: {served} /execute answered in all", replica.url);
    }
}

fn path(post: Option<&str>) -> &'static str {
    if post.is_some() { "/execute" } else { "/livez" }
}
