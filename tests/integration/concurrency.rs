//! Many clients at once on a small pool: every request answered, correctly.

use serde_json::json;

use crate::common::{self, TestServer};

#[tokio::test]
async fn fifty_concurrent_requests_on_a_pool_of_four_all_answer_correctly() {
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 4,
        ..common::config()
    })
    .await;
    let requests = (0..50).map(|i| {
        let server = &server;
        async move {
            let code =
                format!("import time, os\ntime.sleep(0.01)\nprint({i} * {i}, os.getpid() > 1)");
            let (status, body) = server.execute(json!({ "code": code })).await;
            (i, status, body)
        }
    });
    let results = futures_util::future::join_all(requests).await;
    for (i, status, body) in results {
        assert_eq!(status, 200, "request {i}: {body}");
        assert_eq!(body["stdout"], format!("{} True\n", i * i), "request {i}");
    }
    let pool = server.pool().await;
    assert_eq!(pool["size"], 4, "{pool}");
    assert_eq!(pool["busy"], 0, "{pool}");
    server.stop().await;
}
