//! Limits the worker's cgroups enforce: memory across a run's processes,
//! and processes for a run that catches its own fork errors. This host has
//! writable pids and memory hierarchies; a host without them fails these
//! tests instead of skipping them.

use serde_json::{Value, json};

use super::{Arena, pool, run};
use crate::common::{self, TestServer};

/// `/health`'s sandbox section, insisting that both cgroups are in use.
async fn require_cgroups(server: &TestServer) -> Value {
    let (status, health) = server.get("/health").await;
    assert_eq!(status, 200, "{health}");
    let sandbox = health["sandbox"].clone();
    assert!(
        matches!(sandbox["memory"].as_str(), Some("cgroup_v1" | "cgroup_v2")),
        "no memory cgroup in use (is a memory hierarchy mounted and writable here?): {sandbox}"
    );
    assert!(
        matches!(sandbox["pids_cgroup"].as_str(), Some("v1" | "v2")),
        "no pids cgroup in use: {sandbox}"
    );
    sandbox
}

/// A server with one worker, so that runs follow each other on it, and
/// both cgroups in use.
async fn one_worker() -> TestServer {
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        ..common::config()
    })
    .await;
    require_cgroups(&server).await;
    server
}

/// Pids of the workers' launchers (direct children of this test process):
/// a worker keeps its launcher for life.
fn worker_pids(server: &TestServer) -> Vec<u32> {
    let me = std::process::id().to_string();
    let mut pids: Vec<u32> = common::processes_mentioning(server.executor.base_dir())
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .and_then(|s| s.split_whitespace().nth(1))
                    == Some(&me)
            })
        })
        .collect();
    pids.sort();
    pids
}

#[tokio::test]
async fn health_reports_the_memory_cgroup() {
    let server = TestServer::start().await;
    let sandbox = require_cgroups(&server).await;
    // The hierarchy this host offers: v1 memory in a hybrid layout, or v2.
    let v2_memory = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .all(|l| {
            !l.split(':')
                .nth(1)
                .unwrap_or("")
                .split(',')
                .any(|c| c == "memory")
        });
    let expected = if v2_memory { "cgroup_v2" } else { "cgroup_v1" };
    assert_eq!(sandbox["memory"], expected, "{sandbox}");
    server.stop().await;
}

/// Memory spread over several processes, each under its own `RLIMIT_AS`:
/// three helpers hold 120 MiB each while the run grows to the cgroup's cap
/// (the env's 512 MiB plus the worker's allowance). The kernel kills the
/// biggest process, the run, and the worker lives on.
#[tokio::test]
async fn memory_across_processes_is_stopped_by_the_memory_cgroup() {
    let mut config = code_executor::Config {
        pool_size: 1,
        ..pool()
    };
    config.run_limits.memory_bytes = Some(512 << 20);
    // The cgroup holds memory_bytes + disk_bytes + 256 MiB: keep the scratch
    // share small so that three helpers and the run fill it.
    config.sandbox.disk_bytes = 8 << 20;
    let arena = Arena::with_config(config).await;
    require_cgroups(&arena.server).await;
    let workers = worker_pids(&arena.server);
    assert_eq!(workers.len(), 1, "{workers:?}");
    let helper =
        "import time\nx = bytearray(120 << 20)\nprint('held', flush=True)\ntime.sleep(600)";
    let code = format!(
        "import subprocess, sys\n\
         helpers = []\n\
         for _ in range(3):\n\
         \x20   p = subprocess.Popen([sys.executable, '-c', {helper:?}], stdout=subprocess.PIPE)\n\
         \x20   assert p.stdout.readline() == b'held\\n'\n\
         \x20   helpers.append(p)\n\
         print('helpers hold their memory', flush=True)\n\
         chunks = []\n\
         while True:\n\
         \x20   chunks.append(bytearray(8 << 20))\n"
    );
    let body = arena.attack(run(&code, 60.0)).await;
    assert_eq!(body["limit"], "memory", "{body}");
    assert_eq!(body["exit_code"], -9, "{body}");
    assert_eq!(body["signal"], "SIGKILL", "{body}");
    assert_eq!(body["timed_out"], false, "{body}");
    assert_eq!(body["stdout"], "helpers hold their memory\n", "{body}");
    // The same worker serves the next run.
    let next = arena.server.run("print('next')").await;
    assert_eq!(next["stdout"], "next\n", "{next}");
    assert_eq!(next["limit"], Value::Null, "{next}");
    assert_eq!(
        worker_pids(&arena.server),
        workers,
        "the worker was replaced"
    );
    arena.assert_recovered().await;
}

