//! Filling the disk: each worker's scratch root is a tmpfs of `disk_bytes`,
//! so a run that writes past it gets `ENOSPC` (`limit: "disk"`), and the
//! next run has the whole quota back.

use serde_json::{Value, json};

use super::{Arena, run};
use crate::common;

/// The quota these tests set.
const DISK_BYTES: u64 = 32 << 20;

/// One worker (so that the next run lands on the same one), 32 MiB of scratch.
async fn arena() -> Arena {
    Arena::with_config(code_executor::Config {
        pool_size: 1,
        sandbox: code_executor::config::SandboxConfig {
            disk_bytes: DISK_BYTES,
            ..common::sandbox_config()
        },
        ..common::config()
    })
    .await
}

/// The worker's start time (pid 1 of its pid namespace): the same in two
/// runs only when they ran on the same worker.
const WORKER_STARTED: &str =
    "print('worker', open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])";

fn worker_line(body: &Value) -> String {
    body["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .find(|l| l.starts_with("worker "))
        .unwrap_or_else(|| panic!("no worker line: {body}"))
        .to_string()
}

/// The next run on the same worker finds the quota empty, can fill most of
/// it, reads its input files and returns its artifacts.
async fn assert_quota_back(arena: &Arena, before: &str) {
    let code = format!(
        r#"import os, shutil
{WORKER_STARTED}
usage = shutil.disk_usage(os.getcwd())
print('total', usage.total)
print('free enough', usage.free >= {DISK_BYTES} - (1 << 20))
with open('refill.bin', 'wb') as f:
    for _ in range(28):
        f.write(b'\0' * (1 << 20))
os.remove('refill.bin')
print('input', open('in.txt').read())
open('out.txt', 'w').write('written')
"#
    );
    let body = arena
        .attack(json!({"code": code, "timeout": 20, "files": {"in.txt": "given"}}))
        .await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["limit"], Value::Null, "{body}");
    assert_eq!(worker_line(&body), before, "the same worker: {body}");
    let stdout = body["stdout"].as_str().unwrap();
    assert!(
        stdout.contains(&format!("total {DISK_BYTES}\n")),
        "{stdout}"
    );
    assert!(stdout.contains("free enough True\n"), "{stdout}");
    assert!(stdout.contains("input given\n"), "{stdout}");
    let artifacts = body["artifacts"].as_array().unwrap();
    assert!(
        artifacts.iter().any(|a| a["path"] == "out.txt"),
        "{artifacts:?}"
    );
}

#[tokio::test]
async fn one_huge_file_hits_the_disk_quota() {
    let arena = arena().await;
    // 300 MB in 1 MiB chunks; the file-size limit (1 GiB) is far away.
    let code = format!(
        r#"import os
{WORKER_STARTED}
written = 0
try:
    with open('big.bin', 'wb') as f:
        for _ in range(300):
            f.write(b'x' * (1 << 20))
            f.flush()
            written += 1 << 20
finally:
    print('written MiB', written >> 20, flush=True)
"#
    );
    let body = arena.attack(run(&code, 30.0)).await;
    assert_eq!(body["limit"], "disk", "{body}");
    assert_eq!(body["error"]["type"], "OSError", "{body}");
    let message = crate::common::error_message(&body);
    assert!(
        message.contains("[Errno 28] No space left on device"),
        "{message}"
    );
    let stdout = body["stdout"].as_str().unwrap();
    let mib: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("written MiB "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        mib <= DISK_BYTES >> 20,
        "wrote {mib} MiB with a 32 MiB quota"
    );
    assert!(mib >= 24, "only {mib} MiB fit in a 32 MiB quota");
    assert_quota_back(&arena, &worker_line(&body)).await;
    arena.assert_recovered().await;
}

#[tokio::test]
async fn many_small_files_add_up_to_the_disk_quota() {
    let arena = arena().await;
    // 64 KiB each, spread over the run directory and its private temp dir.
    let code = format!(
        r#"import os, tempfile
{WORKER_STARTED}
made = 0
try:
    for i in range(2000):
        where = tempfile.gettempdir() if i % 2 else '.'
        with open(os.path.join(where, 'f%d' % i), 'wb') as f:
            f.write(b'y' * (64 << 10))
        made += 1
finally:
    print('files', made, flush=True)
"#
    );
    let body = arena.attack(run(&code, 30.0)).await;
    assert_eq!(body["limit"], "disk", "{body}");
    assert_eq!(body["error"]["type"], "OSError", "{body}");
    let stdout = body["stdout"].as_str().unwrap();
    let made: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("files "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        (300..=512).contains(&made),
        "{made} files of 64 KiB in a 32 MiB quota"
    );
    assert_quota_back(&arena, &worker_line(&body)).await;
    arena.assert_recovered().await;
}

