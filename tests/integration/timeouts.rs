//! Timeouts, output caps and busy pools.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{self, TestServer};

#[tokio::test]
async fn infinite_loop_times_out_and_the_next_run_succeeds() {
    let server = TestServer::start().await;
    let started = Instant::now();
    let (status, body) = server
        .execute(json!({"code": "print('before', flush=True)\nwhile True: pass", "timeout": 1}))
        .await;
    let elapsed = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true);
    assert_eq!(body["limit"], "timeout");
    assert_eq!(body["signal"], "SIGKILL");
    assert_eq!(body["exit_code"], -9);
    assert_eq!(body["stdout"], "before\n");
    assert!(elapsed >= Duration::from_millis(950), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(2500), "took {elapsed:?}");

    let body = server.run("print('after')").await;
    assert_eq!(body["stdout"], "after\n");
    server.stop().await;
}

#[tokio::test]
async fn timeouts_kill_subprocesses_of_the_run() {
    let server = TestServer::start().await;
    // A sleep with a duration no other process uses marks the run's subprocess.
    let marker = format!("1001.{}", std::process::id());
    let code = format!(
        "import subprocess\nsubprocess.Popen(['sleep', '{marker}'])\nprint('spawned', flush=True)\nsubprocess.run(['sleep', '1000'])"
    );
    let run = server.execute(json!({"code": code, "timeout": 4}));
    let watch = async {
        let started = Instant::now();
        while common::processes_mentioning(std::path::Path::new(&marker)).is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "subprocess never seen"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let ((_, body), ()) = tokio::join!(run, watch);
    assert_eq!(body["timed_out"], true);
    assert_eq!(body["stdout"], "spawned\n");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        common::processes_mentioning(std::path::Path::new(&marker)).is_empty(),
        "a subprocess of the run survived it"
    );
    server.stop().await;
}

#[tokio::test]
async fn large_output_is_capped_and_flagged() {
    let server = TestServer::start().await;
    let started = Instant::now();
    let body = server
        .run("import sys\nsys.stdout.write('x' * (20 * 1024 * 1024))\nprint('tail', file=sys.stderr)")
        .await;
    assert_eq!(body["truncated"], true);
    assert_eq!(body["limit"], "output");
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(body["stderr"], "tail\n");
    assert!(started.elapsed() < Duration::from_secs(10));

    let body = server.run("print('x' * 2_000_000)").await;
    assert_eq!(body["truncated"], true);
    assert_eq!(body["stdout"].as_str().unwrap().len(), 1 << 20);
    server.stop().await;
}

#[tokio::test]
async fn requested_timeout_is_capped_by_the_maximum() {
    let server = TestServer::with_config(code_executor::Config {
        max_timeout: 1.0,
        timeout: 1.0,
        ..common::config()
    })
    .await;
    let started = Instant::now();
    let (_, body) = server
        .execute(json!({"code": "import time; time.sleep(30)", "timeout": 100}))
        .await;
    assert_eq!(body["timed_out"], true);
    assert!(started.elapsed() < Duration::from_secs(3));
    server.stop().await;
}

#[tokio::test]
async fn a_full_pool_answers_busy_with_retry_after() {
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        queue_timeout: Duration::from_millis(300),
        ..common::config()
    })
    .await;
    let slow = server.execute(json!({"code": "import time; time.sleep(2)"}));
    let busy = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let resp = server
            .client
            .post(format!("{}/execute", server.url))
            .json(&json!({"code": "print(1)"}))
            .send()
            .await
            .unwrap();
        let retry = resp.headers().get("retry-after").cloned();
        (
            resp.status().as_u16(),
            retry,
            resp.json::<serde_json::Value>().await.unwrap(),
        )
    };
    let ((slow_status, _), (status, retry, body)) = tokio::join!(slow, busy);
    assert_eq!(slow_status, 200);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "busy");
    assert!(retry.is_some(), "503 busy carries Retry-After");
    server.stop().await;
}

