//! `allowed_hosts`: runs reach the listed hosts through the server's egress
//! proxy and nothing else. Every target is a server this test starts on
//! 127.0.0.1.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{self, TestServer};

/// An HTTP server on 127.0.0.1: `/big` answers `big` bytes, `/files/NAME`
/// a file of `files`, `/simple/NAME/` an index page linking those files,
/// anything else `hello from the test server`. It counts the bytes it
/// received and sent.
struct Origin {
    port: u16,
    received: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
}

impl Origin {
    async fn start(files: HashMap<String, Vec<u8>>, big: usize) -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(AtomicU64::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let files = Arc::new(files);
        let (r, s) = (received.clone(), sent.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let (r, s, files) = (r.clone(), s.clone(), files.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    r.fetch_add(head.len() as u64, Ordering::SeqCst);
                    let text = String::from_utf8_lossy(&head);
                    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let body: Vec<u8> = if path == "/big" {
                        vec![b'x'; big]
                    } else if let Some(name) = path.strip_prefix("/files/") {
                        files.get(name).cloned().unwrap_or_default()
                    } else if let Some(project) = path.strip_prefix("/simple/") {
                        let project = project.trim_end_matches('/');
                        let links: String = files
                            .keys()
                            .filter(|f| f.replace('_', "-").starts_with(project))
                            .map(|f| format!("<a href=\"/files/{f}\">{f}</a>\n"))
                            .collect();
                        format!("<html><body>\n{links}</body></html>\n").into_bytes()
                    } else {
                        b"hello from the test server".to_vec()
                    };
                    let mime = if path.starts_with("/simple/") {
                        "text/html"
                    } else {
                        "application/octet-stream"
                    };
                    let mut response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {mime}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    response.extend_from_slice(&body);
                    if conn.write_all(&response).await.is_ok() {
                        s.fetch_add(response.len() as u64, Ordering::SeqCst);
                    }
                    let _ = conn.shutdown().await;
                });
            }
        });
        Origin {
            port,
            received,
            sent,
        }
    }
}

fn config(allowed: &[String]) -> code_executor::Config {
    code_executor::Config {
        pool_size: 1,
        allowed_hosts: allowed.to_vec(),
        ..common::config()
    }
}

/// Python that fetches `url` and prints what it got, or the error.
fn fetch(url: &str) -> String {
    format!(
        "import urllib.request\ntry:\n    print(urllib.request.urlopen({url:?}, timeout=10).read().decode())\nexcept Exception as e:\n    print('failed:', e)\n"
    )
}

