//! Egress proxy benchmark: a 1 MB download through the proxy of an
//! environment with `allowed_hosts`, against the same download over the
//! host's network (`--network host`, no proxy); and a clean run that opens no
//! connection, with and without an allow-list (the listener is made once per
//! worker, so it should cost nothing). All in one run, on the real server
//! binary, against an HTTP server on 127.0.0.1 started here.
//!
//! `cargo bench --bench egress` (env: `BENCH_ROUNDS`, default 30;
//! `BENCH_PYTHON`, default the real `python3`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "support/server.rs"]
#[allow(dead_code)]
mod server;

use server::{Server, env_or, real_python};

const MB: usize = 1 << 20;

/// Serves `MB` bytes to every request, one request per connection.
async fn origin() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let body = vec![b'x'; MB];
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(&body).await;
            });
        }
    });
    port
}

async fn run(client: &reqwest::Client, url: &str, code: &str) -> Value {
    let resp = client
        .post(format!("{url}/execute"))
        .json(&json!({ "code": code }))
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Median wall time (client side) of `rounds` runs of `code`, after two
/// warm-up runs; checks each answer with `check`.
async fn median(
    client: &reqwest::Client,
    url: &str,
    code: &str,
    rounds: usize,
    check: impl Fn(&Value),
) -> Duration {
    for _ in 0..2 {
        check(&run(client, url, code).await);
    }
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let got = run(client, url, code).await;
        times.push(t.elapsed());
        check(&got);
    }
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() {
    let rounds: usize = env_or("BENCH_ROUNDS", 30);
    let python = real_python();
    let python = python.to_str().unwrap();
    let port = origin().await;
    let listed = format!("127.0.0.1:{port}");
    let proxied = Server::start(&[
        "--python",
        python,
        "--pool-size",
        "1",
        "--allowed-hosts",
        &listed,
    ])
    .await;
    let host = Server::start(&["--python", python, "--pool-size", "1", "--network", "host"]).await;
    let isolated = Server::start(&["--python", python, "--pool-size", "1"]).await;
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let download = format!(
        "import urllib.request\nprint(len(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=30).read()))"
    );
    let got_mb = |v: &Value| assert_eq!(v["stdout"], format!("{MB}\n"), "{v}");
    let clean = |v: &Value| assert_eq!(v["stdout"], "4\n", "{v}");
    // In turns, so that the machine's noise falls on both alike.
    let mut through_proxy = Vec::new();
    let mut direct = Vec::new();
    let mut clean_listed = Vec::new();
    let mut clean_isolated = Vec::new();
    for _ in 0..3 {
        through_proxy.push(median(&client, &proxied.url, &download, rounds, got_mb).await);
        direct.push(median(&client, &host.url, &download, rounds, got_mb).await);
        clean_listed.push(median(&client, &proxied.url, "print(2+2)", rounds, clean).await);
        clean_isolated.push(median(&client, &isolated.url, "print(2+2)", rounds, clean).await);
    }
    let mid = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (p, d) = (mid(&mut through_proxy), mid(&mut direct));
    let (l, i) = (mid(&mut clean_listed), mid(&mut clean_isolated));
    println!(
        "egress benchmark: median of 3 rounds of {rounds} runs each (client-side wall time of POST /execute)"
    );
    println!("| scenario | p50 (ms) |");
    println!("|---|---|");
    println!("| 1 MB download through the egress proxy | {:.2} |", ms(p));
    println!(
        "| 1 MB download over the host's network (no proxy) | {:.2} |",
        ms(d)
    );
    println!(
        "| clean run, environment with allowed_hosts | {:.2} |",
        ms(l)
    );
    println!(
        "| clean run, isolated environment (no proxy) | {:.2} |",
        ms(i)
    );
    println!(
        "proxy overhead on 1 MB: {:+.2} ms ({:.2}x); clean run with an allow-list: {:+.2} ms ({:.2}x)",
        ms(p) - ms(d),
        ms(p) / ms(d),
        ms(l) - ms(i),
        ms(l) / ms(i)
    );
}
