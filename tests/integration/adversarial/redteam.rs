//! The red team's findings, one test per attack: each asserts the exact
//! outcome and that the server, its pool and other clients are unaffected.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Arena, pool, run};
use crate::common::{self, TestServer, error_message};
use crate::ops::spawn_server;
use code_executor::config::TierChoice;

fn tier_config(tier: TierChoice) -> code_executor::Config {
    let mut config = pool();
    config.sandbox.tier = tier;
    config
}

/// A listening socket at `path` that counts the connections it accepts.
fn socket_at(
    path: &std::path::Path,
) -> (UnixListener, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    (listener, count)
}

#[tokio::test]
async fn host_unix_sockets_are_out_of_reach_in_every_tier() {
    let dir = tempfile::Builder::new()
        .prefix("ce-sock")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let in_tmp = dir.path().join("daemon.sock");
    let in_run = std::path::PathBuf::from(format!("/run/ce-test-{}.sock", std::process::id()));
    let (tmp_listener, _) = socket_at(&in_tmp);
    let (run_listener, _) = socket_at(&in_run);
    let code = format!(
        r#"
import errno, multiprocessing, os, socket
for path in ({tmp:?}, {run:?}):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        print("REACHED", path)
    except OSError as e:
        print("refused", errno.errorcode[e.errno])
a, b = socket.socketpair()
a.send(b"pair")
print(b.recv(4).decode())
with multiprocessing.Pool(2) as p:
    print(sum(p.map(abs, [-1, -2, 3])))
"#,
        tmp = in_tmp.display().to_string(),
        run = in_run.display().to_string(),
    );
    for (tier, errno) in [
        (TierChoice::Namespaces, "ENOENT"),
        (TierChoice::Container, "EPERM"),
    ] {
        let arena = Arena::with_config(tier_config(tier)).await;
        let body = arena.attack(run(&code, 20.0)).await;
        assert_eq!(
            body["stdout"],
            format!("refused {errno}\nrefused {errno}\npair\n6\n"),
            "{tier:?}: {body}"
        );
        arena.assert_recovered().await;
    }
    // Neither daemon saw a connection.
    for listener in [&tmp_listener, &run_listener] {
        assert!(listener.accept().is_err(), "a run reached a host socket");
    }
    // In the namespace tier a run's own Unix sockets still work.
    let server = TestServer::with_config(tier_config(TierChoice::Namespaces)).await;
    let body = server
        .run("import socket, os\ns = socket.socket(socket.AF_UNIX)\ns.bind('own.sock'); s.listen(1)\nc = socket.socket(socket.AF_UNIX); c.connect('own.sock')\nconn, _ = s.accept(); c.send(b'mine'); print(conn.recv(4).decode())")
        .await;
    assert_eq!(body["stdout"], "mine\n", "{body}");
    server.stop().await;
    let _ = std::fs::remove_file(&in_run);
}

