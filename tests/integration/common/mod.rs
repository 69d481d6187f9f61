//! Shared test harness: a real server on 127.0.0.1:0 with real Python workers.

#![allow(dead_code)]

pub mod cluster;
pub mod conda;
pub mod docker;
pub mod mcp;
pub mod pyenvs;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use code_executor::config::Config;
use code_executor::config::EnvChoice;
use code_executor::config::SandboxConfig;
use code_executor::{Executor, server};
use serde_json::Value;
use tokio::sync::oneshot;

/// POST `body` as JSON to `http://{address}{path}` (a server a test
/// spawned itself) and return the JSON answer, whatever its status.
pub async fn post_json(address: &str, path: &str, body: &Value) -> Value {
    reqwest::Client::new()
        .post(format!("http://{address}{path}"))
        .json(body)
        .send()
        .await
        .expect("request is answered")
        .json()
        .await
        .expect("JSON answer")
}

/// The message of an error answer (`{"error": {"message": ...}}`).
pub fn error_message(body: &Value) -> &str {
    body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error answer: {body}"))
}

/// One worker of the embedded bootstrap, outside any server and sandbox,
/// with `PATH` and `env` as its environment; its scratch lives in the
/// returned directory.
pub async fn bare_worker(
    env: &[(&str, &str)],
) -> (code_executor::testing::Worker, tempfile::TempDir) {
    let (spec, dir) = bare_spec(env);
    let worker = code_executor::testing::Worker::create(&spec, None)
        .await
        .expect("worker starts");
    (worker, dir)
}

/// How [`bare_worker`] starts a worker; the bootstrap and the scratch roots
/// live in the returned directory.
pub fn bare_spec(env: &[(&str, &str)]) -> (code_executor::testing::WorkerSpec, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("worker.py");
    std::fs::write(&script, code_executor::executor::WORKER_SCRIPT).unwrap();
    let mut vars = vec![("PATH".into(), "/usr/bin:/bin".into())];
    vars.extend(
        env.iter()
            .map(|(k, v)| (k.to_string().into(), v.to_string().into())),
    );
    let spec = code_executor::testing::WorkerSpec {
        python: python(),
        script,
        scratch_parent: dir.path().to_path_buf(),
        env: vars,
        preload: vec![],
        egress: None,
        start_timeout: Duration::from_secs(30),
        grace_period: Duration::from_millis(200),
        sandbox: None,
        owner: None,
        run_processes: 256,
        memory_max: None,
        code_cache: None,
    };
    (spec, dir)
}

/// `code` for a run, after Python that sets `pipes`: the descriptors
/// (3-255) the run holds open for writing on pipes besides stdout and
/// stderr, its report pipe among them.
pub fn with_writable_pipes(code: &str) -> String {
    format!(
        "import fcntl, os, stat
pipes = []
for fd in range(3, 256):
    try:
        if (stat.S_ISFIFO(os.fstat(fd).st_mode)
                and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY):
            pipes.append(fd)
    except OSError:
        pass
{code}"
    )
}

/// The real interpreter behind `python3` on PATH (not a launcher shim).
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let out = std::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("python3 must be on PATH for the tests");
            assert!(out.status.success(), "python3 failed: {out:?}");
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        })
        .clone()
}

/// A test configuration: the real interpreter, a small pool, short waits.
pub fn config() -> Config {
    Config {
        port: 0,
        env: EnvChoice::Python(python()),
        pool_size: 2,
        queue_timeout: Duration::from_secs(10),
        grace_period: Duration::from_millis(500),
        shutdown_timeout: Duration::from_secs(10),
        // Stop at once: no balancer needs time to notice.
        drain_delay: Duration::ZERO,
        sandbox: sandbox_config(),
        ..Config::default()
    }
}

