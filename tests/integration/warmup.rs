//! How workers start: the compiled bootstrap kept across server starts,
//! and a pool that warms in the background without the first request
//! starting a worker of its own; and when a run's child warms up.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use code_executor::Executor;
use code_executor::api::ExecRequest;
use futures_util::StreamExt;

use crate::common::{self, TestServer};

/// The interpreter's bytecode magic (what a kept bootstrap starts with).
fn magic() -> Vec<u8> {
    let out = std::process::Command::new(common::python())
        .args([
            "-c",
            "import importlib.util, sys; sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER)",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    out.stdout
}

/// The kept bootstrap files in `dir`, once there is at least one.
async fn kept_files(dir: &Path) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "code"))
            .collect();
        if !files.is_empty() || Instant::now() > deadline {
            return files;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn server_caching_in(dir: &Path) -> TestServer {
    TestServer::with_config(code_executor::Config {
        pool_size: 1,
        cache_dir: Some(dir.to_path_buf()),
        ..common::config()
    })
    .await
}

#[tokio::test]
async fn workers_run_the_bootstrap_kept_by_an_earlier_start_and_replace_a_stale_one() {
    let cache = tempfile::tempdir().unwrap();
    let magic = magic();

    // A first start compiles the bootstrap and keeps it.
    let server = server_caching_in(cache.path()).await;
    assert_eq!(server.run("print(2+2)").await["stdout"], "4\n");
    let files = kept_files(cache.path()).await;
    assert_eq!(files.len(), 1, "{files:?}");
    let kept = std::fs::read(&files[0]).unwrap();
    assert_eq!(
        kept[..4],
        magic[..],
        "the file starts with the bytecode magic"
    );
    assert!(kept.len() > 10_000, "{} bytes", kept.len());
    server.stop().await;

    // What is kept is what the next start's workers run: code that marks
    // the environment, then runs the bootstrap.
    let marked = std::process::Command::new(common::python())
        .args([
            "-c",
            "import importlib.util, marshal, sys\n\
             src = 'import os\\nos.environ[\"BOOTSTRAP_KEPT\"] = \"yes\"\\n\
             exec(compile(open(__file__, \"rb\").read(), __file__, \"exec\"))\\n'\n\
             sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER + marshal.dumps(compile(src, 'k', 'exec')))",
        ])
        .output()
        .unwrap();
    assert!(marked.status.success(), "{marked:?}");
    std::fs::write(&files[0], &marked.stdout).unwrap();
    let server = server_caching_in(cache.path()).await;
    let out = server
        .run("import os; print(os.environ.get('BOOTSTRAP_KEPT'))")
        .await;
    assert_eq!(out["stdout"], "yes\n", "{out}");
    server.stop().await;

    // Code of another interpreter (another magic) is compiled again, and
    // the file replaced.
    std::fs::write(&files[0], b"\0\0\0\0not code").unwrap();
    let server = server_caching_in(cache.path()).await;
    let out = server
        .run("import os; print(os.environ.get('BOOTSTRAP_KEPT'))")
        .await;
    assert_eq!(out["stdout"], "None\n", "{out}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read(&files[0]).unwrap()[..4] != magic[..] {
        assert!(Instant::now() < deadline, "the stale file was not replaced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;

    // Kept code names this start's bootstrap in tracebacks, so a run's
    // traceback still shows none of the worker's frames.
    let server = server_caching_in(cache.path()).await;
    let out = server.run("def f():\n    return 1/0\nf()").await;
    let stderr = out["stderr"].as_str().unwrap();
    assert!(stderr.contains("ZeroDivisionError"), "{out}");
    assert!(stderr.contains("File \"<code>\", line 2, in f"), "{stderr}");
    assert!(
        !stderr.contains("worker.py"),
        "worker frames leak: {stderr}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_server_that_keeps_nothing_still_runs() {
    // `cache_dir = "none"`: no folder of its own, workers compile at each
    // start (one server's workers still share what the first compiled).
    let config = code_executor::Config {
        pool_size: 2,
        cache_dir: None,
        ..common::config()
    };
    let server = TestServer::with_config(config).await;
    for i in 0..4 {
        let out = server.run(&format!("print({i})")).await;
        assert_eq!(out["stdout"], format!("{i}\n"));
    }
    server.stop().await;
}

#[tokio::test]
async fn a_warming_pool_starts_one_worker_first_and_the_first_request_takes_it() {
    let config = code_executor::Config {
        pool_size: 4,
        ..common::config()
    };
    let executor = Arc::new(Executor::start_warming(&config).await.unwrap());
    let run = tokio::spawn({
        let executor = executor.clone();
        async move {
            executor
                .execute(ExecRequest {
                    code: "print(2+2)".into(),
                    ..ExecRequest::default()
                })
                .await
        }
    });
    // Until a worker is ready, one is starting: the request waits for it
    // instead of starting another beside it.
    let mut before_ready = Vec::new();
    while !run.is_finished() {
        let ready = executor.list_envs()[0].pool.size;
        let live = executor.live_workers().0;
        if ready == 0 {
            before_ready.push(live);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let out = run.await.unwrap().unwrap();
    assert_eq!(out.stdout, "4\n");
    assert!(
        before_ready.iter().all(|&live| live <= 1),
        "workers starting before the first was ready: {before_ready:?}"
    );
    assert!(before_ready.contains(&1), "{before_ready:?}");
    // Then the rest of the pool comes up.
    let deadline = Instant::now() + Duration::from_secs(60);
    while executor.list_envs()[0].pool.size < 4 {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            executor.list_envs()[0].pool
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    executor.shutdown().await;
}

/// A server of one pooled worker whose bootstrap writes, in each run's
/// stderr, how long the run's child waited before warming up: what the
/// worker chose for it after the run before.
async fn server_telling_warm_ups() -> (TestServer, tempfile::TempDir) {
    common::server_with_patched_worker(
        "rehearse = w.rehearse\n\
         def telling(request_fd=None, wait=0):\n    \
             if request_fd is not None:\n        \
                 os.write(2, b'[warm-up after %d ms]' % wait)\n    \
             return rehearse(request_fd, wait)\n\
         w.rehearse = telling\n",
        |_| {},
    )
    .await
}

#[tokio::test]
async fn a_run_after_a_pause_has_the_next_child_warm_up_at_once() {
    let (server, _dir) = server_telling_warm_ups().await;
    server.run("print(1)").await;
    // Nothing else in flight, 50 ms apart: each run's child was forked
    // after a run that came after a pause (the first run too: it came long
    // after the server started), and warmed up at once.
    for i in 0..4 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let body = server.run(&format!("print({i})")).await;
        assert_eq!(body["stdout"], format!("{i}\n"), "{body}");
        assert_eq!(body["stderr"], "[warm-up after 0 ms]", "{body}");
    }
    // A session call in flight (its own worker): the runs beside it, as far
    // apart, did not come after a pause; their children wait for their
    // requests before they warm up.
    let (status, info) = server.post("/sessions", serde_json::json!({})).await;
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    server.wait_for_pool_size(1, Duration::from_secs(30)).await;
    let call = server
        .client
        .post(format!("{}/execute", server.url))
        .json(&serde_json::json!({
            "code": "import time\nprint('started', flush=True)\ntime.sleep(60)",
            "session": id,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    let mut call = call.bytes_stream();
    let first = call.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("started"));
    let mut told = Vec::new();
    for i in 0..4 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let body = server.run(&format!("print({i})")).await;
        assert_eq!(body["stdout"], format!("{i}\n"), "{body}");
        told.push(body["stderr"].as_str().unwrap().to_string());
    }
    // The session took the pooled worker that ran the runs above; its
    // replacement's first child waited as every new worker's does, and the
    // others because of the call in flight.
    for stderr in &told {
        assert_eq!(stderr, "[warm-up after 20 ms]", "{told:?}");
    }
    drop(call);
    let (status, body) = server.delete(&format!("/sessions/{id}")).await;
    assert!(status == 200 || status == 204, "{status} {body}");
    server.stop().await;
}