/// A fork bomb that catches `BlockingIOError` and keeps trying spins until
/// the deadline: the timeout stops it, the pids cgroup is what it hit.
#[tokio::test]
async fn a_fork_bomb_that_catches_its_errors_is_a_process_limit() {
    let arena = Arena::with_config(code_executor::Config {
        pool_size: 1,
        ..pool()
    })
    .await;
    require_cgroups(&arena.server).await;
    let code = "import os, time\n\
                refused = 0\n\
                while True:\n\
                \x20   try:\n\
                \x20       if os.fork() == 0:\n\
                \x20           time.sleep(600)\n\
                \x20           os._exit(0)\n\
                \x20   except (BlockingIOError, OSError):\n\
                \x20       refused += 1\n";
    let body = arena.attack(run(code, 3.0)).await;
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(body["limit"], "processes", "{body}");
    assert_eq!(body["error"], Value::Null, "{body}");
    // A plain timeout on the same worker afterwards is a timeout again.
    let body = arena.attack(run("while True:\n    pass", 1.0)).await;
    assert_eq!(body["limit"], "timeout", "{body}");
    let body = arena.attack(json!({"code": "print('ok')"})).await;
    assert_eq!(body["stdout"], "ok\n", "{body}");
    arena.assert_recovered().await;
}

/// Threads until one is refused (at most 60): how many a run may have.
/// Threads started until the cap refuses one, all gone (joined, and their
/// tasks ended) before the call returns: a session's next call must not meet
/// this one's threads still exiting.
const THREADS: &str = "import threading, time\ndef tasks():\n    return int(open('/proc/self/status').read().split('Threads:')[1].split()[0])\nbefore = tasks()\nstop = threading.Event()\nthreads = []\ntry:\n    for _ in range(60):\n        t = threading.Thread(target=stop.wait)\n        t.start()\n        threads.append(t)\nexcept RuntimeError:\n    pass\nstop.set()\nfor t in threads:\n    t.join()\nwhile tasks() > before:\n    time.sleep(0.001)\nprint(len(threads))";

/// A request's `limits.processes` binds even a run as root (which
/// `RLIMIT_NPROC` does not): the worker's pids cgroup is lowered for that
/// run alone, then restored for the next.
#[tokio::test]
async fn a_request_lowers_the_process_cap_for_its_run_only() {
    let server = one_worker().await;
    let threads = |processes: Option<u64>| {
        let mut body = json!({"code": THREADS});
        if let Some(p) = processes {
            body["limits"] = json!({"processes": p});
        }
        body
    };
    let (status, body) = server.post("/execute", threads(Some(10))).await;
    assert_eq!(status, 200, "{body}");
    // Ten tasks: the run's main thread and nine more.
    assert_eq!(body["stdout"], "9\n", "{body}");
    // The same (only) worker, back to the configured cap.
    let (_, body) = server.post("/execute", threads(None)).await;
    assert_eq!(body["stdout"], "60\n", "{body}");
    // A session keeps its lower cap for every call.
    let (status, session) = server
        .post("/sessions", json!({"limits": {"processes": 10}}))
        .await;
    assert_eq!(status, 201, "{session}");
    for _ in 0..2 {
        let (_, body) = server
            .post(
                "/execute",
                json!({"code": THREADS, "session": session["id"]}),
            )
            .await;
        assert_eq!(body["stdout"], "9\n", "{body}");
    }
    server.stop().await;
}

