//! What the audit log costs: `/execute print(2+2)` at c=1 (p50) and c=8
//! (runs/s) on two servers of the real binary started side by side, one
//! without an audit log and one writing it to a file, measured in the same
//! run and interleaved round by round (off, on, off, on, ...) so that load
//! from elsewhere on the machine falls on both alike. The verdict compares
//! the medians over the rounds.
//!
//! `cargo bench --bench audit`. Environment: `BENCH_SECONDS` per scenario
//! and round (default 3), `BENCH_ROUNDS` (default 3), `BENCH_POOL_SIZE`
//! (default 4), `BENCH_AUDIT_FAIL` (`open` or `closed`, default `open`),
//! `BENCH_PYTHON` (default: the real interpreter behind `python3`).

#[path = "support/load.rs"]
mod load;
#[path = "support/server.rs"]
#[allow(dead_code)]
mod server;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use server::{Server, env_or, real_python};

/// Each of `concurrency` keep-alive clients posts `body` to `url` in a
/// loop for `seconds`; every latency and the time it took.
async fn load(
    url: &str,
    body: &str,
    concurrency: usize,
    seconds: f64,
) -> (Vec<Duration>, Duration) {
    let clients = load::clients(concurrency);
    for client in &clients {
        for _ in 0..10 {
            load::execute(client, url, body).await;
        }
    }
    let (url, body): (Arc<str>, Arc<str>) = (url.into(), body.into());
    load::back_to_back(clients, seconds, move |client| {
        let (url, body) = (url.clone(), body.clone());
        async move { load::execute(&client, &url, &body).await }
    })
    .await
}

fn p50_ms(latencies: &mut [Duration]) -> f64 {
    latencies.sort();
    latencies[latencies.len() / 2].as_secs_f64() * 1e3
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let seconds: f64 = env_or("BENCH_SECONDS", 3.0);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let pool = env_or("BENCH_POOL_SIZE", 4usize).to_string();
    let fail: String = env_or("BENCH_AUDIT_FAIL", "open".to_string());
    let python = real_python();
    let python = python.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let off = Server::start(&["--python", python, "--pool-size", &pool]).await;
    let on = Server::start(&[
        "--python",
        python,
        "--pool-size",
        &pool,
        "--audit-log",
        log.to_str().unwrap(),
        "--audit-fail",
        &fail,
    ])
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let body = json!({ "code": "print(2+2)" }).to_string();
    // [off, on] x [c=1 p50 ms, c=8 runs/s], one value per round.
    let mut p50 = [Vec::new(), Vec::new()];
    let mut rate = [Vec::new(), Vec::new()];
    println!("| round | audit | c=1 p50 ms | c=8 runs/s |");
    println!("|---|---|---:|---:|");
    for round in 0..rounds {
        // Alternate which goes first, so neither always follows the other.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let url = if which == 0 { &off.url } else { &on.url };
            let (mut one, _) = load(url, &body, 1, seconds).await;
            let (eight, elapsed) = load(url, &body, 8, seconds).await;
            let p = p50_ms(&mut one);
            let r = eight.len() as f64 / elapsed.as_secs_f64();
            p50[which].push(p);
            rate[which].push(r);
            println!(
                "| {round} | {} | {p:.3} | {r:.0} |",
                if which == 0 { "off" } else { "on" }
            );
        }
    }
    let records = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count();
    let (p_off, p_on) = (median(&mut p50[0]), median(&mut p50[1]));
    let (r_off, r_on) = (median(&mut rate[0]), median(&mut rate[1]));
    println!();
    println!("| audit log | c=1 p50 ms | c=8 runs/s |");
    println!("|---|---:|---:|");
    println!("| off | {p_off:.3} | {r_off:.0} |");
    println!("| on ({fail}) | {p_on:.3} | {r_on:.0} |");
    println!(
        "| cost | {:+.1}% | {:+.1}% |",
        (p_on / p_off - 1.0) * 100.0,
        (1.0 - r_on / r_off) * 100.0
    );
    println!();
    println!("{records} audit records written; target: under 3% on both");
}
