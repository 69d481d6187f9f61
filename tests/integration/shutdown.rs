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
        .env("CODE_EXECUTOR_DRAIN_DELAY", "0")
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
    let server_pid = child.id().unwrap();
    assert!(
        !server_cgroups(server_pid).is_empty(),
        "the workers have cgroups"
    );

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
    // So are its cgroup directories: removed before it exited, not left to
    // a thread that the exit cut short.
    assert_eq!(server_cgroups(server_pid), Vec::<std::path::PathBuf>::new());
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
    let me = std::process::id();
    assert!(!server_cgroups(me).is_empty(), "the workers have cgroups");
    server.stop().await;
    assert_eq!(server_cgroups(me), Vec::<std::path::PathBuf>::new());
    let deadline = Instant::now() + Duration::from_secs(2);
    while !common::processes_mentioning(&base).is_empty() {
        assert!(Instant::now() < deadline, "workers left after stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn cgroups_left_by_a_killed_server_are_removed_by_the_next() {
    // Where this process's servers make their cgroups.
    let server = common::TestServer::start().await;
    let bases: Vec<_> = server_cgroups(std::process::id())
        .iter()
        .map(|d| d.parent().unwrap().to_path_buf())
        .collect();
    server.stop().await;
    assert!(!bases.is_empty(), "the workers have cgroups");
    // A server that was SIGKILLed: its pid is gone, its directories stay.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    for base in &bases {
        std::fs::create_dir_all(base.join(format!("code-executor-{dead}-{}/w-1", pid_namespace())))
            .unwrap();
    }
    assert_eq!(server_cgroups(dead).len(), bases.len());
    // A server of another pid namespace: its pid means nothing here.
    let foreign = bases[0].join(format!("code-executor-{dead}-{}", pid_namespace() + 1));
    std::fs::create_dir(&foreign).unwrap();
    let server = common::TestServer::start().await;
    // Removed beside the start, not before it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !server_cgroups(dead).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            server_cgroups(dead)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(foreign.is_dir(), "another namespace's cgroup was removed");
    std::fs::remove_dir(&foreign).unwrap();
    server.stop().await;
}

/// The cgroup directories the server in process `pid` made, in any hierarchy.
fn server_cgroups(pid: u32) -> Vec<std::path::PathBuf> {
    let name = format!("code-executor-{pid}-{}", pid_namespace());
    let mut found = Vec::new();
    let mut stack = vec![(std::path::PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if entry.file_name() == name.as_str() {
                found.push(entry.path());
            } else if depth < 4 {
                stack.push((entry.path(), depth + 1));
            }
        }
    }
    found
}

/// This process's pid namespace, as the server names its cgroups by it.
fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").unwrap().ino()
}