#[tokio::test]
async fn shared_memory_is_capped_too() {
    let arena = arena().await;
    // /dev/shm is a private 64 MiB tmpfs per worker.
    let code = "with open('/dev/shm/fill', 'wb') as f:\n    for _ in range(100):\n        f.write(b'z' * (1 << 20))\n        f.flush()";
    let body = arena.attack(run(code, 30.0)).await;
    assert_eq!(body["limit"], "disk", "{body}");
    assert_eq!(body["error"]["type"], "OSError", "{body}");
    // Emptied between runs.
    let body = arena
        .attack(run(
            "import os, shutil\nprint(os.listdir('/dev/shm'), shutil.disk_usage('/dev/shm').total)",
            10.0,
        ))
        .await;
    assert_eq!(body["stdout"], format!("[] {}\n", 64 << 20), "{body}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_session_keeps_its_files_within_the_quota() {
    let arena = arena().await;
    let (status, info) = arena.server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    let call = |code: &str| json!({"code": code, "session": id, "timeout": 20});
    let body = arena
        .attack(call(
            "open('kept.bin', 'wb').write(b'k' * (8 << 20))\nimport os\nprint(os.getcwd())",
        ))
        .await;
    assert_eq!(body["exit_code"], 0, "{body}");
    // The session's files stay between calls, and count against its quota.
    let body = arena
        .attack(call(
            "import os\nprint(os.path.getsize('kept.bin'))\nopen('more.bin', 'wb').write(b'm' * (40 << 20))",
        ))
        .await;
    assert_eq!(body["stdout"], format!("{}\n", 8 << 20), "{body}");
    assert_eq!(body["limit"], "disk", "{body}");
    let body = arena
        .attack(call(
            "import os\nos.remove('more.bin')\nprint(os.path.getsize('kept.bin'))",
        ))
        .await;
    assert_eq!(body["stdout"], format!("{}\n", 8 << 20), "{body}");
    let resp = arena
        .server
        .client
        .delete(format!("{}/sessions/{id}", arena.server.url))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{resp:?}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_session_call_whose_files_do_not_fit_what_is_left_is_refused() {
    let arena = arena().await;
    let (status, info) = arena.server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    // The session has an in.txt, and fills its quota to within 256 KiB.
    let body = arena
        .attack(json!({"session": id, "timeout": 20, "files": {"in.txt": "old"}, "code": "import shutil\nleft = shutil.disk_usage('.').free\nopen('fill.bin', 'wb').write(b'f' * (left - (256 << 10)))\nkept = 'state'"}))
        .await;
    assert_eq!(body["exit_code"], 0, "{body}");
    let one_mib = "x".repeat(1 << 20);
    let (status, body) = arena
        .server
        .execute(json!({"session": id, "code": "kept = 'lost'", "files": {"in.txt": one_mib}}))
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "too_large", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "file \"in.txt\" could not be written: No space left on device; the call did not run"
        ),
        "{message}"
    );
    // The code did not run, and the file it would have replaced is as it
    // was; with room made, the same file goes in.
    let body = arena
        .attack(json!({"session": id, "code": "import os\nos.remove('fill.bin')\nprint(kept, open('in.txt').read(), sorted(os.listdir('.')))"}))
        .await;
    assert_eq!(body["stdout"], "state old ['in.txt']\n", "{body}");
    let (status, body) = arena
        .server
        .execute(json!({"session": id, "code": "print(len(open('in.txt').read()))", "files": {"in.txt": one_mib}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], format!("{}\n", 1 << 20), "{body}");
    arena.server.delete(&format!("/sessions/{id}")).await;
    arena.assert_recovered().await;
}

#[tokio::test]
async fn health_reports_the_disk_quota() {
    let arena = arena().await;
    let (status, health) = arena.server.get("/health").await;
    assert_eq!(status, 200);
    let sandbox = &health["sandbox"];
    assert_eq!(sandbox["disk_quota"], true, "{health}");
    let env = arena.server.executor.default_env().to_string();
    assert_eq!(
        sandbox["disk_bytes"],
        json!({ env: DISK_BYTES }),
        "{health}"
    );
    assert_eq!(sandbox["shm_bytes"], 64 << 20, "{health}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn without_the_sandbox_there_is_no_quota_and_no_filter() {
    let server = crate::common::TestServer::with_config(code_executor::Config {
        pool_size: 1,
        sandbox: code_executor::config::SandboxConfig {
            enabled: false,
            ..common::sandbox_config()
        },
        ..common::config()
    })
    .await;
    let (status, health) = server.get("/health").await;
    assert_eq!(status, 200);
    assert_eq!(health["sandbox"]["disk_quota"], false, "{health}");
    assert_eq!(health["sandbox"].get("disk_bytes"), None, "{health}");
    assert_eq!(health["sandbox"]["seccomp"], false, "{health}");
    // A request's own disk limit cannot be told from other files there.
    let (status, body) = server
        .post(
            "/execute",
            json!({"code": "print(1)", "limits": {"disk_bytes": 1 << 20}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "bad_request", "{body}");
    assert!(
        crate::common::error_message(&body).contains("scratch tmpfs"),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn input_files_larger_than_the_quota_are_refused() {
    let arena = Arena::with_config(code_executor::Config {
        pool_size: 1,
        sandbox: code_executor::config::SandboxConfig {
            disk_bytes: 2 << 20,
            ..common::sandbox_config()
        },
        ..common::config()
    })
    .await;
    let big = "a".repeat(3 << 20);
    let (status, body) = arena
        .server
        .execute(json!({"code": "print(1)", "files": {"in.txt": big}}))
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "too_large", "{body}");
    let message = crate::common::error_message(&body);
    assert!(message.contains("disk_bytes"), "{message}");
    // Files that fit are written and read as ever.
    let body = arena
        .attack(json!({"code": "print(len(open('in.txt').read()))", "files": {"in.txt": "a".repeat(1 << 20)}}))
        .await;
    assert_eq!(body["stdout"], format!("{}\n", 1 << 20), "{body}");
    arena.assert_recovered().await;
}

/// A request's `limits.disk_bytes` lowers the quota for its run alone: the
/// worker watches its scratch tmpfs and kills the run past it.
#[tokio::test]
async fn a_request_lowers_the_disk_quota_for_its_run() {
    let arena = arena().await;
    // 1 MiB every 10 ms: 64 MiB would take most of a second.
    let code = format!(
        r#"import time
{WORKER_STARTED}
with open('big.bin', 'wb') as f:
    for i in range(64):
        f.write(b'x' * (1 << 20))
        f.flush()
        print('MiB', i + 1, flush=True)
        time.sleep(0.01)
"#
    );
    let mut request = run(&code, 30.0);
    request["limits"] = json!({"disk_bytes": 4 << 20});
    let body = arena.attack(request).await;
    assert_eq!(body["limit"], "disk", "{body}");
    assert_eq!(body["exit_code"], -9, "{body}");
    assert_eq!(body["signal"], "SIGKILL", "{body}");
    assert_eq!(body["timed_out"], false, "{body}");
    let stdout = body["stdout"].as_str().unwrap();
    let last: u64 = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("MiB "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    // Stopped soon after it passed 4 MiB (checks come every 20 ms).
    assert!((4..16).contains(&last), "wrote {last} MiB: {body}");
    // Under its limit a run is left alone; the next run has the env's quota.
    let mut small = run(
        "open('f.bin', 'wb').write(b'x' * (3 << 20))\nprint('ok')",
        30.0,
    );
    small["limits"] = json!({"disk_bytes": 4 << 20});
    let body = arena.attack(small).await;
    assert_eq!(body["stdout"], "ok\n", "{body}");
    assert_eq!(body["limit"], Value::Null, "{body}");
    assert_quota_back(&arena, &worker_line(&body_with_worker(&arena).await)).await;
    // Its files count against its limit: too many are refused up front.
    let (status, body) = arena
        .server
        .execute(json!({
            "code": "print(1)",
            "files": {"in.txt": "a".repeat(2 << 20)},
            "limits": {"disk_bytes": 1 << 20},
        }))
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        crate::common::error_message(&body).contains("limits.disk_bytes"),
        "{body}"
    );
    // A session's files are capped by the env's quota only.
    let (status, body) = arena
        .server
        .post("/sessions", json!({"limits": {"disk_bytes": 1 << 20}}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        crate::common::error_message(&body).contains("limits.disk_bytes"),
        "{body}"
    );
    arena.assert_recovered().await;
}

/// A run that goes over its `limits.disk_bytes` and ends before the worker
/// looks again is over it all the same.
#[tokio::test]
async fn a_run_that_ends_over_its_disk_limit_is_reported() {
    let arena = arena().await;
    let mut request = run("open('big.bin', 'wb').write(b'x' * (8 << 20))", 30.0);
    request["limits"] = json!({"disk_bytes": 2 << 20});
    for _ in 0..5 {
        let body = arena.attack(request.clone()).await;
        assert_eq!(body["limit"], "disk", "{body}");
        assert_eq!(body["timed_out"], false, "{body}");
    }
    arena.assert_recovered().await;
}

/// A run that prints its worker's identity.
async fn body_with_worker(arena: &Arena) -> Value {
    arena.attack(run(WORKER_STARTED, 10.0)).await
}
