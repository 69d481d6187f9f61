//! State never leaks from one run to the next; the server's variables never reach a run.

use crate::common::{self, TestServer};

/// A server with one worker, so that consecutive runs surely share it.
async fn one_worker() -> TestServer {
    TestServer::with_config(code_executor::Config {
        pool_size: 1,
        ..common::config()
    })
    .await
}

#[tokio::test]
async fn globals_modules_environment_and_cwd_do_not_leak() {
    let server = one_worker().await;
    let first = server
        .run(
            r#"
import os, json, sys
LEAK = 1
json.dumps = lambda *a, **k: "patched"
os.environ["LEAKED_VAR"] = "yes"
os.chdir("/")
sys.path.append("/leak")
import wave
print("set")
"#,
        )
        .await;
    assert_eq!(first["stdout"], "set\n");
    let second = server
        .run(
            r#"
import os, json, sys
print("LEAK" in globals())
print(json.dumps([1]))
print(os.environ.get("LEAKED_VAR"))
print(os.getcwd() != "/")
print("/leak" in sys.path)
print("wave" in sys.modules)
"#,
        )
        .await;
    assert_eq!(second["stdout"], "False\n[1]\nNone\nTrue\nFalse\nFalse\n");
    server.stop().await;
}

#[tokio::test]
async fn files_written_beside_the_run_directory_do_not_leak() {
    // `~` and `..` of a run are its worker's scratch root: what a run leaves
    // there is gone before the next run on the same worker.
    let server = one_worker().await;
    let first = server
        .run(
            r#"
import os
home = os.path.expanduser("~")
os.makedirs(os.path.join(home, ".cache", "tool"))
open(os.path.join(home, ".cache", "tool", "state"), "w").write("x")
open("../beside.txt", "w").write("x")
os.symlink("/etc/hostname", os.path.join(home, "link"))
print(sorted(os.listdir(home)) != [])
"#,
        )
        .await;
    assert_eq!(first["stdout"], "True\n", "{first}");
    let second = server
        .run(
            r#"
import os
home = os.path.expanduser("~")
print(os.path.exists(os.path.join(home, ".cache")), os.path.exists("../beside.txt"), os.path.lexists(os.path.join(home, "link")))
"#,
        )
        .await;
    assert_eq!(second["stdout"], "False False False\n", "{second}");
    server.stop().await;
}

#[tokio::test]
async fn worker_environment_is_built_from_scratch() {
    // The test process has CARGO_* variables; none may reach user code.
    let server = TestServer::start().await;
    let body = server
        .run("import os, sys\nprint(sorted(k for k in os.environ if k.startswith('CARGO')))\nprint(os.environ['PATH'].split(':')[0] == os.path.join(sys.prefix, 'bin'))\nprint(os.environ.get('MPLBACKEND'))")
        .await;
    assert_eq!(body["stdout"], "[]\nTrue\nAgg\n");
    server.stop().await;
}

#[tokio::test]
async fn temporary_files_are_private_to_each_run_and_work_in_sessions() {
    // One worker: the second clean run and the session both follow the first.
    let server = one_worker().await;
    let first = server
        .run(
            r#"
import os, sys, tempfile
tmp = tempfile.gettempdir()
print(tmp == os.environ["TMPDIR"], os.listdir(tmp))
print(sys.path[0] == os.getcwd() == os.environ["PWD"])
fd, path = tempfile.mkstemp()
os.write(fd, b"x")
print(os.path.dirname(path) == tmp, not tmp.startswith(os.getcwd() + "/"))
"#,
        )
        .await;
    assert_eq!(first["stdout"], "True []\nTrue\nTrue True\n", "{first}");
    // The file is not an artifact (the temporary directory is beside the run
    // directory) and is gone for the next run.
    assert_eq!(first["artifacts"], serde_json::json!([]), "{first}");
    let second = server
        .run("import tempfile, os\nprint(os.listdir(tempfile.gettempdir()))")
        .await;
    assert_eq!(second["stdout"], "[]\n", "{second}");

    // A session has its own directory first on sys.path and a temporary
    // directory that exists.
    let (status, info) = server.post("/sessions", serde_json::json!({})).await;
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap();
    let (status, body) = server
        .execute(serde_json::json!({"session": id, "code": r#"
import os, sys, tempfile
with tempfile.NamedTemporaryFile() as f:
    f.write(b"x")
print(sys.path[0] == os.getcwd() == os.environ["PWD"])
print(sum(p.endswith("/run") for p in sys.path))
"#}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "True\n0\n", "{body}");
    server.stop().await;
}

/// What a process a run starts inherits: stdin, stdout and stderr, never
/// the run's request or report pipe (nor, in a session, its request pipe).
const INHERITED: &str = "import subprocess, sys\n\
    listing = 'import os; print(sorted(int(fd) for fd in os.listdir(\"/proc/self/fd\")))'\n\
    subprocess.run([sys.executable, '-S', '-c', listing], close_fds=False)";

#[tokio::test]
async fn a_process_a_run_or_session_starts_inherits_only_its_standard_streams() {
    let server = one_worker().await;
    for round in 0..3 {
        // The fourth is the listing's own.
        let body = server.run(INHERITED).await;
        assert_eq!(body["stdout"], "[0, 1, 2, 3]\n", "round {round}: {body}");
    }
    let (status, info) = server.post("/sessions", serde_json::json!({})).await;
    assert_eq!(status, 201, "{info}");
    let (status, body) = server
        .execute(serde_json::json!({"code": INHERITED, "session": info["id"]}))
        .await;
    assert_eq!(status, 200, "{body}");
    // The session's process keeps /dev/null and a watch of its directory,
    // both close-on-exec.
    assert_eq!(body["stdout"], "[0, 1, 2, 3]\n", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_run_that_ends_leaving_a_background_process_is_answered_at_once() {
    let server = one_worker().await;
    for round in 0..3 {
        let started = std::time::Instant::now();
        let (status, body) = server
            .execute(serde_json::json!({
                "code": "import os\nos.system('sleep 30 </dev/null >/dev/null 2>&1 &')\nprint('bye', flush=True)\nos._exit(3)",
                "timeout": 20,
            }))
            .await;
        assert_eq!(status, 200, "{body}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "round {round}: answered after {:?}: {body}",
            started.elapsed()
        );
        assert_eq!(body["exit_code"], 3, "round {round}: {body}");
        assert_eq!(body["timed_out"], false, "round {round}: {body}");
        assert_eq!(body["stdout"], "bye\n", "round {round}: {body}");
    }
    server.stop().await;
}
