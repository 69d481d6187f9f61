//! The README's curl example works verbatim against `--conda-prefix …/target_env`.

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
        env: code_executor::env::EnvChoice::CondaPrefix(prefix.clone()),
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
