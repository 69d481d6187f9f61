//! The audit log: one JSON line per run, session call, grading, session
//! start/close/expiry, install, env create/delete and refused request, with
//! the fields docs/operations.md documents (the env's hash, a run's CPU time
//! and peak RSS among them); its sink failing open or closed, a batch
//! holding a slot per record; SIGHUP reopening it and size-based rotation.

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

/// POST /execute of `1` without a token, under `request_id`.
async fn run_with_id(server: &TestServer, request_id: &str) {
    post_as(
        server,
        "/execute",
        None,
        Some(request_id),
        json!({"code": "1"}),
    )
    .await;
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
/// Each field of `expected` is in `record` with that value; a null one is
/// not in `record` at all.
fn assert_fields(record: &Value, expected: Value) {
    for (key, value) in expected.as_object().unwrap() {
        match value {
            Value::Null => assert!(record.get(key).is_none(), "{key} in {record}"),
            value => assert_eq!(&record[key], value, "{key} of {record}"),
        }
    }
}

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
    // The env's hash is the one the result shows; CPU time and peak RSS
    // are there without asking for rusage.
    let hash_a = body["env_hash"].as_str().expect("env_hash in the result");
    assert_eq!(run["env_hash"], hash_a, "{run}");
    assert!(run["cpu_ms"].as_f64().unwrap() >= 0.0, "{run}");
    assert!(run["peak_rss_kb"].as_u64().unwrap() > 1000, "{run}");
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
    let (status, _, in_b) = post_as(
        &server,
        "/execute",
        alice,
        None,
        json!({"code": "1", "env": "b"}),
    )
    .await;
    assert_eq!(status, 200, "{in_b}");
    let (status, _, after_install) = post_as(
        &server,
        "/execute",
        alice,
        None,
        json!({"code": "1", "env": "a"}),
    )
    .await;
    assert_eq!(status, 200, "{after_install}");

    let admin = Some("admin-token");
    let (status, _, made) = post_as(
        &server,
        "/envs",
        admin,
        Some("audit-env-create"),
        json!({"name": "made", "specs": ["python=3.11"]}),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    let (status, _, failed) = post_as(
        &server,
        "/envs",
        admin,
        Some("audit-env-create-failed"),
        json!({"name": "broken", "specs": ["failing-pkg"]}),
    )
    .await;
    assert_eq!(status, 422, "{failed}");
    for (name, id, want) in [
        ("made", "audit-env-delete", 200),
        ("nosuch", "audit-env-delete-unknown", 404),
    ] {
        let deleted = server
            .client
            .delete(format!("{}/envs/{name}", server.url))
            .bearer_auth("admin-token")
            .header("x-request-id", id)
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), want, "{name}");
    }

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
    assert_eq!(call["env_hash"], hash_a, "{call}");
    assert!(call["cpu_ms"].as_f64().is_some(), "{call}");
    assert!(call["peak_rss_kb"].as_u64().unwrap() > 1000, "{call}");
    let created = wait_for_record(&log, "session_create", |r| {
        r["kind"] == "session_create" && r["session"] == id.as_str()
    })
    .await;
    assert_eq!(created["client"], "alice");
    assert_eq!(created["request_id"], "audit-session");
    assert_eq!(created["env_hash"], hash_a, "{created}");
    let close = wait_for_record(&log, "session_close", |r| r["kind"] == "session_close").await;
    assert_eq!(close["session"], id.as_str());
    assert_eq!(close["env_hash"], hash_a, "{close}");
    let expired = wait_for_record(&log, "session_expire", |r| {
        r["kind"] == "session_expire" && r["session"] == short_id.as_str()
    })
    .await;
    assert_eq!(expired["client"], "alice", "{expired}");
    assert_eq!(expired["env"], "a", "{expired}");
    assert_eq!(expired["env_hash"], hash_a, "{expired}");
    let grade = wait_for_record(&log, "grade", |r| r["kind"] == "grade").await;
    assert_eq!(grade["request_id"], "audit-grade");
    assert_eq!(grade["cases"], 2);
    assert_eq!(grade["verdicts"]["ok"], 1, "{grade}");
    assert_eq!(grade["verdicts"]["wrong_answer"], 1, "{grade}");
    assert_eq!(grade["code_sha256"], sha256("print(int(input()) * 2)"));
    assert_eq!(grade["outcome"], "error");
    assert_eq!(grade["env"], "a", "{grade}");
    assert_eq!(grade["env_hash"], hash_a, "{grade}");
    let install = wait_for_record(&log, "install", |r| r["kind"] == "install").await;
    assert_eq!(install["client"], "admin");
    assert_eq!(install["packages"], json!(["zlib"]));
    assert_eq!(install["exit_code"], 0);
    assert_eq!(install["env"], "a");
    // An install's hash is the env's after it, as the next run shows it.
    assert_eq!(install["env_hash"], after_install["env_hash"], "{install}");
    let env_create = wait_for_record(&log, "env_create", |r| {
        r["request_id"] == "audit-env-create"
    })
    .await;
    assert_fields(
        &env_create,
        json!({"kind": "env_create", "client": "admin", "front_end": "http", "env": "made",
               "env_hash": made["env_hash"], "packages": ["python=3.11"], "outcome": "ok"}),
    );
    assert!(
        env_create["wall_ms"].as_f64().unwrap() > 0.0,
        "{env_create}"
    );
    // Records found by their request id; a null field is one the record
    // does not have.
    for (request_id, expected) in [
        (
            "audit-env-create-failed",
            json!({"kind": "env_create", "env": "broken", "outcome": "error", "status": 422,
                   "error": "create_failed", "env_hash": null}),
        ),
        (
            "audit-env-delete",
            json!({"kind": "env_delete", "client": "admin", "env": "made",
                   "env_hash": made["env_hash"], "outcome": "ok"}),
        ),
        (
            "audit-env-delete-unknown",
            json!({"kind": "env_delete", "env": "nosuch", "outcome": "error", "status": 404,
                   "error": "unknown_env", "env_hash": null}),
        ),
        (
            "audit-401",
            json!({"kind": "auth_failure", "status": 401, "client": null}),
        ),
        (
            "audit-403",
            json!({"kind": "auth_failure", "client": "tight", "status": 403, "env": "b",
                   "env_hash": in_b["env_hash"]}),
        ),
        (
            "audit-429",
            json!({"kind": "rate_limited", "status": 429, "error": "too_many_requests"}),
        ),
    ] {
        let record = wait_for_record(&log, request_id, |r| r["request_id"] == request_id).await;
        assert_fields(&record, expected);
    }

    // Every kind of record is there; every record holds documented fields
    // only, and every record has the fields every record has.
    let seen: BTreeSet<String> = records(&log)
        .iter()
        .filter_map(|r| r["kind"].as_str().map(str::to_string))
        .collect();
    let every: BTreeSet<String> = RecordKind::ALL
        .iter()
        .map(|k| k.as_str().to_string())
        .collect();
    assert_eq!(seen, every, "kinds of record written");
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

