//! MCP interoperability with the official Python SDK: `tests/mcp_client/client.py`
//! (pinned `mcp` from `requirements.txt`, installed by `setup.sh` into
//! `target/tmp/mcp-venv`) drives the server over stdio and over streamable
//! HTTP and reports what it saw; the assertions are here.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use code_executor::Config;
use code_executor::testing::EnvSpec;
use serde_json::{Value, json};
use tokio::process::Command;
use tokio::sync::OnceCell;

use crate::common::{TestServer, config, processes_mentioning, python};
use crate::mcp::wait_until_gone;

const CLIENT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client");

/// The venv interpreter with the pinned SDK, set up once per test run (and
/// reused across runs). A failed install fails the test.
async fn sdk_python() -> &'static Path {
    static SDK: OnceCell<PathBuf> = OnceCell::const_new();
    SDK.get_or_init(|| sdk_venv("mcp-venv", "requirements.txt", "import mcp, httpx2"))
        .await
}

/// The venv interpreter with the last 1.x SDK (`requirements-v1.txt`).
async fn sdk_v1_python() -> &'static Path {
    static SDK: OnceCell<PathBuf> = OnceCell::const_new();
    SDK.get_or_init(|| {
        sdk_venv(
            "mcp-v1-venv",
            "requirements-v1.txt",
            "import mcp.client.streamable_http",
        )
    })
    .await
}

/// `setup.sh` for the venv `name` with `requirements`, which must `import`
/// as `check` says; its interpreter.
async fn sdk_venv(name: &str, requirements: &str, check: &str) -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let out = Command::new("bash")
        .arg(format!("{CLIENT_DIR}/setup.sh"))
        .arg(&venv)
        .arg(format!("{CLIENT_DIR}/{requirements}"))
        .env("MCP_TEST_PYTHON", python())
        .env("MCP_IMPORT_CHECK", check)
        .output()
        .await
        .expect("bash runs tests/mcp_client/setup.sh");
    assert!(
        out.status.success(),
        "installing the Python MCP SDK ({requirements}) failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("setup.sh prints the venv python")
            .trim(),
    )
}

