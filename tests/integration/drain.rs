//! A replica drained under load behind HAProxy (the shipped configuration):
//! SIGTERM turns its readiness off first while it serves on, the balancer
//! moves the stateless load away without a failed request, its in-flight runs
//! finish, and its sessions' next calls get a clear `unknown_session` at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::common::cluster::{AFFINITY_COOKIE, set_cookie, three_replicas};

/// One call to a session of the drained replica, as the test saw it.
#[derive(Debug)]
struct Poll {
    /// Seconds after SIGTERM the call started.
    at: f64,
    latency: Duration,
    status: u16,
    body: Value,
}

#[tokio::test]
async fn drain_under_load_loses_no_run_and_ends_its_sessions_clearly() {
    const DRAIN_DELAY: f64 = 3.0;
    let (mut replicas, balancer) =
        three_replicas(&["--pool-size", "4", "--drain-delay", "3"]).await;
    let victim = 1;
    let victim_id = replicas[victim].id.clone();
    let victim_url = replicas[victim].url();
    let client = reqwest::Client::new();

    // Sessions made through the balancer, until two live on the victim.
    let mut doomed = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..15 {
        let resp = client
            .post(format!("{}/sessions", balancer.url))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let cookie = set_cookie(&resp, AFFINITY_COOKIE).unwrap();
        let id = resp.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let set = call_session(&client, &balancer.url, &id, &cookie, "x = 7").await;
        assert_eq!(set.0, 200, "{set:?}");
        if cookie == victim_id {
            doomed.push((id, cookie));
        } else {
            kept.push((id, cookie));
        }
        if doomed.len() == 2 && !kept.is_empty() {
            break;
        }
    }
    assert_eq!(
        doomed.len(),
        2,
        "two of 15 sessions should land on {victim_id}"
    );

    // Stateless load through the balancer, no cookie, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..8)
        .map(|w| {
            let (url, stop) = (balancer.url.clone(), stop.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let (mut ok, mut failed) = (0usize, Vec::new());
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let expected = format!("{w}-{i}\n");
                    let answer = client
                        .post(format!("{url}/execute"))
                        .json(&json!({"code": format!("print('{w}-{i}')")}))
                        .send()
                        .await;
                    match answer {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let body: Value = resp.json().await.unwrap_or(Value::Null);
                            if status == 200 && body["stdout"] == expected.as_str() {
                                ok += 1;
                            } else {
                                failed.push(format!("{status} {body}"));
                            }
                        }
                        Err(e) => failed.push(format!("transport: {e}")),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Runs in flight on the victim (pinned by its cookie) that outlast the
    // drain delay: they must finish after it stopped accepting.
    let in_flight: Vec<_> = (0..3)
        .map(|i| {
            let (url, victim_id) = (balancer.url.clone(), victim_id.clone());
            tokio::spawn(async move {
                let resp = reqwest::Client::new()
                    .post(format!("{url}/execute"))
                    .header("cookie", format!("{AFFINITY_COOKIE}={victim_id}"))
                    .json(&json!({"code": format!("import time\ntime.sleep({})\nprint('done {i}')", DRAIN_DELAY + 1.2)}))
                    .send()
                    .await
                    .expect("an in-flight run is answered");
                let replica = resp.headers()["x-replica"].to_str().unwrap().to_string();
                (resp.status().as_u16(), replica, resp.json::<Value>().await.unwrap())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let sigterm = Instant::now();
    kill(Pid::from_raw(replicas[victim].pid()), Signal::SIGTERM).unwrap();

    // The victim's sessions, polled through the balancer with their cookie.
    let polls: Vec<_> = doomed
        .iter()
        .cloned()
        .map(|(id, cookie)| {
            let url = balancer.url.clone();
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut polls = Vec::new();
                while sigterm.elapsed() < Duration::from_secs_f64(DRAIN_DELAY + 4.0) {
                    let at = sigterm.elapsed().as_secs_f64();
                    let started = Instant::now();
                    let (status, body) =
                        call_session(&client, &url, &id, &cookie, "print(x)").await;
                    polls.push(Poll {
                        at,
                        latency: started.elapsed(),
                        status,
                        body,
                    });
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                polls
            })
        })
        .collect();

    // Readiness goes first: /health 503 draining while the replica still
    // answers and serves everything (/livez, a run).
    let unready_after = loop {
        let resp = client
            .get(format!("{victim_url}/health"))
            .send()
            .await
            .unwrap();
        if resp.status() == 503 {
            let health: Value = resp.json().await.unwrap();
            assert_eq!(health["status"], "draining", "{health}");
            assert_eq!(health["replica"], victim_id.as_str());
            break sigterm.elapsed();
        }
        assert!(
            sigterm.elapsed() < Duration::from_secs(1),
            "still ready 1 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let live = client
        .get(format!("{victim_url}/livez"))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let served = client
        .post(format!("{victim_url}/execute"))
        .json(&json!({"code": "print('still serving')"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        served.headers()["connection"],
        "close",
        "draining closes connections"
    );
    assert_eq!(
        served.json::<Value>().await.unwrap()["stdout"],
        "still serving\n"
    );
    assert!(
        sigterm.elapsed() < Duration::from_secs_f64(DRAIN_DELAY - 1.0),
        "the checks above took too long to prove anything"
    );

    // It exits cleanly once its in-flight runs are done.
    let exit = tokio::time::timeout(Duration::from_secs(20), replicas[victim].child.wait())
        .await
        .expect("the drained replica exits")
        .unwrap();
    let exited_after = sigterm.elapsed();
    assert_eq!(exit.code(), Some(0), "{}", replicas[victim].log_text());
    assert!(
        exited_after >= Duration::from_secs_f64(DRAIN_DELAY),
        "exited {exited_after:?} after SIGTERM, before the drain delay"
    );
    for run in in_flight {
        let (status, replica, body) = run.await.unwrap();
        assert_eq!(
            (status, replica.as_str()),
            (200, victim_id.as_str()),
            "{body}"
        );
        assert!(
            body["stdout"].as_str().unwrap().starts_with("done "),
            "{body}"
        );
    }

    // The load goes on a moment after the exit, then stops: nothing failed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut ok = 0;
    for task in load {
        let (n, failed) = task.await.unwrap();
        assert!(
            failed.is_empty(),
            "stateless requests failed: {failed:#?}\n{}",
            balancer.output()
        );
        ok += n;
    }
    assert!(ok > 100, "only {ok} stateless runs in the whole test");

    // Each of the victim's sessions kept its state while it was reachable,
    // then every call got unknown_session naming the replica, within 1 s.
    for task in polls {
        let polls = task.await.unwrap();
        let first_lost = polls
            .iter()
            .position(|p| p.status != 200)
            .unwrap_or_else(|| panic!("the session outlived its replica: {polls:#?}"));
        for p in &polls[..first_lost] {
            assert_eq!(p.body["stdout"], "7\n", "{p:?}");
        }
        for p in &polls[first_lost..] {
            assert_eq!(p.status, 404, "{p:?}");
            assert_eq!(p.body["error"]["code"], "unknown_session", "{p:?}");
            let message = crate::common::error_message(&p.body);
            assert!(
                message.contains(&format!("lives on replica \"{victim_id}\"")),
                "{message}"
            );
        }
        for p in &polls {
            assert!(
                p.latency < Duration::from_secs(1),
                "a session call took {p:?}"
            );
        }
        let lost_at = polls[first_lost].at;
        assert!(
            lost_at <= exited_after.as_secs_f64() + 1.0,
            "lost only {lost_at} s after SIGTERM; the replica exited after {exited_after:?}"
        );
    }
    // The other replicas' sessions are untouched.
    for (id, cookie) in &kept {
        let (status, body) = call_session(&client, &balancer.url, id, cookie, "print(x)").await;
        assert_eq!((status, &body["stdout"]), (200, &json!("7\n")), "{body}");
    }
    assert!(
        replicas[victim].log_text().contains("draining"),
        "{}",
        replicas[victim].log_text()
    );
    eprintln!(
        "unready after {unready_after:?}, exited after {exited_after:?}, {ok} stateless runs"
    );
    balancer.stop().await;
}

/// `/execute` in session `id` through the balancer at `url`, with the
/// affinity cookie `cookie`.
async fn call_session(
    client: &reqwest::Client,
    url: &str,
    id: &str,
    cookie: &str,
    code: &str,
) -> (u16, Value) {
    let resp = client
        .post(format!("{url}/execute"))
        .header("cookie", format!("{AFFINITY_COOKIE}={cookie}"))
        .json(&json!({"session": id, "code": code}))
        .send()
        .await
        .expect("a session call is answered");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}
