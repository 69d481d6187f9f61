//! What the end-to-end benchmarks share: their settings from the
//! environment, the interpreter they measure, and the real server binary.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};

/// The environment variable `name` parsed, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `BENCH_PYTHON`, else the real interpreter behind `python3` on PATH.
pub fn real_python() -> PathBuf {
    if let Ok(p) = std::env::var("BENCH_PYTHON") {
        return p.into();
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on PATH");
    String::from_utf8(out.stdout).unwrap().trim().into()
}

/// A running `code-executor serve`.
pub struct Server {
    pub child: tokio::process::Child,
    pub url: String,
    /// From spawning the process to its ready line.
    pub ready_after: Duration,
}

impl Server {
    pub async fn start(args: &[&str]) -> Server {
        let started = Instant::now();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_code-executor"))
            .args(["serve", "--port", "0"])
            .args(args)
            .env("CODE_EXECUTOR_LOG", "warn,code_executor=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("server binary starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let address = loop {
            let line = lines.next_line().await.unwrap().expect("server ready line");
            if let Some(rest) = line.split("address=").nth(1) {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        let ready_after = started.elapsed();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Server {
            child,
            url: format!("http://{address}"),
            ready_after,
        }
    }

    /// Resident set size of the server process itself (not its workers), KiB.
    pub fn rss_kib(&self) -> u64 {
        let pid = self.child.id().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
}
