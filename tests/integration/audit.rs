//! The audit log: one JSON line per run, session call, grading, session
//! start/close/expiry, install and refused request, with the fields
//! docs/operations.md documents; its sink failing open or closed; SIGHUP
//! reopening it and size-based rotation.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use code_executor::Config;
use code_executor::audit::{AuditConfig, AuditFail, AuditTarget, Record, RecordKind};
use code_executor::config::EnvChoice;
use serde_json::{Value, json};

use crate::common::conda::{CondaFixture, Interpreter};
use crate::common::{self, TestServer};

/// Every record in the audit log at `path` (none if it does not exist).
pub fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Wait until the log at `path` holds a record `pick` accepts; that record.
pub async fn wait_for_record(path: &Path, what: &str, pick: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        if let Some(r) = records(path).into_iter().find(|r| pick(r)) {
            return r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no {what} record in {}:\n{}",
            path.display(),
            std::fs::read_to_string(path).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An audit config writing to `path`.
pub fn audit_to(path: &Path, fail: AuditFail) -> AuditConfig {
    AuditConfig {
        target: Some(AuditTarget::File(path.to_path_buf())),
        fail,
        queue: 64,
        ..AuditConfig::default()
    }
}

/// SHA-256 of a token or code, hex.
pub fn sha256(text: &str) -> String {
    code_executor::auth::hash_token(text)
}

/// A clients file in `dir` holding `body`; its path.
pub fn clients_file(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("clients.toml");
    std::fs::write(&path, body).unwrap();
    path
}

/// A Conda root on the test interpreter with envs `a` and `b` (served on
/// first use) and a fake `conda` (so installs run and succeed).
pub fn two_envs() -> CondaFixture {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    fixture.create_env("a", Interpreter::primary());
    fixture.create_env("b", Interpreter::primary());
    fixture.install_fake_conda();
    fixture
}

/// The test config over `fixture`'s envs.
pub fn config_over(fixture: &CondaFixture) -> Config {
    Config {
        host_env: fixture.host_env(),
        env: EnvChoice::Default,
        pool_size: 2,
        ..common::config()
    }
}

/// POST `body` to `path` with `token` (and a request id, when given).
pub async fn post_as(
    server: &TestServer,
    path: &str,
    token: Option<&str>,
    request_id: Option<&str>,
    body: Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = server
        .client
        .post(format!("{}{path}", server.url))
        .json(&body);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(id) = request_id {
        req = req.header("x-request-id", id);
    }
    let resp = req.send().await.expect("answered");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.json().await.expect("JSON answer"))
}

/// The fields (and kinds) docs/operations.md documents for the audit
/// record: the first column of the tables under "### Fields" and
/// "### Kinds" of "## Audit log".
fn documented(section: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("docs/operations.md");
    let start = text
        .find(&format!("### {section}\n"))
        .unwrap_or_else(|| panic!("docs/operations.md has no ### {section}"));
    let body = &text[start + section.len() + 5..];
    let body = &body[..body.find("\n#").unwrap_or(body.len())];
    body.lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect()
}

#[test]
fn the_record_schema_is_documented_field_by_field() {
    let mut full = Record::new(RecordKind::Run, None);
    full.request_id = Some("r".into());
    full.client = Some("c".into());
    full.remote = Some("127.0.0.1:1".into());
    full.front_end = Some("http");
    full.env = Some("e".into());
    full.env_hash = Some("h".into());
    full.session = Some("s".into());
    full.code_sha256 = Some("x".into());
    full.code_bytes = Some(1);
    full.outcome = Some("ok");
    full.limit = Some("cpu");
    full.exit_code = Some(0);
    full.wall_ms = Some(1.0);
    full.cpu_ms = Some(1.0);
    full.peak_rss_kb = Some(1);
    full.output_bytes = Some(1);
    full.net_bytes_out = Some(1);
    full.net_bytes_in = Some(1);
    full.status = Some(403);
    full.error = Some("forbidden");
    full.message = Some("m".into());
    full.cases = Some(1);
    full.verdicts = Some(Default::default());
    full.packages = Some(vec![]);
    full.code = Some("c".into());
    full.stdout = Some(String::new());
    full.stderr = Some(String::new());
    let fields: BTreeSet<String> = serde_json::to_value(&full)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        fields,
        documented("Fields"),
        "docs/operations.md's audit fields and the record disagree"
    );
    let kinds: BTreeSet<String> = RecordKind::ALL
        .iter()
        .map(|k| k.as_str().to_string())
        .collect();
    assert_eq!(kinds, documented("Kinds"));
    // A record without facts is the few fields every record has.
    let bare = serde_json::to_value(Record::new(RecordKind::SessionExpire, None)).unwrap();
    assert_eq!(bare["v"], code_executor::audit::SCHEMA_VERSION);
    assert_eq!(bare["kind"], "session_expire");
    assert_eq!(bare.as_object().unwrap().len(), 3, "{bare}");
}