async fn run(server: &TestServer, body: Value) -> Value {
    let (status, body) = server.execute(body).await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn listed_hosts_are_reached_and_others_refused_with_the_rule() {
    let a = Origin::start(HashMap::new(), 0).await;
    let b = Origin::start(HashMap::new(), 0).await;
    let server = TestServer::with_config(config(&[
        format!("127.0.0.1:{}", a.port),
        format!("localhost:{}", a.port),
    ]))
    .await;
    let got = run(
        &server,
        json!({"code": fetch(&format!("http://127.0.0.1:{}/", a.port))}),
    )
    .await;
    assert_eq!(got["stdout"], "hello from the test server\n", "{got}");
    // What the run's result counts is what the test server saw.
    let network = &got["network"];
    assert_eq!(network["connections"], 1, "{got}");
    assert_eq!(
        network["bytes_sent"],
        a.received.load(Ordering::SeqCst),
        "{got}"
    );
    assert_eq!(
        network["bytes_received"],
        a.sent.load(Ordering::SeqCst),
        "{got}"
    );
    assert_eq!(network["denied"], json!([]));
    // Another port of the same address: the proxy's 403 names the rule.
    let refused = run(
        &server,
        json!({"code": fetch(&format!("http://127.0.0.1:{}/", b.port))}),
    )
    .await;
    let out = refused["stdout"].as_str().unwrap();
    assert!(out.starts_with("failed: HTTP Error 403"), "{refused}");
    assert!(
        out.contains("code-executor egress proxy")
            && out.contains("no allowed_hosts entry lists it"),
        "{out}"
    );
    assert_eq!(refused["network"]["denied"][0]["port"], b.port, "{refused}");
    assert_eq!(
        b.received.load(Ordering::SeqCst),
        0,
        "nothing reached port B"
    );
    // By name, when listed by name.
    let named = run(
        &server,
        json!({"code": fetch(&format!("http://localhost:{}/", a.port))}),
    )
    .await;
    assert_eq!(named["stdout"], "hello from the test server\n", "{named}");
    // The metrics count each decision.
    let metrics = server.metrics_text().await;
    for (decision, n) in [("allowed", 2), ("denied", 1)] {
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with("code_executor_egress_connections_total") && l.contains(decision)
            })
            .unwrap_or_else(|| panic!("no {decision} line in:\n{metrics}"));
        assert!(line.ends_with(&format!(" {n}")), "{line}");
    }
    assert!(
        metrics.contains("code_executor_egress_bytes_total"),
        "{metrics}"
    );
    // /list-envs shows the policy.
    let (_, envs) = server.get("/list-envs").await;
    assert_eq!(envs["envs"][0]["network"]["mode"], "allow_list", "{envs}");
    assert_eq!(
        envs["envs"][0]["network"]["allowed_hosts"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    server.stop().await;
}

#[tokio::test]
async fn nothing_leaves_the_namespace_but_through_the_proxy() {
    let a = Origin::start(HashMap::new(), 0).await;
    let server = TestServer::with_config(config(&[format!("127.0.0.1:{}", a.port)])).await;
    let code = format!(
        "import socket, os\n\
         s = socket.socket(); s.settimeout(3)\n\
         try:\n    s.connect(('127.0.0.1', {port})); print('tcp connected')\nexcept OSError as e:\n    print('tcp', type(e).__name__)\n\
         u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         try:\n    u.sendto(b'x', ('8.8.8.8', 53)); print('udp sent')\nexcept OSError as e:\n    print('udp', e.errno)\n\
         try:\n    socket.getaddrinfo('example.com', 80); print('resolved')\nexcept OSError:\n    print('no dns')\n\
         print(os.environ['HTTPS_PROXY'], repr(os.environ['NO_PROXY']))\n",
        port = a.port
    );
    let got = run(&server, json!({"code": code})).await;
    let out = got["stdout"].as_str().unwrap();
    assert!(out.contains("tcp ConnectionRefusedError"), "{out}");
    assert!(out.contains("udp 101"), "{out}"); // ENETUNREACH
    assert!(out.contains("no dns"), "{out}");
    assert!(out.contains("http://127.0.0.1:3128 ''"), "{out}");
    assert_eq!(a.received.load(Ordering::SeqCst), 0);
    server.stop().await;
}

#[tokio::test]
async fn https_goes_through_connect_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ])
        .arg("-keyout")
        .arg(dir.path().join("key.pem"))
        .arg("-out")
        .arg(dir.path().join("cert.pem"))
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let serve = format!(
        "import http.server, ssl\n\
         class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         \x20       body = b'secret over tls'\n\
         \x20       self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n\
         \x20   def log_message(self, *a): pass\n\
         s = http.server.HTTPServer(('127.0.0.1', {port}), H)\n\
         c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain({cert:?}, {key:?})\n\
         s.socket = c.wrap_socket(s.socket, server_side=True)\n\
         s.serve_forever()\n",
        cert = dir.path().join("cert.pem").display().to_string(),
        key = dir.path().join("key.pem").display().to_string(),
    );
    let mut tls = tokio::process::Command::new(common::python())
        .args(["-c", &serve])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let server = TestServer::with_config(config(&[format!("127.0.0.1:{port}")])).await;
    let code = format!(
        "import ssl, urllib.request\nctx = ssl._create_unverified_context()\nprint(urllib.request.urlopen('https://127.0.0.1:{port}/', context=ctx, timeout=10).read().decode())\n"
    );
    let got = run(&server, json!({"code": code})).await;
    assert_eq!(got["stdout"], "secret over tls\n", "{got}");
    assert_eq!(got["network"]["connections"], 1);
    assert!(
        got["network"]["bytes_received"].as_u64().unwrap() > 500,
        "{got}"
    );
    // Not listed: the tunnel is refused with the rule.
    let narrowed = json!({"code": code, "network": {"allowed_hosts": []}});
    let got = run(&server, narrowed).await;
    assert!(
        got["stderr"]
            .as_str()
            .unwrap()
            .contains("Tunnel connection failed: 403 code-executor egress proxy"),
        "{got}"
    );
    let _ = tls.kill().await;
    server.stop().await;
}