#[tokio::test]
async fn every_run_records_its_cpu_time_and_peak_rss_without_asking_for_rusage() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let server = TestServer::with_config(Config {
        audit: audit_to(&log, AuditFail::Open),
        pool_size: 1,
        ..common::config()
    })
    .await;
    // About 100 ms of CPU or more, and 64 MiB written.
    let burn = "n = 0\nfor i in range(2_000_000):\n    n += i\nprint(n > 0)";
    let grow = "x = b'x' * (64 << 20)\nprint(len(x))";
    let mut ids = Vec::new();
    for (id, code) in [("cpu-run", burn), ("rss-run", grow)] {
        let (status, _, body) =
            post_as(&server, "/execute", None, Some(id), json!({"code": code})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["exit_code"], 0, "{body}");
        // The result a client sees is as it was: no rusage fields.
        assert!(body.get("cpu_ms").is_none(), "{body}");
        assert!(body.get("peak_rss_kb").is_none(), "{body}");
        ids.push(id);
    }
    let (status, _, session) = post_as(&server, "/sessions", None, None, json!({})).await;
    assert_eq!(status, 201, "{session}");
    let (status, _, body) = post_as(
        &server,
        "/execute",
        None,
        Some("cpu-call"),
        json!({"code": burn, "session": session["id"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let cpu = wait_for_record(&log, "cpu-run", |r| r["request_id"] == "cpu-run").await;
    let cpu_ms = cpu["cpu_ms"].as_f64().expect("cpu_ms");
    let wall_ms = cpu["wall_ms"].as_f64().unwrap();
    assert!(cpu_ms >= 30.0, "{cpu}");
    // The run's own CPU, not its process's life before the request.
    assert!(cpu_ms <= wall_ms + 20.0, "{cpu}");
    let rss = wait_for_record(&log, "rss-run", |r| r["request_id"] == "rss-run").await;
    assert!(
        rss["peak_rss_kb"].as_u64().expect("peak_rss_kb") >= 64 << 10,
        "{rss}"
    );
    assert!(cpu["peak_rss_kb"].as_u64().unwrap() < 64 << 10, "{cpu}");
    let call = wait_for_record(&log, "cpu-call", |r| r["request_id"] == "cpu-call").await;
    assert_eq!(call["kind"], "session_call");
    assert!(call["cpu_ms"].as_f64().expect("cpu_ms") >= 30.0, "{call}");
    assert!(
        call["peak_rss_kb"].as_u64().expect("peak_rss_kb") > 1000,
        "{call}"
    );
    // A session call counts the CPU of the processes it waited for, and the
    // next call counts only its own.
    let spawn = format!(
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn:?}], check=True)"
    );
    for (id, code) in [("child-call", spawn.as_str()), ("quiet-call", "pass")] {
        let (status, _, body) = post_as(
            &server,
            "/execute",
            None,
            Some(id),
            json!({"code": code, "session": session["id"]}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["exit_code"], 0, "{body}");
    }
    let child = wait_for_record(&log, "child-call", |r| r["request_id"] == "child-call").await;
    let child_ms = child["cpu_ms"].as_f64().expect("cpu_ms");
    assert!(child_ms >= 30.0, "{child}");
    assert!(
        child_ms <= child["wall_ms"].as_f64().unwrap() + 20.0,
        "{child}"
    );
    let quiet = wait_for_record(&log, "quiet-call", |r| r["request_id"] == "quiet-call").await;
    assert!(quiet["cpu_ms"].as_f64().expect("cpu_ms") < 20.0, "{quiet}");

    // A run killed at its timeout never reported: nothing measured.
    let (status, _, body) = post_as(
        &server,
        "/execute",
        None,
        Some("killed-run"),
        json!({"code": "while True: pass", "timeout": 0.5}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    let killed = wait_for_record(&log, "killed-run", |r| r["request_id"] == "killed-run").await;
    assert_eq!(killed["outcome"], "timeout", "{killed}");
    assert!(killed.get("cpu_ms").is_none(), "{killed}");
    server.stop().await;
}

/// A `/grade/batch` body of `n` submissions, `print(i)` each, one case each.
fn batch_of(n: usize) -> Value {
    let submissions: Vec<Value> = (0..n)
        .map(|i| json!({"code": format!("print({i})"), "tests": [{"expected_stdout": format!("{i}\n")}]}))
        .collect();
    json!({ "submissions": submissions })
}

#[tokio::test]
async fn a_batch_failing_closed_holds_a_record_slot_for_every_submission() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let server = TestServer::with_config(Config {
        audit: AuditConfig {
            queue: 3,
            ..audit_to(&log, AuditFail::Closed)
        },
        pool_size: 1,
        ..common::config()
    })
    .await;
    // More submissions than the queue can hold records for: refused
    // before anything runs.
    let (status, headers, refused) =
        post_as(&server, "/grade/batch", None, Some("batch-4"), batch_of(4)).await;
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["error"]["code"], "audit_unavailable", "{refused}");
    assert!(
        common::error_message(&refused).contains("4 audit records"),
        "{refused}"
    );
    assert_eq!(headers["retry-after"], "1");
    // As many as it holds: every submission is graded and recorded.
    let (status, _, graded) =
        post_as(&server, "/grade/batch", None, Some("batch-3"), batch_of(3)).await;
    assert_eq!(status, 200, "{graded}");
    assert_eq!(graded["results"].as_array().unwrap().len(), 3, "{graded}");
    let start = Instant::now();
    let hashes = loop {
        let hashes: BTreeSet<String> = records(&log)
            .iter()
            .filter(|r| r["request_id"] == "batch-3" && r["kind"] == "grade")
            .filter_map(|r| r["code_sha256"].as_str().map(str::to_string))
            .collect();
        if hashes.len() == 3 || start.elapsed() > Duration::from_secs(10) {
            break hashes;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let want: BTreeSet<String> = (0..3).map(|i| sha256(&format!("print({i})"))).collect();
    assert_eq!(hashes, want, "a grade record per submission");
    assert!(
        !records(&log).iter().any(|r| r["request_id"] == "batch-4"),
        "the refused batch left a record"
    );
    // Streamed, the same holds.
    let resp = server
        .client
        .post(format!("{}/grade/batch", server.url))
        .header("accept", "text/event-stream")
        .json(&batch_of(5))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    server.stop().await;
}

/// Runs `print(1)` until one is answered `want`, the `n`th attempt with
/// request id `{id}-{n}`; the last answer and its request id.
async fn run_until(
    server: &TestServer,
    want: u16,
    id: &str,
) -> ((u16, reqwest::header::HeaderMap, Value), String) {
    let start = Instant::now();
    for n in 0.. {
        let attempt = format!("{id}-{n}");
        let answer = post_as(
            server,
            "/execute",
            None,
            Some(&attempt),
            json!({"code": "print(1)"}),
        )
        .await;
        if answer.0 == want {
            return (answer, attempt);
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never answered {want}: {} {}",
            answer.0,
            answer.2
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!("the attempts are endless")
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
    let ((_, headers, refused), refused_id) = run_until(&server, 503, "closed-refused").await;
    assert_eq!(refused["error"]["code"], "audit_unavailable", "{refused}");
    assert!(
        common::error_message(&refused).contains("audit log"),
        "{refused}"
    );
    assert_eq!(headers["retry-after"], "1");
    // The directory is back: the held record is written, runs go on.
    std::fs::create_dir(&logs).unwrap();
    let (_, c_id) = run_until(&server, 200, "closed-c").await;
    wait_for_record(&log, "closed-c", |r| r["request_id"] == c_id.as_str()).await;
    let written = records(&log);
    let ids: Vec<&str> = written
        .iter()
        .filter_map(|r| r["request_id"].as_str())
        .collect();
    assert!(
        ids.contains(&"closed-b"),
        "acknowledged record lost: {ids:?}"
    );
    assert!(ids.contains(&c_id.as_str()), "{ids:?}");
    // (Attempts before the sink was seen failing ran, and have theirs.)
    assert!(
        !ids.contains(&refused_id.as_str()),
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
    let ((_, _, refused), _) = run_until(&server, 503, "full-closed").await;
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
    run_with_id(&server, "before-hup").await;
    wait_for_record(&log, "before-hup", |r| r["request_id"] == "before-hup").await;
    // logrotate: move the file, then SIGHUP.
    let rotated = dir.path().join("audit.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    sighup();
    tokio::time::sleep(Duration::from_millis(200)).await;
    run_with_id(&server, "after-hup").await;
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
    run_with_id(&server, "cap-1").await;
    let first = dir.path().join("capped.log.1");
    wait_for_record(&first, "cap-1", |r| r["request_id"] == "cap-1").await;
    run_with_id(&server, "cap-2").await;
    wait_for_record(&first, "cap-2", |r| r["request_id"] == "cap-2").await;
    server.stop().await;
}
