//! MCP clients on rmcp for the tests (and the end-to-end benchmark, which can
//! include this file with `#[path]`): in process, over a spawned server's
//! stdio, and over streamable HTTP. Self-contained: rmcp, tokio, serde_json.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use code_executor::Config;
use code_executor::Executor;
use code_executor::mcp::McpHandler;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio::process::{Child, Command};

/// A connected MCP client.
pub type McpClient = RunningService<RoleClient, ()>;

/// An [`McpHandler`] over `executor`, connected to a client through an
/// in-memory pipe.
pub async fn connect_in_process(executor: Arc<Executor>, config: &Config) -> McpClient {
    let handler = McpHandler::new(executor, config);
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        if let Ok(running) = handler.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("MCP handshake in process")
}

/// Spawn `binary mcp <args>` and speak MCP over its stdin/stdout. Dropping
/// the client (or `cancel()`) closes the server's stdin.
pub async fn connect_stdio(
    binary: &Path,
    args: &[&str],
    envs: &[(&str, &Path)],
) -> (McpClient, Child) {
    let mut child = Command::new(binary)
        .arg("mcp")
        .args(args)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .env("CODE_EXECUTOR_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("server binary starts");
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let client = ().serve((stdout, stdin)).await.expect("MCP handshake over stdio");
    (client, child)
}

/// Connect to the streamable HTTP endpoint `url` (`http://host:port/mcp`).
pub async fn connect_http(url: &str, token: Option<&str>) -> McpClient {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    ().serve(transport)
        .await
        .expect("MCP handshake over streamable HTTP")
}

/// Call `execute_code` with `args` (a JSON object).
pub async fn execute_code(client: &McpClient, args: Value) -> Result<CallToolResult, ServiceError> {
    call(client, "execute_code", args).await
}

/// Call tool `name` with `args` (a JSON object).
pub async fn call(
    client: &McpClient,
    name: &str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    let Value::Object(args) = args else {
        panic!("tool arguments must be a JSON object, got {args}");
    };
    client
        .call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(args))
        .await
}

/// The text blocks of a result, joined by newlines.
pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n")
}
