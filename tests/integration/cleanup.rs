//! A run that leaves many files: its worker clears them out of turn, and the
//! next requests go to the other workers instead of waiting for it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, TestServer};

/// A worker whose clean-up counts a run as heavy past 50 new entries (or,
/// on a filesystem that counts no inodes, 256 bytes of directory), and
/// takes the seconds a run wrote to `slow` beside its run directory (the
/// scratch root) before it clears; one that finds `stuck` there reports
/// that something stayed.
const SLOW_CLEANUP: &str = "\
import time
w.HEAVY_CLEANUP = 50
w.HEAVY_DIR_BYTES = 256
_clear = w.Worker.clear_scratch
def clear_scratch(self, *args):
    root = self.scratch
    if os.path.exists(os.path.join(root, 'stuck')):
        _clear(self, *args)
        return 'a file stayed'
    slow = os.path.join(root, 'slow')
    if os.path.exists(slow):
        with open(slow) as f:
            time.sleep(float(f.read()))
    return _clear(self, *args)
w.Worker.clear_scratch = clear_scratch
";

/// A run that leaves 100 files in its `$TMPDIR`, and `marker` (holding
/// `text`) in the scratch root.
fn leave_files(marker: &str, text: &str) -> String {
    format!(
        "import os, tempfile\n\
         for i in range(100):\n    open(os.path.join(tempfile.gettempdir(), str(i)), 'w').close()\n\
         with open(os.path.join(os.path.dirname(os.getcwd()), {marker:?}), 'w') as f:\n    f.write({text:?})\n\
         print('left')"
    )
}

/// A server of `size` workers whose clean-up is [`SLOW_CLEANUP`]'s, one of
/// which has just answered a run that left files (see [`leave_files`]).
async fn after_a_run_leaving(
    size: usize,
    marker: &str,
    text: &str,
) -> (TestServer, tempfile::TempDir) {
    let (server, dir) =
        common::server_with_patched_worker(SLOW_CLEANUP, |c| c.pool_size = size).await;
    server
        .wait_for_pool_size(size as u64, Duration::from_secs(30))
        .await;
    let body = server.run(&leave_files(marker, text)).await;
    assert_eq!(body["stdout"], "left\n", "{body}");
    (server, dir)
}

/// What a run sees of the scratch root and its `$TMPDIR`.
const LOOK: &str = "import os, tempfile\nprint(sorted(os.listdir(os.path.dirname(os.getcwd()))), os.listdir(tempfile.gettempdir()))";

/// Run [`LOOK`]: the scratch root holds only the run's two directories,
/// and `$TMPDIR` nothing.
async fn looks_clear(server: &TestServer) {
    let body = server.run(LOOK).await;
    assert_eq!(body["stdout"], "['run', 'run.tmp'] []\n", "{body}");
}

/// The workers replaced so far, each cause as `cause count`.
async fn restarts(server: &TestServer) -> Vec<String> {
    let (_, metrics) = crate::ops::scrape(server, None).await;
    // `code_executor_worker_restarts_total{env="…",cause="dirty"} 1` -> `dirty 1`.
    metrics
        .lines()
        .filter(|l| l.starts_with("code_executor_worker_restarts_total{") && !l.ends_with(" 0"))
        .map(|l| {
            let cause = l.split("cause=\"").nth(1).unwrap_or(l);
            cause.replace("\"}", "")
        })
        .collect()
}

/// Poll the default pool until `done` holds of it, for at most `within`.
async fn pool_until(server: &TestServer, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let pool = server.pool().await;
        if done(&pool) {
            return pool;
        }
        assert!(
            start.elapsed() < within,
            "pool still {pool} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_next_requests_go_to_other_workers_while_one_clears_a_runs_files() {
    // The worker clears for 2.5 s (within the 4.5 s the server gives it):
    // the requests meanwhile go to the other.
    let (server, _dir) = after_a_run_leaving(2, "slow", "2.5").await;
    for i in 0..3 {
        let started = Instant::now();
        let body = server.run(LOOK).await;
        let took = started.elapsed();
        assert_eq!(body["stdout"], "['run', 'run.tmp'] []\n", "{body}");
        assert!(
            took < Duration::from_millis(700),
            "a run waited {took:?} for the clean-up"
        );
        if i == 0 {
            let pool = server.pool().await;
            let counts = (&pool["size"], &pool["cleaning"], &pool["starting"]);
            assert_eq!(counts, (&2.into(), &1.into(), &0.into()), "{pool}");
        }
    }
    // Then it serves again, from a clear root: every worker answers clean.
    pool_until(&server, Duration::from_secs(10), |p| {
        p["cleaning"] == 0 && p["idle"] == 2
    })
    .await;
    for _ in 0..4 {
        looks_clear(&server).await;
    }
    assert_eq!(server.pool().await["size"], 2);
    assert_eq!(restarts(&server).await, Vec::<String>::new());
    server.stop().await;
}

#[tokio::test]
async fn a_pool_of_one_waits_for_its_worker_to_clear_and_starts_no_other() {
    let (server, _dir) = after_a_run_leaving(1, "slow", "1.5").await;
    let started = Instant::now();
    let next = {
        let server = &server;
        async move { server.run(LOOK).await }
    };
    let watch = async {
        // Seen while the clean-up goes on and the request waits for it.
        pool_until(&server, Duration::from_secs(5), |p| {
            p["waiting"] == 1 || p["cleaning"] == 0
        })
        .await
    };
    let (body, pool) = tokio::join!(next, watch);
    let took = started.elapsed();
    assert_eq!(body["stdout"], "['run', 'run.tmp'] []\n", "{body}");
    assert!(
        took >= Duration::from_millis(1200),
        "answered in {took:?}, before the clean-up ended"
    );
    assert_eq!(
        (&pool["size"], &pool["cleaning"], &pool["starting"]),
        (&1.into(), &1.into(), &0.into()),
        "{pool}"
    );
    assert_eq!(server.pool().await["size"], 1);
    assert_eq!(restarts(&server).await, Vec::<String>::new());
    server.stop().await;
}

#[tokio::test]
async fn a_clean_up_that_leaves_something_replaces_its_worker() {
    let (server, _dir) = after_a_run_leaving(1, "stuck", "").await;
    // The next request is answered, by the replacement, on a clear root.
    looks_clear(&server).await;
    assert_eq!(restarts(&server).await, ["dirty 1"]);
    server.wait_for_pool_size(1, Duration::from_secs(30)).await;
    server.stop().await;
}

#[tokio::test]
async fn a_clean_up_past_its_budget_replaces_its_worker() {
    let (server, _dir) = after_a_run_leaving(1, "slow", "60").await;
    // Its budget (2 s for the scratch root, 2 s for /dev/shm, plus the
    // grace) runs out long before the minute: a new worker answers.
    let started = Instant::now();
    looks_clear(&server).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "answered after {took:?}");
    assert_eq!(restarts(&server).await, ["timeout 1"]);
    server.stop().await;
}