/// Run client.py with `args`; its JSON report.
pub(crate) async fn run_client(args: Vec<OsString>) -> Value {
    let sdk = sdk_python().await;
    let run = Command::new(sdk)
        .arg(format!("{CLIENT_DIR}/client.py"))
        .args(&args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("the Python client finishes within 90 s")
        .expect("the Python client starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "client.py {args:?} failed ({}):\n{stderr}",
        out.status
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("client.py printed no JSON report ({e}):\n{stdout}\n{stderr}"))
}

pub(crate) fn default_env_name() -> String {
    EnvSpec::from_interpreter(&python(), None)
        .expect("the test interpreter resolves")
        .name
}

/// What every transport must show a Python SDK client.
fn check_report(report: &Value) {
    let env = default_env_name();
    assert!(
        report["protocol_version"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    );
    assert_eq!(report["server_name"], "code-executor");
    let instructions = report["instructions"].as_str().unwrap_or("");
    assert!(instructions.contains(&format!("`{env}`")), "{instructions}");

    let tools = report["tools"].as_object().expect("tools");
    assert_eq!(
        tools.keys().collect::<Vec<_>>(),
        [
            "close_session",
            "create_session",
            "execute_code",
            "grade_code",
            "list_environments",
            "list_packages"
        ]
    );
    let exec = &tools["execute_code"];
    assert_eq!(exec["input_schema"]["required"], json!(["code"]));
    assert!(exec["input_schema"]["properties"]["files"].is_object());
    assert!(exec["output_schema"]["properties"]["exit_code"].is_object());
    assert!(
        exec["description"]
            .as_str()
            .unwrap_or("")
            .contains("clean state")
    );

    // Image artifacts arrive as image content.
    let image = &report["image"];
    assert_eq!(image["is_error"], false, "{image}");
    assert_eq!(image["content"][0]["type"], "image", "{image}");
    assert_eq!(image["content"][0]["mime"], "image/png");
    assert!(
        image["content"][0]["data"]
            .as_str()
            .unwrap_or("")
            .starts_with("iVBORw0KGgo")
    );
    assert_eq!(image["structured"]["artifacts"][0]["path"], "pixel.png");

    // With a progress token, output chunks arrive as progress notifications
    // before the result; the result itself is unchanged.
    let progress = &report["progress"];
    assert_eq!(
        progress["result"]["text"], "tick\ntock\n[exit code 0]",
        "{progress}"
    );
    let events = progress["events"].as_array().expect("progress events");
    let tick = events
        .iter()
        .find(|e| e["message"].as_str().is_some_and(|m| m.contains("tick")))
        .unwrap_or_else(|| panic!("no progress event carries the first output: {progress}"));
    assert_eq!(
        tick["message"].as_str().unwrap().trim_end(),
        "[stdout] tick"
    );
    let before_end = progress["elapsed_s"].as_f64().unwrap() - tick["after_s"].as_f64().unwrap();
    assert!(
        before_end >= 0.3,
        "first chunk arrived only {before_end} s before the result"
    );

    let calls = &report["calls"];
    let success = &calls["success"];
    assert_eq!(success["is_error"], false, "{success}");
    assert_eq!(success["text"], "4\n[exit code 0]");
    assert_eq!(success["structured"]["stdout"], "4\n");
    assert_eq!(success["structured"]["exit_code"], 0);

    let syntax = &calls["syntax_error"];
    assert_eq!(syntax["is_error"], true, "{syntax}");
    let shown = syntax["text"].as_str().unwrap_or("");
    assert!(
        shown.contains("SyntaxError") && shown.ends_with("[exit code 1]"),
        "{shown}"
    );

    let zero = &calls["zero_division"];
    assert_eq!(zero["is_error"], true, "{zero}");
    let shown = zero["text"].as_str().unwrap_or("");
    assert!(shown.starts_with("before\n[stderr]\nTraceback"), "{shown}");
    assert!(
        shown.contains("ZeroDivisionError: division by zero"),
        "{shown}"
    );
    assert_eq!(zero["structured"]["exit_code"], 1);

    let timeout = &calls["timeout"];
    assert_eq!(timeout["is_error"], true, "{timeout}");
    assert_eq!(timeout["text"], "(no output)\n[timed out after 1 s]");
    assert_eq!(timeout["structured"]["timed_out"], true);
    assert!(timeout["elapsed_s"].as_f64().unwrap() < 5.0, "{timeout}");

    let unknown = &calls["unknown_env"];
    assert_eq!(unknown["is_error"], true, "{unknown}");
    assert_eq!(
        unknown["text"],
        format!(
            "error (unknown_env): unknown environment \"no-such-env\"; known environments: {env}"
        )
    );

    assert_eq!(
        calls["files_and_stdin"]["text"],
        "from file from stdin\n[exit code 0]"
    );
    let bad = &calls["bad_args"];
    assert_eq!(bad["is_error"], true, "{bad}");
    assert!(
        bad["text"]
            .as_str()
            .unwrap_or("")
            .contains("unknown field `cod`"),
        "{bad}"
    );

    let envs = &report["list_environments"];
    assert_eq!(envs["is_error"], false);
    assert_eq!(envs["structured"]["envs"][0]["name"], env.as_str());

    let cancel = &report["cancel"];
    assert_eq!(cancel["seen_running"], true, "{cancel}");
    assert!(
        cancel["client_error"]
            .as_str()
            .unwrap_or("")
            .contains("timed out"),
        "{cancel}"
    );
    let gone = cancel["gone_after_s"].as_f64();
    assert!(
        gone.is_some_and(|s| s < 2.0),
        "run not killed promptly: {cancel}"
    );
    assert_eq!(cancel["after"]["text"], "alive\n[exit code 0]");
}

#[tokio::test]
async fn python_sdk_over_stdio() {
    let tmp = tempfile::tempdir().unwrap();
    let mut tmpdir = OsString::from("TMPDIR=");
    tmpdir.push(tmp.path());
    let report = run_client(vec![
        "stdio".into(),
        env!("CARGO_BIN_EXE_code-executor").into(),
        python().into(),
        tmpdir,
        "CODE_EXECUTOR_LOG=warn".into(),
    ])
    .await;
    check_report(&report);
    // The server, its workers and the cancelled run are all gone.
    wait_until_gone(tmp.path(), Duration::from_secs(3)).await;
}

#[tokio::test]
async fn python_sdk_over_shared_stdio_launches() {
    // Two launches of one configuration with sharing on (by its variable),
    // each the SDK's whole exercise: the second finds the first's server.
    let runtime = tempfile::tempdir().unwrap();
    let mut xdg = OsString::from("XDG_RUNTIME_DIR=");
    xdg.push(runtime.path());
    let mut servers = Vec::new();
    for _ in 0..2 {
        let report = run_client(vec![
            "stdio".into(),
            env!("CARGO_BIN_EXE_code-executor").into(),
            python().into(),
            xdg.clone(),
            "CODE_EXECUTOR_MCP_SHARED=1".into(),
            "CODE_EXECUTOR_MCP_SHARED_IDLE=60".into(),
            "CODE_EXECUTOR_LOG=warn".into(),
        ])
        .await;
        check_report(&report);
        let sockets = crate::mcp_shared::sockets_in(runtime.path());
        assert_eq!(sockets.len(), 1, "{sockets:?}");
        servers.push(crate::mcp_shared::server_pid(&sockets[0]));
    }
    assert_eq!(servers[0], servers[1], "one server served both launches");
    // SIGTERM stops it: its workers and the runs the SDK cancelled are gone.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(servers[0] as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_until_gone(runtime.path(), Duration::from_secs(15)).await;
    assert_eq!(
        crate::mcp_shared::sockets_in(runtime.path()),
        Vec::<PathBuf>::new()
    );
}

#[tokio::test]
async fn python_sdk_over_streamable_http() {
    let server = TestServer::with_config(Config {
        token: Some("s3cret".into()),
        ..config()
    })
    .await;
    let report = run_client(vec![
        "http".into(),
        format!("{}/mcp", server.url).into(),
        "s3cret".into(),
    ])
    .await;
    check_report(&report);

    let concurrent = report["concurrent"].as_array().expect("concurrent results");
    assert_eq!(concurrent.len(), 10);
    for (i, result) in concurrent.iter().enumerate() {
        assert_eq!(result["is_error"], false, "{result}");
        assert_eq!(result["text"], format!("{}\n[exit code 0]", i * i));
    }

    let marker = report["cancel"]["marker"].as_str().unwrap();
    assert!(processes_mentioning(marker.as_ref()).is_empty());
    let pool = server.wait_for_pool_size(2, Duration::from_secs(10)).await;
    assert_eq!(pool["busy"], 0, "{pool}");
    server.stop().await;
}

#[tokio::test]
async fn every_output_chunk_reaches_the_python_sdk_coalesced_and_in_order() {
    let report = run_client(vec![
        "progress".into(),
        env!("CARGO_BIN_EXE_code-executor").into(),
        python().into(),
    ])
    .await;
    // Five quick lines, twenty times: all five arrive, in order, before the
    // result, however the server groups them.
    let want: String = (0..5).map(|i| format!("line {i}\n")).collect();
    for (round, messages) in report["quick"].as_array().unwrap().iter().enumerate() {
        let got: String = messages
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m.as_str()
                    .unwrap()
                    .strip_prefix("[stdout] ")
                    .unwrap_or_else(|| panic!("round {round}: {m}"))
                    .to_string()
            })
            .collect();
        assert_eq!(got, want, "round {round}: {messages}");
    }
    // A flood: at most one notification per 100 ms of the call (plus the
    // last), and no text lost.
    let flood = &report["flood"];
    let messages = flood["messages"].as_array().unwrap();
    let seconds = flood["seconds"].as_f64().unwrap();
    let bound = (seconds / 0.1).ceil() as usize + 2;
    assert!(
        messages.len() <= bound,
        "{} notifications in {seconds} s (bound {bound})",
        messages.len()
    );
    let text: String = messages
        .iter()
        .map(|m| {
            m.as_str()
                .unwrap()
                .strip_prefix("[stdout] ")
                .unwrap()
                .to_string()
        })
        .collect();
    let want: String = (0..100_000).map(|i| format!("{i}\n")).collect();
    assert_eq!(text.len(), want.len());
    assert!(
        text == want,
        "the flood's text differs from what was printed"
    );
    assert_eq!(flood["structured_stdout_len"], want.len());
}