#[tokio::test]
async fn state_planted_by_one_run_never_reaches_the_next() {
    let arena = Arena::one_worker().await;
    let plant = r#"
import fcntl, os, struct, sys
home = os.path.expanduser("~")
status = open("/proc/self/status").read()
print("caps", status.split("CapEff:")[1].split()[0], status.split("CapBnd:")[1].split()[0])
open(os.path.join(home, "sticky"), "w").write("x")
fd = os.open(os.path.join(home, "sticky"), os.O_RDONLY)
try:
    fcntl.ioctl(fd, 0x40086602, struct.pack("l", 0x10))  # FS_IOC_SETFLAGS, immutable
    print("immutable SET")
except OSError as e:
    print("immutable refused", e.errno)
site = os.path.join(home, ".local", "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
os.makedirs(site)
open(os.path.join(site, "usercustomize.py"), "w").write("print('PLANTED')\n")
os.makedirs(os.path.join(home, "locked", "inner"))
open(os.path.join(home, "locked", "inner", "f"), "w").write("x")
os.chmod(os.path.join(home, "locked", "inner"), 0o555)
os.chmod(os.path.join(home, "locked"), 0o000)
open(os.path.join(home, "big"), "wb").write(b"x" * (50 << 20))
"#;
    let body = arena.attack(run(plant, 20.0)).await;
    let stdout = body["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("caps 0000000000000000 0000000000000000\n"),
        "{body}"
    );
    assert!(
        stdout.contains(&format!("immutable refused {}\n", nix::libc::EPERM)),
        "{body}"
    );
    let check = r#"
import os, subprocess, sys
print(sorted(os.listdir(os.path.expanduser("~"))))
out = subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True)
print(out.stdout.strip())
"#;
    let body = arena.attack(run(check, 20.0)).await;
    // Only the run's own directory and its private tmp; no planted module ran.
    let stdout = body["stdout"].as_str().unwrap();
    let first = stdout.lines().next().unwrap();
    assert!(
        first.starts_with("['run', 'run.tmp']") || first.starts_with("['run']"),
        "{body}"
    );
    assert_eq!(stdout.lines().nth(1), Some("child"), "{body}");
    // The 50 MB left nothing behind: a run may fill the quota again.
    let body = arena
        .attack(run(
            "open('again', 'wb').write(b'x' * (200 << 20)); print('ok')",
            20.0,
        ))
        .await;
    assert_eq!(body["stdout"], "ok\n", "{body}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn state_planted_by_one_session_never_reaches_the_next_on_its_worker() {
    // A closed session's worker is kept for the next session, which may be
    // another client's: nothing the first left may reach it.
    let arena = Arena::one_worker().await;
    let server = &arena.server;
    let (status, info) = server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{info}");
    let first = info["id"].as_str().unwrap().to_string();
    let plant = r#"
import os, sys, time
home = os.path.expanduser("~")
for where in (".", home, os.environ["TMPDIR"], "/dev/shm"):
    open(os.path.join(where, "planted"), "w").write("x")
site = os.path.join(home, ".local", "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
os.makedirs(site)
open(os.path.join(site, "usercustomize.py"), "w").write("print('PLANTED')\n")
os.makedirs(os.path.join(home, "locked", "inner"))
os.chmod(os.path.join(home, "locked"), 0o000)
open(os.path.join(home, "big"), "wb").write(b"x" * (100 << 20))
# A process of its own session that outlives it and keeps planting.
pid = os.fork()
if pid == 0:
    os.setsid()
    os.chdir(home)  # not the session's directory: the test finds the session's process by it
    if os.fork():
        os._exit(0)
    while True:
        for where in (home, "/dev/shm"):
            try:
                open(os.path.join(where, "daemon"), "w").write("x")
            except OSError:
                pass
        time.sleep(0.01)
os.waitpid(pid, 0)
secret = "TOPSECRET"
print("planted")
"#;
    let body = arena
        .attack(json!({"code": plant, "session": first, "timeout": 20.0}))
        .await;
    assert_eq!(body["stdout"], "planted\n", "{body}");
    let worker = common::session_worker(server);
    let (status, _) = server.delete(&format!("/sessions/{first}")).await;
    assert_eq!(status, 200);
    common::wait_for_session_spares(server, 1).await;
    let launchers = common::worker_pids(server).len();

    let (status, info) = server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{info}");
    let second = info["id"].as_str().unwrap().to_string();
    let check = r#"
import json, os, subprocess, sys, time
time.sleep(0.2)  # time for a planting process, were one left
home = os.path.expanduser("~")
tmp = os.environ["TMPDIR"]
out = subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True)
print(json.dumps({"home": sorted(os.listdir(home)), "cwd": os.listdir("."),
                  "tmp": sorted(os.listdir(tmp)) if tmp != home else "home",
                  "shm": os.listdir("/dev/shm"), "secret": "secret" in globals(),
                  "child": out.stdout}))
open("again", "wb").write(b"x" * (200 << 20))
"#;
    let body = arena
        .attack(json!({"code": check, "session": second, "timeout": 20.0}))
        .await;
    assert_eq!(
        common::session_worker(server),
        worker,
        "the kept worker serves it"
    );
    assert_eq!(common::worker_pids(server).len(), launchers);
    // Its own directory, empty; a /dev/shm of its own; no planted module
    // ran in its child; the 100 MB left nothing behind (nor held open), so
    // the quota (256 MB) holds 200 MB again.
    let seen: Value = serde_json::from_str(body["stdout"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(seen["home"], json!(["session"]), "{body}");
    assert_eq!(seen["cwd"], json!([]), "{body}");
    assert!(seen["tmp"] == "home" || seen["tmp"] == json!([]), "{body}");
    assert_eq!(seen["shm"], json!([]), "{body}");
    assert_eq!(seen["secret"], false, "{body}");
    assert_eq!(seen["child"], "child\n", "{body}");
    assert_eq!(body["exit_code"], 0, "the quota was full: {body}");
    let (status, _) = server.delete(&format!("/sessions/{second}")).await;
    assert_eq!(status, 200);
    common::wait_for_session_spares(server, 1).await;
    arena.assert_recovered().await;
}

/// Changes a process of the zygote's user can make to it from outside,
/// each of which every child it forks later would inherit (`zygote` is
/// its pid).
const HANDED_DOWN_CHANGES: [(&str, &str); 4] = [
    ("nice", "os.setpriority(os.PRIO_PROCESS, zygote, 19)"),
    (
        "rlimit",
        "resource.prlimit(zygote, resource.RLIMIT_NOFILE, (64, 64))",
    ),
    (
        "affinity",
        "os.sched_setaffinity(zygote, {min(os.sched_getaffinity(0))})",
    ),
    (
        "policy",
        "os.sched_setscheduler(zygote, os.SCHED_IDLE, os.sched_param(0))",
    ),
];

#[tokio::test]
async fn a_run_that_changes_what_its_zygote_hands_down_reaches_no_later_run() {
    // Rlimits, nice value, CPU affinity and scheduling policy pass from the
    // zygote to every run it forks, and a run may change them from outside
    // (a process of the same user): the zygote then forks nothing more, and
    // its worker is replaced.
    let arena = Arena::one_worker().await;
    let state = "import json, os, resource
limits = sorted({getattr(resource, n) for n in dir(resource) if n.startswith('RLIMIT_')})
print(json.dumps([[resource.getrlimit(r) for r in limits], os.getpriority(os.PRIO_PROCESS, 0),
                  sorted(os.sched_getaffinity(0)), os.sched_getscheduler(0)]))";
    let fresh = arena.attack(run(state, 10.0)).await;
    assert_eq!(fresh["exit_code"], 0, "{fresh}");
    for (what, change) in HANDED_DOWN_CHANGES {
        let code =
            format!("import os, resource\nzygote = os.getppid()\n{change}\nprint('changed')");
        let body = arena.attack(run(&code, 10.0)).await;
        assert_eq!(body["stdout"], "changed\n", "{what}: {body}");
        for _ in 0..2 {
            let body = arena.attack(run(state, 10.0)).await;
            assert_eq!(body["stdout"], fresh["stdout"], "{what} was handed down");
        }
    }
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_session_that_changes_what_its_zygote_hands_down_leaves_no_worker_kept() {
    // Rlimits, nice value, CPU affinity and scheduling policy pass from the
    // zygote to every process it forks, and a session's code may change
    // them from outside (a process of the same user). A closed session's
    // worker whose zygote or worker was changed so is ended, not kept for
    // the next session (maybe another client's).
    let arena = Arena::one_worker().await;
    let server = &arena.server;
    for (what, change) in HANDED_DOWN_CHANGES {
        let (status, info) = server.post("/sessions", json!({})).await;
        assert_eq!(status, 201, "{info}");
        let id = info["id"].as_str().unwrap().to_string();
        let code = format!(
            "import os, resource\nzygote = os.getppid()\ntry:\n    {change}\n    print('changed')\nexcept OSError as e:\n    print('refused', e.errno)"
        );
        let body = arena.attack(json!({"code": code, "session": id})).await;
        let worker = common::session_worker(server);
        let (status, _) = server.delete(&format!("/sessions/{id}")).await;
        assert_eq!(status, 200);
        if body["stdout"] == "changed\n" {
            common::wait_gone(worker, what).await;
            assert_eq!(server.pool().await["session_spares"], 0, "{what}");
        } else {
            // Refused here: the worker is kept as after any session.
            assert!(
                what != "nice",
                "raising a nice value is never refused: {body}"
            );
            common::wait_for_session_spares(server, 1).await;
        }
        server.wait_for_pool_size(1, Duration::from_secs(10)).await;
    }
    arena.assert_recovered().await;
}

/// Code that reads its own process's anonymous memory and prints every marker
/// (`TOPSECRET-<WHAT>-<n>`) it finds there, but the ones it holds itself:
/// the marker's prefix is spelled in hex here, and what the scan builds of
/// it has no `-<WHAT>-<n>` after it.
const SCAN_OWN_MEMORY: &str = r#"
import os, re
pattern = re.compile(re.escape(bytes.fromhex("544f50534543524554")) + rb"-[A-Z]+-\d{4}")
found = set()
mem = os.open("/proc/self/mem", os.O_RDONLY)
for line in open("/proc/self/maps").read().splitlines():
    fields = line.split()
    lo, hi = (int(x, 16) for x in fields[0].split("-"))
    # Anonymous memory (the heap, mmapped arenas), where freed data stays.
    if not fields[1].startswith("rw") or (len(fields) > 5 and fields[5] != "[heap]"):
        continue
    # In chunks that overlap by more than a marker, each read on its own: a
    # region this scan's own allocations unmap meanwhile reads as an error.
    for at in range(lo, hi, 1 << 20):
        try:
            data = os.pread(mem, min((1 << 20) + 64, hi - at), at)
        except OSError:
            continue
        found.update(m.group().decode() for m in pattern.finditer(data))
print(sorted(found))
"#;

#[tokio::test]
async fn what_earlier_requests_left_in_memory_reaches_no_run_and_no_session() {
    earlier_requests_stay_out_of_memory(Arena::one_worker().await).await;
}

/// One worker serves every request: other clients' runs whose code, stdin,
/// files and output carry markers, then a run and a session that look for
/// them in their own memory. The worker relayed all of it; its zygote,
/// which forks runs and sessions, never held any of it.
pub async fn earlier_requests_stay_out_of_memory(arena: Arena) {
    for n in 0..12 {
        let body = arena
            .attack(json!({
                "code": format!(
                    "secret = 'TOPSECRET-CODE-{n:04}'\nprint('TOPSECRET-OUT-{n:04}')\nprint(open('in.txt').read())\n{}",
                    "x = 1\n".repeat(n * 40)
                ),
                "stdin": format!("TOPSECRET-STDIN-{n:04}"),
                "files": {"in.txt": format!("TOPSECRET-FILE-{n:04}")},
                "timeout": 10.0,
            }))
            .await;
        assert_eq!(
            body["stdout"],
            format!("TOPSECRET-OUT-{n:04}\nTOPSECRET-FILE-{n:04}\n"),
            "{body}"
        );
    }
    let body = arena.attack(run(SCAN_OWN_MEMORY, 20.0)).await;
    assert_eq!(
        body["stdout"], "[]\n",
        "a run read earlier requests: {body}"
    );
    let (status, info) = arena.server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{info}");
    let session = info["id"].as_str().unwrap().to_string();
    let body = arena
        .attack(json!({"code": SCAN_OWN_MEMORY, "session": session, "timeout": 20.0}))
        .await;
    assert_eq!(
        body["stdout"], "[]\n",
        "a session read earlier requests: {body}"
    );
    let (status, _) = arena.server.delete(&format!("/sessions/{session}")).await;
    assert_eq!(status, 200);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn what_a_run_leaves_in_place_of_its_own_directories_is_cleared_too() {
    // Between runs the worker removes the run's directories and tells an
    // emptied scratch root by its size, not a listing. A run that leaves as
    // many entries as it was given, or a file where its private tmp was,
    // must not get past that.
    let arena = Arena::one_worker().await;
    let check = "import os
print(sorted(os.listdir(os.path.expanduser('~'))), os.listdir('/dev/shm'), \
                 os.path.isdir(os.environ['TMPDIR']), os.listdir('.'))";
    for plant in [
        // The private tmp goes, a file of another name takes its place.
        "import os
os.rmdir(os.environ['TMPDIR'])
open(os.path.expanduser('~/planted'), 'w').write('x')
open('/dev/shm/planted', 'w').write('x')
print('planted')",
        // A file where the private tmp was, under its name.
        "import os
os.rmdir(os.environ['TMPDIR'])
open(os.environ['TMPDIR'], 'w').write('x')
print('planted')",
        // The run's own directory moved aside, an empty one in its place.
        "import os
here = os.getcwd()
os.chdir('/')
os.rename(here, here + '.kept')
os.mkdir(here)
open(here + '.kept/f', 'w').write('x')
print('planted')",
    ] {
        let body = arena.attack(run(plant, 10.0)).await;
        assert_eq!(body["stdout"], "planted\n", "{body}");
        let body = arena.attack(run(check, 10.0)).await;
        assert_eq!(
            body["stdout"], "['run', 'run.tmp'] [] True []\n",
            "after {plant:?}: {body}"
        );
    }
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_scratch_root_that_cannot_be_cleared_retires_its_worker_first() {
    // Without the sandbox a root run keeps its capabilities: it can make a
    // file the worker cannot delete. The next request must not run there.
    let mut config = code_executor::Config {
        pool_size: 1,
        ..common::config()
    };
    config.sandbox.enabled = false;
    let server = TestServer::with_config(config).await;
    let body = server
        .run("import fcntl, os, struct\nopen('x', 'w').close()\nopen(os.path.expanduser('~/stuck'), 'w').close()\nfd = os.open(os.path.expanduser('~/stuck'), os.O_RDONLY)\nfcntl.ioctl(fd, 0x40086602, struct.pack('l', 0x10))\nprint('planted')")
        .await;
    assert_eq!(body["stdout"], "planted\n", "{body}");
    let stuck: Vec<_> = walk(server.executor.base_dir())
        .into_iter()
        .filter(|p| p.ends_with("stuck"))
        .collect();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    // The next run is answered, by a fresh worker, and sees nothing planted.
    let body = server
        .run("import os\nprint(os.path.exists(os.path.expanduser('~/stuck')))")
        .await;
    assert_eq!(body["stdout"], "False\n", "{body}");
    let metrics = server
        .client
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("cause=\"dirty\"} 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("restart"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    for path in stuck {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&path)
            .status();
    }
    server.stop().await;
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
            out.push(e.path());
        }
    }
    out
}

#[tokio::test]
async fn descriptors_the_server_inherited_never_reach_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "root-only-canary").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let unsandboxed = tmp.path().join("plain.toml");
    std::fs::write(&unsandboxed, "sandbox = false\n").unwrap();
    // What each descriptor of the run is: only /dev/null and pipes (stdio
    // and its report to the worker) may be there.
    let code = r#"import os
kinds = set()
for f in os.listdir('/proc/self/fd'):
    try:
        target = os.readlink('/proc/self/fd/' + f)
    except OSError:
        continue  # the listing's own descriptor, closed by now
    kinds.add(target.split(':')[0])
print(sorted(kinds))
try:
    print(os.read(7, 100))
except OSError as e:
    print('EBADF' if e.errno == 9 else e)"#;
    for extra in [vec![], vec!["--config", unsandboxed.to_str().unwrap()]] {
        // The server starts with fd 7 open on the secret (no close-on-exec),
        // as a careless parent would leave it.
        let (_child, address, _logs) = crate::ops::spawn_server_wrapped(
            &format!("exec 7<{}\nexec", secret.display()),
            &extra,
            tmp.path(),
        )
        .await;
        let body: Value = reqwest::Client::new()
            .post(format!("http://{address}/execute"))
            .json(&json!({"code": code}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let stdout = body["stdout"].as_str().unwrap();
        assert!(stdout.ends_with("EBADF\n"), "{extra:?}: {body}");
        assert!(!stdout.contains("canary"), "{body}");
        assert!(
            stdout.starts_with("['/dev/null', 'pipe']\n"),
            "{extra:?}: {body}"
        );
    }
}

#[tokio::test]
async fn slow_and_silent_connections_cost_nobody_else() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("server.toml");
    std::fs::write(
        &config,
        "header_read_timeout_secs = 2\nbody_read_timeout_secs = 2\npool_size = 1\n",
    )
    .unwrap();
    // The server starts with a soft limit of 1024 descriptors, as it would
    // under many service managers; it raises its own.
    let prlimit = std::path::Path::new("/usr/bin/prlimit");
    assert!(prlimit.exists(), "prlimit (util-linux) is needed");
    let (_child, address, _logs) = crate::ops::spawn_server_wrapped(
        &format!("exec prlimit --nofile=1024:{hard}"),
        &["--config", config.to_str().unwrap()],
        tmp.path(),
    )
    .await;
    let mut held = Vec::new();
    for i in 0..1100 {
        let mut s = TcpStream::connect(&address).unwrap();
        match i % 3 {
            0 => {}
            1 => s
                .write_all(b"POST /execute HTTP/1.1\r\nHost: x\r\n")
                .unwrap(),
            _ => s
                .write_all(b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
                .unwrap(),
        }
        held.push(s);
    }
    let client = reqwest::Client::new();
    let started = Instant::now();
    let body: Value = client
        .post(format!("http://{address}/execute"))
        .json(&json!({"code": "print(2+2)"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["stdout"], "4\n", "{body}");
    let health = client
        .get(format!("http://{address}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let metrics = client
        .get(format!("http://{address}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "served late: {:?}",
        started.elapsed()
    );
    // Then the server closes every one of them: silent and half-header ones
    // at the header timeout, the short body with a 408.
    let mut answers = [0usize; 3];
    for (i, s) in held.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        let text = String::from_utf8_lossy(&got);
        if i % 3 == 2 {
            assert!(
                text.starts_with("HTTP/1.1 408"),
                "short body answered {text:?}"
            );
            assert!(text.contains("request_timeout"), "{text}");
        }
        answers[i % 3] += 1;
    }
    assert_eq!(answers, [367, 367, 366]);
}

#[tokio::test]
async fn connections_past_the_cap_are_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("server.toml");
    std::fs::write(&config, "max_connections = 8\npool_size = 1\n").unwrap();
    let (_child, address, _logs) =
        spawn_server(&["--config", config.to_str().unwrap()], tmp.path()).await;
    let held: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(&address).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(&address).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut text = String::new();
    let _ = extra.read_to_string(&mut text);
    assert!(text.starts_with("HTTP/1.1 503"), "{text:?}");
    assert!(text.contains("max_connections"), "{text}");
    drop(held);
    // With the held ones gone, clients are served again.
    let started = Instant::now();
    loop {
        if let Ok(resp) = reqwest::get(format!("http://{address}/health")).await
            && resp.status() == 200
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never served again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_deep_tree_left_behind_costs_no_other_request() {
    let arena = Arena::one_worker().await;
    let deep = r#"
import os
os.chdir(os.path.expanduser("~"))
for _ in range(2000):
    os.mkdir("d")
    os.chdir("d")
open("leaf", "w").write("x")
os.chdir("/dev/shm")
for _ in range(1000):
    os.mkdir("s")
    os.chdir("s")
print("deep")
"#;
    let body = arena.attack(run(deep, 30.0)).await;
    assert_eq!(body["stdout"], "deep\n", "{body}");
    for i in 0..10 {
        let body = arena
            .attack(run(&format!("import os\nprint({i}, os.listdir(os.path.expanduser('~')), os.listdir('/dev/shm'))"), 10.0))
            .await;
        let stdout = body["stdout"].as_str().unwrap();
        assert!(stdout.starts_with(&format!("{i} ['run")), "{body}");
        assert!(stdout.ends_with("[]\n"), "{body}");
    }
    arena.assert_recovered().await;
}

#[tokio::test]
async fn absurd_numbers_are_refused_or_capped_never_a_panic() {
    let server = TestServer::with_config(pool()).await;
    let max_ttl = code_executor::Config::default()
        .sessions
        .max_ttl
        .as_secs_f64();
    for ttl in [1e20, 1.7976931348623157e308, 18446744073709551616.0] {
        let (status, body) = server.post("/sessions", json!({"ttl": ttl})).await;
        assert_eq!(status, 201, "ttl {ttl}: {body}");
        assert_eq!(body["ttl"], max_ttl, "{body}");
        let id = body["id"].as_str().unwrap().to_string();
        let (_, listed) = server.get("/sessions").await;
        assert!(listed.to_string().contains(&id), "{listed}");
        let (status, _) = server.delete(&format!("/sessions/{id}")).await;
        assert_eq!(status, 200);
    }
    for ttl in [-1.0, 0.0] {
        let (status, body) = server.post("/sessions", json!({"ttl": ttl})).await;
        assert_eq!(status, 400, "ttl {ttl}: {body}");
    }
    // Numbers JSON cannot hold, and ones past u64, in every numeric field.
    for (field, value) in [
        ("timeout", "1e999"),
        ("timeout", "-1e999"),
        ("timeout", "-5"),
        ("limits", r#"{"memory_bytes": 1e30}"#),
        ("limits", r#"{"memory_bytes": -1}"#),
        ("limits", r#"{"processes": 18446744073709551616}"#),
        ("limits", r#"{"cpu_seconds": 1.5e300}"#),
        ("limits", r#"{"disk_bytes": -7}"#),
    ] {
        let raw = format!(r#"{{"code": "print(1)", "{field}": {value}}}"#);
        let resp = server
            .client
            .post(format!("{}/execute", server.url))
            .header("content-type", "application/json")
            .body(raw.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{raw}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "bad_request", "{raw}: {body}");
    }
    // A huge timeout is capped by the maximum, not refused.
    let (status, body) = server
        .execute(json!({"code": "print(1)", "timeout": 1e300}))
        .await;
    assert_eq!(
        (status, body["stdout"].as_str()),
        (200, Some("1\n")),
        "{body}"
    );
    let (status, body) = server
        .post("/grade", json!({"code": "print(input())", "timeout": 1e300, "tests": [{"stdin": "a", "expected_stdout": "a\n", "timeout": 1e300}]}))
        .await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn bad_file_entries_are_refused_before_any_run() {
    let server = TestServer::with_config(pool()).await;
    let deep = "d/".repeat(1500) + "f";
    let long = "n".repeat(300);
    for files in [
        json!({"a": "x", "a/b": "y"}),
        json!({ long.clone(): "x" }),
        json!({ deep.clone(): "x" }),
        json!({"x/y": "1", "./x//y": "2"}),
    ] {
        let (status, body) = server
            .execute(json!({"code": "print(1)", "files": files}))
            .await;
        assert_eq!(status, 400, "{body}");
        let message = error_message(&body);
        assert!(
            !message.contains("/tmp/"),
            "the server's paths leak: {message}"
        );
        assert!(!message.contains("code-executor-"), "{message}");
    }
    let body = server.run("print('fine')").await;
    assert_eq!(body["stdout"], "fine\n");
    server.stop().await;
}

#[tokio::test]
async fn error_messages_say_each_thing_once() {
    let mut config = code_executor::Config {
        pool_size: 1,
        queue_timeout: Duration::from_millis(300),
        ..common::config()
    };
    config.max_workers = 1;
    let server = std::sync::Arc::new(TestServer::with_config(config).await);
    let busy = {
        let server = server.clone();
        tokio::spawn(async move { server.run("import time; time.sleep(2)").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = server.execute(json!({"code": "print(1)"})).await;
    assert_eq!(status, 503, "{body}");
    let message = error_message(&body);
    let first = message.split(": ").next().unwrap();
    assert_eq!(message.matches(first).count(), 1, "{message}");
    busy.await.unwrap();
    std::sync::Arc::try_unwrap(server)
        .ok()
        .unwrap()
        .stop()
        .await;
}

#[tokio::test]
async fn a_killed_servers_temporary_directory_goes_with_the_next_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut first, _, _) = spawn_server(&["--pool-size", "1"], tmp.path()).await;
    let pid = first.id().unwrap();
    let left: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("code-executor-{pid}-")))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    first.wait().await.unwrap();
    assert!(tmp.path().join(&left[0]).exists());
    let (_second, _, _) = spawn_server(&["--pool-size", "1"], tmp.path()).await;
    assert!(!tmp.path().join(&left[0]).exists(), "{} stayed", left[0]);
}

#[tokio::test]
async fn absurd_numbers_over_mcp_are_refused_or_capped_and_the_session_lives_on() {
    use crate::common::mcp::{call, connect_in_process, text};
    let config = pool();
    let executor = std::sync::Arc::new(code_executor::Executor::start(&config).await.unwrap());
    let client = connect_in_process(executor.clone(), &config).await;
    // Capped: a TTL and a timeout past anything a duration holds.
    let created = call(&client, "create_session", json!({"ttl": 1e20}))
        .await
        .unwrap();
    assert_ne!(created.is_error, Some(true), "{created:?}");
    let session = created.structured_content.as_ref().unwrap();
    assert_eq!(session["ttl"], 86400.0, "{session:?}");
    let ran = call(
        &client,
        "execute_code",
        json!({"code": "print(1)", "timeout": 1e300}),
    )
    .await
    .unwrap();
    assert_eq!(text(&ran).lines().next(), Some("1"), "{ran:?}");
    // Refused: negative, zero and non-numbers, each a clear error result or
    // an invalid-params error, never a lost connection.
    for (tool, args) in [
        ("create_session", json!({"ttl": -1.0})),
        ("create_session", json!({"timeout": 0.0})),
        ("execute_code", json!({"code": "print(1)", "timeout": -5.0})),
        (
            "execute_code",
            json!({"code": "print(1)", "timeout": "NaN"}),
        ),
        (
            "execute_code",
            json!({"code": "print(1)", "limits": {"memory_bytes": -1}}),
        ),
    ] {
        match call(&client, tool, args.clone()).await {
            Ok(out) => assert_eq!(out.is_error, Some(true), "{tool} {args}: {out:?}"),
            Err(err) => assert!(err.to_string().contains("nvalid"), "{tool} {args}: {err}"),
        }
    }
    // The same connection still serves.
    let ran = call(&client, "execute_code", json!({"code": "print('alive')"}))
        .await
        .unwrap();
    assert_eq!(text(&ran).lines().next(), Some("alive"), "{ran:?}");
}