#[tokio::test]
async fn a_request_may_lower_its_limits_but_not_raise_them() {
    let server = TestServer::start().await;
    let (status, body) = server
        .execute(json!({"code": "x = bytearray(600 * 1024 * 1024)\nprint('allocated')", "limits": {"memory_bytes": 300_000_000u64}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 1, "{body}");
    assert_eq!(body["error"]["type"], "MemoryError");
    // Without the request's limit the same allocation fits the default 2 GiB.
    let body = server
        .run("x = bytearray(600 * 1024 * 1024)\nprint('allocated')")
        .await;
    assert_eq!(body["stdout"], "allocated\n");
    // A request cannot raise the configured limit.
    let (_, body) = server
        .execute(json!({"code": "import resource\nprint(resource.getrlimit(resource.RLIMIT_AS)[0])", "limits": {"memory_bytes": 64u64 << 30}}))
        .await;
    assert_eq!(body["stdout"], format!("{}\n", 2u64 << 30));
    let (status, body) = server
        .execute(json!({"code": "1", "limits": {"processes": 0}}))
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = server
        .execute(json!({"code": "1", "limits": {"memroy_bytes": 1}}))
        .await;
    assert_eq!(status, 400);
    server.stop().await;
}

/// A server of one worker that reads its runs' pipes a byte at a time
/// (`READ_CHUNK`): a run's own processes then keep any pipe of theirs full
/// against it, as faster writers could against the worker as it is.
async fn slow_reading_server() -> (TestServer, tempfile::TempDir) {
    common::server_with_patched_worker("w.READ_CHUNK = 1\n", |_| {}).await
}

/// Three processes write to stdout without end.
const FILL_STDOUT: &str = "import os
for _ in range(2):
    if os.fork() == 0:
        break
chunk = b'x' * 4096
while True:
    os.write(1, chunk)";

/// Three processes write to the run's report pipe without end (after
/// [`common::with_writable_pipes`]): a length over any report's cap, then
/// zeros.
const FILL_REPORT_PIPE: &str = "for fd in pipes:
    os.write(fd, bytes([0xff, 0xff, 0xff, 0xf0]))
print('filling', len(pipes), flush=True)
for _ in range(2):
    if os.fork() == 0:
        break
chunk = bytes(4096)
while True:
    for fd in pipes:
        os.write(fd, chunk)";

/// A run whose processes keep one of its pipes full ends at its timeout,
/// answered by its worker: the worker reads a pipe so much per wake-up
/// (`PIPE_READS`), then looks at the clock. Reading on until the pipe was
/// empty, it never did: the server gave up on it 3 s later and replaced it.
async fn a_pipe_kept_full_does_not_hold_off_the_timeout(code: &str, stdout: &str) {
    let (server, _dir) = slow_reading_server().await;
    let before = common::worker_pids(&server);
    let started = Instant::now();
    let (status, mut body) = server.execute(json!({"code": code, "timeout": 1})).await;
    let elapsed = started.elapsed();
    // Up to 1 MiB of output: checked, then left out of the messages.
    let out = body["stdout"].take();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(body["limit"], "timeout", "{body}");
    assert!(
        out.as_str().unwrap().starts_with(stdout),
        "{:?}",
        &out.as_str().unwrap()[..40.min(out.as_str().unwrap().len())]
    );
    // The server would have given up at 4 s.
    assert!(elapsed >= Duration::from_millis(950), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(3500), "took {elapsed:?}");
    assert_eq!(
        common::worker_pids(&server),
        before,
        "the worker was replaced"
    );
    let body = server.run("print('after')").await;
    assert_eq!(body["stdout"], "after\n", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_run_that_keeps_its_stdout_full_ends_at_its_timeout() {
    a_pipe_kept_full_does_not_hold_off_the_timeout(FILL_STDOUT, "xxxx").await;
}

#[tokio::test]
async fn a_run_that_keeps_its_report_pipe_full_ends_at_its_timeout() {
    a_pipe_kept_full_does_not_hold_off_the_timeout(
        &common::with_writable_pipes(FILL_REPORT_PIPE),
        "filling 1\n",
    )
    .await;
}
