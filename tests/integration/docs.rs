//! The docs are held to the code, both ways: every endpoint, type field,
//! error code, MCP tool and option the code has is documented, and
//! everything the docs list exists.
//!
//! * Endpoints: the router (`src/http/mod.rs`, `/mcp` in `src/server.rs`),
//!   the paths of `/openapi.json` and the `### `METHOD /path`` sections of
//!   `docs/api.md`, with each section's status codes.
//! * Types: every field (or enum value) of every component of
//!   `/openapi.json` and the tables of `docs/api.md`'s "Types".
//! * Error codes: what [`ExecError`] and the HTTP layer answer, and the
//!   table of `docs/api.md`'s "Error codes".
//! * MCP: the tools the server lists and their arguments, against
//!   `docs/api.md`, `docs/mcp.md` and the README's MCP section.
//! * Options: the command line, its variables and the TOML keys, against
//!   the README's options table; `[[envs]]` keys against theirs.
//!
//! A failure says what to add or remove; the options test prints the whole
//! expected table, ready to paste.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use code_executor::error::{ExecError, PoolError, WorkerError};
use serde_json::Value;

use crate::common::mcp::connect_in_process;

/// A file of the repository, read when the test runs.
fn repo_file(path: &str) -> String {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {full}: {e}"))
}

/// The part of `text` under the heading line `heading` (exactly, e.g.
/// `## Options`), up to the next heading of the same level or higher.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let start = text
        .lines()
        .scan(0, |offset, line| {
            let at = *offset;
            *offset += line.len() + 1;
            Some((at, line))
        })
        .find(|(_, line)| line.trim_end() == heading)
        .map(|(at, line)| at + line.len() + 1)
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    let rest = &text[start.min(text.len())..];
    let mut end = rest.len();
    let mut offset = 0;
    let mut in_code = false;
    for line in rest.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !in_code && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            end = offset;
            break;
        }
        offset += line.len() + 1;
    }
    &rest[..end]
}

/// The subsections of `text` at `level` (`###`): heading text -> body.
fn subsections(text: &str, level: usize) -> Vec<(String, String)> {
    let marker = format!("{} ", "#".repeat(level));
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && line.starts_with(&marker) {
            out.push((line[marker.len()..].trim().to_string(), String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            let hashes = line.chars().take_while(|c| *c == '#').count();
            if !in_code && hashes > 0 && hashes < level && line[hashes..].starts_with(' ') {
                break;
            }
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

/// The rows of the markdown tables in `text`, as cells, without header
/// rows and separator rows. A `\|` inside a cell is not a separator.
fn table_rows(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut header_next = true;
    for line in text.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            header_next = true;
            continue;
        }
        let mut cells = Vec::new();
        let mut cell = String::new();
        let mut chars = line[1..].chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    cell.push('|');
                    chars.next();
                }
                '|' => cells.push(std::mem::take(&mut cell).trim().to_string()),
                c => cell.push(c),
            }
        }
        if header_next {
            header_next = false;
            continue;
        }
        if cells
            .iter()
            .all(|c| c.chars().all(|c| matches!(c, '-' | ':')))
        {
            continue;
        }
        rows.push(cells);
    }
    rows
}

/// The code spans (`` `x` ``) of `text`.
fn code_spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The first column's code spans of every table row in `text`.
fn first_column(text: &str) -> BTreeSet<String> {
    table_rows(text)
        .iter()
        .filter_map(|row| row.first())
        .flat_map(|cell| code_spans(cell))
        .collect()
}

/// What is in `expected` but not in `found`, and the reverse, as lines.
fn differences<T: Ord + std::fmt::Debug>(
    what: &str,
    expected: &BTreeSet<T>,
    found: &BTreeSet<T>,
    missing_where: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for item in expected.difference(found) {
        out.push(format!("{what} {item:?} is missing from {missing_where}"));
    }
    for item in found.difference(expected) {
        out.push(format!(
            "{missing_where} lists {what} {item:?}, which does not exist"
        ));
    }
    out
}

fn assert_no_problems(problems: Vec<String>, hint: &str) {
    assert!(
        problems.is_empty(),
        "the docs and the code disagree:\n  {}\n{hint}",
        problems.join("\n  ")
    );
}

// ---------------------------------------------------------------- endpoints

