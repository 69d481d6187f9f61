//! The Python client of clients/python, installed into a venv from its path
//! (tests/python_client/setup.sh), against real servers on loopback:
//! everything it offers, and its retries on `503 busy` honouring Retry-After
//! within their bound (tests/python_client/driver.py reports, these assert).

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::cluster::{Replica, run_driver};

#[tokio::test]
async fn client_retries_503_busy_honouring_retry_after_within_its_bound() {
    // One worker and a 0.2 s queue: a second request while a run holds the
    // worker is refused with 503 busy and Retry-After: 1.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("busy.toml");
    std::fs::write(&config, "queue_timeout_secs = 0.2\n").unwrap();
    let replica = Replica::start(
        "solo",
        &["--pool-size", "1", "--config", config.to_str().unwrap()],
    )
    .await;
    // The refusal the client sees, as a plain HTTP client sees it.
    let url = replica.url();
    let hold = tokio::spawn({
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{url}/execute"))
                .json(&json!({"code": "import time; time.sleep(1.5)"}))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    let refused = loop {
        let resp = reqwest::Client::new()
            .post(format!("{url}/execute"))
            .json(&json!({"code": "print(1)"}))
            .send()
            .await
            .unwrap();
        if resp.status() == 503 {
            break resp;
        }
    };
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "busy", "{body}");
    assert_eq!(hold.await.unwrap(), 200);

    let report = run_driver(&["retry", &url], Duration::from_secs(60)).await;
    // Retried until the worker was free, each wait at least Retry-After.
    let retried = &report["retried"];
    assert_eq!(retried["stdout"], "after\n", "{report}");
    assert_eq!(retried["held"], "held\n", "{report}");
    let waits: Vec<f64> = retried["waits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_f64().unwrap())
        .collect();
    assert!(!waits.is_empty(), "no retry was needed: {report}");
    assert!(
        waits.iter().all(|w| *w >= 1.0),
        "a wait shorter than Retry-After: {waits:?}"
    );
    assert!(retried["elapsed_s"].as_f64().unwrap() >= 1.0, "{report}");
    // Bounded by attempts: two tries, one wait, then Busy with the server's words.
    let bounded = &report["bounded"];
    assert_eq!(bounded["raised"], "Busy", "{report}");
    assert_eq!(
        (bounded["status"].as_u64(), bounded["code"].as_str()),
        (Some(503), Some("busy"))
    );
    assert!(
        bounded["message"]
            .as_str()
            .unwrap()
            .contains("no worker became free"),
        "{bounded}"
    );
    assert_eq!(bounded["waits"].as_array().unwrap().len(), 1, "{bounded}");
    let elapsed = bounded["elapsed_s"].as_f64().unwrap();
    assert!((1.0..3.5).contains(&elapsed), "{bounded}");
    // Bounded by the deadline: a Retry-After past it is not waited for.
    let deadline = &report["deadline"];
    assert_eq!(deadline["raised"], "Busy", "{report}");
    assert_eq!(deadline["waits"], json!([]), "{report}");
    assert!(deadline["elapsed_s"].as_f64().unwrap() < 1.0, "{report}");
    let busy = replica.metrics().await[&format!(
        r#"code_executor_runs_total{{env="{}",outcome="busy"}}"#,
        crate::mcp_python::default_env_name()
    )];
    assert!(busy >= 4.0, "the server counted {busy} refusals");
}

#[tokio::test]
async fn client_executes_streams_grades_and_pins_sessions_over_two_replicas() {
    let (a, b) = tokio::join!(
        Replica::start("client-a", &["--pool-size", "2"]),
        Replica::start("client-b", &["--pool-size", "2"])
    );
    let report = run_driver(&["features", &a.url(), &b.url()], Duration::from_secs(60)).await;
    assert_eq!(
        report["execute"],
        json!({"stdout": "4\n", "result": "42", "exit_code": 0})
    );
    assert_eq!(report["stdin"], "HI\n");
    // Streamed: output as it was written, then the result, last.
    let events = report["stream"].as_array().unwrap();
    let last = events.last().unwrap();
    assert_eq!(last["kind"], "result", "{events:?}");
    assert_eq!(last["data"]["stdout"], "a\nb\n");
    // `print` may reach the stream as two writes ("a", then "\n"): the
    // output is the chunks together, the first of them "a".
    let first = &events[0];
    assert_eq!(first["kind"], "stdout", "{events:?}");
    assert!(
        first["data"].as_str().unwrap().starts_with('a'),
        "{events:?}"
    );
    let streamed: String = events
        .iter()
        .filter(|e| e["kind"] == "stdout")
        .map(|e| e["data"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, "a\nb\n", "{events:?}");
    assert!(
        last["after_s"].as_f64().unwrap() - first["after_s"].as_f64().unwrap() >= 0.3,
        "the first chunk came with the result: {events:?}"
    );
    let unknown = &report["unknown_env"];
    assert_eq!(
        (unknown["status"].as_u64(), unknown["code"].as_str()),
        (Some(404), Some("unknown_env"))
    );
    assert_eq!(report["grade"], json!(["ok", "wrong_answer"]));
    // A session keeps its state on the replica it was made on, streams too,
    // and is gone once its `with` block ends.
    let session = &report["session"];
    assert_eq!(session["result"], "28.27", "{session}");
    let home = session["replica"].as_str().unwrap();
    assert!(
        session["id"]
            .as_str()
            .unwrap()
            .ends_with(&format!(".{home}"))
    );
    assert_eq!(
        session["stream"].as_array().unwrap().last().unwrap(),
        "result"
    );
    assert!(
        session["after_close"].as_str().unwrap().contains("closed"),
        "{session}"
    );
    // Stateless calls take the two replicas in turn.
    let replicas: Vec<&str> = report["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(
        replicas.iter().filter(|r| **r == "client-a").count(),
        6,
        "{replicas:?}"
    );
    assert_eq!(
        replicas.iter().filter(|r| **r == "client-b").count(),
        6,
        "{replicas:?}"
    );
    for replica in [&a, &b] {
        assert_eq!(replica.metrics().await["code_executor_sessions"], 0.0);
    }
}