/// A server of one pooled worker whose bootstrap is the embedded one,
/// imported as module `w` and changed by `patch` (Python, run before
/// `w.main()`); `configure` sets the rest of its configuration. The
/// directory holds the bootstrap: keep it for the server's life.
pub async fn server_with_patched_worker(
    patch: &str,
    configure: impl FnOnce(&mut Config),
) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("worker.py"),
        code_executor::executor::WORKER_SCRIPT,
    )
    .unwrap();
    let script = dir.path().join("patched.py");
    std::fs::write(
        &script,
        format!(
            "import os, sys\nsys.path.insert(0, {:?})\nimport worker as w\n{patch}w.main()\n",
            dir.path()
        ),
    )
    .unwrap();
    let mut config = config();
    config.pool_size = 1;
    config.worker_script = Some(script);
    configure(&mut config);
    (TestServer::with_config(config).await, dir)
}

/// The sandbox as the server sets it up, with the real binary as launcher
/// (the test binary has no `sandbox-exec` subcommand).
pub fn sandbox_config() -> SandboxConfig {
    SandboxConfig {
        launcher: Some(launcher()),
        ..SandboxConfig::default()
    }
}

/// The `code-executor` binary (its `sandbox-exec` subcommand is the launcher).
pub fn launcher() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_code-executor"))
}

