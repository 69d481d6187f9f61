//! The HTTP surface: JSON errors for bad input, health, list-envs, auth.

use serde_json::{Value, json};

use crate::common::{self, TestServer};

async fn raw_post(server: &TestServer, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    (status, json)
}

fn assert_error(status: u16, body: &Value, want_status: u16, code: &str, mentions: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = crate::common::error_message(body);
    assert!(
        message.contains(mentions),
        "message {message:?} lacks {mentions:?}"
    );
}

#[tokio::test]
async fn bad_requests_get_json_errors() {
    let server = TestServer::with_config(code_executor::Config {
        max_body_bytes: 64 * 1024,
        ..common::config()
    })
    .await;
    let (s, b) = raw_post(&server, "{not json").await;
    assert_error(s, &b, 400, "bad_request", "invalid JSON");
    let (s, b) = raw_post(&server, r#"{"env": "x"}"#).await;
    assert_error(s, &b, 400, "bad_request", "missing field `code`");
    let (s, b) = raw_post(&server, r#"{"code": 5}"#).await;
    assert_error(s, &b, 400, "bad_request", "invalid type");
    let (s, b) = raw_post(&server, "").await;
    assert_error(s, &b, 400, "bad_request", "invalid JSON");
    // An array of the fields in order is not a request.
    let (s, b) = raw_post(&server, r#"["print(7)"]"#).await;
    assert_error(s, &b, 400, "bad_request", "expected a JSON object");
    let (s, b) = raw_post(&server, "  5").await;
    assert_error(s, &b, 400, "bad_request", "invalid type");

    let big = json!({"code": "x = '".to_string() + &"a".repeat(100 * 1024) + "'"}).to_string();
    let (s, b) = raw_post(&server, big.clone()).await;
    assert_error(s, &b, 413, "too_large", "size limit");
    // The body guard's answers carry the request id too.
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .header("content-type", "application/json")
        .header("x-request-id", "too-big-1")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.headers()["x-request-id"], "too-big-1");

    let (s, b) = server.execute(json!({"code": "1", "env": "nope"})).await;
    assert_error(s, &b, 404, "unknown_env", "\"nope\"");
    let (_, envs) = server.get("/list-envs").await;
    let name = envs["envs"][0]["name"].as_str().unwrap();
    assert!(crate::common::error_message(&b).contains(name), "{b}");

    for (files, mentions) in [
        (json!({"../x": "a"}), "leaves the working directory"),
        (json!({"/etc/x": "a"}), "must be relative"),
        (json!({"a": {"base64": "%%%"}}), "invalid base64"),
    ] {
        let (s, b) = server.execute(json!({"code": "1", "files": files})).await;
        assert_error(s, &b, 400, "bad_request", mentions);
    }
    let (s, b) = server.execute(json!({"code": "1", "timeout": -1})).await;
    assert_error(s, &b, 400, "bad_request", "timeout");

    // Form-encoded curl bodies still parse as JSON.
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(r#"{"code": "print(2+2)"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let (s, b) = server.get("/no-such-route").await;
    assert_error(s, &b, 404, "not_found", "no such route");
    server.stop().await;
}

#[tokio::test]
async fn health_and_list_envs_report_the_pool() {
    let server = TestServer::start().await;
    let (status, envs) = server.get("/list-envs").await;
    assert_eq!(status, 200);
    let env = &envs["envs"][0];
    let name = env["name"].as_str().unwrap();
    let (status, health) = server.get("/health").await;
    assert_eq!(status, 200);
    assert_eq!(health["status"], "ok");
    let pool = &health["envs"][name];
    assert_eq!(
        (
            pool["size"].as_u64(),
            pool["idle"].as_u64(),
            pool["busy"].as_u64()
        ),
        (Some(2), Some(2), Some(0))
    );

    assert_eq!(env["default"], true);
    assert!(["python", "venv", "conda"].contains(&env["kind"].as_str().unwrap()));
    let version = env["python_version"].as_str().unwrap();
    assert!(version.starts_with("3."), "{version}");
    assert_eq!(env["pool"]["size"], 2);

    // The env is also addressable by its name and by its prefix.
    let prefix = env["prefix"].as_str().unwrap().to_string();
    for name in [name, prefix.as_str()] {
        let (s, b) = server
            .execute(json!({"code": "import sys; print(sys.prefix)", "env": name}))
            .await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["stdout"].as_str().unwrap().trim(), prefix);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_configured_token_guards_execution_but_not_health() {
    let server = TestServer::with_config(code_executor::Config {
        token: Some("s3cret".into()),
        ..common::config()
    })
    .await;
    let (s, b) = server.execute(json!({"code": "print(1)"})).await;
    assert_error(s, &b, 401, "unauthorized", "bearer token");
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .bearer_auth("wrong")
        .json(&json!({"code": "print(1)"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .bearer_auth("s3cret")
        .json(&json!({"code": "print(1)"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (s, _) = server.get("/health").await;
    assert_eq!(s, 200);
    server.stop().await;
}

#[tokio::test]
async fn an_array_in_place_of_a_nested_object_is_refused_naming_the_field() {
    let server = TestServer::start().await;
    // serde would fill each of these structs from an array of its fields
    // in order; every one is refused with the field's name.
    let refusals = [
        (
            "/execute",
            json!({"code": "1", "limits": [1]}),
            "limits must be a JSON object ({...}), not an array",
        ),
        (
            "/execute",
            json!({"code": "1", "network": [[]]}),
            "network must be a JSON object ({...}), not an array",
        ),
        (
            "/execute",
            json!({"code": "1", "files": {"a.txt": ["aGk="]}}),
            "every value of files must be a string or {\"base64\": \"...\"}",
        ),
        (
            "/sessions",
            json!({"limits": []}),
            "limits must be a JSON object ({...}), not an array",
        ),
        (
            "/sessions",
            json!({"network": [[]]}),
            "network must be a JSON object ({...}), not an array",
        ),
        (
            "/grade",
            json!({"code": "1", "tests": [{}, ["x"]]}),
            "every item of tests must be a JSON object ({...}), not an array",
        ),
        (
            "/grade",
            json!({"code": "1", "tests": [{}], "limits": [1]}),
            "limits must be a JSON object ({...}), not an array",
        ),
        (
            "/grade",
            json!({"code": "1", "tests": [{}], "checker": ["def check(*a):\n    return True\n"]}),
            "checker must be a JSON object ({...}), not an array",
        ),
        (
            "/grade",
            json!({"code": "1", "tests": [{"files": {"a": ["aGk="]}}]}),
            "every value of files must be a string or {\"base64\": \"...\"}",
        ),
        (
            "/grade/batch",
            json!({"submissions": [["print(1)", null, null, "pass"]]}),
            "every item of submissions must be a JSON object ({...}), not an array",
        ),
    ];
    for (path, body, mentions) in refusals {
        let (s, b) = server.post(path, body.clone()).await;
        assert_eq!(s, 400, "{path} {body} -> {b}");
        assert_eq!(b["error"]["code"], "bad_request", "{b}");
        let message = crate::common::error_message(&b);
        assert!(
            message.starts_with("invalid JSON body: ") && message.contains(mentions),
            "{path} {body}: {message:?} lacks {mentions:?}"
        );
    }
    // The objects themselves are read as before.
    let (s, b) = server
        .execute(
            json!({"code": "print(open('a.txt').read())", "limits": {"cpu_seconds": 5},
                        "files": {"a.txt": {"base64": "aGk="}}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["stdout"], "hi\n", "{b}");
    server.stop().await;
}

#[tokio::test]
async fn a_value_of_the_wrong_type_is_refused_naming_its_field() {
    let server = TestServer::start().await;
    let refusals = [
        (
            "/execute",
            r#"{"code": "1", "limits": {"memory_bytes": "NaN"}}"#,
            "field `limits.memory_bytes`: invalid type: string \"NaN\"",
        ),
        (
            "/execute",
            r#"{"code": "1", "limits": {"cpu_seconds": -1}}"#,
            "field `limits.cpu_seconds`: invalid value: integer `-1`",
        ),
        (
            "/execute",
            r#"{"code": "1", "limits": {"processes": 1.5}}"#,
            "field `limits.processes`: invalid type: floating point `1.5`",
        ),
        (
            "/execute",
            r#"{"code": "1", "limits": {"file_size_bytes": 1e400}}"#,
            "field `limits.file_size_bytes`: number out of range",
        ),
        (
            "/execute",
            r#"{"code": "1", "timeout": "5"}"#,
            "field `timeout`: invalid type: string \"5\"",
        ),
        (
            "/grade",
            r#"{"code": "1", "tests": [{}, {"timeout": true}]}"#,
            "field `tests[1].timeout`: invalid type: boolean `true`",
        ),
        (
            "/sessions",
            r#"{"limits": {"open_files": [64]}}"#,
            "field `limits.open_files`: invalid type: sequence",
        ),
    ];
    for (path, body, mentions) in refusals {
        let resp = server
            .client
            .post(format!("{}{path}", server.url))
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(status, 400, "{path} {body} -> {answer}");
        assert_eq!(answer["error"]["code"], "bad_request", "{answer}");
        let message = common::error_message(&answer);
        assert!(
            message.starts_with("invalid JSON body: ") && message.contains(mentions),
            "{path} {body}: {message:?} lacks {mentions:?}"
        );
    }
    // A zero names its field too.
    let (status, answer) = server
        .execute(json!({"code": "1", "limits": {"memory_bytes": 0}}))
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        common::error_message(&answer),
        "limits.memory_bytes must be positive"
    );
    server.stop().await;
}