#[tokio::test]
async fn the_last_1x_python_sdk_works_over_stdio_and_http() {
    let sdk = sdk_v1_python().await;
    let mut server_config = config();
    server_config.token = Some("v1-token".into());
    let server = TestServer::with_config(server_config).await;
    let script = format!("{CLIENT_DIR}/client_v1.py");
    for args in [
        vec![
            "stdio".to_string(),
            env!("CARGO_BIN_EXE_code-executor").to_string(),
            python().display().to_string(),
        ],
        vec![
            "http".into(),
            format!("{}/mcp", server.url),
            "v1-token".into(),
        ],
    ] {
        let out = Command::new(sdk)
            .arg(&script)
            .args(&args)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(90), out)
            .await
            .expect("the 1.x client finishes within 90 s")
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap())
                .unwrap();
        assert_eq!(report["server_name"], "code-executor", "{report}");
        assert!(
            report["tools"]
                .as_array()
                .unwrap()
                .contains(&json!("execute_code")),
            "{report}"
        );
        assert_eq!(report["text"], "4\n[exit code 0]", "{report}");
        assert_eq!(report["structured_stdout"], "4\n");
        let progress: String = report["progress"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m.as_str()
                    .unwrap()
                    .trim_start_matches("[stdout] ")
                    .to_string()
            })
            .collect();
        assert_eq!(
            progress, "line 0\nline 1\nline 2\nline 3\nline 4\n",
            "{report}"
        );
        let link = report["links"][0].as_str().unwrap();
        assert!(link.starts_with("artifact://"), "{report}");
        assert_eq!(report["read"]["mime"], "image/png");
        assert!(
            report["read"]["blob"]
                .as_str()
                .unwrap()
                .starts_with("iVBORw0KGgo")
        );
        assert!(
            report["resources"]
                .as_array()
                .unwrap()
                .contains(&json!(link))
        );
    }
    server.stop().await;
}

