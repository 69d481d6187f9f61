//! Attacks made by the code a run executes.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Arena, pool, processes_running, run};
use crate::common::{self, TestServer};

#[tokio::test]
async fn infinite_loop_is_stopped_by_the_timeout() {
    let arena = Arena::start().await;
    let started = Instant::now();
    let body = arena.attack(run("while True:\n    pass", 1.0)).await;
    assert!(started.elapsed() < Duration::from_secs(4), "{body}");
    assert_eq!(body["limit"], "timeout", "{body}");
    assert_eq!(body["timed_out"], true);
    assert_eq!(body["signal"], "SIGKILL");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn pure_c_cpu_burn_hits_the_cpu_limit() {
    let arena = Arena::start().await;
    // Catastrophic backtracking: the loop runs in C and never checks signals.
    let body = arena
        .attack(json!({
            "code": "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')",
            "timeout": 20,
            "limits": {"cpu_seconds": 1},
        }))
        .await;
    assert_eq!(body["limit"], "cpu", "{body}");
    assert_eq!(body["signal"], "SIGXCPU", "{body}");
    assert_eq!(body["timed_out"], false);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn ignoring_sigterm_does_not_survive_the_timeout() {
    let arena = Arena::start().await;
    let body = arena
        .attack(run(
            "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
            1.0,
        ))
        .await;
    assert_eq!(body["limit"], "timeout", "{body}");
    assert_eq!(body["signal"], "SIGKILL");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn leaving_its_process_group_does_not_survive_the_timeout() {
    // The run moves itself into the group of a child it started in a group
    // of its own, so that killing the run's process group misses both.
    let arena = Arena::start().await;
    let started = std::time::Instant::now();
    let body = arena
        .attack(run(
            r#"
import os, time
child = os.fork()
if child == 0:
    os.setpgid(0, 0)
    while True:
        time.sleep(1)
time.sleep(0.2)
os.setpgid(0, child)
print("moved", flush=True)
while True:
    pass
"#,
            1.0,
        ))
        .await;
    assert_eq!(body["stdout"], "moved\n", "{body}");
    assert_eq!(body["limit"], "timeout", "{body}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{body}"
    );
    // The child in its own group is gone too before the next run.
    arena.assert_recovered().await;
}

#[tokio::test]
async fn fork_bomb_hits_the_process_limit() {
    let arena = Arena::start().await;
    let body = arena
        .attack(run("import os\nwhile True:\n    os.fork()", 20.0))
        .await;
    assert_eq!(body["limit"], "processes", "{body}");
    assert_eq!(body["error"]["type"], "BlockingIOError", "{body}");
    assert_eq!(body["timed_out"], false);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn thread_bomb_hits_the_process_limit() {
    let arena = Arena::start().await;
    let body = arena
        .attack(run(
            "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()",
            20.0,
        ))
        .await;
    assert_eq!(body["limit"], "processes", "{body}");
    assert_eq!(body["error"]["type"], "RuntimeError", "{body}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn one_huge_allocation_is_a_memory_limit() {
    let arena = Arena::start().await;
    let body = arena.attack(run("x = bytearray(1 << 40)", 10.0)).await;
    assert_eq!(body["limit"], "memory", "{body}");
    assert_eq!(body["error"]["type"], "MemoryError");
    assert_eq!(body["exit_code"], 1);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn slow_memory_growth_is_a_memory_limit() {
    let arena = Arena::start().await;
    let body = arena
        .attack(json!({
            "code": "chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))",
            "timeout": 20,
            "limits": {"memory_bytes": 512u64 << 20},
        }))
        .await;
    assert_eq!(body["limit"], "memory", "{body}");
    assert_eq!(body["error"]["type"], "MemoryError");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn printing_100_mb_is_cut_at_the_output_cap() {
    let arena = Arena::start().await;
    let body = arena
        .attack(run(
            "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1000000)",
            30.0,
        ))
        .await;
    assert_eq!(body["limit"], "output", "{body:.200}");
    assert_eq!(body["truncated"], true);
    assert_eq!(body["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(body["exit_code"], 0);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn os_exit_mid_output_keeps_what_was_written() {
    let arena = Arena::start().await;
    let body = arena
        .attack(run(
            "import os, sys\nprint('before')\nsys.stdout.write('unflushed')\nos._exit(0)",
            5.0,
        ))
        .await;
    assert_eq!(body["stdout"], "before\nunflushed", "{body}");
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["limit"], json!(null));
    arena.assert_recovered().await;
}

#[tokio::test]
async fn segfault_through_ctypes_reads_as_sigsegv() {
    let arena = Arena::start().await;
    let body = arena
        .attack(run("import ctypes\nctypes.string_at(0)", 5.0))
        .await;
    assert_eq!(body["signal"], "SIGSEGV", "{body}");
    assert_eq!(body["exit_code"], -11);
    assert_eq!(body["limit"], json!(null));
    arena.assert_recovered().await;
}

#[tokio::test]
async fn killing_its_own_worker_does_nothing() {
    let arena = Arena::start().await;
    // Where the kernel scopes signals, the worker found so too (it tries the
    // domain once at start). Where it cannot, a run may kill its zygote:
    // `unscoped.rs` shows what that costs (the run itself, and its worker).
    let scoped = common::signals_scoped(&arena.server).await;
    // Every process of the worker's pid namespace but the run's own: the
    // worker (pid 1) and the zygote the run was forked from (its parent).
    let (status, body) = arena
        .server
        .execute(run(
            r#"
import os, signal
mine = {os.getpid()}
others = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine)
refused = 0
for pid in others:
    for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except OSError:
            refused += 1
print(os.getppid() in others, 1 in others, refused == 3 * len(others))
"#,
            5.0,
        ))
        .await;
    if scoped {
        // Signals from inside are dropped for pid 1 and refused for the
        // zygote (a Landlock domain scopes the run's signals), so the worker
        // runs on unharmed and its next run gets a fresh child.
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["stdout"], "True True True\n", "{body}");
        assert_eq!(body["exit_code"], 0);
    } else {
        // The zygote took the signals: the run died with it.
        assert_eq!(status, 500, "{body}");
    }
    let body = arena
        .attack(run("import os\nprint(os.getppid())", 5.0))
        .await;
    assert_ne!(body["stdout"], "1\n", "runs fork from the worker: {body}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn garbage_on_and_closing_every_inherited_fd_breaks_nothing() {
    let arena = Arena::start().await;
    let body = arena
        .attack(run(
            "import os\nfor fd in range(3, 1024):\n    try:\n        os.write(fd, b'\\xff' * 64 + b'\\x00\\x00\\x00\\x10garbage')\n    except OSError:\n        pass\nfor fd in range(3, 1024):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\nprint('done')",
            10.0,
        ))
        .await;
    assert_eq!(body["stdout"], "done\n", "{body}");
    assert_eq!(body["exit_code"], 0);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_fake_report_on_the_control_pipe_cannot_forge_the_result() {
    let arena = Arena::start().await;
    // A well-formed report with ill-typed fields, written to every fd.
    let body = arena
        .attack(run(
            "import os, struct\nbody = b'\\x81\\xa6status\\xa3bad'\nframe = struct.pack('!I', len(body)) + body\nfor fd in range(3, 1024):\n    try:\n        os.write(fd, frame)\n    except OSError:\n        pass\nprint('done')",
            10.0,
        ))
        .await;
    // The forged report ends the run (its own business), read as a clean
    // exit: ill-typed fields never reach the server.
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["error"], json!(null), "{body}");
    assert_eq!(body["limit"], json!(null), "{body}");
    arena.assert_recovered().await;
}

/// Writes a report's length announcing ~4 GiB, then 768 MiB, to every pipe
/// the run holds open for writing besides stdout and stderr: its report pipe
/// (after [`common::with_writable_pipes`]).
const REPORT_FLOOD: &str = "chunk = bytes(1 << 20)
for fd in pipes:
    os.write(fd, bytes([0xff, 0xff, 0xff, 0xf0]))
    for _ in range(768):
        os.write(fd, chunk)
print('flooded', len(pipes))";

#[tokio::test]
async fn a_flood_on_the_report_pipe_is_dropped_not_held_by_the_worker() {
    let arena = Arena::start().await;
    let base = arena.server.executor.base_dir().to_path_buf();
    let code = common::with_writable_pipes(REPORT_FLOOD);
    let body = arena.attack(run(&code, 60.0)).await;
    // Read as no report, as garbage there is: the run ends by its exit.
    assert_eq!(body["stdout"], "flooded 1\n", "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["timed_out"], false, "{body}");
    // No process of the sandbox (the worker least of all) ever held the
    // 768 MiB.
    assert_no_process_peaked_past(&base, 256 << 10);
    arena.assert_recovered().await;
}

/// Each process of the sandbox under `base` peaked below `kib` KiB of
/// resident memory.
fn assert_no_process_peaked_past(base: &std::path::Path, kib: u64) {
    for pid in super::sandbox_processes(base) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let peak_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        assert!(
            peak_kib < kib,
            "{} peaked at {peak_kib} KiB",
            super::lineage(pid)
        );
    }
}

/// Writes a whole report, well under the report's cap, to the run's report
/// pipe (after [`common::with_writable_pipes`]): a map whose `status` is an
/// array of 8 Mi empty maps, one byte each. Decoded, that is a Python object
/// per byte (over 600 MiB in the worker).
const REPORT_OF_EMPTY_MAPS: &str = "n = 8 << 20
body = b'\\x81\\xa6status\\xdd' + n.to_bytes(4, 'big') + b'\\x80' * n
frame = len(body).to_bytes(4, 'big') + body
for fd in pipes:
    os.write(fd, frame)
print('sent', len(pipes))";

/// A report of millions of empty maps is no report (a worker decodes at
/// most `REPORT_ITEMS` containers and items of one); the run ends by its
/// exit, soon, and no process of the sandbox holds what it wrote.
async fn a_report_of_millions_of_items_is_no_report(arena: Arena) {
    let base = arena.server.executor.base_dir().to_path_buf();
    let started = Instant::now();
    let code = common::with_writable_pipes(REPORT_OF_EMPTY_MAPS);
    let body = arena.attack(run(&code, 60.0)).await;
    let elapsed = started.elapsed();
    assert_eq!(body["stdout"], "sent 1\n", "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["error"], json!(null), "{body}");
    assert_eq!(body["timed_out"], false, "{body}");
    // Decoded, it took the worker 4-5 s here.
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    assert_no_process_peaked_past(&base, 256 << 10);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_report_of_millions_of_items_is_no_report_to_the_workers_own_codec() {
    a_report_of_millions_of_items_is_no_report(Arena::start().await).await;
}

#[tokio::test]
async fn a_report_of_millions_of_items_is_no_report_to_the_msgpack_package() {
    let python = common::pyenvs::codec_python().await;
    let arena = Arena::with_config(code_executor::Config {
        env: code_executor::config::EnvChoice::Python(python),
        pool_size: 1,
        ..common::config()
    })
    .await;
    // The worker decodes with the package: the run's process, forked from
    // the worker's, has it loaded without importing it.
    let body = arena
        .attack(run("import sys\nprint('msgpack' in sys.modules)", 10.0))
        .await;
    assert_eq!(body["stdout"], "True\n", "{body}");
    a_report_of_millions_of_items_is_no_report(arena).await;
}

#[tokio::test]
async fn a_detached_grandchild_is_killed_when_the_run_ends() {
    let arena = Arena::start().await;
    let body = arena
        .attack(run(
            "import subprocess\np = subprocess.Popen(['sleep', '1000.25'], start_new_session=True)\nprint(p.pid > 0)",
            10.0,
        ))
        .await;
    assert_eq!(body["stdout"], "True\n", "{body}");
    let started = Instant::now();
    while !processes_running("sleep 1000.25").is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the detached sleep outlived its run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_double_forked_daemon_is_killed_when_the_run_ends() {
    let arena = Arena::start().await;
    let body = arena
        .attack(run(
            "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '1000.75'])\n    os._exit(0)\nos.wait()\nprint('parent done')",
            10.0,
        ))
        .await;
    assert_eq!(body["stdout"], "parent done\n", "{body}");
    let started = Instant::now();
    while !processes_running("sleep 1000.75").is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the daemon outlived its run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    arena.assert_recovered().await;
}

#[tokio::test]
async fn input_without_stdin_is_an_eof_error_at_once() {
    let arena = Arena::start().await;
    let started = Instant::now();
    let body = arena.attack(run("input()", 10.0)).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(body["error"]["type"], "EOFError", "{body}");
    assert_eq!(body["exit_code"], 1);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn the_servers_environment_and_proc_are_out_of_reach() {
    let token = "tok-9f3a61d2c4e8";
    let mut server = TestServer::with_config(code_executor::Config {
        token: Some(token.into()),
        ..common::config()
    })
    .await;
    server.client = reqwest::Client::builder()
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}").parse().unwrap(),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .unwrap();
    let arena = Arena::from_server(server, 2).await;
    let server_pid = std::process::id();
    let code = format!(
        r#"import os
found = []
for pid in os.listdir('/proc'):
    if not pid.isdigit():
        continue
    for name in ('environ', 'cmdline'):
        try:
            with open('/proc/%s/%s' % (pid, name), 'rb') as f:
                if b'{token}' in f.read():
                    found.append((pid, name))
        except OSError:
            pass
print('found', found)
print('env', '{token}' in repr(os.environ))
print('server visible', os.path.exists('/proc/{server_pid}'))
print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
"#
    );
    let body = arena.attack(run(&code, 10.0)).await;
    let stdout = body["stdout"].as_str().unwrap();
    assert!(stdout.contains("found []\n"), "{stdout}");
    assert!(stdout.contains("env False\n"), "{stdout}");
    assert!(stdout.contains("server visible False\n"), "{stdout}");
    // Only the worker (pid 1) and the run itself: a private /proc.
    assert!(stdout.contains("pids [1, "), "{stdout}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn writes_outside_the_run_directory_are_refused() {
    let config_dir = tempfile::tempdir().unwrap();
    let config_file = config_dir.path().join("server.toml");
    std::fs::write(&config_file, "token = 'x'\n").unwrap();
    let arena = Arena::start().await;
    let base = arena.server.executor.base_dir().to_path_buf();
    // Every worker's scratch root: the run picks one that is not its own.
    let roots: Vec<String> = std::fs::read_dir(&base)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("worker-")
        })
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(roots.len(), 2, "{roots:?}");
    // The compiled bootstrap the environment's next workers run.
    let staged = std::fs::read_dir(base.join("bootstrap"))
        .unwrap()
        .flatten()
        .map(|e| e.path().display().to_string())
        .find(|p| p.ends_with(".code"))
        .expect("the bootstrap is staged");
    let prefix = common::python()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let code = format!(
        r#"import os, sys
own = os.path.dirname(os.getcwd())
other = [r for r in {roots:?} if r != own][0]
import errno
def attempt(label, fn):
    try:
        fn()
        print(label, 'ALLOWED')
    except OSError as e:
        # Landlock refuses (EACCES), or the path is not in the worker's
        # root at all (ENOENT) or lies on its read-only part (EROFS).
        refused = e.errno in (errno.EACCES, errno.EPERM, errno.ENOENT, errno.EROFS)
        print(label, 'refused' if refused else type(e).__name__, e.errno)
attempt('tmp', lambda: open('/tmp/ce-escape-{pid}', 'w'))
attempt('prefix', lambda: open(os.path.join({prefix:?}, 'ce-escape'), 'w'))
attempt('other-write', lambda: open(os.path.join(other, 'x'), 'w'))
attempt('other-list', lambda: os.listdir(other))
attempt('base-list', lambda: os.listdir({base:?}))
attempt('config', lambda: open({config:?}).read())
attempt('bootstrap-write', lambda: open({staged:?}, 'r+b').write(b'x'))
attempt('bootstrap-replace', lambda: open(os.path.join(os.path.dirname({staged:?}), 'new'), 'w'))
attempt('own', lambda: open('mine.txt', 'w').write('ok'))
attempt('tmpdir', lambda: open(os.path.join(os.environ['TMPDIR'], 't'), 'w'))
"#,
        pid = std::process::id(),
        prefix = prefix.display().to_string(),
        base = base.display().to_string(),
        config = config_file.display().to_string(),
    );
    let body = arena.attack(run(&code, 10.0)).await;
    let stdout = body["stdout"].as_str().unwrap();
    for label in [
        "tmp",
        "prefix",
        "other-write",
        "other-list",
        "base-list",
        "config",
        "bootstrap-write",
        "bootstrap-replace",
    ] {
        assert!(
            stdout.contains(&format!("{label} refused ")),
            "{label}: {stdout}"
        );
    }
    assert!(stdout.contains("own ALLOWED\n"), "{stdout}");
    assert!(stdout.contains("tmpdir ALLOWED\n"), "{stdout}");
    assert!(!std::path::Path::new(&format!("/tmp/ce-escape-{}", std::process::id())).exists());
    arena.assert_recovered().await;
}

#[tokio::test]
async fn the_network_is_loopback_only() {
    let arena = Arena::start().await;
    let port = arena.server.url.rsplit(':').next().unwrap().to_string();
    let code = format!(
        r#"import socket
print(socket.if_nameindex())
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2)
    print('connected')
except OSError as e:
    print(type(e).__name__)
"#
    );
    let body = arena.attack(run(&code, 10.0)).await;
    assert_eq!(
        body["stdout"], "[(1, 'lo')]\nConnectionRefusedError\n",
        "{body}"
    );
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_2_gb_file_hits_the_file_size_limit() {
    let arena = Arena::start().await;
    let body = arena
        .attack(json!({
            "code": "with open('big', 'wb') as f:\n    for _ in range(2048):\n        f.write(bytes(1 << 20))",
            "timeout": 30,
            "limits": {"file_size_bytes": 8u64 << 20},
            "artifacts": false,
        }))
        .await;
    assert_eq!(body["limit"], "file_size", "{body}");
    assert_eq!(body["error"]["type"], "OSError");
    assert!(crate::common::error_message(&body).contains("File too large"));
    arena.assert_recovered().await;
}

#[tokio::test]
async fn ten_thousand_files_are_cleaned_up() {
    let arena = Arena::start().await;
    let body = arena
        .attack(json!({
            "code": "for i in range(10000):\n    open('f%d' % i, 'w').close()\nprint('made')",
            "timeout": 60,
        }))
        .await;
    assert_eq!(body["stdout"], "made\n", "{body:.300}");
    assert_eq!(body["exit_code"], 0);
    // Artifacts are capped; the files themselves go with the run directory.
    assert_eq!(body["artifacts"].as_array().unwrap().len(), 1000);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_thousand_concurrent_requests_on_a_pool_of_four_are_all_answered() {
    let arena = Arena::with_config(code_executor::Config {
        pool_size: 4,
        queue_timeout: Duration::from_secs(2),
        ..pool()
    })
    .await;
    // A client of its own: its 1,000 connections close when it is dropped.
    let client = reqwest::Client::new();
    let requests = (0..1000).map(|i| {
        let server = &arena.server;
        let client = &client;
        async move {
            let resp = tokio::time::timeout(
                Duration::from_secs(60),
                client
                    .post(format!("{}/execute", server.url))
                    .json(&json!({"code": format!("print({i})"), "timeout": 5}))
                    .send(),
            )
            .await
            .expect("answered, not hung")
            .expect("answered");
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap();
            (i, status, body)
        }
    });
    let results = futures_util::future::join_all(requests).await;
    let mut ok = 0;
    for (i, status, body) in &results {
        match status {
            200 => {
                assert_eq!(body["stdout"], format!("{i}\n"));
                ok += 1;
            }
            503 => assert_eq!(body["error"]["code"], "busy", "{body}"),
            _ => panic!("request {i}: {status} {body}"),
        }
    }
    assert_eq!(results.len(), 1000);
    assert!(ok > 0, "no request ran");
    drop(client);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn run_as_nobody_drops_privileges() {
    // Debian's interpreter: /root (pyenv) is private and `nobody` cannot load it.
    let python = std::path::PathBuf::from("/usr/bin/python3.11");
    assert!(python.exists(), "this test needs Debian's python3.11");
    let mut sandbox = common::sandbox_config();
    sandbox.run_as = Some("nobody".into());
    let arena = Arena::with_config(code_executor::Config {
        env: code_executor::config::EnvChoice::Python(python),
        sandbox,
        ..pool()
    })
    .await;
    let body = arena
        .attack(run(
            "import os\nprint(os.getuid(), os.geteuid(), os.getgid())\nopen('mine', 'w').write('x')\ntry:\n    os.setuid(0)\nexcept PermissionError:\n    print('setuid refused')",
            10.0,
        ))
        .await;
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let uid = nobody.uid.as_raw();
    let gid = nobody.gid.as_raw();
    assert_eq!(
        body["stdout"],
        format!("{uid} {uid} {gid}\nsetuid refused\n"),
        "{body}"
    );
    // The worker (pid 1 here) runs as the same user but is not dumpable:
    // its memory, which may hold earlier requests, is out of reach.
    let body = arena
        .attack(run(
            "import os\ntry:\n    open('/proc/1/mem', 'rb')\nexcept PermissionError:\n    print('worker memory refused')\nprint(len(os.listdir('/proc/self/fd')) > 0)",
            10.0,
        ))
        .await;
    assert_eq!(body["stdout"], "worker memory refused\nTrue\n", "{body}");
    let (_, health) = arena.server.get("/health").await;
    assert_eq!(health["sandbox"]["run_as"], true, "{health}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn shared_memory_works_and_does_not_outlive_the_run() {
    let arena = Arena::with_config(code_executor::Config {
        pool_size: 1,
        ..pool()
    })
    .await;
    let body = arena
        .attack(run(
            "import multiprocessing\nopen('/dev/shm/left-behind', 'w').write('x')\nwith multiprocessing.Pool(2) as p:\n    print(p.map(abs, [-1, -2]))",
            20.0,
        ))
        .await;
    assert_eq!(body["stdout"], "[1, 2]\n", "{body}");
    // The same (only) worker runs next: its /dev/shm is empty again.
    let body = arena
        .attack(run("import os\nprint(os.listdir('/dev/shm'))", 5.0))
        .await;
    assert_eq!(body["stdout"], "[]\n", "{body}");
    assert!(!std::path::Path::new("/dev/shm/left-behind").exists());
    arena.assert_recovered().await;
}