/// A wheel of package `demo_pkg` with module `demo_pkg` (`VALUE = 42`).
fn demo_wheel() -> (String, Vec<u8>) {
    let out = std::process::Command::new(common::python())
        .args(["-c", r#"
import base64, hashlib, io, sys, zipfile
files = {"demo_pkg/__init__.py": b"VALUE = 42\n",
         "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
         "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
record = ""
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += f"{name},sha256={digest},{len(data)}\n"
record += "demo_pkg-1.0.dist-info/RECORD,,\n"
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
    z.writestr("demo_pkg-1.0.dist-info/RECORD", record)
sys.stdout.buffer.write(buf.getvalue())
"#])
        .output()
        .unwrap();
    assert!(out.status.success());
    ("demo_pkg-1.0-py3-none-any.whl".to_string(), out.stdout)
}

#[tokio::test]
async fn pip_installs_from_a_listed_index_and_fails_clearly_from_an_unlisted_one() {
    let (name, wheel) = demo_wheel();
    let index = Origin::start(HashMap::from([(name, wheel)]), 0).await;
    let other = Origin::start(HashMap::new(), 0).await;
    let server = TestServer::with_config(code_executor::Config {
        timeout: 120.0,
        ..config(&[format!("127.0.0.1:{}", index.port)])
    })
    .await;
    let pip = |port: u16| {
        format!(
            "import subprocess, sys\n\
             r = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', '--disable-pip-version-check', \
             '--index-url', 'http://127.0.0.1:{port}/simple/', '--target', 'lib', 'demo-pkg'], capture_output=True, text=True)\n\
             print(r.returncode)\nprint(r.stdout[-2000:])\nprint(r.stderr[-2000:], file=sys.stderr)\n\
             if r.returncode == 0:\n    sys.path.insert(0, 'lib'); import demo_pkg; print('value', demo_pkg.VALUE)\n"
        )
    };
    let got = run(&server, json!({"code": pip(index.port), "timeout": 120})).await;
    let out = got["stdout"].as_str().unwrap();
    assert!(out.starts_with("0\n") && out.contains("value 42"), "{got}");
    assert!(
        got["network"]["connections"].as_u64().unwrap() >= 2,
        "{got}"
    );
    // Unlisted: pip finds nothing, and the result says which connection was
    // refused and by which rule (pip itself only says so with -v for a
    // plain-HTTP index; over https it prints the proxy's 403 line).
    let got = run(&server, json!({"code": pip(other.port), "timeout": 120})).await;
    assert!(!got["stdout"].as_str().unwrap().starts_with("0\n"), "{got}");
    assert!(
        got["stderr"]
            .as_str()
            .unwrap()
            .contains("No matching distribution"),
        "{got}"
    );
    let denied = &got["network"]["denied"][0];
    assert_eq!(denied["port"], other.port, "{got}");
    assert_eq!(denied["reason"], "no allowed_hosts entry lists it", "{got}");
    assert_eq!(other.received.load(Ordering::SeqCst), 0);
    server.stop().await;
}

#[tokio::test]
async fn requests_narrow_never_widen_and_listed_names_may_not_lead_to_loopback() {
    let a = Origin::start(HashMap::new(), 0).await;
    let b = Origin::start(HashMap::new(), 0).await;
    let server = TestServer::with_config(code_executor::Config {
        network_hosts: HashMap::from([(
            "example.test".to_string(),
            vec!["127.0.0.1".parse().unwrap()],
        )]),
        ..config(&[format!("127.0.0.1:{}", a.port), "example.test".to_string()])
    })
    .await;
    let url = format!("http://127.0.0.1:{}/", a.port);
    // Narrowed to nothing: no access.
    let got = run(
        &server,
        json!({"code": fetch(&url), "network": {"allowed_hosts": []}}),
    )
    .await;
    assert!(got["stdout"].as_str().unwrap().contains("403"), "{got}");
    // Narrowed to the one entry: access.
    let only = json!({"code": fetch(&url), "network": {"allowed_hosts": [format!("127.0.0.1:{}", a.port)]}});
    assert_eq!(
        run(&server, only).await["stdout"],
        "hello from the test server\n"
    );
    // Widened: 400 naming the entry.
    let (status, body) = server
        .execute(json!({"code": "1", "network": {"allowed_hosts": ["10.0.0.0/8"]}}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        common::error_message(&body).contains("\"10.0.0.0/8\""),
        "{body}"
    );
    // A listed name (any port) that resolves to a loopback address no
    // entry lists is refused: port B of 127.0.0.1 is listed by no address.
    let got = run(
        &server,
        json!({"code": fetch(&format!("http://example.test:{}/", b.port))}),
    )
    .await;
    let out = got["stdout"].as_str().unwrap();
    assert!(
        out.contains("403") && out.contains("loopback, private or link-local"),
        "{got}"
    );
    assert_eq!(
        b.received.load(Ordering::SeqCst),
        0,
        "nothing reached the server"
    );
    server.stop().await;
}

#[tokio::test]
async fn caps_on_connections_and_bytes_are_enforced_and_reported() {
    let a = Origin::start(HashMap::new(), 100_000).await;
    let server = TestServer::with_config(code_executor::Config {
        egress: code_executor::config::EgressLimits {
            max_connections: 2,
            max_bytes: 10_000,
            idle_timeout: Duration::from_secs(5),
        },
        ..config(&[format!("127.0.0.1:{}", a.port)])
    })
    .await;
    let small = format!("http://127.0.0.1:{}/", a.port);
    let code = format!("{}\n{}\n{}", fetch(&small), fetch(&small), fetch(&small));
    let got = run(&server, json!({"code": code})).await;
    let out = got["stdout"].as_str().unwrap();
    assert_eq!(
        out.matches("hello from the test server").count(),
        2,
        "{out}"
    );
    assert!(out.contains("cap of 2 connections"), "{out}");
    assert_eq!(got["network"]["connections"], 3, "{got}");
    // 100 kB through a 10 kB cap: cut, and the failed run names the limit.
    let big = format!(
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{}/big', timeout=10).read()\n",
        a.port
    );
    let got = run(&server, json!({"code": big})).await;
    assert_ne!(got["exit_code"], 0, "{got}");
    assert_eq!(got["limit"], "network", "{got}");
    assert!(
        got["network"]["bytes_received"].as_u64().unwrap() <= 10_000,
        "{got}"
    );
    server.stop().await;
}

#[tokio::test]
async fn sessions_and_grading_keep_the_policy() {
    let a = Origin::start(HashMap::new(), 0).await;
    let b = Origin::start(HashMap::new(), 0).await;
    let server = TestServer::with_config(config(&[
        format!("127.0.0.1:{}", a.port),
        format!("127.0.0.1:{}", b.port),
    ]))
    .await;
    let (status, session) = server
        .post(
            "/sessions",
            json!({"network": {"allowed_hosts": [format!("127.0.0.1:{}", a.port)]}}),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap();
    for (port, ok) in [(a.port, true), (b.port, false), (a.port, true)] {
        let got = run(
            &server,
            json!({"code": fetch(&format!("http://127.0.0.1:{port}/")), "session": id}),
        )
        .await;
        assert_eq!(
            got["stdout"].as_str().unwrap().starts_with("hello"),
            ok,
            "{port}: {got}"
        );
        assert_eq!(got["network"]["connections"], 1, "counted per call: {got}");
    }
    let (status, body) = server
        .execute(json!({"code": "1", "session": id, "network": {"allowed_hosts": []}}))
        .await;
    assert_eq!(status, 400, "{body}");
    let code = "import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:' + input() + '/', timeout=10).read().decode())\n";
    let (status, graded) = server
        .post(
            "/grade",
            json!({
                "code": code,
                "network": {"allowed_hosts": [format!("127.0.0.1:{}", a.port)]},
                "tests": [
                    {"stdin": a.port.to_string(), "expected_stdout": "hello from the test server\n"},
                    {"stdin": b.port.to_string(), "expected_stdout": "hello from the test server\n"},
                ],
            }),
        )
        .await;
    assert_eq!(status, 200, "{graded}");
    assert_eq!(graded["cases"][0]["verdict"], "ok", "{graded}");
    assert_eq!(graded["cases"][1]["verdict"], "runtime_error", "{graded}");
    server.stop().await;
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test]
async fn a_hundred_runs_with_connections_leave_nothing_open() {
    let a = Origin::start(HashMap::new(), 0).await;
    let server = TestServer::with_config(config(&[format!("127.0.0.1:{}", a.port)])).await;
    let code = fetch(&format!("http://127.0.0.1:{}/", a.port));
    for _ in 0..5 {
        run(&server, json!({"code": code})).await;
    }
    let before = open_fds();
    for i in 0..100 {
        let got = run(&server, json!({"code": code})).await;
        assert_eq!(
            got["stdout"], "hello from the test server\n",
            "run {i}: {got}"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = open_fds();
    assert!(
        after <= before + 4,
        "descriptors: {before} before, {after} after 100 runs"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_allow_list_is_refused_where_it_cannot_be_enforced() {
    let mut config = config(&["pypi.org:443".to_string()]);
    config.sandbox.tier = code_executor::config::TierChoice::Container;
    let err = TestServer::try_with_config(config)
        .await
        .err()
        .expect("refused");
    let text = format!("{err:#}");
    assert!(
        text.contains("cannot be enforced") && text.contains("container tier"),
        "{text}"
    );
    let host = code_executor::config::parse_file("allowed_hosts = ['pypi.org']\nnetwork = 'host'")
        .unwrap();
    let err = code_executor::Config::merge(&Default::default(), host).unwrap_err();
    assert!(
        err.to_string()
            .contains("allowed_hosts needs network = \"isolated\""),
        "{err}"
    );
    let bad = code_executor::config::parse_file("allowed_hosts = ['pypi.org:0']").unwrap();
    let err = code_executor::Config::merge(&Default::default(), bad).unwrap_err();
    assert!(err.to_string().contains("pypi.org:0"), "{err}");
}

/// An environment found after the start, under the server's allow-list:
/// `/metrics` counts its proxy's connections as it counts the first ones'.
#[tokio::test]
async fn an_environment_found_later_counts_its_egress_in_metrics() {
    use crate::common::conda::{CondaFixture, Interpreter};

    let a = Origin::start(HashMap::new(), 0).await;
    let mut fixture = CondaFixture::new(Interpreter::primary());
    std::fs::write(
        fixture.home.join(".conda/environments.txt"),
        format!("{}\n", fixture.root.display()),
    )
    .unwrap();
    let server = TestServer::with_config(code_executor::Config {
        host_env: fixture.host_env(),
        env: code_executor::config::EnvChoice::Default,
        rescan_interval: Duration::from_millis(200),
        ..config(&[format!("127.0.0.1:{}", a.port)])
    })
    .await;
    fixture.create_env("late", Interpreter::primary());
    let url = format!("http://127.0.0.1:{}/", a.port);
    let got = run(&server, json!({"code": fetch(&url), "env": "late"})).await;
    assert_eq!(got["stdout"], "hello from the test server\n", "{got}");
    let metrics = server.metrics_text().await;
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("code_executor_egress_connections_total")
                && l.contains("env=\"late\"")
                && l.contains("allowed")
        })
        .unwrap_or_else(|| panic!("no line for env late in:\n{metrics}"));
    assert!(line.ends_with(" 1"), "{line}");
    server.stop().await;
}
