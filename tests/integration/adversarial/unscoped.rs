//! Where the kernel cannot scope a run's signals (Landlock below ABI 6,
//! simulated here by a bootstrap whose `signal_scope` finds none): runs and
//! sessions still come from the zygote, which holds nothing of earlier
//! requests; a run can now signal that zygote, which costs the run itself
//! and its worker, never another request.

use std::time::{Duration, Instant};

use super::{Arena, run};
use crate::common::{self, TestServer};

/// A one-worker server whose runs cannot be kept from signalling their
/// zygote; the directory holds its bootstrap.
async fn unscoped() -> (Arena, tempfile::TempDir) {
    let (server, dir) =
        common::server_with_patched_worker("w.signal_scope = lambda: None\n", |c| {
            c.sessions.keep_worker = super::KEEP_WORKER
        })
        .await;
    (Arena::from_server(server, 1).await, dir)
}

/// The run's parent, which the run could not signal with a scope.
async fn parent_is_zygote(server: &TestServer) {
    let body = server.run("import os\nprint(os.getppid())").await;
    assert_ne!(body["stdout"], "1\n", "runs fork from the worker: {body}");
}

/// Another client's request right after: answered at once, in full.
async fn next_request_is_unharmed(server: &TestServer) {
    let started = Instant::now();
    let body = server.run("print(6 * 7)").await;
    assert_eq!(body["stdout"], "42\n", "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the next request waited {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn without_signal_scopes_earlier_requests_still_stay_out_of_memory() {
    let (arena, _dir) = unscoped().await;
    parent_is_zygote(&arena.server).await;
    super::redteam::earlier_requests_stay_out_of_memory(arena).await;
}

#[tokio::test]
async fn without_signal_scopes_a_run_that_kills_its_zygote_costs_only_itself() {
    let (arena, _dir) = unscoped().await;
    parent_is_zygote(&arena.server).await;
    let (status, body) = arena
        .server
        .execute(run(
            "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(10)\nprint('outlived it')",
            20.0,
        ))
        .await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "internal", "{body}");
    let message = common::error_message(&body);
    assert!(message.contains("process was lost"), "{body}");
    next_request_is_unharmed(&arena.server).await;
    arena.assert_recovered().await;
}

#[tokio::test]
async fn without_signal_scopes_a_run_that_stops_its_zygote_costs_only_itself() {
    // Its worker cannot reap it: the server's own deadline ends the wait.
    let (arena, _dir) = unscoped().await;
    let code = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nprint('stopped it')";
    answered_by_its_deadline(&arena.server, code, 1.0, false).await;
    next_request_is_unharmed(&arena.server).await;
    arena.assert_recovered().await;
}

/// Run `code` with `timeout`: answered within the server's deadline for it,
/// with an error unless `may_succeed`.
async fn answered_by_its_deadline(
    server: &TestServer,
    code: &str,
    timeout: f64,
    may_succeed: bool,
) {
    let started = Instant::now();
    let (status, body) = server.execute(run(code, timeout)).await;
    assert!(
        status >= 500 || (may_succeed && status == 200),
        "{status} {body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "answered after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn without_signal_scopes_nothing_a_run_left_is_alive_when_it_is_answered() {
    // A detached grandchild that stops the zygote the moment the run's
    // process is gone. The worker ends a run, leftovers and all, before it
    // answers: the stopped zygote can hold back that run's answer (the
    // server's deadline ends it), never a later request's, which another
    // worker serves at once.
    let (arena, _dir) = unscoped().await;
    let code = r#"
import os, signal
zygote, me = os.getppid(), os.getpid()
if os.fork() == 0:
    os.setsid()
    while os.getppid() == me:
        pass
    os.kill(zygote, signal.SIGSTOP)
    os._exit(0)
print('left one behind')
"#;
    answered_by_its_deadline(&arena.server, code, 2.0, true).await;
    next_request_is_unharmed(&arena.server).await;
    arena.assert_recovered().await;
}
