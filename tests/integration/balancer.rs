//! Three real replicas behind HAProxy with the shipped configuration
//! (deploy/haproxy/haproxy.cfg), all on loopback: stateless runs spread,
//! sessions and MCP sessions stay on the replica that holds them, and a call
//! that reaches another replica is told where its session lives.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::cluster::{self, AFFINITY_COOKIE, set_cookie, three_replicas};

#[tokio::test]
async fn balancer_spreads_2000_stateless_runs_over_three_replicas() {
    let (replicas, balancer) = three_replicas(&["--pool-size", "3"]).await;
    let before: Vec<f64> =
        futures_util::future::join_all(replicas.iter().map(|r| r.executes_served())).await;
    const CALLS: usize = 2000;
    const CONCURRENCY: usize = 16;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (url, next) = (balancer.url.clone(), next.clone());
            tokio::spawn(async move {
                // One keep-alive client per worker, as a load generator has:
                // HAProxy balances each request, not each connection.
                let client = reqwest::Client::new();
                let mut wrong = Vec::new();
                let mut by_replica: BTreeMap<String, usize> = BTreeMap::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= CALLS {
                        return (wrong, by_replica);
                    }
                    let resp = client
                        .post(format!("{url}/execute"))
                        .json(&json!({"code": format!("print({i} * 3)")}))
                        .send()
                        .await
                        .expect("answered through the balancer");
                    let status = resp.status().as_u16();
                    let replica = resp
                        .headers()
                        .get("x-replica")
                        .map(|v| v.to_str().unwrap().to_string())
                        .unwrap_or_default();
                    // A stateless call sets the affinity cookie, which this
                    // client does not send back: every call is balanced.
                    let body: Value = resp.json().await.unwrap_or(Value::Null);
                    if status != 200 || body["stdout"] != format!("{}\n", i * 3) {
                        wrong.push(format!("{i}: {status} {body}"));
                    }
                    *by_replica.entry(replica).or_default() += 1;
                }
            })
        })
        .collect();
    let mut wrong = Vec::new();
    let mut by_replica: BTreeMap<String, usize> = BTreeMap::new();
    for worker in workers {
        let (w, seen) = worker.await.unwrap();
        wrong.extend(w);
        for (replica, n) in seen {
            *by_replica.entry(replica).or_default() += n;
        }
    }
    let elapsed = started.elapsed();
    assert!(
        wrong.is_empty(),
        "{} wrong answers: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    // Each replica's own count (its /metrics) agrees with the x-replica
    // headers, and each served at least 20% of the calls.
    for (replica, before) in replicas.iter().zip(before) {
        let served = replica.executes_served().await - before;
        assert_eq!(
            served as usize,
            by_replica.get(&replica.id).copied().unwrap_or(0),
            "{by_replica:?}"
        );
        assert!(
            served >= CALLS as f64 * 0.2,
            "replica {} served {served} of {CALLS} calls: {by_replica:?}",
            replica.id
        );
    }
    eprintln!("{CALLS} calls at c={CONCURRENCY} through HAProxy in {elapsed:?}: {by_replica:?}");
    balancer.stop().await;
}

