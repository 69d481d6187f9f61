//! Several real server replicas behind HAProxy with the shipped
//! configuration (deploy/haproxy/haproxy.cfg, its addresses and ports
//! replaced by loopback ones), all on 127.0.0.1. HAProxy is Debian's package,
//! installed with apt-get when missing; the Python client of clients/python
//! is installed into a venv by tests/python_client/setup.sh.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::sync::OnceCell;

/// The shipped HAProxy configuration.
pub const HAPROXY_CFG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/haproxy/haproxy.cfg");

/// The `haproxy` binary, installed from Debian's package under a file lock
/// when missing (nextest runs each test in its own process). A failed
/// install fails the test.
pub async fn haproxy() -> PathBuf {
    static HAPROXY: OnceCell<PathBuf> = OnceCell::const_new();
    HAPROXY
        .get_or_init(|| async {
            let script = "exec 9>/tmp/code-executor-haproxy-install.lock; flock 9; \
                command -v haproxy >/dev/null 2>&1 || { apt-get update -q >&2 && \
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >&2; }; \
                command -v haproxy";
            let out = tokio::process::Command::new("bash")
                .args(["-c", script])
                .env(
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                )
                .output()
                .await
                .expect("bash runs");
            assert!(
                out.status.success(),
                "haproxy is needed for this test and could not be installed with apt-get ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        })
        .await
        .clone()
}

/// The interpreter of the venv holding the Python client.
pub async fn client_python() -> PathBuf {
    static CLIENT: OnceCell<PathBuf> = OnceCell::const_new();
    CLIENT
        .get_or_init(|| async {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python_client/setup.sh");
            let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("client-venv");
            let out = tokio::process::Command::new("bash")
                .arg(script)
                .arg(&venv)
                .env("CLIENT_TEST_PYTHON", super::python())
                .output()
                .await
                .expect("bash runs tests/python_client/setup.sh");
            assert!(
                out.status.success(),
                "installing clients/python failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .last()
                    .expect("setup.sh prints the venv python")
                    .trim(),
            )
        })
        .await
        .clone()
}

/// Run `tests/python_client/driver.py` with `args` in the client's venv;
/// its JSON report (the last line of its stdout). It must finish within
/// `within`.
pub async fn run_driver(args: &[&str], within: Duration) -> Value {
    let python = client_python().await;
    let driver = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python_client/driver.py");
    let run = tokio::process::Command::new(&python)
        .arg(driver)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(within, run)
        .await
        .unwrap_or_else(|_| panic!("driver.py {args:?} did not finish within {within:?}"))
        .expect("the driver starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "driver.py {args:?} failed ({}):\n{stderr}",
        out.status
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("driver.py printed no JSON report ({e}):\n{stdout}\n{stderr}"))
}

/// One server process.
pub struct Replica {
    pub id: String,
    /// `127.0.0.1:port`.
    pub address: String,
    pub child: tokio::process::Child,
    /// Its log lines, kept for failure messages.
    pub log: Arc<Mutex<Vec<String>>>,
    _tmp: tempfile::TempDir,
}

impl Replica {
    /// Start the real binary as replica `id`, with `args`.
    pub async fn start(id: &str, args: &[&str]) -> Replica {
        let tmp = tempfile::tempdir().unwrap();
        let mut all = vec!["--replica-id", id];
        all.extend_from_slice(args);
        let (child, address, mut lines) = crate::ops::spawn_server(&all, tmp.path()).await;
        let log = Arc::new(Mutex::new(Vec::new()));
        let keep = log.clone();
        tokio::spawn(async move {
            while let Some(line) = lines.recv().await {
                keep.lock().unwrap().push(line);
            }
        });
        Replica {
            id: id.to_string(),
            address,
            child,
            log,
            _tmp: tmp,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("the replica runs") as i32
    }

    /// Its metrics: `name{labels}` -> value.
    pub async fn metrics(&self) -> BTreeMap<String, f64> {
        let text = reqwest::get(format!("{}/metrics", self.url()))
            .await
            .expect("metrics answered")
            .text()
            .await
            .unwrap();
        crate::ops::parse_metrics(&text)
    }

    /// `POST /execute` answered 200 by this replica so far.
    pub async fn executes_served(&self) -> f64 {
        self.metrics()
            .await
            .get(
                r#"code_executor_http_requests_total{method="POST",route="/execute",status="200"}"#,
            )
            .copied()
            .unwrap_or(0.0)
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

/// HAProxy in front of replicas, with the shipped configuration.
pub struct Balancer {
    pub url: String,
    child: tokio::process::Child,
    output: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl Balancer {
    /// Start HAProxy with deploy/haproxy/haproxy.cfg, its `bind` and its
    /// three `server` lines pointed at 127.0.0.1 and `replicas` (each
    /// server keeps its name and cookie: r1, r2, r3); wait until every
    /// replica answers through it.
    pub async fn start(replicas: &[&Replica]) -> Balancer {
        let haproxy = haproxy().await;
        let port = super::docker::free_port();
        let shipped = std::fs::read_to_string(HAPROXY_CFG).unwrap();
        let mut servers = 0;
        let config: String = shipped
            .lines()
            .map(|line| {
                let trimmed = line.trim_start();
                if trimmed == "bind :8080" {
                    return line.replace(":8080", &format!("127.0.0.1:{port}"));
                }
                if let Some(rest) = trimmed.strip_prefix("server ") {
                    let mut words: Vec<&str> = rest.split_whitespace().collect();
                    let replica = replicas.get(servers).unwrap_or_else(|| {
                        panic!(
                            "the shipped config has more than {} servers",
                            replicas.len()
                        )
                    });
                    assert_eq!(words[0], replica.id, "server names are the replica ids");
                    words[1] = &replica.address;
                    servers += 1;
                    return format!("    server {}", words.join(" "));
                }
                line.to_string()
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(servers, replicas.len(), "one server line per replica");
        assert!(
            config.contains(&format!("bind 127.0.0.1:{port}")),
            "{config}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, format!("{config}\n")).unwrap();
        let mut child = tokio::process::Command::new(&haproxy)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("haproxy starts");
        let output = Arc::new(Mutex::new(String::new()));
        for mut pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let output = output.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    output
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let mut balancer = Balancer {
            url: format!("http://127.0.0.1:{port}"),
            child,
            output,
            _dir: dir,
        };
        balancer.wait_for(replicas.len()).await;
        balancer
    }

    /// Wait until requests through the balancer reach `n` distinct replicas.
    async fn wait_for(&mut self, n: usize) {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = std::collections::BTreeSet::new();
        while seen.len() < n {
            if let Ok(resp) = client.get(format!("{}/livez", self.url)).send().await
                && let Some(id) = resp.headers().get("x-replica")
            {
                seen.insert(id.to_str().unwrap().to_string());
            }
            if let Ok(Some(exit)) = self.child.try_wait() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                panic!("haproxy exited ({exit}):\n{}", self.output());
            }
            assert!(
                Instant::now() < deadline,
                "only {seen:?} answered through HAProxy within 20 s:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What HAProxy printed (alerts, servers going down and up).
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Three replicas (r1, r2, r3) started with `args`, and HAProxy in front.
pub async fn three_replicas(args: &[&str]) -> (Vec<Replica>, Balancer) {
    let replicas =
        futures_util::future::join_all(["r1", "r2", "r3"].map(|id| Replica::start(id, args))).await;
    let balancer = Balancer::start(&replicas.iter().collect::<Vec<_>>()).await;
    (replicas, balancer)
}

/// The value of cookie `name` a response sets, if it does.
pub fn set_cookie(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .filter_map(|pair| pair.split_once('='))
        .find(|(n, _)| n.trim() == name)
        .map(|(_, v)| v.trim().to_string())
}

/// The affinity cookie of the shipped configurations.
pub const AFFINITY_COOKIE: &str = "CE_REPLICA";
