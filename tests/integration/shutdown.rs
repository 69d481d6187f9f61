//! The real binary: SIGTERM lets in-flight runs finish and leaves no process behind.

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common;

#[tokio::test]
async fn sigterm_finishes_in_flight_runs_and_leaves_no_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_code-executor"))
        .args(["serve", "--port", "0", "--pool-size", "3", "--python"])
        .arg(common::python())
        .env("TMPDIR", tmp.path())
        .env("CODE_EXECUTOR_TOKEN", "")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The server logs its address once it is ready.
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let address = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("address=").nth(1) {
                return rest.split_whitespace().next().unwrap().to_string();
            }
        }
        panic!("server exited before it was ready");
    })
    .await
    .expect("server ready within 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let url = format!("http://{address}/execute");
    let client = reqwest::Client::new();
    assert!(common::processes_mentioning(tmp.path()).len() >= 3);

    let in_flight = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move {
            let resp = client
                .post(&url)
                .json(&json!({"code": "import time; time.sleep(1); print('finished')"}))
                .send()
                .await
                .unwrap();
            (
                resp.status().as_u16(),
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();

    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "finished\n");

    let exit = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("server exits after SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    // New connections are refused once it is gone.
    assert!(
        client
            .post(&url)
            .json(&json!({"code": "1"}))
            .send()
            .await
            .is_err()
    );

    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = common::processes_mentioning(tmp.path());
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "processes left after shutdown: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The scratch directories are gone too.
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

#[tokio::test]
async fn stopping_the_in_process_server_terminates_every_worker() {
    let server = common::TestServer::start().await;
    server.run("print(1)").await;
    let base = server.executor.base_dir().to_path_buf();
    assert!(!common::processes_mentioning(&base).is_empty());
    server.stop().await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while !common::processes_mentioning(&base).is_empty() {
        assert!(Instant::now() < deadline, "workers left after stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
