//! Workers that die, hang or break the protocol: a clear answer, then recovery.

use std::time::{Duration, Instant};

use code_executor::executor::WORKER_SCRIPT;
use code_executor::testing::PROTOCOL_VERSION;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::common::{self, TestServer};

/// Wait until none of the `dead` workers is left and `size` workers are
/// idle (besides those kept for sessions).
async fn wait_until_replaced(server: &TestServer, dead: &[u32], size: usize, within: Duration) {
    let started = Instant::now();
    loop {
        let pids = common::worker_pids(server);
        let pool = server.pool().await;
        let kept = pool["session_spares"].as_u64().unwrap() as usize;
        if pids.len() == size + kept
            && pids.iter().all(|p| !dead.contains(p))
            && pool["idle"] == size
        {
            return;
        }
        assert!(
            started.elapsed() < within,
            "not replaced within {within:?}: {pids:?} {pool}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_run_cannot_kill_its_worker() {
    // The worker is pid 1 of its own pid namespace: the kernel drops signals
    // its namespace sends it that it has no handler for, SIGKILL included.
    // A run's parent is the worker's zygote, which the run's Landlock domain
    // may not signal (where the kernel has no Landlock signal scopes, the
    // run may kill its zygote: it dies with it, and its worker is replaced).
    let server = TestServer::start().await;
    let scoped = common::signals_scoped(&server).await;
    let before = common::worker_pids(&server);
    let (status, body) = server
        .execute(json!({"code": "import os\nfor pid in (1, os.getppid()):\n    try:\n        os.kill(pid, 9)\n    except PermissionError:\n        pass\nprint('still here')"}))
        .await;
    if scoped {
        assert_eq!(body["stdout"], "still here\n", "{body}");
        assert_eq!(body["exit_code"], 0);
    } else {
        assert_eq!(status, 500, "{body}");
    }
    let body = server.run("print('still serving')").await;
    assert_eq!(body["stdout"], "still serving\n");
    server.wait_for_pool_size(2, Duration::from_secs(5)).await;
    if scoped {
        assert_eq!(common::worker_pids(&server), before);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_worker_killed_from_outside_is_replaced() {
    let server = TestServer::start().await;
    server.run("print(1)").await;
    let before = common::worker_pids(&server);
    assert_eq!(before.len(), 2, "two workers: {before:?}");
    kill(Pid::from_raw(before[0] as i32), Signal::SIGKILL).unwrap();

    // Within a second the dead worker is gone and a new one stands in.
    wait_until_replaced(&server, &before[..1], 2, Duration::from_secs(1)).await;
    for i in 0..4 {
        let body = server.run(&format!("print({i})")).await;
        assert_eq!(body["stdout"], format!("{i}\n"));
    }
    server.stop().await;
}

#[tokio::test]
async fn a_zygote_lost_between_runs_costs_no_request() {
    // The worker learns of it from the next request, which it has run
    // nothing of: that request runs on another worker, and the worker is
    // replaced.
    let server = TestServer::start().await;
    server.run("print(0)").await;
    let before = common::worker_pids(&server);
    assert_eq!(before.len(), 2, "{before:?}");
    common::kill_zygote(before[0]).await;
    // Workers take turns: one of these goes to the worker without a zygote.
    for i in 1..=4 {
        let body = server.run(&format!("print({i})")).await;
        assert_eq!(body["stdout"], format!("{i}\n"), "{body}");
        assert_eq!(body["exit_code"], 0, "{body}");
    }
    wait_until_replaced(&server, &before[..1], 2, Duration::from_secs(10)).await;
    assert!(common::worker_pids(&server).contains(&before[1]));
    server.stop().await;
}

/// A server of one worker that has served a run, and that worker.
async fn one_worker() -> (TestServer, u32) {
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        ..common::config()
    })
    .await;
    server.run("print(0)").await;
    let worker = common::worker_pids(&server)[0];
    (server, worker)
}

#[tokio::test]
async fn a_zygote_lost_mid_run_fails_that_run_clearly_and_the_worker_is_replaced() {
    let (server, worker) = one_worker().await;
    let killer = tokio::spawn(async move {
        // The run's process is the zygote's child once it runs.
        let started = Instant::now();
        while common::children_of(common::zygote_of(worker)).is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no run started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        common::kill_zygote(worker).await
    });
    let started = Instant::now();
    let (status, body) = server
        .execute(json!({"code": "import time\nprint('begun', flush=True)\ntime.sleep(20)"}))
        .await;
    killer.await.unwrap();
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "internal", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the run's process was lost") && message.contains("zygote"),
        "{body}"
    );
    // Answered when the run died, not at its end nor at its timeout.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    wait_until_replaced(&server, &[worker], 1, Duration::from_secs(10)).await;
    let body = server.run("print('after')").await;
    assert_eq!(body["stdout"], "after\n", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_zygote_lost_after_its_run_answered_costs_the_next_request_nothing() {
    // The zygote is stopped while the run goes on: the run answers, and the
    // worker's clean-up waits for the zygote to report the run's end. The
    // zygote dies then: the worker learns of it after the answer, and its
    // next request runs on the worker that replaces it. (Where the kernel
    // cannot scope a run's signals, the worker reaps a run before answering
    // it: the stopped zygote holds the answer back, and the server's
    // deadline ends the request.)
    let (server, worker) = one_worker().await;
    let scoped = common::signals_scoped(&server).await;
    let zygote = common::zygote_of(worker);
    let stopper = tokio::spawn(async move {
        // Stopped once the run sleeps: the zygote has forked it and said so.
        let sleeping = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/wchan"))
                .is_ok_and(|wchan| wchan.contains("nanosleep"))
        };
        let started = Instant::now();
        while !common::children_of(zygote).into_iter().any(sleeping) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no run started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        kill(Pid::from_raw(zygote as i32), Signal::SIGSTOP).unwrap();
    });
    let (status, body) = server
        .execute(json!({"code": "import time\ntime.sleep(0.5)\nprint('answered')", "timeout": 2}))
        .await;
    stopper.await.unwrap();
    if scoped {
        assert_eq!(body["stdout"], "answered\n", "{body}");
    } else {
        assert!(status >= 500, "{status} {body}");
    }
    kill(Pid::from_raw(zygote as i32), Signal::SIGKILL).unwrap();
    for i in 0..3 {
        let body = server.run(&format!("print({i})")).await;
        assert_eq!(body["stdout"], format!("{i}\n"), "{body}");
    }
    wait_until_replaced(&server, &[worker], 1, Duration::from_secs(10)).await;
    server.stop().await;
}

#[tokio::test]
async fn a_session_opens_on_another_worker_when_its_workers_zygote_is_gone() {
    // A session's process is forked by the worker's zygote: a worker without
    // one answers `retire`, and the server opens the session on another.
    let (server, worker) = one_worker().await;
    common::kill_zygote(worker).await;
    let (status, info) = server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    let (status, body) = server
        .execute(json!({"code": "x = 41\nprint('set')", "session": id}))
        .await;
    assert_eq!((status, &body["stdout"]), (200, &json!("set\n")), "{body}");
    // The session's directory holds nothing the pre-forked run left.
    let (status, body) = server
        .execute(json!({"code": "import os\nprint(x + 1, os.listdir('.'))", "session": id}))
        .await;
    assert_eq!(
        (status, &body["stdout"]),
        (200, &json!("42 []\n")),
        "{body}"
    );
    let (status, closed) = server.delete(&format!("/sessions/{id}")).await;
    assert_eq!((status, &closed["closed"]), (200, &json!(true)), "{closed}");
    // The session's worker, whose zygote lives, is kept for the next one.
    common::wait_for_session_spares(&server, 1).await;
    wait_until_replaced(&server, &[worker], 1, Duration::from_secs(10)).await;
    // The pool refills and clean runs go on.
    let body = server.run("print('clean')").await;
    assert_eq!(body["stdout"], "clean\n", "{body}");
    server.stop().await;
}

/// Six runs in a row from one client go to both workers in turn: each
/// prepares its next run (forks the process for it) while the other serves.
/// The run directory tells the workers apart (each has its own).
async fn assert_workers_take_turns(server: &TestServer, when: &str) {
    let mut dirs = Vec::new();
    for _ in 0..6 {
        let body = server.run("import os\nprint(os.getcwd())").await;
        assert_eq!(body["exit_code"], 0, "{body}");
        dirs.push(body["stdout"].as_str().unwrap().trim().to_string());
    }
    let distinct = dirs.iter().collect::<std::collections::HashSet<_>>().len();
    assert_eq!(distinct, 2, "{when}: {dirs:?}");
    assert!(
        dirs.windows(2).all(|w| w[0] != w[1]),
        "{when}: the same worker twice in a row: {dirs:?}"
    );
}

#[tokio::test]
async fn workers_take_turns_also_after_all_were_replaced() {
    // Replacements must join the turns, not wait as spares while a single
    // worker serves everything.
    let server = TestServer::start().await;
    assert_workers_take_turns(&server, "a fresh pool").await;
    let before = common::worker_pids(&server);
    assert_eq!(before.len(), 2, "two workers: {before:?}");
    for pid in &before {
        kill(Pid::from_raw(*pid as i32), Signal::SIGKILL).unwrap();
    }
    wait_until_replaced(&server, &before, 2, Duration::from_secs(5)).await;
    assert_workers_take_turns(&server, "after replacement").await;
    server.stop().await;
}

#[tokio::test]
async fn workers_take_turns_after_sessions_took_theirs() {
    // A session takes a warm worker out of the pool, which starts another.
    let server = TestServer::start().await;
    for _ in 0..2 {
        let (status, info) = server.post("/sessions", json!({})).await;
        assert_eq!(status, 201, "{info}");
    }
    server.wait_for_pool_size(2, Duration::from_secs(5)).await;
    assert_workers_take_turns(&server, "after two sessions").await;
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_goes_away_mid_run_costs_the_run_not_its_worker() {
    use crate::mcp::{marked_sleeper, unique_marker, wait_for_process, wait_until_gone};

    let server = TestServer::start().await;
    server.run("print(1)").await;
    let before = common::worker_pids(&server);
    let marker = unique_marker("client-gone");
    let request = server
        .client
        .post(format!("{}/execute", server.url))
        .json(&json!({
            "code": marked_sleeper(&marker),
            "timeout": 60,
            "limits": {"processes": 8},
        }))
        .send();
    tokio::select! {
        answer = request => panic!("the sleeper answered: {answer:?}"),
        _ = wait_for_process(&marker, Duration::from_secs(10)) => {}
    }
    // The request future is gone, and its connection with it: the run (and
    // what it started) is killed...
    let gone_after = wait_until_gone(marker.as_ref(), Duration::from_secs(5)).await;
    assert!(
        gone_after < Duration::from_secs(2),
        "killed only after {gone_after:?}"
    );
    // ...but its worker serves on: no Python start is paid for it. (The
    // cancelled run's answer, which frees the worker, may follow the
    // process's end by a moment.)
    let started = std::time::Instant::now();
    loop {
        let pool = server.wait_for_pool_size(2, Duration::from_secs(2)).await;
        if pool["idle"] == 2 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(3), "{pool}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(common::worker_pids(&server), before);
    let (_, metrics) = crate::ops::scrape(&server, None).await;
    let env = server.executor.default_env();
    let cancelled =
        format!(r#"code_executor_worker_restarts_total{{env="{env}",cause="cancelled"}}"#);
    assert_eq!(
        crate::ops::parse_metrics(&metrics)[&cancelled],
        0.0,
        "{metrics}"
    );
    // The cancelled run's cap on processes went with it.
    let many = "import subprocess\nps = [subprocess.Popen(['sleep', '2']) for _ in range(16)]\nprint(len(ps))";
    for _ in 0..2 {
        let body = server.run(many).await;
        assert_eq!(body["stdout"], "16\n", "{body}");
    }
    for i in 0..4 {
        let body = server.run(&format!("print({i})")).await;
        assert_eq!(body["stdout"], format!("{i}\n"), "{body}");
    }
    assert_eq!(common::worker_pids(&server), before);
    server.stop().await;
}

/// A server whose workers run `fake` instead of the real bootstrap. `fake`
/// can `import worker` (the real one, for its codec).
async fn server_with_bootstrap(
    fake: &str,
    tweak: impl FnOnce(&mut code_executor::Config),
) -> anyhow::Result<(TestServer, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("worker.py"), WORKER_SCRIPT)?;
    let script = dir.path().join("fake.py");
    std::fs::write(
        &script,
        format!(
            "import os, sys\nsys.path.insert(0, {:?})\nimport worker as w\n{fake}",
            dir.path()
        ),
    )?;
    let mut config = common::config();
    config.worker_script = Some(script);
    config.worker_start_timeout = Duration::from_secs(2);
    tweak(&mut config);
    let server = TestServer::try_with_config(config).await?;
    Ok((server, dir))
}

const READY: &str = "w.write_frame(1, {'t': 'ready', 'protocol': PROTO, 'python': '3', 'executable': sys.executable, 'pid': os.getpid()})";

#[tokio::test]
async fn startup_failures_are_clear_errors_naming_the_interpreter() {
    let err = server_with_bootstrap(
        "sys.stderr.write('boom: cannot start\\n'); sys.exit(3)",
        |_| {},
    )
    .await
    .err()
    .expect("start fails");
    let text = format!("{err:#}");
    assert!(text.contains("boom: cannot start"), "{text}");
    assert!(
        text.contains(&common::python().display().to_string()),
        "{text}"
    );

    let err = server_with_bootstrap(&READY.replace("PROTO", "99"), |_| {})
        .await
        .err()
        .expect("start fails");
    let text = format!("{err:#}");
    assert!(
        text.contains("protocol 99") && text.contains(&format!("speaks {PROTOCOL_VERSION}")),
        "{text}"
    );

    let started = Instant::now();
    let err = server_with_bootstrap("import time; time.sleep(60)", |_| {})
        .await
        .err()
        .expect("start fails");
    assert!(
        format!("{err:#}").contains("did not become ready"),
        "{err:#}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    let err = server_with_bootstrap("", |c| c.preload = vec!["no_such_module_xyz".into()]).await;
    // The fake exits without a handshake; with the real bootstrap a missing
    // preload is reported by name:
    assert!(err.is_err());
    let mut config = common::config();
    config.preload = vec!["no_such_module_xyz".into()];
    let err = TestServer::try_with_config(config)
        .await
        .err()
        .expect("start fails");
    assert!(format!("{err:#}").contains("no_such_module_xyz"), "{err:#}");
}

#[tokio::test]
async fn protocol_violations_discard_the_worker_with_a_clear_error() {
    for (name, on_exec) in [
        (
            "garbage on the channel",
            "os.write(1, b'this is not a frame at all')",
        ),
        ("exit mid-request", "os._exit(0)"),
    ] {
        let fake = format!(
            "{ready}\nf = open(0, 'rb', buffering=0)\nwhile True:\n    w.read_frame(f)\n    {on_exec}\n    import time; time.sleep(30)\n",
            ready = READY.replace("PROTO", &PROTOCOL_VERSION.to_string())
        );
        let (server, _dir) = server_with_bootstrap(&fake, |c| c.timeout = 1.0)
            .await
            .unwrap();
        let started = Instant::now();
        let (status, body) = server.execute(json!({"code": "print(1)"})).await;
        assert_eq!(status, 500, "{name}: {body}");
        assert_eq!(body["error"]["code"], "internal", "{name}");
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{name}: {:?}",
            started.elapsed()
        );
        server.wait_for_pool_size(2, Duration::from_secs(2)).await;
        server.stop().await;
    }
}

#[tokio::test]
async fn a_frame_over_the_size_limit_is_refused_by_its_length_at_once() {
    // The fake announces a frame one byte over the limit and sends nothing
    // more: only the frame-size check answers before the run's deadline
    // (without it the server would wait for the bytes, then for the hard
    // deadline). That frames up to the limit pass is shown by the codec
    // tests, whose frames are larger than the codec's default limit.
    let announced = code_executor::testing::MAX_FRAME_BYTES + 1;
    let fake = format!(
        "{ready}\nf = open(0, 'rb', buffering=0)\nwhile True:\n    w.read_frame(f)\n    os.write(1, ({announced}).to_bytes(4, 'big'))\n    import time; time.sleep(60)\n",
        ready = READY.replace("PROTO", &PROTOCOL_VERSION.to_string())
    );
    let (server, _dir) = server_with_bootstrap(&fake, |_| {}).await.unwrap();
    let before = common::worker_pids(&server);
    let timeout = 20.0;
    let started = Instant::now();
    let (status, body) = server
        .execute(json!({"code": "print(1)", "timeout": timeout}))
        .await;
    let answered = started.elapsed();
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "internal", "{body}");
    let message = crate::common::error_message(&body);
    assert!(
        message.contains("broke the protocol") && message.contains("frame size too big"),
        "{body}"
    );
    assert!(
        answered < Duration::from_secs(3),
        "answered after {answered:?} of a {timeout} s timeout: {body}"
    );
    // The worker that sent it is discarded and replaced.
    let started = Instant::now();
    loop {
        let after = common::worker_pids(&server);
        let kept = before.iter().filter(|p| after.contains(p)).count();
        if kept == 1 && after.len() == 2 {
            break;
        }
        assert!(
            kept >= 1 && started.elapsed() < Duration::from_secs(5),
            "exactly one old worker discarded: before {before:?} after {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn a_worker_that_stops_answering_is_killed_after_the_hard_deadline() {
    let fake = format!(
        "{ready}\nf = open(0, 'rb', buffering=0)\nwhile True:\n    w.read_frame(f)\n    import time; time.sleep(600)\n",
        ready = READY.replace("PROTO", &PROTOCOL_VERSION.to_string())
    );
    let (server, _dir) = server_with_bootstrap(&fake, |c| c.timeout = 0.5)
        .await
        .unwrap();
    let before = common::worker_pids(&server);
    let started = Instant::now();
    let (status, body) = server.execute(json!({"code": "print(1)"})).await;
    assert_eq!(status, 500, "{body}");
    assert!(
        crate::common::error_message(&body).contains("did not answer"),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(6));
    server.wait_for_pool_size(2, Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = common::worker_pids(&server);
    assert!(
        before.iter().filter(|p| after.contains(p)).count() == 1,
        "exactly one old worker killed: before {before:?} after {after:?}"
    );
    server.stop().await;
}
