//! POST /execute: output, exit status and exceptions as `python script.py` gives them.

use crate::common::TestServer;

#[tokio::test]
async fn print_returns_stdout_and_exit_code_zero() {
    let server = TestServer::start().await;
    let body = server.run("print(2+2)").await;
    assert_eq!(body["stdout"], "4\n");
    assert_eq!(body["stderr"], "");
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["timed_out"], false);
    assert_eq!(body["truncated"], false);
    assert!(body["signal"].is_null());
    assert!(body["duration_ms"].as_f64().unwrap() > 0.0);
    server.stop().await;
}