#[tokio::test]
async fn a_request_waiting_for_a_worker_takes_the_first_one_free() {
    let (server, _dir) = after_a_run_leaving(2, "slow", "3").await;
    // One worker clears for 3 s; the other runs for 0.5 s while a third
    // request comes, which finds no worker idle. It is answered by the one
    // whose run ends first, not by the one clearing.
    let busy = server.run("import time\ntime.sleep(0.5)\nprint('slept')");
    let third = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let started = Instant::now();
        (server.run(LOOK).await, started.elapsed())
    };
    let (slept, (body, took)) = tokio::join!(busy, third);
    assert_eq!(slept["stdout"], "slept\n", "{slept}");
    assert_eq!(body["stdout"], "['run', 'run.tmp'] []\n", "{body}");
    assert!(
        took < Duration::from_millis(1800),
        "the request waited {took:?}, for the clean-up"
    );
    assert_eq!(restarts(&server).await, Vec::<String>::new());
    server.stop().await;
}

/// This environment's runs cleared out of turn so far.
async fn cleared_out_of_turn(server: &TestServer) -> u64 {
    let (_, metrics) = crate::ops::scrape(server, None).await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("code_executor_cleared_out_of_turn_total{"))
        .unwrap_or_else(|| panic!("no cleared_out_of_turn_total in\n{metrics}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_run_past_two_thousand_entries_is_cleared_out_of_turn_and_a_smaller_one_is_not() {
    // The bootstrap as it ships: its own count of what a run left, in any
    // of the places a run can write (a subdirectory of the run directory,
    // `$TMPDIR`, `~`), with its artifacts listed or not.
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 2,
        ..common::config()
    })
    .await;
    server.wait_for_pool_size(2, Duration::from_secs(30)).await;
    let leave = |top: &str, n: usize| {
        format!(
            "import os, tempfile\nd = os.path.join({top}, 'out')\nos.mkdir(d)\n\
             for i in range({n}):\n    open(os.path.join(d, str(i)), 'w').close()\nprint('left')"
        )
    };
    let mut expected = 0;
    for (top, artifacts) in [
        ("'.'", json!(false)),
        ("'.'", json!(["*.png"])),
        ("tempfile.gettempdir()", json!(true)),
        ("os.path.expanduser('~')", json!(true)),
    ] {
        for (n, heavy) in [(500, false), (3000, true)] {
            let code = leave(top, n);
            let (status, body) = server
                .execute(json!({"code": code, "artifacts": artifacts}))
                .await;
            assert_eq!((status, &body["stdout"]), (200, &json!("left\n")), "{body}");
            expected += u64::from(heavy);
            assert_eq!(
                cleared_out_of_turn(&server).await,
                expected,
                "{n} files in {top}, artifacts {artifacts}"
            );
            // Whichever worker answers next finds nothing of it.
            pool_until(&server, Duration::from_secs(10), |p| p["cleaning"] == 0).await;
            for _ in 0..2 {
                looks_clear(&server).await;
            }
        }
    }
    assert_eq!(restarts(&server).await, Vec::<String>::new());
    server.stop().await;
}

#[tokio::test]
async fn stopping_the_server_ends_a_worker_that_clears() {
    let (server, _dir) = after_a_run_leaving(1, "slow", "60").await;
    let base = server.executor.base_dir().to_path_buf();
    assert_eq!(server.pool().await["cleaning"], 1);
    assert!(!common::processes_mentioning(&base).is_empty());
    let started = Instant::now();
    server.stop().await;
    // Not after its clean-up's budget (4.5 s), nor its minute: now, with
    // the grace of any worker's termination.
    while !common::processes_mentioning(&base).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "a worker is left {:?} after the stop",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
