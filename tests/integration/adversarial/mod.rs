//! The adversarial suite: one test per attack. Each asserts what the client
//! sees, then that the server still answers, the pool is back at full size
//! and nothing is left behind: no stray process, file descriptor or directory.
//! No test sends traffic to any address outside this machine.

mod cgroups;
mod code;
mod disk;
mod host;
mod launcher;
mod redteam;
mod requests;
mod seccomp;
mod tiers;
mod unscoped;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, TestServer};

/// Workers in the pools these tests start.
const POOL: u64 = 2;

/// A server under attack and what it looked like before.
pub struct Arena {
    pub server: TestServer,
    size: u64,
    fds: usize,
}

impl Arena {
    pub async fn start() -> Arena {
        Self::with_config(common::config()).await
    }

    /// A server of one worker: every run follows the one before on the
    /// same scratch root.
    pub async fn one_worker() -> Arena {
        Self::with_config(code_executor::Config {
            pool_size: 1,
            ..common::config()
        })
        .await
    }

    /// A server of `config`, but for the workers of closed sessions: each
    /// is kept for the next session for only 2 s, so that
    /// [`Arena::assert_recovered`] sees the pool as it started.
    pub async fn with_config(mut config: code_executor::Config) -> Arena {
        config.sessions.keep_worker = KEEP_WORKER;
        let size = config.pool_size as u64;
        Self::from_server(TestServer::with_config(config).await, size).await
    }

    /// Watch a started server whose pools hold `size` workers.
    pub async fn from_server(server: TestServer, size: u64) -> Arena {
        // One run first, so that the client's connection is open in both counts.
        server.run("pass").await;
        server
            .wait_for_pool_size(size, Duration::from_secs(10))
            .await;
        wait_for_spares(&server, size).await;
        let fds = open_fds();
        Arena { server, size, fds }
    }

    /// Run `body` and insist on a 200.
    pub async fn attack(&self, body: Value) -> Value {
        let (status, answer) = self.server.execute(body).await;
        assert_eq!(status, 200, "unexpected answer: {answer}");
        answer
    }

    /// The server answers, the pool is whole and nothing is left behind
    /// (once the workers kept for sessions are gone).
    pub async fn assert_recovered(self) {
        let body = self.server.run("print('still serving')").await;
        assert_eq!(body["stdout"], "still serving\n", "{body}");
        let started = Instant::now();
        while self.server.pool().await["session_spares"] != 0 {
            assert!(
                started.elapsed() < KEEP_WORKER + Duration::from_secs(10),
                "workers kept for sessions past their time"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.server
            .wait_for_pool_size(self.size, Duration::from_secs(10))
            .await;
        wait_for_spares(&self.server, self.size).await;
        let started = Instant::now();
        loop {
            let fds = open_fds();
            if fds == self.fds {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the server holds {fds} file descriptors, {} before the attack",
                self.fds
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let base = self.server.executor.base_dir().to_path_buf();
        let workers: Vec<_> = std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("worker-"))
            .collect();
        assert_eq!(workers.len() as u64, self.size, "worker scratch roots");
        for w in workers {
            // The next run's directory and its private tmp, nothing else, on
            // the worker's scratch tmpfs (seen through its mount namespace),
            // once the worker has made them: it does so after its last
            // answer, as a request may come meanwhile.
            let started = Instant::now();
            loop {
                let mut names: Vec<String> = std::fs::read_dir(scratch_seen_by_worker(&w.path()))
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                if names.len() == 2 && names[1] == format!("{}.tmp", names[0]) {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "left in {}: {names:?}",
                    w.path().display()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.server.stop().await;
        let started = Instant::now();
        while !sandbox_processes(&base).is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "processes outlived the server: {:?}",
                sandbox_processes(&base)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!base.exists(), "{} was not removed", base.display());
    }
}

/// How long an arena's server keeps a closed session's worker.
const KEEP_WORKER: Duration = Duration::from_secs(2);

/// A worker's scratch root as its own processes see it: in their mount
/// namespace a tmpfs covers the directory the server created.
pub fn scratch_seen_by_worker(scratch: &Path) -> std::path::PathBuf {
    let pid = common::processes_mentioning(scratch)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no process of the worker at {}", scratch.display()));
    Path::new(&format!("/proc/{pid}/root")).join(scratch.strip_prefix("/").unwrap())
}

/// Wait until every worker has its next child forked and nothing else runs
/// in the sandboxes: per worker the launcher (in the namespace tier; in the
/// container tier it execs the worker itself), the worker, its zygote and
/// its next child.
async fn wait_for_spares(server: &TestServer, size: u64) {
    #[allow(non_snake_case)]
    let PER_WORKER: u64 = if server.executor.health().sandbox.tier == "container" {
        3
    } else {
        4
    };
    let base = server.executor.base_dir().to_path_buf();
    let started = Instant::now();
    loop {
        let pids = sandbox_processes(&base);
        if pids.len() as u64 == PER_WORKER * size {
            return;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let described: Vec<String> = pids.iter().map(|p| describe(*p)).collect();
            panic!(
                "expected {} sandbox processes ({PER_WORKER} per worker), found {}: {described:#?}",
                PER_WORKER * size,
                pids.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every live process of this server's sandboxes: those whose command line
/// names the executor's directory, and every process in their pid namespaces.
pub fn sandbox_processes(base: &Path) -> Vec<u32> {
    let own_ns = std::fs::read_link("/proc/self/ns/pid").ok();
    let named: HashSet<u32> = common::processes_mentioning(base).into_iter().collect();
    let mut ns_of: HashMap<u32, std::path::PathBuf> = HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(ns) = std::fs::read_link(entry.path().join("ns/pid")) {
            ns_of.insert(pid, ns);
        }
    }
    let worker_ns: HashSet<_> = named
        .iter()
        .filter_map(|p| ns_of.get(p))
        .filter(|ns| Some(*ns) != own_ns.as_ref())
        .cloned()
        .collect();
    let mut pids: Vec<u32> = ns_of
        .iter()
        .filter(|(pid, ns)| {
            (named.contains(pid) || worker_ns.contains(*ns)) && common::alive(**pid)
        })
        .map(|(pid, _)| *pid)
        .collect();
    pids.sort();
    pids
}

fn describe(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    format!(
        "{pid}: {}",
        String::from_utf8_lossy(&cmdline).replace('\0', " ")
    )
}

/// `pid` and its ancestors, each with its state and command line: where a
/// process that should be gone hangs from.
pub fn lineage(mut pid: u32) -> String {
    let mut chain = Vec::new();
    while pid > 1 && chain.len() < 8 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        chain.push(format!("{} [{}]", describe(pid), field("State:")));
        pid = field("PPid:").parse().unwrap_or(0);
    }
    chain.join(" <- ")
}

/// File descriptors this (server) process holds.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Live processes whose command line is exactly `cmdline` (words joined by spaces).
pub fn processes_running(cmdline: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&raw).replace('\0', " ");
        if text.trim_end() == cmdline && common::alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// A request body running `code` with `timeout` seconds.
pub fn run(code: &str, timeout: f64) -> Value {
    json!({ "code": code, "timeout": timeout })
}

/// The default pool size of this suite's servers.
pub fn pool() -> code_executor::Config {
    code_executor::Config {
        pool_size: POOL as usize,
        ..common::config()
    }
}