/// A session of one process is that process alone: it opens (the worker's
/// pre-forked run child, which held one of the cgroup's processes, is gone
/// before the session's fork), its calls run, and its code can start no
/// process, first call or later.
#[tokio::test]
async fn a_session_of_one_process_opens_and_starts_no_other() {
    let server = one_worker().await;
    let fork = "import os\n\
                try:\n\
                \x20   pid = os.fork()\n\
                except BlockingIOError:\n\
                \x20   print('refused')\n\
                else:\n\
                \x20   if pid == 0:\n\
                \x20       os._exit(0)\n\
                \x20   os.waitpid(pid, 0)\n\
                \x20   print('forked')\n";
    for processes in [1, 2] {
        let (status, session) = server
            .post("/sessions", json!({"limits": {"processes": processes}}))
            .await;
        assert_eq!(status, 201, "{session}");
        let id = &session["id"];
        let expected = if processes == 1 {
            "refused\n"
        } else {
            "forked\n"
        };
        for _ in 0..2 {
            let (status, body) = server
                .post("/execute", json!({"code": fork, "session": id}))
                .await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["stdout"], expected, "{body}");
        }
        let (status, body) = server
            .delete(&format!("/sessions/{}", id.as_str().unwrap()))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    server.stop().await;
}

/// A run that meets the process cap, catches the refusal and succeeds is
/// not a limit, and neither is the failure of the next run on the same
/// worker or in the same session: the refusal was the earlier run's.
#[tokio::test]
async fn a_refusal_a_run_survived_is_not_laid_at_the_next_run() {
    let server = one_worker().await;
    let capped = json!({"code": THREADS, "limits": {"processes": 10}});
    let fails = json!({"code": "raise ValueError('mine')"});
    for _ in 0..2 {
        let (_, body) = server.post("/execute", capped.clone()).await;
        assert_eq!(body["stdout"], "9\n", "{body}");
        assert_eq!(body["limit"], Value::Null, "{body}");
        let (_, body) = server.post("/execute", fails.clone()).await;
        assert_eq!(body["exit_code"], 1, "{body}");
        assert_eq!(body["limit"], Value::Null, "{body}");
    }
    let (status, session) = server
        .post("/sessions", json!({"limits": {"processes": 10}}))
        .await;
    assert_eq!(status, 201, "{session}");
    let id = &session["id"];
    for _ in 0..2 {
        let (_, body) = server
            .post("/execute", json!({"code": THREADS, "session": id}))
            .await;
        assert_eq!(body["stdout"], "9\n", "{body}");
        let (_, body) = server
            .post(
                "/execute",
                json!({"code": "raise ValueError('mine')", "session": id}),
            )
            .await;
        assert_eq!(body["exit_code"], 1, "{body}");
        assert_eq!(body["limit"], Value::Null, "{body}");
    }
    // What the cap does refuse in a run that fails is still told.
    let (_, body) = server
        .post(
            "/execute",
            json!({"code": format!("{THREADS}\nraise SystemExit(3)"), "session": id}),
        )
        .await;
    assert_eq!(body["exit_code"], 3, "{body}");
    assert_eq!(body["limit"], "processes", "{body}");
    server.stop().await;
}

/// A preload that starts threads (as numpy's BLAS pool can) does not eat
/// into a run's `processes`: the worker's own tasks are counted once it is
/// ready.
#[tokio::test]
async fn a_preload_with_threads_leaves_a_run_its_processes() {
    use crate::common::conda::{Interpreter, create_prefix, site_packages};
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("threads");
    let interpreter = Interpreter::primary();
    create_prefix(&prefix, interpreter);
    std::fs::write(
        site_packages(&prefix, interpreter).join("threads_at_import.py"),
        "import threading\nfor _ in range(3):\n    threading.Thread(target=threading.Event().wait, daemon=True).start()\n",
    )
    .unwrap();
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        env: code_executor::config::EnvChoice::Python(prefix.join("bin/python")),
        preload: vec!["threads_at_import".into()],
        ..common::config()
    })
    .await;
    require_cgroups(&server).await;
    let code = format!(
        "print('worker threads', open('/proc/1/status').read().split('Threads:')[1].split()[0])\n{THREADS}"
    );
    let (status, body) = server
        .post(
            "/execute",
            json!({"code": code, "limits": {"processes": 10}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "worker threads 4\n9\n", "{body}");
    server.stop().await;
}
