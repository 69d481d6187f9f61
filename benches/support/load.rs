//! Keep-alive HTTP load for the benchmarks: clients that each send their
//! request back to back for a while, every latency kept.

use std::future::Future;
use std::time::{Duration, Instant};

/// `n` keep-alive clients, Nagle off (as a latency-minded client has it).
pub fn clients(n: usize) -> Vec<reqwest::Client> {
    (0..n)
        .map(|_| {
            reqwest::Client::builder()
                .tcp_nodelay(true)
                .build()
                .unwrap()
        })
        .collect()
}

/// Every client sends back to back for `seconds`, one task each: `send`
/// makes one request of it, answered and checked. Every latency, and the
/// time it all took.
pub async fn back_to_back<C, F, Fut>(
    clients: Vec<C>,
    seconds: f64,
    send: F,
) -> (Vec<Duration>, Duration)
where
    C: Clone + Send + 'static,
    F: Fn(C) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let tasks = clients.into_iter().map(|client| {
        let send = send.clone();
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                send(client.clone()).await;
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

/// One `POST {url}/execute` of the JSON `body`: a 200 whose run exited 0.
pub async fn execute(client: &reqwest::Client, url: &str, body: &str) {
    let result = post(client, &format!("{url}/execute"), body).await;
    assert_eq!(result["exit_code"], 0, "{result}");
}

/// One `POST` of the JSON `body` to `url`: its 200 answer's JSON.
pub async fn post(client: &reqwest::Client, url: &str, body: &str) -> serde_json::Value {
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request answered");
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}
