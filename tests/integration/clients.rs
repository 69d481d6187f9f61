//! Named clients (`--clients`): scopes, env allow-lists, quotas and
//! ceilings over HTTP and MCP (stdio with `--mcp-client`, streamable HTTP
//! by bearer token), sessions owned by their client, reloads under load,
//! the `client` metrics label and `code-executor hash-token`.

use std::time::{Duration, Instant};

use code_executor::Config;
use serde_json::{Value, json};

use crate::audit::{clients_file, config_over, post_as, sha256, two_envs, wait_for_record};
use crate::common::TestServer;
use crate::common::mcp::{call, connect_http, connect_stdio, execute_code, text};

/// A `[[clients]]` table for `name` with token `<name>-token` and `extra`
/// TOML lines.
fn client(name: &str, extra: &str) -> String {
    format!(
        "[[clients]]\nname = \"{name}\"\ntoken_sha256 = \"{}\"\n{extra}\n\n",
        sha256(&format!("{name}-token"))
    )
}

fn token(name: &str) -> String {
    format!("{name}-token")
}

async fn execute_as(
    server: &TestServer,
    name: &str,
    body: Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    post_as(server, "/execute", Some(&token(name)), None, body).await
}

/// `GET /sessions` as client `name`.
async fn sessions_of(server: &TestServer, name: &str) -> Value {
    server
        .client
        .get(format!("{}/sessions", server.url))
        .bearer_auth(token(name))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// When client `name`'s session `id` expires, as `GET /sessions` lists it:
/// seconds since the Unix epoch (the listing's `expires_at`, RFC 3339 in
/// UTC).
async fn expires_at(server: &TestServer, name: &str, id: &str) -> f64 {
    let listed = sessions_of(server, name).await;
    let session = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("{id} not listed: {listed}"));
    let time = session["expires_at"].as_str().unwrap();
    let (date, clock) = time.trim_end_matches('Z').split_once('T').unwrap();
    let [year, month, day]: [i64; 3] = date
        .split('-')
        .map(|part| part.parse().unwrap())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    // Days since 1970-01-01 of a date in the proleptic Gregorian calendar.
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = clock
        .split(':')
        .map(|part| part.parse::<f64>().unwrap())
        .fold(0.0, |total, part| total * 60.0 + part);
    days as f64 * 86_400.0 + seconds
}

fn message(body: &Value) -> &str {
    crate::common::error_message(body)
}