/// A running server and a client for it.
pub struct TestServer {
    pub url: String,
    pub client: reqwest::Client,
    pub executor: Arc<Executor>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::with_config(config()).await
    }

    pub async fn with_config(config: Config) -> TestServer {
        Self::try_with_config(config).await.expect("server starts")
    }

    pub async fn try_with_config(config: Config) -> anyhow::Result<TestServer> {
        let listener = tokio::net::TcpListener::bind((config.host, config.port)).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let executor = Arc::new(Executor::start(&config).await?);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn({
            let executor = executor.clone();
            async move {
                server::run(listener, executor, &config, async {
                    let _ = stopped.await;
                })
                .await
            }
        });
        Ok(TestServer {
            url,
            client: reqwest::Client::new(),
            executor,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// POST /execute with `body`; the status and the JSON answer.
    pub async fn execute(&self, body: Value) -> (u16, Value) {
        self.post("/execute", body).await
    }

    /// Run `code` and insist on a 200; the result object.
    pub async fn run(&self, code: &str) -> Value {
        let (status, body) = self.execute(serde_json::json!({ "code": code })).await;
        assert_eq!(status, 200, "unexpected answer: {body}");
        body
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let url = format!("{}{path}", self.url);
        answer(self.client.post(url).json(&body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        answer(self.client.delete(format!("{}{path}", self.url))).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        answer(self.client.get(format!("{}{path}", self.url))).await
    }

    /// The text of `GET /metrics`.
    pub async fn metrics_text(&self) -> String {
        let resp = self
            .client
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap();
        resp.text().await.unwrap()
    }

    /// Pool counts of the default environment from /health.
    pub async fn pool(&self) -> Value {
        let (_, health) = self.get("/health").await;
        health["envs"]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .clone()
    }

    /// Wait until the default pool reports `size` live workers.
    pub async fn wait_for_pool_size(&self, size: u64, within: Duration) -> Value {
        let start = std::time::Instant::now();
        loop {
            let pool = self.pool().await;
            if pool["size"].as_u64() == Some(size) && pool["starting"].as_u64() == Some(0) {
                return pool;
            }
            if start.elapsed() > within {
                panic!("pool did not reach {size} workers within {within:?}: {pool}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stop the server and wait for it to finish shutting down.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

/// The status and JSON body of the answer to `request`.
async fn answer(request: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = request.send().await.expect("request is answered");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON answer"))
}

/// Pids of live processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &Path) -> Vec<u32> {
    let needle = needle.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) && alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Whether the server's runs enter a Landlock domain that scopes their
/// signals (`/health` lists `landlock_scope`): where not, a run can signal
/// its zygote.
pub async fn signals_scoped(server: &TestServer) -> bool {
    let (_, health) = server.get("/health").await;
    health["sandbox"]["mechanisms"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m == "landlock_scope"))
}

/// Pids of the worker processes (direct children of this test process).
pub fn worker_pids(server: &TestServer) -> Vec<u32> {
    let me = std::process::id();
    processes_mentioning(server.executor.base_dir())
        .into_iter()
        .filter(|pid| parent_of(*pid) == Some(me))
        .collect()
}

pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The children of `pid` (of its main thread, which is every child of the
/// single-threaded processes the tests look at).
pub fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The zygote of the worker under `worker` (a child of this test process:
/// the sandbox's launcher, or the worker itself): the first process the
/// Python worker forked. With no run in flight it is the worker's only child.
pub fn zygote_of(worker: u32) -> u32 {
    let python = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|comm| comm.starts_with("python"))
            .unwrap_or(false)
    };
    let mut pid = worker;
    while !python(pid) {
        pid = *children_of(pid)
            .first()
            .unwrap_or_else(|| panic!("no Python worker under {worker}"));
    }
    let zygote = *children_of(pid)
        .first()
        .unwrap_or_else(|| panic!("the worker {pid} has no zygote"));
    assert!(python(zygote), "{zygote} under {pid} is no Python process");
    zygote
}

/// Whether process `pid` exists and has not ended (a zombie has).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
    })
}

/// Wait until process `pid` has ended (see `alive`), `what` naming it if
/// it lives on past five seconds.
pub async fn wait_gone(pid: u32, what: &str) {
    let started = std::time::Instant::now();
    while alive(pid) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{what} ({pid}) lives on"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The session's process: the one process working in a `session` directory
/// (once it has served a call).
pub fn session_process(server: &TestServer) -> u32 {
    let found: Vec<u32> = processes_mentioning(server.executor.base_dir())
        .into_iter()
        .filter(|p| {
            std::fs::read_link(format!("/proc/{p}/cwd"))
                .is_ok_and(|cwd| cwd.file_name().is_some_and(|n| n == "session"))
        })
        .collect();
    assert_eq!(found.len(), 1, "one session process, found {found:?}");
    found[0]
}

/// The session's worker: the parent of the zygote that forked the
/// session's process.
pub fn session_worker(server: &TestServer) -> u32 {
    let ours = processes_mentioning(server.executor.base_dir());
    let worker = parent_of(session_process(server)).and_then(parent_of);
    match worker {
        Some(worker) if ours.contains(&worker) => worker,
        other => panic!("the session's worker: {other:?}"),
    }
}

/// Wait until the default environment's pool keeps `n` workers of closed
/// sessions for the next session (see `session_spares` in `/health`); its
/// pool status then.
pub async fn wait_for_session_spares(server: &TestServer, n: u64) -> serde_json::Value {
    let started = std::time::Instant::now();
    loop {
        let pool = server.pool().await;
        if pool["session_spares"] == n {
            return pool;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the pool keeps no {n} workers for sessions: {pool}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Kill the zygote of the worker `worker` and wait until it is gone (reaped
/// by its worker, or a zombie its worker has not reaped yet); its pid.
pub async fn kill_zygote(worker: u32) -> u32 {
    let zygote = zygote_of(worker);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_gone(zygote, "the killed zygote").await;
    zygote
}

/// `uv`, installed from PyPI into a venv under the temporary directory the
/// first time a test needs it (kept for later runs). Fails loudly when it
/// cannot be installed.
pub fn uv() -> PathBuf {
    static UV: OnceLock<PathBuf> = OnceLock::new();
    UV.get_or_init(|| {
        let home = std::env::temp_dir().join("code-executor-test-uv");
        let uv = home.join("bin/uv");
        if uv.is_file() {
            return uv;
        }
        // Built aside and renamed into place: test processes running at
        // once never see half a venv.
        let building =
            std::env::temp_dir().join(format!("code-executor-test-uv.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&building);
        let status = std::process::Command::new(python())
            .args(["-m", "venv"])
            .arg(&building)
            .status()
            .expect("python -m venv runs");
        assert!(status.success(), "python -m venv failed");
        let out = std::process::Command::new(building.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--quiet",
                "uv",
            ])
            .output()
            .expect("pip runs");
        assert!(
            out.status.success(),
            "installing uv from PyPI failed (the uv tests need it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if std::fs::rename(&building, &home).is_err() {
            // Another test process finished first.
            let _ = std::fs::remove_dir_all(&building);
        }
        assert!(
            uv.is_file(),
            "{} is missing after the install",
            uv.display()
        );
        uv
    })
    .clone()
}