#[tokio::test]
async fn balancer_keeps_20_sessions_on_their_replicas_through_the_python_client() {
    // Room for all 20 on any one replica: leastconn need not split them evenly.
    let dir = tempfile::tempdir().unwrap();
    let caps = dir.path().join("caps.toml");
    std::fs::write(&caps, "max_sessions = 20\nmax_sessions_per_env = 20\n").unwrap();
    let (replicas, balancer) =
        three_replicas(&["--pool-size", "3", "--config", caps.to_str().unwrap()]).await;
    let report = cluster::run_driver(
        &["sessions", &balancer.url, "20", "50"],
        Duration::from_secs(120),
    )
    .await;
    let sessions = report["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), 20);
    let mut per_replica: BTreeMap<String, usize> = BTreeMap::new();
    for s in sessions {
        assert_eq!(s["calls_ok"], 50, "{s}");
        assert_eq!(s["errors"], json!([]), "{s}");
        let replica = s["replica"].as_str().expect("the replica that holds it");
        // The id names the replica, and the balancer's cookie pins it.
        let id = s["id"].as_str().unwrap();
        assert!(id.ends_with(&format!(".{replica}")), "{s}");
        assert_eq!(s["cookies"][AFFINITY_COOKIE], replica, "{s}");
        let after = s["after_close"].as_str().unwrap();
        assert!(after.starts_with("session_lost: "), "{s}");
        *per_replica.entry(replica.to_string()).or_default() += 1;
    }
    // Created without a cookie, the sessions spread over the replicas.
    assert_eq!(per_replica.len(), 3, "{per_replica:?}");
    for replica in &replicas {
        let m = replica.metrics().await;
        assert_eq!(
            m["code_executor_sessions"], 0.0,
            "all closed: {}",
            replica.id
        );
    }
    balancer.stop().await;
}

#[tokio::test]
async fn balancer_answers_a_session_call_without_its_cookie_with_where_the_session_lives() {
    let (replicas, balancer) = three_replicas(&["--pool-size", "2"]).await;
    let client = reqwest::Client::new();
    let mut sessions = Vec::new();
    for _ in 0..6 {
        let resp = client
            .post(format!("{}/sessions", balancer.url))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let cookie = set_cookie(&resp, AFFINITY_COOKIE).expect("the balancer sets its cookie");
        let body: Value = resp.json().await.unwrap();
        let id = body["id"].as_str().unwrap().to_string();
        assert!(id.ends_with(&format!(".{cookie}")), "{id} is on {cookie}");
        let with_cookie = client
            .post(format!("{}/execute", balancer.url))
            .header("cookie", format!("{AFFINITY_COOKIE}={cookie}"))
            .json(&json!({"session": id, "code": "y = 5"}))
            .send()
            .await
            .unwrap();
        assert_eq!(with_cookie.status(), 200);
        sessions.push((id, cookie));
    }
    // Without the cookie, a call lands where the balancer puts it: on the
    // right replica it runs, elsewhere it is refused with the reason.
    let mut misrouted = 0;
    for (id, home) in &sessions {
        for _ in 0..3 {
            let resp = client
                .post(format!("{}/execute", balancer.url))
                .json(&json!({"session": id, "code": "print(y)"}))
                .send()
                .await
                .unwrap();
            let answered_by = resp.headers()["x-replica"].to_str().unwrap().to_string();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap();
            if answered_by == *home {
                assert_eq!((status, &body["stdout"]), (200, &json!("5\n")), "{body}");
            } else {
                misrouted += 1;
                assert_eq!(status, 404, "{body}");
                assert_eq!(body["error"]["code"], "unknown_session");
                let message = crate::common::error_message(&body);
                assert!(
                    message.contains(&format!("lives on replica \"{home}\""))
                        && message.contains(&format!("reached replica \"{answered_by}\""))
                        && message.contains("affinity cookie"),
                    "{message}"
                );
            }
        }
    }
    assert!(
        misrouted > 0,
        "no call without its cookie reached another replica"
    );
    // /health names each replica.
    for replica in &replicas {
        let health: Value = reqwest::get(format!("{}/health", replica.url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(health["replica"], replica.id.as_str());
        assert_eq!(health["status"], "ok");
    }
    balancer.stop().await;
}

#[tokio::test]
async fn balancer_carries_a_whole_mcp_session_on_one_replica() {
    let (replicas, balancer) = three_replicas(&["--pool-size", "2"]).await;
    let report = crate::mcp_python::run_client(vec![
        "balanced".into(),
        format!("{}/mcp", balancer.url).into(),
    ])
    .await;
    eprintln!(
        "MCP session through HAProxy: {} s of calls, {} s to close",
        report["exercised_s"], report["closed_s"]
    );
    assert_eq!(report["server_name"], "code-executor");
    let tools = report["tools"].as_array().expect("tools");
    for tool in ["execute_code", "create_session", "close_session"] {
        assert!(tools.iter().any(|t| t == tool), "{tool} missing: {tools:?}");
    }
    let calls = report["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 20);
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(call["is_error"], false, "{call}");
        assert_eq!(call["text"], format!("{}\n[exit code 0]", i * i), "{call}");
    }
    let session = &report["session"];
    assert_eq!(session["created"]["is_error"], false, "{session}");
    assert_eq!(session["read"]["text"], "42\n[exit code 0]", "{session}");
    assert_eq!(session["closed"]["is_error"], false, "{session}");
    // The SDK's HTTP client kept the balancer's cookie, so every request of
    // the MCP session (and its Mcp-Session-Id) reached one replica.
    assert!(
        report["cookies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == AFFINITY_COOKIE),
        "{report}"
    );
    let mut served = Vec::new();
    for replica in &replicas {
        let m = replica.metrics().await;
        let mcp: f64 = m
            .iter()
            .filter(|(k, _)| {
                k.starts_with("code_executor_http_requests_total") && k.contains(r#"route="/mcp""#)
            })
            .map(|(_, v)| v)
            .sum();
        served.push((replica.id.clone(), mcp));
    }
    let busy: Vec<_> = served.iter().filter(|(_, n)| *n > 0.0).collect();
    assert_eq!(
        busy.len(),
        1,
        "MCP requests on more than one replica: {served:?}"
    );
    assert!(busy[0].1 >= 24.0, "{served:?}");
    balancer.stop().await;
}

#[tokio::test]
async fn the_shipped_haproxy_config_is_valid_and_fits_long_runs_and_draining() {
    let haproxy = cluster::haproxy().await;
    let out = std::process::Command::new(&haproxy)
        .args(["-c", "-f", cluster::HAPROXY_CFG])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(cluster::HAPROXY_CFG).unwrap();
    let value = |key: &str| -> String {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key}"))
            .trim()
            .to_string()
    };
    // Readiness is /health, and a draining replica is out before its
    // default drain delay ends: fastinter + (fall - 1) checks.
    assert_eq!(value("http-check send"), "meth GET uri /health");
    assert!(text.contains("inter 1s fastinter 500ms") && text.contains("fall 2"));
    let default_delay = code_executor::Config::default().drain_delay;
    assert!(Duration::from_millis(1000 + 500) < default_delay);
    // The longest run (max_timeout) fits the inactivity timeouts.
    let max_timeout = code_executor::Config::default().max_timeout;
    for key in ["timeout client", "timeout server"] {
        let secs: f64 = value(key).trim_end_matches('s').parse().unwrap();
        assert!(
            secs > max_timeout,
            "{key} {secs} s <= max_timeout {max_timeout} s"
        );
    }
    assert_eq!(
        value("cookie"),
        "CE_REPLICA insert indirect nocache httponly"
    );
    assert!(text.contains("option redispatch"));
}

#[tokio::test]
async fn the_stateless_mcp_revision_spreads_and_sessions_follow_the_cookie() {
    use crate::mcp_protocol::stateless_at;
    let (replicas, balancer) = three_replicas(&["--pool-size", "2"]).await;
    let url = format!("{}/mcp", balancer.url);
    // Without a cookie, stateless calls go anywhere and all answer.
    for i in 0..30u64 {
        let (answer, _) = stateless_at(
            &url,
            None,
            i,
            "tools/call",
            serde_json::json!({"name": "execute_code", "arguments": {"code": format!("print({i} * 2)")}}),
        )
        .await;
        assert_eq!(
            answer["result"]["structuredContent"]["stdout"],
            format!("{}\n", i * 2),
            "{answer}"
        );
    }
    let served: Vec<f64> = futures_util::future::join_all(replicas.iter().map(|r| r.metrics()))
        .await
        .iter()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.starts_with("code_executor_mcp_tool_calls_total"))
                .map(|(_, v)| v)
                .sum()
        })
        .collect();
    assert!(
        served.iter().filter(|n| **n > 0.0).count() >= 2,
        "{served:?}"
    );
    // A session is created on one replica; the balancer's cookie from that
    // answer brings every later call back to it.
    let (created, cookie) = stateless_at(
        &url,
        None,
        100,
        "tools/call",
        serde_json::json!({"name": "create_session", "arguments": {}}),
    )
    .await;
    let id = created["result"]["structuredContent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    let cookie = cookie.expect("the balancer sets its cookie");
    for (n, code) in ["v = 7", "v += 1", "print(v)"].iter().enumerate() {
        let (answer, _) = stateless_at(
            &url,
            Some(&cookie),
            101 + n as u64,
            "tools/call",
            serde_json::json!({"name": "execute_code", "arguments": {"code": code, "session": id}}),
        )
        .await;
        if n == 2 {
            assert_eq!(
                answer["result"]["structuredContent"]["stdout"], "8\n",
                "{answer}"
            );
        } else {
            assert_ne!(answer["result"]["isError"], true, "{answer}");
        }
    }
    balancer.stop().await;
}
