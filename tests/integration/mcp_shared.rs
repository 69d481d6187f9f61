//! `code-executor mcp --shared`: launches relay to one warm server per
//! configuration, over a Unix socket in a directory of the user's own.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::mcp::{McpClient, connect_stdio, execute_code, text};
use crate::common::{alive, processes_mentioning, python};
use crate::mcp::{marked_sleeper, unique_marker, wait_for_process, wait_until_gone};

fn binary() -> &'static Path {
    env!("CARGO_BIN_EXE_code-executor").as_ref()
}

/// A runtime directory of the test's own, and the shared servers started
/// under it, stopped when it drops.
struct Runtime {
    dir: tempfile::TempDir,
}

impl Runtime {
    fn new() -> Runtime {
        Runtime {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn sockets_dir(&self) -> PathBuf {
        self.dir.path().join("code-executor")
    }

    /// The sockets there, sorted.
    fn sockets(&self) -> Vec<PathBuf> {
        sockets_in(self.dir.path())
    }

    /// A shared launch with `args` after the interpreter and a small pool.
    async fn launch(&self, args: &[&str]) -> (McpClient, tokio::process::Child) {
        let all = launch_args(args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        connect_stdio(binary(), &all, &[("XDG_RUNTIME_DIR", self.dir.path())]).await
    }
}

/// The arguments after `mcp` of a shared launch with `args`: the test's
/// interpreter and a pool of one.
fn launch_args(args: &[&str]) -> Vec<String> {
    let python = python().to_str().unwrap().to_string();
    ["--shared", "--python", &python, "--pool-size", "1"]
        .into_iter()
        .chain(args.iter().copied())
        .map(String::from)
        .collect()
}

impl Drop for Runtime {
    fn drop(&mut self) {
        for pid in processes_mentioning(self.dir.path()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The shared servers' sockets under the runtime directory `runtime`,
/// sorted.
pub(crate) fn sockets_in(runtime: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(runtime.join("code-executor")) else {
        return vec![];
    };
    let mut sockets: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sock"))
        .collect();
    sockets.sort();
    sockets
}

/// The pid of the process listening on `socket`.
pub(crate) fn server_pid(socket: &Path) -> u32 {
    let stream = UnixStream::connect(socket).expect("a server listens on the socket");
    let cred =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).unwrap();
    cred.pid() as u32
}

/// SIGKILL the server on `socket` and wait until it is dead and its socket
/// refuses connections (its last thread has exited: its main thread shows
/// as a zombie before that); its pid.
async fn kill_server(socket: &Path) -> u32 {
    let pid = server_pid(socket);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("the server dies", Duration::from_secs(5), || {
        !alive(pid) && UnixStream::connect(socket).is_err()
    })
    .await;
    pid
}

async fn wait_for(what: &str, within: Duration, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn close(client: McpClient, mut child: tokio::process::Child) {
    let _ = client.cancel().await;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the launch exits once its client closes stdin")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn launches_of_one_configuration_share_a_warm_server_that_idles_out() {
    let runtime = Runtime::new();
    let (client, child) = runtime.launch(&["--shared-idle", "2"]).await;
    let result = execute_code(&client, json!({"code": "print(2+2)"}))
        .await
        .unwrap();
    assert_eq!(text(&result), "4\n[exit code 0]");
    let sockets = runtime.sockets();
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    let socket = &sockets[0];
    let mode = std::fs::metadata(runtime.sockets_dir())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o700,
        "the sockets' directory is the user's alone"
    );
    let server = server_pid(socket);
    close(client, child).await;

    // The launch is gone, its server is not: the next launch uses it.
    assert!(alive(server), "the shared server outlives its first client");
    let (client, child) = runtime.launch(&["--shared-idle", "2"]).await;
    let result = execute_code(
        &client,
        json!({"code": "import sys\nprint(sys.stdin.read().upper())", "stdin": "warm"}),
    )
    .await
    .unwrap();
    assert_eq!(text(&result), "WARM\n[exit code 0]");
    assert_eq!(server_pid(socket), server, "the same server answered");
    assert_eq!(runtime.sockets().len(), 1);
    // Answers far larger than the relay's buffer arrive whole, and a client
    // connected for longer than the idle time keeps its server.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let result = execute_code(&client, json!({"code": "print('x' * 300_000)"}))
        .await
        .unwrap();
    assert_eq!(
        result.structured_content.as_ref().unwrap()["stdout"]
            .as_str()
            .map(str::len),
        Some(300_001)
    );
    assert_eq!(server_pid(socket), server);

    // Another configuration has a server of its own.
    let (other, other_child) = runtime
        .launch(&["--shared-idle", "2", "--timeout", "7"])
        .await;
    let result = execute_code(&other, json!({"code": "print('other')"}))
        .await
        .unwrap();
    assert_eq!(text(&result), "other\n[exit code 0]");
    let sockets = runtime.sockets();
    assert_eq!(sockets.len(), 2, "{sockets:?}");
    let other_socket = sockets.iter().find(|s| *s != socket).unwrap();
    let other_server = server_pid(other_socket);
    assert_ne!(other_server, server);

    // Both idle out once their clients leave: sockets removed, processes gone.
    close(client, child).await;
    close(other, other_child).await;
    wait_for("both servers exit", Duration::from_secs(20), || {
        !alive(server) && !alive(other_server)
    })
    .await;
    assert_eq!(runtime.sockets(), Vec::<PathBuf>::new());
    wait_until_gone(runtime.dir.path(), Duration::from_secs(5)).await;
}

#[tokio::test]
async fn concurrent_first_launches_start_one_server() {
    let runtime = Runtime::new();
    let launches = (0..3).map(|i| {
        let runtime = &runtime;
        async move {
            let (client, child) = runtime.launch(&["--shared-idle", "2"]).await;
            let result = execute_code(&client, json!({"code": format!("print({i} * 10)")}))
                .await
                .unwrap();
            assert_eq!(text(&result), format!("{}\n[exit code 0]", i * 10));
            (client, child)
        }
    });
    let launched = futures_util::future::join_all(launches).await;
    let sockets = runtime.sockets();
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    let servers: Vec<_> = processes_mentioning(&sockets[0]);
    assert_eq!(servers.len(), 1, "one server serves them all: {servers:?}");
    for (client, child) in launched {
        close(client, child).await;
    }
}

#[tokio::test]
async fn a_client_that_goes_away_has_its_runs_killed_and_the_server_stays() {
    let runtime = Runtime::new();
    let (client, mut child) = runtime.launch(&["--shared-idle", "30"]).await;
    let marker = unique_marker("shared-gone");
    let peer = client.peer().clone();
    let in_flight = tokio::spawn({
        let code = marked_sleeper(&marker);
        async move {
            let Value::Object(args) = json!({"code": code, "timeout": 60}) else {
                unreachable!()
            };
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("execute_code").with_arguments(args),
            )
            .await
        }
    });
    wait_for_process(&marker, Duration::from_secs(10)).await;
    let server = server_pid(&runtime.sockets()[0]);

    // The client is killed, not closed: its relay dies with it.
    child.kill().await.unwrap();
    wait_until_gone(marker.as_ref(), Duration::from_secs(10)).await;
    assert!(
        in_flight.await.unwrap().is_err(),
        "no answer reached a dead client"
    );
    assert!(alive(server));

    // The server serves the next launch; its one worker is free again.
    let (client, child) = runtime.launch(&["--shared-idle", "30"]).await;
    let result = execute_code(&client, json!({"code": "print('next')"}))
        .await
        .unwrap();
    assert_eq!(text(&result), "next\n[exit code 0]");
    assert_eq!(server_pid(&runtime.sockets()[0]), server);
    close(client, child).await;
}

/// Run `mcp <args>` (with the runtime directory and `vars`) to its end with
/// stdin closed; check that it printed nothing and exited with `code`; its
/// stderr.
fn failed_launch(runtime: &Runtime, args: &[&str], vars: &[(&str, &str)], code: i32) -> String {
    let out = std::process::Command::new(binary())
        .arg("mcp")
        .args(args)
        .envs(vars.iter().copied())
        .env("XDG_RUNTIME_DIR", runtime.dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    stderr
}

impl Runtime {
    /// Start a server with a launch of `--shared-idle 30` that ran once,
    /// then kill it: its socket, left behind, and its pid.
    async fn killed_server(&self) -> (PathBuf, u32) {
        let (client, child) = self.launch(&["--shared-idle", "30"]).await;
        execute_code(&client, json!({"code": "pass"}))
            .await
            .unwrap();
        let socket = self.sockets()[0].clone();
        close(client, child).await;
        let server = kill_server(&socket).await;
        (socket, server)
    }

    /// The command of [`Runtime::launch`]`(args)`, to spawn by hand.
    fn command_like(&self, args: &[&str]) -> std::process::Command {
        let mut command = std::process::Command::new(binary());
        command
            .arg("mcp")
            .args(launch_args(args))
            .env("CODE_EXECUTOR_LOG", "warn")
            .env("XDG_RUNTIME_DIR", self.dir.path());
        command
    }

    /// [`failed_launch`] with the command line and variables of
    /// [`Runtime::launch`]`(args)`: its configuration, so its socket.
    fn failed_launch_like(&self, args: &[&str], code: i32) -> String {
        let all = launch_args(args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        failed_launch(self, &all, &[("CODE_EXECUTOR_LOG", "warn")], code)
    }
}

#[tokio::test]
async fn a_server_that_cannot_start_fails_the_launch_with_its_own_error() {
    let runtime = Runtime::new();
    let args = ["--shared", "--python", "/nonexistent/bin/python3"];
    let stderr = failed_launch(&runtime, &args, &[], 1);
    assert!(
        stderr.contains("the shared server did not start"),
        "{stderr}"
    );
    assert!(stderr.contains("/nonexistent/bin/python3"), "{stderr}");
    assert_eq!(runtime.sockets(), Vec::<PathBuf>::new());

    // Bad flags are the command line's errors, before any server starts:
    // an idle time too short to connect in among them.
    for (idle, says) in [
        ("soon", "\"soon\" is not a number of seconds"),
        ("0.5", "--shared-idle must be at least 1 second"),
    ] {
        let stderr = failed_launch(&runtime, &["--shared", "--shared-idle", idle], &[], 2);
        assert!(stderr.contains(says), "{stderr}");
    }
    assert_eq!(runtime.sockets(), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn a_sockets_directory_others_can_use_is_refused() {
    let runtime = Runtime::new();
    std::fs::create_dir(runtime.sockets_dir()).unwrap();
    std::fs::set_permissions(
        runtime.sockets_dir(),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let python = python();
    let args = ["--shared", "--python", python.to_str().unwrap()];
    let stderr = failed_launch(&runtime, &args, &[], 1);
    assert!(
        stderr.contains("cannot keep the shared server's socket in")
            && stderr.contains("its mode is 777"),
        "{stderr}"
    );
    assert_eq!(runtime.sockets(), Vec::<PathBuf>::new());

    // A link in its place is refused too; the variable turns sharing on
    // as the flag does.
    std::fs::remove_dir(runtime.sockets_dir()).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::set_permissions(elsewhere.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), runtime.sockets_dir()).unwrap();
    let shared = [("CODE_EXECUTOR_MCP_SHARED", "1")];
    let stderr = failed_launch(
        &runtime,
        &["--python", python.to_str().unwrap()],
        &shared,
        1,
    );
    assert!(stderr.contains("it is not a directory"), "{stderr}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn a_killed_or_dying_server_is_replaced_and_a_socket_that_speaks_otherwise_refused() {
    let runtime = Runtime::new();
    let (socket, server) = runtime.killed_server().await;
    assert!(socket.exists(), "a killed server leaves its socket behind");

    // A dying server in its place: it takes two connections and closes them
    // unserved, then stops listening (its socket stays, refusing). The
    // launch retries, then removes the stale socket and starts a server.
    std::fs::remove_file(&socket).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let dying = std::thread::spawn(move || {
        for _ in 0..2 {
            drop(listener.accept().unwrap());
        }
    });
    let (client, child) = runtime.launch(&["--shared-idle", "30"]).await;
    let result = execute_code(&client, json!({"code": "print('served')"}))
        .await
        .unwrap();
    assert_eq!(text(&result), "served\n[exit code 0]");
    dying.join().unwrap();
    close(client, child).await;
    let replacement = kill_server(&socket).await;
    assert!(replacement != server && replacement != std::process::id());

    // A socket that never serves: the launch gives up after its attempts.
    std::fs::remove_file(&socket).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let closer = std::thread::spawn(move || {
        let mut taken = 0;
        listener.set_nonblocking(true).unwrap();
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            match listener.accept() {
                Ok(_) => taken += 1,
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
        taken
    });
    let stderr = runtime.failed_launch_like(&["--shared-idle", "30"], 1);
    assert!(stderr.contains("closed 5 connections unserved"), "{stderr}");
    assert_eq!(closer.join().unwrap(), 5);

    // Something else on the socket: the launch refuses it and says what it
    // heard.
    std::fs::remove_file(&socket).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let stranger = std::thread::spawn(move || {
        use std::io::Write;
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let stderr = runtime.failed_launch_like(&["--shared-idle", "30"], 1);
    assert!(
        stderr.contains("is not a code-executor shared server: it said \"HTTP/1.1 400"),
        "{stderr}"
    );
    stranger.join().unwrap();
}

#[tokio::test]
async fn sigterm_stops_a_shared_server_and_its_launches_say_so() {
    let runtime = Runtime::new();
    // One launch mid-session, one that never sent `initialize`.
    let (client, mut child) = runtime.launch(&["--shared-idle", "60"]).await;
    execute_code(&client, json!({"code": "pass"}))
        .await
        .unwrap();
    let socket = runtime.sockets()[0].clone();
    let silent = runtime
        .command_like(&["--shared-idle", "60"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let server = server_pid(&socket);
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for("the server stops", Duration::from_secs(8), || {
        !alive(server)
    })
    .await;
    assert!(!socket.exists(), "a stopped server removes its socket");

    // Both launches end with an error that says what happened.
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("the launch ends with its server")
        .unwrap();
    assert_eq!(status.code(), Some(1));
    drop(client);
    let out = silent.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the shared server closed the connection"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_launch_killed_while_its_server_starts_leaves_the_next_launch_served() {
    for delay_ms in [0, 2, 5, 10, 15, 20, 30, 45, 60] {
        let runtime = Runtime::new();
        let mut first = runtime
            .command_like(&["--shared-idle", "30"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        first.kill().unwrap();
        first.wait().unwrap();
        let (client, child) = runtime.launch(&["--shared-idle", "30"]).await;
        let result = execute_code(&client, json!({"code": "print('next')"}))
            .await
            .unwrap();
        assert_eq!(text(&result), "next\n[exit code 0]", "after {delay_ms} ms");
        close(client, child).await;
        let sockets = runtime.sockets();
        assert_eq!(sockets.len(), 1, "{sockets:?}");
        wait_for("one server is left", Duration::from_secs(5), || {
            processes_mentioning(&sockets[0]).len() == 1
        })
        .await;
    }
}

#[tokio::test]
async fn a_socket_served_by_another_user_is_refused() {
    // A listener that binds as this user, then listens as nobody: the
    // socket's peer credentials are the listener's at `listen`.
    let runtime = Runtime::new();
    let (socket, _) = runtime.killed_server().await;
    std::fs::remove_file(&socket).unwrap();
    let script = "import os, socket, sys, time\n\
                  s = socket.socket(socket.AF_UNIX)\n\
                  s.bind(sys.argv[1])\n\
                  os.setgid(65534); os.setuid(65534)\n\
                  s.listen(4)\n\
                  print('listening', flush=True)\n\
                  c, _ = s.accept()\n\
                  c.sendall(b'code-executor shared 1\\n')\n\
                  time.sleep(2)\n";
    let mut stranger = std::process::Command::new("/usr/bin/python3.11")
        .args(["-c", script])
        .arg(&socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(stranger.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "listening\n");
    let stderr = runtime.failed_launch_like(&["--shared-idle", "30"], 1);
    assert!(
        stderr.contains("is served by uid 65534, not this user"),
        "{stderr}"
    );
    let _ = stranger.kill();
    let _ = stranger.wait();
}

#[tokio::test]
async fn an_edited_config_file_gets_a_server_of_its_own() {
    let runtime = Runtime::new();
    let file = runtime.dir.path().join("config.toml");
    std::fs::write(&file, "timeout = 1\n").unwrap();
    let config = file.to_str().unwrap();
    let (client, child) = runtime
        .launch(&["--shared-idle", "30", "--config", config])
        .await;
    execute_code(&client, json!({"code": "pass"}))
        .await
        .unwrap();
    close(client, child).await;
    let first = runtime.sockets();
    assert_eq!(first.len(), 1);

    std::fs::write(&file, "timeout = 2\n").unwrap();
    let (client, child) = runtime
        .launch(&["--shared-idle", "30", "--config", config])
        .await;
    let result = execute_code(&client, json!({"code": "import time; time.sleep(1.5)"}))
        .await
        .unwrap();
    assert_eq!(
        result.structured_content.as_ref().unwrap()["exit_code"],
        0,
        "the new file's timeout (2 s) holds: {result:?}"
    );
    close(client, child).await;
    let sockets = runtime.sockets();
    assert_eq!(sockets.len(), 2, "{sockets:?}");
    assert!(sockets.contains(&first[0]));
}
