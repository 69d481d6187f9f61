//! How workers start: the compiled bootstrap kept across server starts,
//! and a pool that warms in the background without the first request
//! starting a worker of its own.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use code_executor::Executor;
use code_executor::api::ExecRequest;

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
