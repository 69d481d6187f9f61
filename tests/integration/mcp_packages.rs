//! MCP package tools: `list_packages` for everyone, `install_packages` only
//! with an admin token (and over HTTP only for a caller presenting it).

use serde_json::json;

use crate::common::mcp::{call, connect_http, text};
use crate::common::{TestServer, config};

#[tokio::test]
async fn list_packages_reports_the_default_environment() {
    let server = TestServer::start().await;
    let client = connect_http(&format!("{}/mcp", server.url), None).await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    assert!(
        !names.contains(&"install_packages".to_string()),
        "{names:?}"
    );

    let result = call(&client, "list_packages", json!({})).await.unwrap();
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    let packages = result.structured_content.clone().unwrap()["packages"].clone();
    let names: Vec<&str> = packages
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().any(|n| n.eq_ignore_ascii_case("pip")),
        "{names:?}"
    );
    assert!(
        text(&result).lines().any(|l| l.starts_with("pip==")),
        "{}",
        text(&result)
    );

    let result = call(&client, "list_packages", json!({"env": "nope"}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true));
    assert!(text(&result).contains("unknown_env"), "{}", text(&result));
    let _ = client.cancel().await;
    server.stop().await;
}

#[tokio::test]
async fn install_packages_needs_the_admin_token_over_http() {
    let server = TestServer::with_config(code_executor::Config {
        token: Some("user-token".into()),
        admin_token: Some("admin-token".into()),
        ..config()
    })
    .await;
    let url = format!("{}/mcp", server.url);

    // A user-token client sees the tool but may not use it.
    let user = connect_http(&url, Some("user-token")).await;
    let tools = user.list_all_tools().await.unwrap();
    let install = tools
        .iter()
        .find(|t| t.name == "install_packages")
        .expect("listed with an admin token configured");
    assert!(install.input_schema.get("properties").unwrap()["packages"].is_object());
    let result = call(
        &user,
        "install_packages",
        json!({"packages": ["--version"]}),
    )
    .await
    .unwrap();
    assert_eq!(result.is_error, Some(true));
    assert!(text(&result).contains("forbidden"), "{}", text(&result));
    let _ = user.cancel().await;

    // The admin passes the check; an option smuggled in as a package is refused
    // before anything runs.
    let admin = connect_http(&url, Some("admin-token")).await;
    let result = call(
        &admin,
        "install_packages",
        json!({"packages": ["--version;", "echo", "INJECTED"]}),
    )
    .await
    .unwrap();
    assert_eq!(result.is_error, Some(true));
    let shown = text(&result);
    assert!(shown.contains("bad_request"), "{shown}");
    assert!(!shown.contains("INJECTED\n"), "{shown}");
    let _ = admin.cancel().await;
    server.stop().await;
}