#[tokio::test]
async fn scopes_and_env_allow_lists_are_refused_with_403_naming_what_is_missing() {
    let fixture = two_envs();
    let dir = tempfile::tempdir().unwrap();
    let clients = clients_file(
        dir.path(),
        &(client("runner", "scopes = [\"execute\"]\nenvs = [\"a\"]")
            + &client("grader", "scopes = [\"grade\"]\nenvs = [\"a\"]")
            + &client(
                "everything",
                "scopes = [\"execute\", \"sessions\", \"grade\", \"install\"]\nenvs = [\"*\"]",
            )),
    );
    let server = TestServer::with_config(Config {
        clients_file: Some(clients),
        ..config_over(&fixture)
    })
    .await;
    // No token: nobody (a clients file turns anonymous access off).
    let (status, _, body) = post_as(&server, "/execute", None, None, json!({"code": "1"})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );

    let (status, _, body) =
        execute_as(&server, "runner", json!({"code": "print(1)", "env": "a"})).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) =
        execute_as(&server, "runner", json!({"code": "print(1)", "env": "b"})).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    assert!(message(&body).contains("\"b\""), "{body}");
    assert!(message(&body).contains("runner"), "{body}");
    for (path, scope, payload) in [
        (
            "/install",
            "install",
            json!({"env": "a", "packages": ["zlib"], "manager": "conda"}),
        ),
        (
            "/grade",
            "grade",
            json!({"code": "print(1)", "tests": [{"expected_stdout": "1"}]}),
        ),
        ("/sessions", "sessions", json!({})),
    ] {
        let (status, _, body) = post_as(&server, path, Some("runner-token"), None, payload).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{path}");
        assert!(
            message(&body).contains(&format!("`{scope}`")),
            "{path}: {body}"
        );
    }
    // A batch names the submission whose environment the client may not use.
    let (status, _, body) = post_as(
        &server,
        "/grade/batch",
        Some("grader-token"),
        None,
        json!({"submissions": [
            {"code": "print(1)", "env": "a", "tests": [{"expected_stdout": "1"}]},
            {"code": "print(1)", "env": "b", "tests": [{"expected_stdout": "1"}]},
        ]}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden", "{body}");
    assert!(
        message(&body).starts_with("submission 1: client \"grader\" may not use environment \"b\""),
        "{body}"
    );
    let (status, _, body) = post_as(
        &server,
        "/install",
        Some("everything-token"),
        None,
        json!({"env": "b", "packages": ["zlib"], "manager": "conda"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // /health never lists clients.
    let health = server
        .client
        .get(format!("{}/health", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !health.contains("runner") && !health.contains("everything"),
        "{health}"
    );
    server.stop().await;
}

#[tokio::test]
async fn max_concurrent_refuses_past_the_cap_at_once_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let clients = clients_file(
        dir.path(),
        &client("pair", "scopes = [\"execute\"]\nmax_concurrent = 2"),
    );
    let server = TestServer::with_config(Config {
        clients_file: Some(clients),
        pool_size: 2,
        ..crate::common::config()
    })
    .await;
    let started = Instant::now();
    let answers = futures_util::future::join_all((0..10).map(|_| {
        execute_as(
            &server,
            "pair",
            json!({"code": "import time; time.sleep(1.5)"}),
        )
    }))
    .await;
    let ok = answers.iter().filter(|a| a.0 == 200).count();
    let limited: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    assert_eq!(
        ok,
        2,
        "{:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    assert_eq!(limited.len(), 8);
    for (_, headers, body) in &limited {
        assert_eq!(body["error"]["code"], "too_many_requests");
        assert!(message(body).contains("max_concurrent"), "{body}");
        assert_eq!(headers["retry-after"], "1");
    }
    // Refused at once: the whole batch took about one run.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The slots are free again.
    let (status, _, _) = execute_as(&server, "pair", json!({"code": "1"})).await;
    assert_eq!(status, 200);
    server.stop().await;
}

#[tokio::test]
async fn rate_per_minute_refuses_past_the_budget_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let clients = clients_file(
        dir.path(),
        &client(
            "metered",
            "scopes = [\"execute\"]\nrate_per_minute = 60\nburst = 2",
        ),
    );
    let server = TestServer::with_config(Config {
        clients_file: Some(clients),
        pool_size: 1,
        ..crate::common::config()
    })
    .await;
    for _ in 0..2 {
        let (status, _, body) = execute_as(&server, "metered", json!({"code": "1"})).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, headers, body) = execute_as(&server, "metered", json!({"code": "1"})).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "too_many_requests");
    assert!(message(&body).contains("rate_per_minute"), "{body}");
    let wait: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert_eq!(wait, 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, _, body) = execute_as(&server, "metered", json!({"code": "1"})).await;
    assert_eq!(status, 200, "{body}");
    // Refusals are counted per client and reason.
    let metrics = server
        .client
        .get(format!("{}/metrics", server.url))
        .bearer_auth("metered-token")
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 401, "metered lacks the metrics scope");
    server.stop().await;
}

#[tokio::test]
async fn sessions_belong_to_their_client_and_ceilings_hold() {
    let dir = tempfile::tempdir().unwrap();
    let clients = clients_file(
        dir.path(),
        &(client(
            "alice",
            "scopes = [\"execute\", \"sessions\", \"metrics\"]\nmax_sessions = 1\nmax_timeout = 1",
        ) + &client("bob", "scopes = [\"execute\", \"sessions\"]")),
    );
    let server = TestServer::with_config(Config {
        clients_file: Some(clients),
        pool_size: 2,
        ..crate::common::config()
    })
    .await;
    let (status, _, session) =
        post_as(&server, "/sessions", Some("alice-token"), None, json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap();
    let (status, _, body) =
        execute_as(&server, "alice", json!({"code": "x = 41", "session": id})).await;
    assert_eq!(status, 200, "{body}");
    // Bob gets what a session that never existed gets, and his call does
    // not renew it.
    let expires_before = expires_at(&server, "alice", id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, _, body) =
        execute_as(&server, "bob", json!({"code": "print(x)", "session": id})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_session");
    let expires_after = expires_at(&server, "alice", id).await;
    assert!(
        (expires_after - expires_before).abs() < 0.5,
        "another client's call moved the session's expiry by {:.3} s",
        expires_after - expires_before
    );
    let gone = server
        .client
        .delete(format!("{}/sessions/{id}", server.url))
        .bearer_auth("bob-token")
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
    let listed = sessions_of(&server, "bob").await;
    assert_eq!(listed["sessions"], json!([]), "{listed}");
    // Alice's session is intact, and she may hold only one.
    let (_, _, body) = execute_as(
        &server,
        "alice",
        json!({"code": "print(x + 1)", "session": id}),
    )
    .await;
    assert_eq!(body["stdout"], "42\n", "{body}");
    let (status, _, body) =
        post_as(&server, "/sessions", Some("alice-token"), None, json!({})).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "too_many_sessions");
    assert!(message(&body).contains("alice"), "{body}");
    // Her runs get at most her max_timeout, whatever they ask.
    let (status, _, body) = execute_as(
        &server,
        "alice",
        json!({"code": "import time; time.sleep(5)", "timeout": 30}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert!(body["duration_ms"].as_f64().unwrap() < 3000.0, "{body}");
    // Runs are counted by client.
    let metrics = server
        .client
        .get(format!("{}/metrics", server.url))
        .bearer_auth("alice-token")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("code_executor_client_runs_total{client=\"alice\",outcome=\"ok\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "code_executor_client_refusals_total{client=\"alice\",reason=\"sessions\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("code_executor_client_queue_wait_seconds_count{client=\"bob\"}"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_reload_under_load_changes_rights_without_failing_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let before = client("worker", "scopes = [\"execute\"]");
    let path = clients_file(dir.path(), &before);
    let server = TestServer::with_config(Config {
        clients_file: Some(path.clone()),
        pool_size: 2,
        ..crate::common::config()
    })
    .await;
    let grade = json!({"code": "print(1)", "tests": [{"expected_stdout": "1"}]});
    let (status, _, _) =
        post_as(&server, "/grade", Some("worker-token"), None, grade.clone()).await;
    assert_eq!(status, 403);
    let load = async {
        let mut statuses = Vec::new();
        for _ in 0..40 {
            let (a, b) = tokio::join!(
                execute_as(&server, "worker", json!({"code": "print(1)"})),
                execute_as(&server, "worker", json!({"code": "print(2)"})),
            );
            statuses.extend([a.0, b.0]);
        }
        statuses
    };
    let reload = async {
        for i in 0..10 {
            tokio::time::sleep(Duration::from_millis(30)).await;
            let scopes = if i % 2 == 0 {
                "scopes = [\"execute\", \"grade\"]"
            } else {
                "scopes = [\"execute\"]"
            };
            std::fs::write(&path, client("worker", scopes)).unwrap();
            server.executor.reload().expect("the file reloads");
        }
        // Ends with grade granted.
        std::fs::write(&path, client("worker", "scopes = [\"execute\", \"grade\"]")).unwrap();
        server.executor.reload().unwrap();
    };
    let (statuses, ()) = tokio::join!(load, reload);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let (status, _, body) = post_as(&server, "/grade", Some("worker-token"), None, grade).await;
    assert_eq!(status, 200, "{body}");
    // A file that does not parse leaves the clients in force.
    std::fs::write(&path, "[[clients]]\nname = 1\n").unwrap();
    assert!(server.executor.reload().is_err());
    let (status, _, _) = execute_as(&server, "worker", json!({"code": "1"})).await;
    assert_eq!(status, 200);
    server.stop().await;
}

#[test]
fn hash_token_prints_the_sha256_of_the_argument_or_stdin() {
    let binary = env!("CARGO_BIN_EXE_code-executor");
    let out = std::process::Command::new(binary)
        .args(["hash-token", "s3cret"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        sha256("s3cret")
    );
    let mut child = std::process::Command::new(binary)
        .arg("hash-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        sha256("s3cret")
    );
}

/// The first text of an MCP result.
/// Another client's session, live or ended, gets exactly the answer an id
/// of the same shape that never named a session gets (with the id in it):
/// over HTTP and MCP, with or without `limits`, nothing tells a client that
/// holds another's id whether that session exists or why it ended.
#[tokio::test]
async fn another_clients_session_is_answered_as_one_that_never_existed() {
    let dir = tempfile::tempdir().unwrap();
    let clients = clients_file(
        dir.path(),
        &(client("alice", "scopes = [\"execute\", \"sessions\"]")
            + &client("bob", "scopes = [\"execute\", \"sessions\"]")),
    );
    let server = TestServer::with_config(Config {
        clients_file: Some(clients),
        pool_size: 1,
        ..crate::common::config()
    })
    .await;
    let (status, _, session) =
        post_as(&server, "/sessions", Some("alice-token"), None, json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    // The same shape (32 hex digits, this replica), another random part.
    let never = format!("{}{}", "0".repeat(32), &id[32..]);
    assert_ne!(never, id);
    let bob = connect_http(&format!("{}/mcp", server.url), Some("bob-token")).await;
    // What bob is told about `named`, with the id written as <id>.
    let answers = |named: String| {
        let (server, bob) = (&server, &bob);
        async move {
            let mut seen = Vec::new();
            for extra in [json!({}), json!({"limits": {"memory_bytes": 100_000_000}})] {
                let mut body = json!({"code": "1", "session": named});
                body.as_object_mut()
                    .unwrap()
                    .extend(extra.as_object().unwrap().clone());
                let (status, _, answer) = execute_as(server, "bob", body.clone()).await;
                seen.push(format!("{status} {answer}").replace(&named, "<id>"));
                let shown = refused(&execute_code(bob, body).await.unwrap());
                seen.push(shown.replace(&named, "<id>"));
            }
            let gone = server
                .client
                .delete(format!("{}/sessions/{named}", server.url))
                .bearer_auth("bob-token")
                .send()
                .await
                .unwrap();
            let status = gone.status();
            let body = gone.text().await.unwrap();
            seen.push(format!("{status} {body}").replace(&named, "<id>"));
            let shown = refused(
                &call(bob, "close_session", json!({"session": named}))
                    .await
                    .unwrap(),
            );
            seen.push(shown.replace(&named, "<id>"));
            seen
        }
    };
    let never_seen = answers(never.clone()).await;
    assert!(never_seen[0].starts_with("404 "), "{never_seen:?}");
    assert_eq!(
        answers(id.clone()).await,
        never_seen,
        "alice's live session"
    );
    let (status, _, body) = post_as(
        &server,
        "/execute",
        Some("alice-token"),
        None,
        json!({"code": "1", "session": id}),
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
    assert_eq!(
        answers(id.clone()).await,
        never_seen,
        "alice's closed session"
    );
    // Alice herself is told why hers ended.
    let (status, _, body) = execute_as(&server, "alice", json!({"code": "1", "session": id})).await;
    assert_eq!(status, 404, "{body}");
    assert!(message(&body).contains("it was closed"), "{body}");
    let _ = bob.cancel().await;
    server.stop().await;
}

fn refused(result: &rmcp::model::CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "{}", text(result));
    text(result)
}

#[tokio::test]
async fn every_rule_holds_over_mcp_streamable_http_by_bearer_token() {
    let fixture = two_envs();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let clients = clients_file(
        dir.path(),
        &(client(
            "runner",
            "scopes = [\"execute\"]\nenvs = [\"a\"]\nrate_per_minute = 60\nburst = 2",
        ) + &client("owner", "scopes = [\"execute\", \"sessions\"]")
            + &client("intruder", "scopes = [\"execute\", \"sessions\"]")
            + &client("single", "scopes = [\"execute\"]\nmax_concurrent = 1")
            + &client("installer", "scopes = [\"install\"]")),
    );
    let server = TestServer::with_config(Config {
        clients_file: Some(clients),
        audit: crate::audit::audit_to(&log, code_executor::audit::AuditFail::Open),
        ..config_over(&fixture)
    })
    .await;
    let url = format!("{}/mcp", server.url);
    let runner = connect_http(&url, Some("runner-token")).await;
    let result = execute_code(&runner, json!({"code": "print(6*7)", "env": "a"}))
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    let run = wait_for_record(&log, "mcp run", |r| r["front_end"] == "mcp-http").await;
    assert_eq!(run["client"], "runner");
    assert!(!run["request_id"].as_str().unwrap().is_empty(), "{run}");
    let shown = refused(
        &execute_code(&runner, json!({"code": "1", "env": "b"}))
            .await
            .unwrap(),
    );
    assert!(
        shown.contains("forbidden") && shown.contains("\"b\""),
        "{shown}"
    );
    let shown = refused(&call(&runner, "create_session", json!({})).await.unwrap());
    assert!(
        shown.contains("forbidden") && shown.contains("`sessions`"),
        "{shown}"
    );
    // The second token of the bucket went on the refused env (a missing
    // scope takes none): the next run is over the budget.
    let shown = refused(
        &execute_code(&runner, json!({"code": "1", "env": "a"}))
            .await
            .unwrap(),
    );
    assert!(shown.contains("too_many_requests"), "{shown}");
    let limited = wait_for_record(&log, "mcp 429", |r| {
        r["kind"] == "rate_limited" && r["client"] == "runner"
    })
    .await;
    assert_eq!(limited["front_end"], "mcp-http", "{limited}");
    let forbidden = wait_for_record(&log, "mcp 403", |r| {
        r["kind"] == "auth_failure" && r["client"] == "runner" && r["env"] == "b"
    })
    .await;
    assert_eq!(forbidden["front_end"], "mcp-http", "{forbidden}");
    // A client without `install` is refused the tool, naming the scope.
    let shown = refused(
        &call(&runner, "install_packages", json!({"packages": ["zlib"]}))
            .await
            .unwrap(),
    );
    assert!(
        shown.contains("forbidden") && shown.contains("`install`"),
        "{shown}"
    );

    // max_concurrent = 1: of calls made at once, one runs and the others
    // are refused at once; once it ended, the next runs.
    let mut single = Vec::new();
    for _ in 0..3 {
        single.push(connect_http(&url, Some("single-token")).await);
    }
    let results = futures_util::future::join_all(single.iter().map(|c| {
        execute_code(
            c,
            json!({"code": "import time; time.sleep(1.5); print('slow')"}),
        )
    }))
    .await;
    let shown: Vec<String> = results.iter().map(|r| text(r.as_ref().unwrap())).collect();
    let ran = shown.iter().filter(|t| t.contains("slow")).count();
    let refusals = shown
        .iter()
        .filter(|t| t.contains("too_many_requests") && t.contains("max_concurrent"))
        .count();
    assert_eq!((ran, refusals), (1, 2), "{shown:?}");
    let result = execute_code(&single[0], json!({"code": "print(2)"}))
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    for c in single {
        let _ = c.cancel().await;
    }

    let owner = connect_http(&url, Some("owner-token")).await;
    let created = call(&owner, "create_session", json!({})).await.unwrap();
    let id = created.structured_content.as_ref().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let other = connect_http(&url, Some("intruder-token")).await;
    let shown = refused(
        &execute_code(&other, json!({"code": "1", "session": id}))
            .await
            .unwrap(),
    );
    assert!(shown.contains("unknown_session"), "{shown}");
    let shown = refused(
        &call(&other, "close_session", json!({"session": id}))
            .await
            .unwrap(),
    );
    assert!(shown.contains("unknown_session"), "{shown}");
    let result = execute_code(&owner, json!({"code": "print('mine')", "session": id}))
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    let _ = runner.cancel().await;
    let _ = other.cancel().await;
    let _ = owner.cancel().await;
    server.stop().await;
}

#[tokio::test]
async fn mcp_over_stdio_acts_as_its_configured_client() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let clients = clients_file(
        dir.path(),
        &(client(
            "notebook",
            "scopes = [\"execute\"]\nmax_timeout = 1\nrate_per_minute = 6\nburst = 2",
        ) + &client("other", "scopes = [\"execute\", \"sessions\", \"install\"]")
            + &client("confined", "scopes = [\"execute\"]\nenvs = [\"nowhere\"]")),
    );
    let python = crate::common::python();
    // `code-executor mcp` over stdio as `client` of the clients file.
    let serve_as = |client: &'static str, extra: Vec<String>| {
        let mut args: Vec<String> = ["--python", python.to_str().unwrap(), "--pool-size", "1"]
            .into_iter()
            .map(String::from)
            .collect();
        args.extend(["--clients".into(), clients.to_str().unwrap().into()]);
        args.extend(["--mcp-client".into(), client.into()]);
        args.extend(extra);
        let dir = dir.path().to_path_buf();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            connect_stdio(
                env!("CARGO_BIN_EXE_code-executor").as_ref(),
                &args,
                &[("TMPDIR", dir.as_path())],
            )
            .await
        }
    };
    let (stdio, _child) = serve_as(
        "notebook",
        vec!["--audit-log".into(), log.to_str().unwrap().into()],
    )
    .await;
    let result = execute_code(
        &stdio,
        json!({"code": "import time; time.sleep(4)", "timeout": 30}),
    )
    .await
    .unwrap();
    assert!(
        text(&result).contains("timed out after 1"),
        "{}",
        text(&result)
    );
    let run = wait_for_record(&log, "stdio run", |r| r["kind"] == "run").await;
    assert_eq!(run["front_end"], "mcp-stdio");
    assert_eq!(run["client"], "notebook");
    assert!(!run["request_id"].as_str().unwrap().is_empty(), "{run}");
    let shown = refused(&call(&stdio, "create_session", json!({})).await.unwrap());
    assert!(
        shown.contains("forbidden") && shown.contains("`sessions`"),
        "{shown}"
    );
    let shown = refused(
        &call(&stdio, "install_packages", json!({"packages": ["zlib"]}))
            .await
            .unwrap(),
    );
    assert!(
        shown.contains("forbidden") && shown.contains("`install`"),
        "{shown}"
    );
    let _ = execute_code(&stdio, json!({"code": "1"})).await.unwrap();
    let shown = refused(&execute_code(&stdio, json!({"code": "1"})).await.unwrap());
    assert!(shown.contains("too_many_requests"), "{shown}");
    let limited = wait_for_record(&log, "stdio 429", |r| r["kind"] == "rate_limited").await;
    assert_eq!(limited["front_end"], "mcp-stdio", "{limited}");
    assert_eq!(limited["client"], "notebook", "{limited}");
    let forbidden = wait_for_record(&log, "stdio 403", |r| r["kind"] == "auth_failure").await;
    assert_eq!(forbidden["front_end"], "mcp-stdio", "{forbidden}");
    assert_eq!(forbidden["client"], "notebook", "{forbidden}");
    let _ = stdio.cancel().await;

    // A client confined to other envs is refused the server's env, named.
    let (confined, _confined_child) = serve_as("confined", Vec::new()).await;
    let shown = refused(&execute_code(&confined, json!({"code": "1"})).await.unwrap());
    assert!(
        shown.contains("forbidden")
            && shown.contains("may not use environment")
            && shown.contains("nowhere"),
        "{shown}"
    );
    let _ = confined.cancel().await;

    // A name the clients file lacks stops the server at start.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_code-executor"))
        .args(["mcp", "--python", python.to_str().unwrap(), "--clients"])
        .arg(&clients)
        .args(["--mcp-client", "nobody"])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"nobody\""),
        "{out:?}"
    );
}
