//! System calls that reach for the kernel: the workers' seccomp filter
//! refuses them with `EPERM`, while ordinary Python keeps working.

use nix::libc;
use serde_json::json;

use super::{Arena, run};
use crate::common;

/// `syscall(nr, args...)` through ctypes; prints `name result errno-name`.
fn attempt(name: &str, nr: i64, args: &str) -> String {
    format!(
        "r = libc.syscall({nr}, {args})\nprint({name:?}, r, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()), flush=True)\nif r == 0 and {name:?} == 'clone':\n    os._exit(0)\n"
    )
}

#[tokio::test]
async fn kernel_facing_syscalls_are_refused_with_eperm() {
    let arena = Arena::start().await;
    let calls: &[(&str, i64, String)] = &[
        // PTRACE_TRACEME
        ("ptrace", libc::SYS_ptrace, "0, 0, 0, 0".into()),
        (
            "unshare",
            libc::SYS_unshare,
            format!("{}", libc::CLONE_NEWUSER),
        ),
        // The same through clone: a child in a new user namespace.
        (
            "clone",
            libc::SYS_clone,
            format!("{}, 0, 0, 0, 0", libc::CLONE_NEWUSER | libc::SIGCHLD),
        ),
        (
            "mount",
            libc::SYS_mount,
            "b'none', b'/tmp', b'tmpfs', 0, None".into(),
        ),
        // BPF_PROG_LOAD with no attributes.
        ("bpf", libc::SYS_bpf, "5, None, 0".into()),
        (
            "perf_event_open",
            libc::SYS_perf_event_open,
            "None, 0, -1, -1, 0".into(),
        ),
        ("userfaultfd", libc::SYS_userfaultfd, "0".into()),
        // KEYCTL_GET_KEYRING_ID of the session keyring.
        ("keyctl", libc::SYS_keyctl, "0, -3, 0".into()),
        ("setns", libc::SYS_setns, "0, 0".into()),
        ("io_uring_setup", libc::SYS_io_uring_setup, "1, None".into()),
        // PER_LINUX32
        ("personality", libc::SYS_personality, "8".into()),
        // The worker (pid 1 of the run's pid namespace): its fds, its pages.
        ("pidfd_getfd", libc::SYS_pidfd_getfd, "0, 0, 0".into()),
        (
            "process_madvise",
            libc::SYS_process_madvise,
            "0, None, 0, 0, 0".into(),
        ),
        ("kcmp", libc::SYS_kcmp, "1, os.getpid(), 0, 0, 0".into()),
        ("sethostname", libc::SYS_sethostname, "b'x', 1".into()),
        ("setdomainname", libc::SYS_setdomainname, "b'x', 1".into()),
    ];
    let mut code = String::from(
        "import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n",
    );
    for (name, nr, args) in calls {
        code.push_str(&attempt(name, *nr, args));
    }
    // Allowed: the query of the current personality.
    code.push_str(&format!(
        "print('query', libc.syscall({}, 0xffffffff) >= 0)\n",
        libc::SYS_personality
    ));
    let body = arena.attack(run(&code, 10.0)).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    let stdout = body["stdout"].as_str().unwrap();
    for (name, ..) in calls {
        assert!(
            stdout.contains(&format!("{name} -1 EPERM\n")),
            "{name} was not refused with EPERM:\n{stdout}"
        );
    }
    assert!(stdout.contains("query True\n"), "{stdout}");
    // The run has its own UTS namespace besides: the host's name is apart.
    let body = arena
        .attack(run(
            "import os\nprint(os.readlink('/proc/self/ns/uts'))",
            10.0,
        ))
        .await;
    let ours = std::fs::read_link("/proc/self/ns/uts").unwrap();
    assert_ne!(
        body["stdout"].as_str().unwrap().trim(),
        ours.to_string_lossy(),
        "{body}"
    );
    arena.assert_recovered().await;
}

#[tokio::test]
async fn ordinary_python_works_under_the_filter() {
    let arena = Arena::start().await;
    let code = r#"import os, signal, subprocess, threading, multiprocessing, socket, time, asyncio
results = []
threads = [threading.Thread(target=results.append, args=(i,)) for i in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print('threads', sorted(results) == list(range(16)))
print('subprocess', subprocess.run(['echo', 'hi'], capture_output=True, text=True).stdout.strip())
with multiprocessing.Pool(2) as pool:
    print('pool', pool.map(abs, [-1, -2, -3]))
pid = os.fork()
if pid == 0:
    os._exit(7)
print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
os.kill(os.getpid(), signal.SIGUSR1)
signal.signal(signal.SIGALRM, lambda s, f: got.append(s))
signal.setitimer(signal.ITIMER_REAL, 0.01)
time.sleep(0.2)
print('signals', got == [signal.SIGUSR1, signal.SIGALRM])
a, b = socket.socketpair()
a.sendall(b'ping')
print('socketpair', b.recv(4))
print('asyncio', asyncio.run(asyncio.sleep(0, 'done')))
print('seccomp', open('/proc/self/status').read().split('Seccomp:')[1].split()[0])
"#;
    let body = arena.attack(run(code, 20.0)).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(
        body["stdout"],
        "threads True\nsubprocess hi\npool [1, 2, 3]\nfork 7\nsignals True\nsocketpair b'ping'\nasyncio done\nseccomp 2\n",
        "{body}"
    );
    arena.assert_recovered().await;
}

#[tokio::test]
async fn numpy_works_under_the_filter() {
    // numpy's BLAS starts its own threads (clone3, then clone).
    let python = common::pyenvs::plot_python().await;
    let arena = Arena::with_config(code_executor::Config {
        env: code_executor::config::EnvChoice::Python(python),
        pool_size: 1,
        ..common::config()
    })
    .await;
    let code = "import numpy as np\na = np.random.default_rng(0).random((400, 400))\nb = a @ a.T\nprint(np.allclose(b, b.T), np.linalg.matrix_rank(a))";
    let body = arena.attack(run(code, 60.0)).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "True 400\n", "{body}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn health_reports_the_filter() {
    let arena = Arena::start().await;
    let (status, health) = arena.server.get("/health").await;
    assert_eq!(status, 200);
    assert_eq!(health["sandbox"]["seccomp"], true, "{health}");
    assert_eq!(health["sandbox"].get("problem"), None, "{health}");
    assert_eq!(health["sandbox"]["disk_quota"], true, "{health}");
    let env = arena.server.executor.default_env().to_string();
    assert_eq!(
        health["sandbox"]["disk_bytes"],
        json!({ env: code_executor::config::DEFAULT_DISK_BYTES }),
        "{health}"
    );
    arena.assert_recovered().await;
}