/// `(METHOD, /path)` of every route `src/http/mod.rs` declares, with
/// `{*rest}` written `{rest}` as OpenAPI does.
fn routed_endpoints() -> BTreeSet<(String, String)> {
    let source = repo_file("src/http/mod.rs");
    let mut out = BTreeSet::new();
    for call in source.split(".route(\"").skip(1) {
        let (path, rest) = call.split_once('"').expect("a quoted route path");
        let args = rest.split(".route(").next().unwrap_or(rest);
        let args = args.split(".route_layer").next().unwrap_or(args);
        let path = path.replace("{*", "{");
        for method in ["get", "post", "put", "patch", "delete"] {
            let called = args
                .match_indices(&format!("{method}("))
                .any(|(at, _)| at == 0 || !args[..at].ends_with(char::is_alphanumeric));
            if called {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    assert!(out.len() > 10, "the route parser found only {out:?}");
    out
}

/// `(METHOD, /path)` of every operation of `/openapi.json`.
fn openapi_endpoints(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            out.insert((method.to_uppercase(), path.clone()));
        }
    }
    out
}

/// `### `METHOD /path`` sections of `docs/api.md`'s "Endpoints".
fn documented_endpoints(api: &str) -> BTreeMap<(String, String), String> {
    subsections(section(api, "## Endpoints"), 3)
        .into_iter()
        .map(|(heading, body)| {
            let spans = code_spans(&heading);
            let endpoint = spans
                .first()
                .and_then(|s| s.split_once(' '))
                .unwrap_or_else(|| {
                    panic!("endpoint heading {heading:?} is not `### `METHOD /path``")
                });
            ((endpoint.0.to_string(), endpoint.1.to_string()), body)
        })
        .collect()
}

#[test]
fn every_endpoint_is_routed_described_and_documented() {
    let doc = code_executor::http::openapi::document();
    let api = repo_file("docs/api.md");
    let routed = routed_endpoints();
    let described = openapi_endpoints(doc);
    let documented = documented_endpoints(&api);
    let mut problems = differences(
        "endpoint",
        &routed,
        &described,
        "/openapi.json (src/http/openapi.rs)",
    );
    problems.extend(differences(
        "endpoint",
        &described,
        &documented.keys().cloned().collect(),
        "docs/api.md (## Endpoints)",
    ));
    // Each section gives the statuses the document does, and names its
    // request and result types.
    for (endpoint, body) in &documented {
        let Some(operation) = doc["paths"][&endpoint.1][endpoint.0.to_lowercase()].as_object()
        else {
            continue;
        };
        let statuses: BTreeSet<String> = operation["responses"]
            .as_object()
            .expect("responses")
            .keys()
            .cloned()
            .collect();
        let listed: BTreeSet<String> = table_rows(body)
            .iter()
            .filter_map(|row| row.first())
            .filter(|cell| cell.len() == 3 && cell.chars().all(|c| c.is_ascii_digit()))
            .cloned()
            .collect();
        problems.extend(differences(
            "status",
            &statuses,
            &listed,
            &format!("the status table of {} {}", endpoint.0, endpoint.1),
        ));
        let mut types = Vec::new();
        if let Some(r) = operation
            .get("requestBody")
            .and_then(|b| b.pointer("/content/application~1json/schema/$ref"))
        {
            types.push(r);
        }
        for status in &statuses {
            if let Some(r) =
                operation["responses"][status].pointer("/content/application~1json/schema/$ref")
                && !status.starts_with(['4', '5'])
            {
                types.push(r);
            }
        }
        for r in types {
            let name = r.as_str().unwrap().rsplit('/').next().unwrap();
            if !body.contains(&format!("`{name}`")) {
                problems.push(format!(
                    "the section of {} {} does not name its type `{name}`",
                    endpoint.0, endpoint.1
                ));
            }
        }
    }
    // MCP's streamable HTTP endpoint is routed beside the API, described
    // in docs/api.md and docs/mcp.md, and not an OpenAPI path.
    assert!(
        repo_file("src/server.rs").contains("\"/mcp\""),
        "/mcp is no longer routed: update docs/api.md and this test"
    );
    assert!(
        doc["paths"].get("/mcp").is_none(),
        "/mcp is in /openapi.json"
    );
    assert!(
        section(&api, "## MCP").contains("`/mcp`"),
        "docs/api.md does not describe /mcp"
    );
    assert_no_problems(
        problems,
        "An endpoint needs its route, its #[utoipa::path] (listed in src/http/openapi.rs) and a \
         `### `METHOD /path`` section in docs/api.md with a status table.",
    );
}

// -------------------------------------------------------------------- types

/// The field names (or enum values) a component schema defines, if it
/// defines either.
fn schema_members(schema: &Value) -> Option<BTreeSet<String>> {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        return Some(props.keys().cloned().collect());
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return Some(
            values
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
        );
    }
    let variants = schema.get("oneOf").and_then(Value::as_array)?;
    let values: Option<BTreeSet<String>> = variants
        .iter()
        .map(|v| {
            v.get("const")
                .or_else(|| v.get("enum").and_then(|e| e.get(0)))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    values
}

#[test]
fn every_field_of_every_type_is_documented() {
    let doc = code_executor::http::openapi::document();
    let api = repo_file("docs/api.md");
    let types: BTreeMap<String, String> = subsections(section(&api, "## Types"), 3)
        .into_iter()
        .map(|(heading, body)| {
            let name = code_spans(&heading)
                .into_iter()
                .next()
                .unwrap_or_else(|| panic!("type heading {heading:?} is not `### `Name``"));
            (name, body)
        })
        .collect();
    let schemas = doc["components"]["schemas"]
        .as_object()
        .expect("components.schemas");
    let mut problems = differences(
        "type",
        &schemas.keys().cloned().collect(),
        &types.keys().cloned().collect(),
        "docs/api.md (## Types)",
    );
    for (name, schema) in schemas {
        let (Some(members), Some(body)) = (schema_members(schema), types.get(name)) else {
            continue;
        };
        problems.extend(differences(
            "field",
            &members,
            &first_column(body),
            &format!("the table of `{name}`"),
        ));
    }
    // Every $ref resolves (the schemars components included).
    let text = doc.to_string();
    for reference in text.split("\"$ref\":\"").skip(1) {
        let target = reference.split('"').next().unwrap();
        let name = target.trim_start_matches("#/components/schemas/");
        if !schemas.contains_key(name) {
            problems.push(format!("/openapi.json refers to {target}, which it lacks"));
        }
    }
    assert_no_problems(
        problems,
        "Each component of /openapi.json needs a `### `Name`` section in docs/api.md's Types \
         whose table lists exactly its fields (or enum values) in the first column.",
    );
}

/// Problems of `value` against `schema` of the document: a required field
/// missing, a field the schema does not define, a value of another type.
fn schema_problems(doc: &Value, schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
        let name = target.rsplit('/').next().unwrap();
        return schema_problems(doc, &doc["components"]["schemas"][name], value, at, out);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            let fits = options.iter().any(|option| {
                let mut inner = Vec::new();
                schema_problems(doc, option, value, at, &mut inner);
                inner.is_empty()
            });
            if !fits {
                out.push(format!("{at}: {value} fits none of {key}"));
            }
            return;
        }
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let actual = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let fits = types.is_empty()
        || types.contains(&actual)
        || (actual == "integer" && types.contains(&"number"));
    if !fits {
        out.push(format!("{at}: {actual} where the document says {types:?}"));
        return;
    }
    match value {
        Value::Object(fields) => {
            let props = schema.get("properties").and_then(Value::as_object);
            for required in schema["required"].as_array().into_iter().flatten() {
                let required = required.as_str().unwrap();
                if !fields.contains_key(required) {
                    out.push(format!("{at}.{required}: required, and missing"));
                }
            }
            for (name, field) in fields {
                let at = format!("{at}.{name}");
                match (
                    props.and_then(|p| p.get(name)),
                    schema.get("additionalProperties"),
                ) {
                    (Some(s), _) => schema_problems(doc, s, field, &at, out),
                    (None, Some(extra)) if extra.is_object() => {
                        schema_problems(doc, extra, field, &at, out)
                    }
                    (None, _) => out.push(format!("{at}: not in the document")),
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    schema_problems(doc, item, v, &format!("{at}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// The grading and session types, described by schemars rather than
/// utoipa, fit what the server answers and accepts.
#[tokio::test]
async fn the_grading_and_session_schemas_fit_real_answers() {
    let doc = code_executor::http::openapi::document();
    let server = crate::common::TestServer::with_config(code_executor::Config {
        pool_size: 1,
        ..crate::common::config()
    })
    .await;
    let schema_of = |method: &str, path: &str, status: u16| {
        doc["paths"][path][method]["responses"][status.to_string()]
            ["content"]["application/json"]["schema"]
            .clone()
    };
    let request_schema = |path: &str| {
        doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"].clone()
    };
    let grade = serde_json::json!({
        "code": "print(sum(map(int, input().split())))",
        "tests": [
            {"name": "small", "stdin": "1 2", "expected_stdout": "3"},
            {"stdin": "5 5", "expected_stdout": "11", "weight": 2},
            {"stdin": "x", "timeout": 5}
        ],
        "compare": "trim",
        "limits": {"memory_bytes": 1073741824}
    });
    let mut problems = Vec::new();
    let mut answers = Vec::new();
    schema_problems(
        doc,
        &request_schema("/grade"),
        &grade,
        "grade request",
        &mut problems,
    );
    let (status, body) = server.post("/grade", grade.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["cases"][1]["verdict"], "wrong_answer", "{body}");
    answers.push(("post", "/grade", status, body));
    let batch = serde_json::json!({"submissions": [grade.clone(), {"code": "1/0", "tests": [{}]}]});
    schema_problems(
        doc,
        &request_schema("/grade/batch"),
        &batch,
        "batch request",
        &mut problems,
    );
    let (status, body) = server.post("/grade/batch", batch).await;
    assert_eq!(status, 200, "{body}");
    answers.push(("post", "/grade/batch", status, body));
    let create = serde_json::json!({"ttl": 60, "timeout": 5, "limits": {"open_files": 256}});
    schema_problems(
        doc,
        &request_schema("/sessions"),
        &create,
        "session request",
        &mut problems,
    );
    let (status, body) = server.post("/sessions", create).await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    answers.push(("post", "/sessions", status, body));
    let (status, body) = server.get("/sessions").await;
    answers.push(("get", "/sessions", status, body));
    let (status, body) = server.delete(&format!("/sessions/{id}")).await;
    assert_eq!(body["closed"], true, "{body}");
    answers.push(("delete", "/sessions/{id}", status, body));
    let (status, body) = server
        .post("/grade", serde_json::json!({"code": "1"}))
        .await;
    assert_eq!(status, 400, "{body}");
    answers.push(("post", "/grade", status, body));
    for (method, path, status, body) in &answers {
        let schema = schema_of(method, path, *status);
        assert!(
            !schema.is_null(),
            "{method} {path} {status} is not in the document"
        );
        schema_problems(
            doc,
            &schema,
            body,
            &format!("{method} {path} {status}"),
            &mut problems,
        );
    }
    server.stop().await;
    assert_no_problems(
        problems,
        "/openapi.json's components and the answers disagree.",
    );
}

// -------------------------------------------------------------- error codes

/// Every `ExecError` variant, so that a new one fails to compile here until
/// it is documented. (`Encode`, whose frame error the crate keeps to itself,
/// is `internal` 500 as the other faults of the server are.)
fn exec_errors() -> Vec<ExecError> {
    let io = || std::io::Error::other("x");
    let all = vec![
        ExecError::BadRequest(String::new()),
        ExecError::TooLarge(String::new()),
        ExecError::UnknownEnv {
            name: String::new(),
            known: String::new(),
        },
        ExecError::DefaultEnvDeleted {
            name: String::new(),
            known: String::new(),
        },
        ExecError::Busy(PoolError::Busy(std::time::Duration::from_secs(1))),
        ExecError::EnvUnavailable {
            env: String::new(),
            reason: String::new(),
        },
        ExecError::Worker(WorkerError::Internal(String::new())),
        ExecError::ShuttingDown,
        ExecError::Draining {
            replica: String::new(),
        },
        ExecError::UnknownSession {
            message: String::new(),
            create_one: false,
        },
        ExecError::FixedBySession { field: "limits" },
        ExecError::TooManySessions {
            env: None,
            client: None,
            limit: 1,
        },
        ExecError::Forbidden(String::new()),
        ExecError::TooManyRequests {
            message: String::new(),
            retry_after: 1,
        },
        ExecError::AuditUnavailable(String::new()),
        ExecError::Cgroup(io()),
        ExecError::SessionId(io()),
        ExecError::Installer(io()),
        ExecError::Conflict(String::new()),
        ExecError::CreateFailed(String::new()),
        ExecError::EnvFiles(io()),
        // A part's code and status are its error's.
        ExecError::Part {
            part: "submission 1".into(),
            error: Box::new(ExecError::UnknownEnv {
                name: String::new(),
                known: String::new(),
            }),
        },
    ];
    for err in &all {
        match err {
            ExecError::BadRequest(_)
            | ExecError::TooLarge(_)
            | ExecError::UnknownEnv { .. }
            | ExecError::DefaultEnvDeleted { .. }
            | ExecError::Busy(_)
            | ExecError::EnvUnavailable { .. }
            | ExecError::Worker(_)
            | ExecError::ShuttingDown
            | ExecError::Draining { .. }
            | ExecError::UnknownSession { .. }
            | ExecError::FixedBySession { .. }
            | ExecError::TooManySessions { .. }
            | ExecError::Cgroup(_)
            | ExecError::Encode(_)
            | ExecError::SessionId(_)
            | ExecError::Installer(_)
            | ExecError::Forbidden(_)
            | ExecError::TooManyRequests { .. }
            | ExecError::AuditUnavailable(_)
            | ExecError::Conflict(_)
            | ExecError::CreateFailed(_)
            | ExecError::EnvFiles(_)
            | ExecError::Part { .. } => {}
        }
    }
    all
}

/// `(code, status)` of the errors the HTTP layer makes itself: every
/// `ApiError::new(StatusCode::X, "code", ...)` and `ApiError::bad_request`
/// in `src/http/`, and the JSON `503` past the connection cap.
fn http_layer_errors() -> BTreeSet<(String, u16)> {
    let mut out = BTreeSet::new();
    for file in [
        "src/http/mod.rs",
        "src/http/gate.rs",
        "src/http/guard.rs",
        "src/http/error.rs",
    ] {
        let source = repo_file(file);
        for call in source.split("StatusCode::").skip(1) {
            let (name, rest) = call.split_at(
                call.find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                    .unwrap_or(call.len()),
            );
            let rest = rest.trim_start();
            let Some(rest) = rest.strip_prefix(',') else {
                continue;
            };
            let rest = rest.trim_start();
            let Some(rest) = rest.strip_prefix('"') else {
                continue;
            };
            let code = rest.split('"').next().unwrap().to_string();
            let status = status_by_name(name).unwrap_or_else(|| {
                panic!("StatusCode::{name} in {file}: add it to status_by_name")
            });
            out.insert((code, status));
        }
        if source.contains("ApiError::bad_request(") {
            out.insert(("bad_request".into(), 400));
        }
    }
    let server = repo_file("src/server.rs");
    if let Some(rest) = server.split("{{\\\"code\\\":\\\"").nth(1) {
        let code = rest.split('\\').next().unwrap().to_string();
        out.insert((code, 503));
    }
    assert!(out.len() >= 6, "the error parser found only {out:?}");
    out
}

fn status_by_name(name: &str) -> Option<u16> {
    Some(match name {
        "BAD_REQUEST" => 400,
        "UNAUTHORIZED" => 401,
        "FORBIDDEN" => 403,
        "NOT_FOUND" => 404,
        "REQUEST_TIMEOUT" => 408,
        "PAYLOAD_TOO_LARGE" => 413,
        "TOO_MANY_REQUESTS" => 429,
        "INTERNAL_SERVER_ERROR" => 500,
        "SERVICE_UNAVAILABLE" => 503,
        _ => return None,
    })
}

#[test]
fn every_error_code_is_documented() {
    let mut codes: BTreeSet<(String, u16)> = exec_errors()
        .iter()
        .map(|e| (e.code().to_string(), e.status()))
        .collect();
    codes.extend(http_layer_errors());
    let api = repo_file("docs/api.md");
    let listed: BTreeSet<(String, u16)> = table_rows(section(&api, "## Error codes"))
        .iter()
        .filter_map(|row| {
            let code = code_spans(row.first()?).into_iter().next()?;
            let status = row.get(1)?.trim().parse().ok()?;
            Some((code, status))
        })
        .collect();
    assert_no_problems(
        differences(
            "error (code, status)",
            &codes,
            &listed,
            "docs/api.md (## Error codes)",
        ),
        "docs/api.md's Error codes table has one row per code and status: | `code` | status | when |",
    );
}

// ---------------------------------------------------------------------- MCP

/// The tools the server lists (with an admin token, so all of them): their
/// arguments, and the fields of their structured results.
async fn mcp_tools() -> BTreeMap<String, (BTreeSet<String>, Option<BTreeSet<String>>)> {
    let config = code_executor::Config {
        admin_token: Some("admin".into()),
        pool_size: 1,
        ..crate::common::config()
    };
    let executor = Arc::new(
        code_executor::Executor::start(&config)
            .await
            .expect("executor starts"),
    );
    let client = connect_in_process(executor.clone(), &config).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    let _ = client.cancel().await;
    executor.shutdown().await;
    tools
        .into_iter()
        .map(|tool| {
            let args = tool
                .input_schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            let output = tool.output_schema.as_ref().map(|s| {
                s.get("properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default()
            });
            (tool.name.to_string(), (args, output))
        })
        .collect()
}

#[tokio::test]
async fn every_mcp_tool_and_argument_is_documented() {
    let tools = mcp_tools().await;
    assert!(tools.len() >= 7, "{tools:?}");
    let doc = code_executor::http::openapi::document();
    let schemas = doc["components"]["schemas"]
        .as_object()
        .expect("components");
    let names: BTreeSet<String> = tools.keys().cloned().collect();
    let api = repo_file("docs/api.md");
    let mcp = repo_file("docs/mcp.md");
    let readme = repo_file("README.md");
    let mut problems = Vec::new();

    // docs/api.md: one `#### `tool`` section each, whose first table lists
    // exactly its arguments, naming its output type.
    let sections: BTreeMap<String, String> = subsections(section(&api, "### Tools"), 4)
        .into_iter()
        .filter_map(|(heading, body)| Some((code_spans(&heading).into_iter().next()?, body)))
        .collect();
    problems.extend(differences(
        "MCP tool",
        &names,
        &sections.keys().cloned().collect(),
        "docs/api.md (### Tools)",
    ));
    for (name, (args, output)) in &tools {
        let Some(body) = sections.get(name) else {
            continue;
        };
        problems.extend(differences(
            "argument",
            args,
            &first_column(body),
            &format!("docs/api.md's table of {name}"),
        ));
        // The result is a type of the HTTP API: the section names it.
        if let Some(fields) = output {
            let same: Vec<&String> = schemas
                .iter()
                .filter(|(_, s)| schema_members(s).as_ref() == Some(fields))
                .map(|(n, _)| n)
                .collect();
            if same.is_empty() {
                problems.push(format!(
                    "{name}'s structured result {fields:?} is no type of docs/api.md"
                ));
            } else if !same.iter().any(|n| body.contains(&format!("`{n}`"))) {
                problems.push(format!(
                    "docs/api.md's section of {name} does not name its result type (one of {same:?})"
                ));
            }
        }
    }

    // docs/mcp.md: one row per tool, its second column naming exactly the
    // tool's arguments.
    let rows = table_rows(section(&mcp, "## Tools"));
    let mut listed = BTreeSet::new();
    for row in &rows {
        let Some(name) = row.first().and_then(|c| code_spans(c).into_iter().next()) else {
            continue;
        };
        if let (Some((args, _)), Some(cell)) = (tools.get(&name), row.get(1)) {
            problems.extend(differences(
                "argument",
                args,
                &code_spans(cell).into_iter().collect(),
                &format!("docs/mcp.md's row of {name}"),
            ));
        }
        listed.insert(name);
    }
    problems.extend(differences(
        "MCP tool",
        &names,
        &listed,
        "docs/mcp.md (## Tools)",
    ));

    // The README's MCP section names every tool.
    let readme_mcp: BTreeSet<String> = code_spans(section(&readme, "## MCP")).into_iter().collect();
    for name in &names {
        if !readme_mcp.contains(name) {
            problems.push(format!("README's MCP section does not name {name}"));
        }
    }
    assert_no_problems(problems, "");
}

// ------------------------------------------------------------------ options

/// The fields a `Deserialize` struct reads: what its derived
/// `deserialize_struct` call names (skipped fields excluded).
fn serde_fields<T: serde::de::DeserializeOwned>() -> Vec<&'static str> {
    use serde::de::{Error as _, Visitor};
    use std::cell::RefCell;

    struct Fields<'a>(&'a RefCell<Vec<&'static str>>);

    impl<'de> serde::Deserializer<'de> for Fields<'_> {
        type Error = serde::de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Self::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.0.borrow_mut().extend_from_slice(fields);
            Err(Self::Error::custom("fields read"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    let fields = RefCell::new(Vec::new());
    let _ = T::deserialize(Fields(&fields));
    let fields = fields.into_inner();
    assert!(
        !fields.is_empty(),
        "{} is not a struct",
        std::any::type_name::<T>()
    );
    fields
}

/// One row of the options table: its flags, variables and TOML keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
struct OptionRow {
    flags: Vec<String>,
    variables: Vec<String>,
    keys: Vec<String>,
}

impl OptionRow {
    /// What the row is known by: its key, else its flag, else its variable.
    fn id(&self) -> String {
        self.keys
            .first()
            .or(self.flags.first())
            .or(self.variables.first())
            .cloned()
            .unwrap_or_default()
    }

    fn cell(items: &[String]) -> String {
        if items.is_empty() {
            return "–".into();
        }
        items
            .iter()
            .map(|i| format!("`{i}`"))
            .collect::<Vec<_>>()
            .join(", then ")
    }
}

/// Variables read outside the command line's definition, by the option (or
/// the file) they set:
/// * the three that choose the default environment, below every flag
///   (`HostEnv::from_process`, see `code_executor::config`'s docs), the
///   most specific first;
/// * `CODE_EXECUTOR_DEFAULTS` (a file of defaults beneath the config file,
///   `HostEnv::from_process`) and `CODE_EXECUTOR_LOG` (the log filter,
///   `main.rs`), which are no option.
const SEPARATE_VARIABLES: [(&str, &[&str]); 5] = [
    ("conda_env", &["CODE_EXECUTOR_CONDA_ENV", "CONDA_ENV_NAME"]),
    ("conda_prefix", &["CODE_EXECUTOR_CONDA_PREFIX"]),
    ("python", &["CODE_EXECUTOR_PYTHON"]),
    ("CODE_EXECUTOR_DEFAULTS", &["CODE_EXECUTOR_DEFAULTS"]),
    ("CODE_EXECUTOR_LOG", &["CODE_EXECUTOR_LOG"]),
];

/// Every row the options table must have, by id.
fn expected_option_rows() -> BTreeMap<String, (OptionRow, String)> {
    use clap::CommandFactory;
    let mut rows = BTreeMap::new();
    let separate: BTreeMap<&str, &[&str]> = SEPARATE_VARIABLES.into_iter().collect();
    let docs = code_executor::config::option_docs();
    for doc in &docs {
        let mut row = OptionRow {
            flags: vec![doc.flag.clone()],
            variables: doc.variable.iter().cloned().collect(),
            keys: if doc.key.is_empty() {
                vec![]
            } else {
                vec![doc.key.clone()]
            },
        };
        if let Some(vars) = separate.get(doc.key.as_str()) {
            assert!(
                row.variables.is_empty(),
                "{} now reads {:?} through clap: update SEPARATE_VARIABLES",
                doc.key,
                row.variables
            );
            row.variables = vars.iter().map(|v| v.to_string()).collect();
        }
        rows.insert(row.id(), (row, doc.help.clone()));
    }
    // Flags of `serve` and `mcp` beyond the options (`--check-config`,
    // `--shared`).
    let cli = code_executor::config::Cli::command();
    let commands = ["serve", "mcp"].map(|name| cli.find_subcommand(name).expect("a subcommand"));
    for arg in commands
        .iter()
        .flat_map(|c| c.get_arguments())
        .filter(|a| !a.is_hide_set())
    {
        let Some(long) = arg.get_long() else { continue };
        let flag = format!("--{long}");
        if docs.iter().any(|d| d.flag == flag) {
            continue;
        }
        let row = OptionRow {
            flags: vec![flag],
            variables: arg
                .get_env()
                .map(|v| v.to_string_lossy().into_owned())
                .into_iter()
                .collect(),
            keys: vec![],
        };
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        rows.insert(row.id(), (row, help));
    }
    // TOML keys with no flag (`envs`).
    for key in serde_fields::<code_executor::config::Options>() {
        if !docs.iter().any(|d| d.key == key) {
            let row = OptionRow {
                keys: vec![key.to_string()],
                ..OptionRow::default()
            };
            rows.insert(row.id(), (row, "file only".to_string()));
        }
    }
    for (name, vars) in SEPARATE_VARIABLES {
        if name.starts_with("CODE_EXECUTOR_") {
            let row = OptionRow {
                variables: vars.iter().map(|v| v.to_string()).collect(),
                ..OptionRow::default()
            };
            rows.insert(row.id(), (row, String::new()));
        }
    }
    rows
}

/// The header every options table starts with, in the README and docs/.
const OPTIONS_HEADER: &str = "| flag | environment variable | TOML key |";

/// Every options table of `text`.
fn option_tables(text: &str) -> Vec<&str> {
    text.match_indices(OPTIONS_HEADER)
        .map(|(start, _)| {
            let table = &text[start..];
            &table[..table.find("\n\n").unwrap_or(table.len())]
        })
        .collect()
}

/// The rows of an options table, with their default and meaning cells. A
/// flag's or variable's placeholder (`--max-sessions N`) is dropped.
fn option_rows(table: &str) -> Vec<(OptionRow, String, String)> {
    table_rows(table)
        .into_iter()
        .map(|cells| {
            let get = |i: usize| {
                cells
                    .get(i)
                    .map(|c| {
                        code_spans(c)
                            .iter()
                            .filter_map(|s| s.split_whitespace().next())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let row = OptionRow {
                flags: get(0),
                variables: get(1),
                keys: get(2),
            };
            let default = cells.get(3).cloned().unwrap_or_default();
            let meaning = cells.get(4).cloned().unwrap_or_default();
            (row, default, meaning)
        })
        .collect()
}

/// The options tables of docs/ name real options the way the code does
/// (each lists some of them).
#[test]
fn the_options_tables_of_the_docs_agree_with_the_code() {
    let expected = expected_option_rows();
    let mut problems = Vec::new();
    let mut tables = 0;
    let dir = format!("{}/docs", env!("CARGO_MANIFEST_DIR"));
    for entry in std::fs::read_dir(&dir).expect("docs/") {
        let path = entry.expect("a docs/ entry").path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let name = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
        let text = repo_file(&name);
        for table in option_tables(&text) {
            tables += 1;
            for (row, _, _) in option_rows(table) {
                let id = row.id();
                match expected.get(&id) {
                    None => problems.push(format!("{name} lists {id:?}, which is no option")),
                    Some((want, _)) if *want != row => problems.push(format!(
                        "{name}'s row for {id:?} says {} | {} | {}, the code says {} | {} | {}",
                        OptionRow::cell(&row.flags),
                        OptionRow::cell(&row.variables),
                        OptionRow::cell(&row.keys),
                        OptionRow::cell(&want.flags),
                        OptionRow::cell(&want.variables),
                        OptionRow::cell(&want.keys),
                    )),
                    Some(_) => {}
                }
            }
        }
    }
    assert!(tables >= 3, "only {tables} options tables in docs/");
    assert_no_problems(problems, "");
}

#[test]
fn the_options_table_lists_every_flag_variable_and_key() {
    let readme = repo_file("README.md");
    let expected = expected_option_rows();
    let options = section(&readme, "## Options");
    let tables = option_tables(options);
    assert_eq!(
        tables.len(),
        1,
        "README's Options section has {} tables starting {OPTIONS_HEADER}",
        tables.len()
    );
    let found = option_rows(tables[0]);
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (row, _, _) in &found {
        let id = row.id();
        match expected.get(&id) {
            None => problems.push(format!(
                "README's options table has a row for {id:?}, which no flag, variable or key is"
            )),
            Some((want, _)) if want != row => problems.push(format!(
                "README's row for {id:?} says {} | {} | {}, the code says {} | {} | {}",
                OptionRow::cell(&row.flags),
                OptionRow::cell(&row.variables),
                OptionRow::cell(&row.keys),
                OptionRow::cell(&want.flags),
                OptionRow::cell(&want.variables),
                OptionRow::cell(&want.keys),
            )),
            Some(_) => {}
        }
        if !seen.insert(id.clone()) {
            problems.push(format!("README's options table has {id:?} twice"));
        }
    }
    for id in expected.keys() {
        if !seen.contains(id) {
            problems.push(format!("README's options table has no row for {id:?}"));
        }
    }
    if !problems.is_empty() {
        // The whole table as it should be: existing rows keep their
        // default and meaning, new ones get the help text.
        let known: BTreeMap<String, (String, String)> = found
            .iter()
            .map(|(row, d, m)| (row.id(), (d.clone(), m.clone())))
            .collect();
        let mut table = String::from(
            "| flag | environment variable | TOML key | default | meaning |\n|---|---|---|---|---|\n",
        );
        let order: Vec<&String> = found
            .iter()
            .map(|(row, _, _)| row.id())
            .filter(|id| expected.contains_key(id))
            .filter_map(|id| expected.get_key_value(&id).map(|(k, _)| k))
            .chain(expected.keys().filter(|id| !known.contains_key(*id)))
            .collect();
        let mut done = BTreeSet::new();
        for id in order {
            if !done.insert(id) {
                continue;
            }
            let (row, help) = &expected[id];
            let (default, meaning) = known
                .get(id)
                .cloned()
                .unwrap_or_else(|| ("?".into(), help.clone()));
            table.push_str(&format!(
                "| {} | {} | {} | {default} | {meaning} |\n",
                OptionRow::cell(&row.flags),
                OptionRow::cell(&row.variables),
                OptionRow::cell(&row.keys),
            ));
        }
        println!("{table}");
    }
    assert_no_problems(
        problems,
        "The expected table is printed above (run with --nocapture); fill in the `?` defaults.",
    );
}

/// `[[envs]]` keys: the fields of `EnvTable`, listed in the README and
/// docs/configuration.md, each parsing in a table, an unknown one refused.
#[test]
fn the_envs_tables_list_every_key() {
    let keys: BTreeSet<String> = serde_fields::<code_executor::config::EnvTable>()
        .into_iter()
        .map(str::to_string)
        .collect();
    let mut problems = Vec::new();
    for key in &keys {
        let text = format!("[[envs]]\n{key} = {{}}\n");
        let err = code_executor::config::parse_file(&text)
            .err()
            .unwrap_or_default();
        assert!(!err.contains("unknown field"), "[[envs]] {key}: {err}");
    }
    let err = code_executor::config::parse_file("[[envs]]\nname = 'a'\nno_such_key = 1\n")
        .expect_err("an unknown [[envs]] key is refused");
    assert!(err.contains("unknown field"), "{err}");
    let readme = repo_file("README.md");
    let options = section(&readme, "## Options");
    let start = options
        .find("| `[[envs]]` key |")
        .expect("README's [[envs]] table (| `[[envs]]` key | ...)");
    let table = &options[start..];
    let end = table.find("\n\n").unwrap_or(table.len());
    problems.extend(differences(
        "[[envs]] key",
        &keys,
        &first_column(&table[..end]),
        "README's [[envs]] table",
    ));
    let configuration = repo_file("docs/configuration.md");
    problems.extend(differences(
        "[[envs]] key",
        &keys,
        &first_column(section(&configuration, "## `[[envs]]` tables")),
        "docs/configuration.md's [[envs]] table",
    ));
    assert_no_problems(problems, "");
}

#[test]
fn the_readme_points_to_the_reference_in_the_repository() {
    let readme = repo_file("README.md");
    assert!(
        readme.contains("(docs/api.md)"),
        "README links no docs/api.md"
    );
    assert!(
        !readme.contains("shared documents"),
        "README still points outside the repository"
    );
}

// ------------------------------------------------------- the checks check

/// The helpers above find what they must: a table row, a section's end, a
/// drifted list.
#[test]
fn the_doc_parsers_catch_drift() {
    let text = "# T\n## A\n| x | y |\n|---|---|\n| `a`, `b` | 1 \\| 2 |\n\n## B\n### `c`\n| n |\n|---|\n| `d` |\n";
    assert_eq!(
        first_column(section(text, "## A")),
        ["a", "b"].map(String::from).into()
    );
    assert_eq!(table_rows(section(text, "## A"))[0][1], "1 | 2");
    assert!(!section(text, "## A").contains("`d`"));
    let subs = subsections(section(text, "## B"), 3);
    assert_eq!(subs.len(), 1);
    assert_eq!(first_column(&subs[0].1), ["d"].map(String::from).into());
    let expected: BTreeSet<&str> = ["a", "b"].into();
    let found: BTreeSet<&str> = ["b", "c"].into();
    let diff = differences("x", &expected, &found, "doc");
    assert_eq!(diff.len(), 2, "{diff:?}");
    assert!(diff[0].contains("\"a\" is missing"), "{diff:?}");
    assert!(diff[1].contains("\"c\", which does not exist"), "{diff:?}");
}