/// `mcp-inspector` of the pinned MCP Inspector (npm), installed once per
/// machine under the target directory (a file lock keeps nextest's processes
/// from installing it together). A failed install fails the test.
fn inspector() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mcp-inspector");
    let script = format!(
        r#"set -euo pipefail
mkdir -p "{dir}"; exec 9>"{dir}.lock"; flock 9
bin="{dir}/node_modules/.bin/mcp-inspector"
if [ -x "$bin" ]; then exit 0; fi
cd "{dir}" && npm install --no-audit --no-fund --silent @modelcontextprotocol/inspector@2.12.0 >&2
"#,
        dir = dir.display()
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "installing the MCP Inspector failed (npm is needed):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("node_modules/.bin/mcp-inspector")
}

/// One Inspector CLI call (`inspector --cli <options> code-executor mcp
/// <flags> --python … --pool-size 1 --method <method>`): its JSON answer.
fn inspector_call(
    inspector: &Path,
    options: &[OsString],
    flags: &[&str],
    method: &[&str],
) -> Value {
    let out = std::process::Command::new(inspector)
        .arg("--cli")
        .args(options)
        .arg(env!("CARGO_BIN_EXE_code-executor"))
        .arg("mcp")
        .args(flags)
        .arg("--python")
        .arg(python())
        .args(["--pool-size", "1", "--method"])
        .args(method)
        .env("CODE_EXECUTOR_LOG", "warn")
        .output()
        .expect("the inspector runs");
    assert!(
        out.status.success(),
        "{method:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap_or_else(|e| panic!("{method:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test]
async fn the_mcp_inspector_cli_lists_tools_and_resources_and_runs_code() {
    let inspector = inspector();
    let run = |method: &[&str]| inspector_call(&inspector, &[], &[], method);
    let tools = run(&["tools/list"]);
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"execute_code"), "{names:?}");
    let resources = run(&["resources/list"]);
    assert_eq!(resources["resources"], json!([]), "{resources}");
    let templates = run(&["resources/templates/list"]);
    assert_eq!(
        templates["resourceTemplates"][0]["uriTemplate"], "artifact://{run}/{path}",
        "{templates}"
    );
    let called = run(&[
        "tools/call",
        "--tool-name",
        "execute_code",
        "--tool-arg",
        "code=print(2+2)",
    ]);
    assert_eq!(called["content"][0]["text"], "4\n[exit code 0]", "{called}");
    assert_eq!(called["structuredContent"]["stdout"], "4\n");
}

#[tokio::test]
async fn inspector_cli_calls_share_a_server_and_its_artifacts_with_shared() {
    // Each Inspector CLI call is a launch; with --shared they reach one
    // server, so an artifact one call made is listed and read by the next.
    let inspector = inspector();
    let runtime = tempfile::tempdir().unwrap();
    // The Inspector gives the server its own short environment plus what
    // `-e` names.
    let mut xdg = std::ffi::OsString::from("XDG_RUNTIME_DIR=");
    xdg.push(runtime.path());
    let run = |method: &[&str]| {
        inspector_call(
            &inspector,
            &["-e".into(), xdg.clone()],
            &["--shared"],
            method,
        )
    };
    let called = run(&[
        "tools/call",
        "--tool-name",
        "execute_code",
        "--tool-arg",
        "code=open('note.txt', 'w').write('kept by the shared server')",
    ]);
    let uri = called["structuredContent"]["artifacts"][0]["uri"]
        .as_str()
        .unwrap_or_else(|| panic!("an artifact: {called}"))
        .to_string();
    let sockets = crate::mcp_shared::sockets_in(runtime.path());
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    let server = crate::mcp_shared::server_pid(&sockets[0]);

    let listed = run(&["resources/list"]);
    let uris: Vec<&str> = listed["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    assert_eq!(uris, [uri.as_str()], "{listed}");
    let read = run(&["resources/read", "--uri", &uri]);
    let contents = &read["contents"][0];
    let bytes = match (contents["text"].as_str(), contents["blob"].as_str()) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(blob)) => {
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, blob).unwrap()
        }
        _ => panic!("no content: {read}"),
    };
    assert_eq!(bytes, b"kept by the shared server");
    assert_eq!(crate::mcp_shared::server_pid(&sockets[0]), server);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_until_gone(runtime.path(), Duration::from_secs(15)).await;
}
