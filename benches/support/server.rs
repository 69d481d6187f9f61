//! What the end-to-end benchmarks share: their settings from the
//! environment, the interpreter they measure, and the real server binary.

use std::path::{Path, PathBuf};
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

/// The interpreter the benchmarks measure: `BENCH_PYTHON`, else the real
/// interpreter behind `python3` on PATH. With `BENCH_CONDA_LAYOUT=1`, the
/// `bin/python` of a Conda-layout copy of it instead (see [`conda_layout`]).
pub fn real_python() -> PathBuf {
    let python = match std::env::var("BENCH_PYTHON") {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let out = std::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("python3 on PATH");
            String::from_utf8(out.stdout).unwrap().trim().into()
        }
    };
    if std::env::var_os("BENCH_CONDA_LAYOUT").is_some_and(|v| v == "1") {
        return conda_layout(&python).join("bin").join("python");
    }
    python
}

/// The fork floors of `benches/support/worker_cost.py` for `python`,
/// measured now, in microseconds of CPU per fork + exit + wait: a process
/// holding the worker's imports, and the bare interpreter (`python -I -S`).
/// `None` if they could not be measured.
pub fn fork_floors(python: &Path) -> Option<(f64, f64)> {
    let out = std::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/support/worker_cost.py"
        ))
        .args(["--floors", "--runs", "500", "--python"])
        .arg(python)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    match text
        .split_whitespace()
        .filter_map(|v| v.parse::<f64>().ok())
        .collect::<Vec<f64>>()[..]
    {
        [worker_sized, bare] => Some((worker_sized, bare)),
        _ => None,
    }
}

/// A prefix laid out as `conda create` makes one, built from `python`: a
/// copy of the binary in `bin/`, the standard library's entries linked into
/// `lib/pythonX.Y/` beside an empty `site-packages`, `conda-meta/history`,
/// no `pyvenv.cfg`. Its interpreter starts without whatever the original
/// installation's `site-packages` holds (`.pth` files included), as a fresh
/// Conda environment does.
pub fn conda_layout(python: &Path) -> PathBuf {
    let out = std::process::Command::new(python)
        .args([
            "-I",
            "-c",
            "import os, sys, sysconfig; print(os.path.realpath(sys.executable)); \
             print(sysconfig.get_paths()['stdlib']); print('%d.%d' % sys.version_info[:2])",
        ])
        .output()
        .expect("the interpreter runs");
    assert!(out.status.success(), "{} failed: {out:?}", python.display());
    let text = String::from_utf8(out.stdout).unwrap();
    let [binary, stdlib, version] = text.lines().collect::<Vec<_>>()[..] else {
        panic!("unexpected answer from {}: {text}", python.display());
    };
    let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-conda-env");
    let _ = std::fs::remove_dir_all(&prefix);
    let lib = prefix.join("lib").join(format!("python{version}"));
    std::fs::create_dir_all(lib.join("site-packages")).unwrap();
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::create_dir_all(prefix.join("conda-meta")).unwrap();
    std::fs::write(prefix.join("conda-meta").join("history"), "==> bench <==\n").unwrap();
    let name = format!("python{version}");
    std::fs::copy(binary, prefix.join("bin").join(&name)).unwrap();
    for link in ["python", "python3"] {
        std::os::unix::fs::symlink(&name, prefix.join("bin").join(link)).unwrap();
    }
    for entry in std::fs::read_dir(stdlib).unwrap().flatten() {
        if entry.file_name() != "site-packages" {
            std::os::unix::fs::symlink(entry.path(), lib.join(entry.file_name())).unwrap();
        }
    }
    prefix
}

/// The server binary the benchmarks run: `BENCH_SERVER_BIN`, else the one
/// built with them. Another build's binary measures that build's server with
/// this build's clients (`benches/support/ab.py` sets it per side).
pub fn server_binary() -> PathBuf {
    std::env::var_os("BENCH_SERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_code-executor")))
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
        // `BENCH_SANDBOX_TIER=container` measures the container tier.
        let tier: Vec<String> = std::env::var("BENCH_SANDBOX_TIER")
            .map(|t| vec!["--sandbox-tier".to_string(), t])
            .unwrap_or_default();
        let mut child = tokio::process::Command::new(server_binary())
            .args(["serve", "--port", "0"])
            .args(args)
            .args(&tier)
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

    /// CPU seconds (user + system) the server and every process under it
    /// have used so far, from `/proc`, by role: each live process's own time
    /// plus what its reaped children used, so that a run's process, reaped
    /// by its zygote, counts there.
    pub fn tree_cpu(&self) -> TreeCpu {
        let root = self.child.id().unwrap();
        let exe = std::fs::read_link(format!("/proc/{root}/exe")).ok();
        let mut cpu = TreeCpu::default();
        // (pid, how many Python processes are above it)
        let mut pending = vec![(root, 0usize)];
        while let Some((pid, above)) = pending.pop() {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let fields: Vec<f64> = stat
                .rsplit_once(')')
                .map_or("", |(_, rest)| rest)
                .split_whitespace()
                .skip(11)
                .take(4)
                .map(|f| f.parse::<f64>().unwrap_or(0.0) / 100.0)
                .collect();
            // utime, stime, cutime, cstime: fields 14-17 of stat(5), in clock
            // ticks of USER_HZ, 100 a second on Linux.
            let (own, reaped) = match fields[..] {
                [u, s, cu, cs] => (u + s, cu + cs),
                _ => continue,
            };
            // The server's own binary: the server and its sandbox launchers.
            let ours = exe.is_some() && std::fs::read_link(format!("/proc/{pid}/exe")).ok() == exe;
            let depth = if ours { above } else { above + 1 };
            match (ours, depth) {
                // What a launcher reaped is a worker's whole tree, which
                // ended: it counts as the worker's.
                (true, _) => {
                    cpu.server += own;
                    cpu.workers += reaped;
                }
                (false, 1) => {
                    cpu.workers += own;
                    cpu.runs += reaped; // runs it forked itself (no zygote)
                }
                (false, 2) => {
                    cpu.zygotes += own;
                    cpu.runs += reaped;
                }
                _ => cpu.runs += own + reaped,
            }
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                    pending.extend(
                        children
                            .split_whitespace()
                            .filter_map(|p| p.parse::<u32>().ok())
                            .map(|p| (p, depth)),
                    );
                }
            }
        }
        cpu
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

/// CPU seconds used by the server's process tree, by role (see
/// [`Server::tree_cpu`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct TreeCpu {
    /// The server, and its sandbox launchers.
    pub server: f64,
    /// The long-lived Python workers (and workers that ended).
    pub workers: f64,
    /// Their zygotes, which fork the runs.
    pub zygotes: f64,
    /// The runs' processes (and session children).
    pub runs: f64,
}

impl TreeCpu {
    /// All of it.
    pub fn total(&self) -> f64 {
        self.server + self.workers + self.zygotes + self.runs
    }

    /// Each role's use from `before` to `self`, divided by `runs`.
    pub fn per_run(&self, before: &TreeCpu, runs: usize) -> TreeCpu {
        let n = runs.max(1) as f64;
        TreeCpu {
            server: (self.server - before.server) / n,
            workers: (self.workers - before.workers) / n,
            zygotes: (self.zygotes - before.zygotes) / n,
            runs: (self.runs - before.runs) / n,
        }
    }
}