#[tokio::test]
async fn every_kind_of_record_carries_its_documented_fields() {
    let fixture = two_envs();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let clients = clients_file(
        dir.path(),
        &format!(
            r#"
[[clients]]
name = "alice"
token_sha256 = "{}"
scopes = ["execute", "sessions", "grade"]

[[clients]]
name = "tight"
token_sha256 = "{}"
scopes = ["execute"]
envs = ["a"]
rate_per_minute = 1
"#,
            sha256("alice-token"),
            sha256("tight-token")
        ),
    );
    let server = TestServer::with_config(Config {
        audit: audit_to(&log, AuditFail::Open),
        clients_file: Some(clients),
        admin_token: Some("admin-token".into()),
        ..config_over(&fixture)
    })
    .await;
    let documented = documented("Fields");
    let alice = Some("alice-token");

    let code = "print('hi')";
    let (status, _, body) = post_as(
        &server,
        "/execute",
        alice,
        Some("audit-run-1"),
        json!({"code": code, "env": "a"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let run = wait_for_record(&log, "run", |r| r["request_id"] == "audit-run-1").await;
    assert_eq!(run["v"], 1, "{run}");
    assert_eq!(run["kind"], "run");
    assert_eq!(run["client"], "alice");
    assert_eq!(run["front_end"], "http");
    assert!(
        run["remote"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{run}"
    );
    assert_eq!(run["env"], "a");
    assert_eq!(run["code_sha256"], sha256(code));
    assert_eq!(run["code_bytes"], code.len());
    assert_eq!(run["outcome"], "ok");
    assert_eq!(run["exit_code"], 0);
    assert_eq!(run["output_bytes"], 3);
    assert!(run["wall_ms"].as_f64().unwrap() > 0.0, "{run}");
    assert!(run["time"].as_str().unwrap().ends_with('Z'), "{run}");
    for absent in ["code", "stdout", "stderr"] {
        assert!(run.get(absent).is_none(), "{absent} in {run}");
    }

    let (status, _, session) = post_as(
        &server,
        "/sessions",
        alice,
        Some("audit-session"),
        json!({"env": "a"}),
    )
    .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    let (status, _, body) = post_as(
        &server,
        "/execute",
        alice,
        Some("audit-call"),
        json!({"code": "x = 1\nprint(x)", "session": id}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let closed = server
        .client
        .delete(format!("{}/sessions/{id}", server.url))
        .bearer_auth("alice-token")
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 200);
    let (status, _, short) = post_as(
        &server,
        "/sessions",
        alice,
        None,
        json!({"env": "a", "ttl": 0.3}),
    )
    .await;
    assert_eq!(status, 201, "{short}");
    let short_id = short["id"].as_str().unwrap().to_string();

    let (status, _, graded) = post_as(
        &server,
        "/grade",
        alice,
        Some("audit-grade"),
        json!({"code": "print(int(input()) * 2)", "env": "a", "compare": "trim", "tests": [
            {"stdin": "2", "expected_stdout": "4"},
            {"stdin": "3", "expected_stdout": "7"}
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{graded}");

    let (status, _, installed) = post_as(
        &server,
        "/install",
        Some("admin-token"),
        Some("audit-install"),
        json!({"env": "a", "packages": ["zlib"], "manager": "conda"}),
    )
    .await;
    assert_eq!(status, 200, "{installed}");

    let (status, _, _) = post_as(
        &server,
        "/execute",
        Some("nobody-token"),
        Some("audit-401"),
        json!({"code": "1"}),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _, _) = post_as(
        &server,
        "/execute",
        Some("tight-token"),
        Some("audit-403"),
        json!({"code": "1", "env": "b"}),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _, _) = post_as(
        &server,
        "/execute",
        Some("tight-token"),
        Some("audit-429"),
        json!({"code": "1", "env": "a"}),
    )
    .await;
    assert_eq!(status, 429);

    let call = wait_for_record(&log, "session_call", |r| r["request_id"] == "audit-call").await;
    assert_eq!(call["kind"], "session_call");
    assert_eq!(call["session"], id.as_str());
    assert_eq!(call["code_sha256"], sha256("x = 1\nprint(x)"));
    let created = wait_for_record(&log, "session_create", |r| {
        r["kind"] == "session_create" && r["session"] == id.as_str()
    })
    .await;
    assert_eq!(created["client"], "alice");
    assert_eq!(created["request_id"], "audit-session");
    let close = wait_for_record(&log, "session_close", |r| r["kind"] == "session_close").await;
    assert_eq!(close["session"], id.as_str());
    let expired = wait_for_record(&log, "session_expire", |r| {
        r["kind"] == "session_expire" && r["session"] == short_id.as_str()
    })
    .await;
    assert_eq!(expired["client"], "alice", "{expired}");
    let grade = wait_for_record(&log, "grade", |r| r["kind"] == "grade").await;
    assert_eq!(grade["request_id"], "audit-grade");
    assert_eq!(grade["cases"], 2);
    assert_eq!(grade["verdicts"]["ok"], 1, "{grade}");
    assert_eq!(grade["verdicts"]["wrong_answer"], 1, "{grade}");
    assert_eq!(grade["code_sha256"], sha256("print(int(input()) * 2)"));
    assert_eq!(grade["outcome"], "error");
    let install = wait_for_record(&log, "install", |r| r["kind"] == "install").await;
    assert_eq!(install["client"], "admin");
    assert_eq!(install["packages"], json!(["zlib"]));
    assert_eq!(install["exit_code"], 0);
    let unknown = wait_for_record(&log, "401", |r| r["request_id"] == "audit-401").await;
    assert_eq!(unknown["kind"], "auth_failure");
    assert_eq!(unknown["status"], 401);
    assert!(unknown.get("client").is_none(), "{unknown}");
    let forbidden = wait_for_record(&log, "403", |r| r["request_id"] == "audit-403").await;
    assert_eq!(forbidden["kind"], "auth_failure");
    assert_eq!(forbidden["client"], "tight");
    assert_eq!(forbidden["status"], 403);
    assert_eq!(forbidden["env"], "b");
    let limited = wait_for_record(&log, "429", |r| r["request_id"] == "audit-429").await;
    assert_eq!(limited["kind"], "rate_limited");
    assert_eq!(limited["status"], 429);
    assert_eq!(limited["error"], "too_many_requests");

    // Every record holds documented fields only, and every record has the
    // fields every record has.
    for record in records(&log) {
        for key in record.as_object().unwrap().keys() {
            assert!(documented.contains(key), "undocumented {key:?} in {record}");
        }
        for key in ["v", "time", "kind"] {
            assert!(record.get(key).is_some(), "no {key} in {record}");
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn code_and_output_are_recorded_only_with_audit_include_code() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let server = TestServer::with_config(Config {
        audit: AuditConfig {
            include_code: true,
            ..audit_to(&log, AuditFail::Open)
        },
        pool_size: 1,
        ..common::config()
    })
    .await;
    let code = "import sys\nprint('out')\nprint('err', file=sys.stderr)";
    server.run(code).await;
    let run = wait_for_record(&log, "run", |r| r["kind"] == "run").await;
    assert_eq!(run["code"], code);
    assert_eq!(run["stdout"], "out\n");
    assert_eq!(run["stderr"], "err\n");
    assert_eq!(run["code_sha256"], sha256(code));
    // Without a client configured, the caller is the anonymous client.
    assert_eq!(run["client"], "anonymous");
    server.stop().await;
}

/// Runs `print(N)` until one is answered `want`; the last answer.
async fn run_until(
    server: &TestServer,
    want: u16,
    id: &str,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let start = Instant::now();
    loop {
        let answer = post_as(
            server,
            "/execute",
            None,
            Some(id),
            json!({"code": "print(1)"}),
        )
        .await;
        if answer.0 == want {
            return answer;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never answered {want}: {} {}",
            answer.0,
            answer.2
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Send SIGHUP to this process (the server's reload listener takes it).
fn sighup() {
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).unwrap();
}

/// Keep a SIGHUP handler of this process's own, so that a SIGHUP raised
/// before the server's listener exists cannot end the test process.
fn hold_sighup() -> tokio::signal::unix::Signal {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).unwrap()
}

#[tokio::test]
async fn a_sink_failing_closed_refuses_runs_and_loses_no_acknowledged_record() {
    let _hup = hold_sighup();
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let log = logs.join("audit.log");
    let server = TestServer::with_config(Config {
        audit: audit_to(&log, AuditFail::Closed),
        pool_size: 1,
        ..common::config()
    })
    .await;
    let (status, _, _) = post_as(
        &server,
        "/execute",
        None,
        Some("closed-a"),
        json!({"code": "1"}),
    )
    .await;
    assert_eq!(status, 200);
    wait_for_record(&log, "closed-a", |r| r["request_id"] == "closed-a").await;
    // The log's directory goes away and the file is reopened: the sink
    // cannot write.
    let moved = dir.path().join("moved");
    std::fs::rename(&logs, &moved).unwrap();
    sighup();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The first run after that was acknowledged (its record queued) ...
    let (status, _, body) = post_as(
        &server,
        "/execute",
        None,
        Some("closed-b"),
        json!({"code": "print(2)"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // ... and once the sink is seen failing, runs are refused, naming why.
    let (_, headers, refused) = run_until(&server, 503, "closed-refused").await;
    assert_eq!(refused["error"]["code"], "audit_unavailable", "{refused}");
    assert!(
        common::error_message(&refused).contains("audit log"),
        "{refused}"
    );
    assert_eq!(headers["retry-after"], "1");
    // The directory is back: the held record is written, runs go on.
    std::fs::create_dir(&logs).unwrap();
    run_until(&server, 200, "closed-c").await;
    wait_for_record(&log, "closed-c", |r| r["request_id"] == "closed-c").await;
    let written = records(&log);
    let ids: Vec<&str> = written
        .iter()
        .filter_map(|r| r["request_id"].as_str())
        .collect();
    assert!(
        ids.contains(&"closed-b"),
        "acknowledged record lost: {ids:?}"
    );
    assert!(ids.contains(&"closed-c"), "{ids:?}");
    assert!(
        !ids.contains(&"closed-refused"),
        "a refused run has a run record: {ids:?}"
    );
    let before: Vec<Value> = records(&moved.join("audit.log"));
    assert_eq!(before.len(), 1, "{before:?}");
    server.stop().await;
}

#[tokio::test]
async fn a_full_sink_fails_closed_with_503_and_open_with_counted_drops() {
    let full = Path::new("/dev/full");
    assert!(full.exists(), "the test needs /dev/full");
    let server = TestServer::with_config(Config {
        audit: audit_to(full, AuditFail::Closed),
        pool_size: 1,
        ..common::config()
    })
    .await;
    let (status, _, _) = post_as(&server, "/execute", None, None, json!({"code": "1"})).await;
    assert_eq!(status, 200);
    let (_, _, refused) = run_until(&server, 503, "full-closed").await;
    assert_eq!(refused["error"]["code"], "audit_unavailable");
    server.stop().await;

    let server = TestServer::with_config(Config {
        audit: audit_to(full, AuditFail::Open),
        pool_size: 1,
        ..common::config()
    })
    .await;
    for _ in 0..3 {
        let (status, _, body) =
            post_as(&server, "/execute", None, None, json!({"code": "1"})).await;
        assert_eq!(status, 200, "{body}");
    }
    let start = Instant::now();
    loop {
        let metrics = server
            .client
            .get(format!("{}/metrics", server.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let dropped: f64 = metrics
            .lines()
            .find(|l| l.starts_with("code_executor_audit_dropped_total "))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|v| v.parse().ok())
            .expect("code_executor_audit_dropped_total in /metrics");
        if dropped >= 3.0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "drops not counted: {dropped}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn sighup_reopens_the_log_and_a_size_cap_rotates_it() {
    let _hup = hold_sighup();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let server = TestServer::with_config(Config {
        audit: audit_to(&log, AuditFail::Open),
        pool_size: 1,
        ..common::config()
    })
    .await;
    post_as(
        &server,
        "/execute",
        None,
        Some("before-hup"),
        json!({"code": "1"}),
    )
    .await;
    wait_for_record(&log, "before-hup", |r| r["request_id"] == "before-hup").await;
    // logrotate: move the file, then SIGHUP.
    let rotated = dir.path().join("audit.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    sighup();
    tokio::time::sleep(Duration::from_millis(200)).await;
    post_as(
        &server,
        "/execute",
        None,
        Some("after-hup"),
        json!({"code": "1"}),
    )
    .await;
    wait_for_record(&log, "after-hup", |r| r["request_id"] == "after-hup").await;
    assert_eq!(records(&log).len(), 1);
    assert_eq!(records(&rotated).len(), 1);
    server.stop().await;

    // With audit_max_bytes, the file is rotated in place past the size.
    let log = dir.path().join("capped.log");
    let server = TestServer::with_config(Config {
        audit: AuditConfig {
            max_bytes: Some(1),
            ..audit_to(&log, AuditFail::Open)
        },
        pool_size: 1,
        ..common::config()
    })
    .await;
    post_as(
        &server,
        "/execute",
        None,
        Some("cap-1"),
        json!({"code": "1"}),
    )
    .await;
    let first = dir.path().join("capped.log.1");
    wait_for_record(&first, "cap-1", |r| r["request_id"] == "cap-1").await;
    post_as(
        &server,
        "/execute",
        None,
        Some("cap-2"),
        json!({"code": "1"}),
    )
    .await;
    wait_for_record(&first, "cap-2", |r| r["request_id"] == "cap-2").await;
    server.stop().await;
}
