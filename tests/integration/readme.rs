//! The README's curl example works verbatim against `--conda-prefix …/target_env`,
//! and `.ci/run` runs the test command the README gives.

use std::time::Duration;

use serde_json::json;

use crate::common::{self, TestServer};

#[tokio::test]
async fn seed_curl_example_runs_in_the_named_conda_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("target_env");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::create_dir_all(prefix.join("conda-meta")).unwrap();
    std::os::unix::fs::symlink(common::python(), prefix.join("bin/python")).unwrap();
    let server = TestServer::with_config(code_executor::Config {
        env: code_executor::config::EnvChoice::CondaPrefix(prefix.clone()),
        ..common::config()
    })
    .await;
    // curl -X POST http://localhost:8080/execute -H "Content-Type: application/json" \
    //      -d '{"code": "print(2+2)", "env": "target_env"}'
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .header("Content-Type", "application/json")
        .body(r#"{"code": "print(2+2)", "env": "target_env"}"#)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["stdout"], "4\n");
    assert_eq!(body["exit_code"], 0);

    // The activation variables of that env are what the code sees.
    let (_, body) = server
        .execute(json!({"code": "import os; print(os.environ['CONDA_DEFAULT_ENV'], os.environ['CONDA_PREFIX'])", "env": "target_env"}))
        .await;
    let canonical = prefix.canonicalize().unwrap();
    assert_eq!(
        body["stdout"],
        format!("target_env {}\n", canonical.display())
    );
    server.stop().await;
}

/// The command of the first `sh` block after "Run the tests" in the README.
fn readme_test_command(readme: &str) -> String {
    let after = readme
        .split_once("Run the tests")
        .expect("README says how to run the tests")
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a sh block with the test command")
        .0;
    block.trim().to_string()
}

#[test]
fn ci_runs_the_readmes_test_command_and_times_it() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let ci = std::fs::read_to_string(format!("{root}/.ci/run")).unwrap();
    let command = readme_test_command(&readme);
    assert_eq!(
        command, "cargo nextest run",
        "README's test command changed"
    );
    let runs: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("cargo nextest") || l.starts_with("cargo test"))
        .collect();
    assert_eq!(
        runs,
        [command.as_str()],
        ".ci/run must run exactly the README's test command"
    );
    // The wall time is printed on the way out, whatever the suite's status.
    let timing = ci
        .lines()
        .position(|l| l.starts_with("trap ") && l.contains("suite took"))
        .expect(".ci/run prints the suite's wall time");
    let run = ci.lines().position(|l| l.trim() == command).unwrap();
    assert!(
        timing < run,
        "the timing trap must be set before the suite runs"
    );
}
