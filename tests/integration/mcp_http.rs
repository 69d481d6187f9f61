//! The streamable HTTP transport of `/mcp` as the specification has it, on
//! raw HTTP: ending an MCP session with `DELETE`, and taking a call's event
//! stream up again with `Last-Event-ID`.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::common::TestServer;

const VERSION: &str = "2025-11-25";

/// One server-sent event: its `id` and its `data`.
#[derive(Debug)]
struct Event {
    id: Option<String>,
    data: String,
}

/// Events of an event stream as they arrive.
struct Events {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buffer: String,
}

impl Events {
    fn new(resp: reqwest::Response) -> Events {
        Events {
            body: Box::pin(resp.bytes_stream()),
            buffer: String::new(),
        }
    }

    /// The next event, `None` when the stream ended (or `within` passed).
    async fn next(&mut self, within: Duration) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = Event {
                    id: None,
                    data: String::new(),
                };
                for line in block.lines() {
                    if let Some(id) = line.strip_prefix("id:") {
                        event.id = Some(id.trim().to_string());
                    } else if let Some(data) = line.strip_prefix("data:") {
                        event.data.push_str(data.trim_start());
                    }
                }
                return Some(event);
            }
            let chunk = tokio::time::timeout(within, self.body.next())
                .await
                .ok()??
                .ok()?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Every event until the stream ends; panics past `within`.
    async fn rest(&mut self, within: Duration) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + within;
        let mut events = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(!left.is_zero(), "the stream did not end: {events:?}");
            match self.next(left).await {
                Some(event) => events.push(event),
                None => return events,
            }
        }
    }
}

/// A request to `/mcp` with the headers of a client of this revision, in
/// MCP session `session` if given.
fn request(
    server: &TestServer,
    method: reqwest::Method,
    session: Option<&str>,
) -> reqwest::RequestBuilder {
    let mut req = server
        .client
        .request(method, format!("{}/mcp", server.url))
        .header("accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", VERSION);
    if let Some(session) = session {
        req = req.header("Mcp-Session-Id", session);
    }
    req
}

/// Open an MCP session (`initialize`, then `notifications/initialized`);
/// its `Mcp-Session-Id`.
async fn open_session(server: &TestServer) -> String {
    let resp = request(server, reqwest::Method::POST, None)
        .json(&json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let session = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let events = Events::new(resp).rest(Duration::from_secs(10)).await;
    assert!(
        events.iter().any(|e| e.data.contains("\"serverInfo\"")),
        "{events:?}"
    );
    let resp = request(server, reqwest::Method::POST, Some(&session))
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    session
}

#[tokio::test]
async fn deleting_an_unknown_or_ended_mcp_session_answers_404() {
    let server = TestServer::start().await;
    let delete = async |session: &str| {
        request(&server, reqwest::Method::DELETE, Some(session))
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(delete("no-such-session").await, 404);
    let session = open_session(&server).await;
    assert_eq!(delete(&session).await, 202);
    // Ended: every request naming it gets 404, as the specification asks.
    assert_eq!(delete(&session).await, 404);
    let resp = request(&server, reqwest::Method::POST, Some(&session))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // A DELETE without a session id is still the client's mistake (400).
    let resp = request(&server, reqwest::Method::DELETE, None)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    server.stop().await;
}

/// A client that lost a call's event stream takes it up with the id of the
/// last event it read, and gets every later event once: none again.
#[tokio::test]
async fn a_resumed_call_stream_sends_no_event_twice() {
    let server = TestServer::start().await;
    let session = open_session(&server).await;
    let code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')";
    let resp = request(&server, reqwest::Method::POST, Some(&session))
        .json(&json!({
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {
                "name": "execute_code",
                "arguments": {"code": code},
                "_meta": {"progressToken": "p"},
            },
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut events = Events::new(resp);
    // Read up to the progress notification of the first line, then leave.
    let last = loop {
        let event = events
            .next(Duration::from_secs(10))
            .await
            .expect("the progress of the first line");
        if event.data.contains("[stdout] first") {
            break event;
        }
    };
    drop(events);
    let last_id = last.id.clone().expect("events carry ids");

    let resp = request(&server, reqwest::Method::GET, Some(&session))
        .header("accept", "text/event-stream")
        .header("Last-Event-ID", &last_id)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resumed = Events::new(resp).rest(Duration::from_secs(15)).await;
    let ids: Vec<&str> = resumed.iter().filter_map(|e| e.id.as_deref()).collect();
    assert!(
        !ids.contains(&last_id.as_str()),
        "{last_id} again: {resumed:?}"
    );
    assert!(
        !resumed.iter().any(|e| e.data.contains("[stdout] first")),
        "{resumed:?}"
    );
    let results: Vec<Value> = resumed
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
        .filter(|m| m["id"] == 7)
        .collect();
    assert_eq!(results.len(), 1, "{resumed:?}");
    assert_eq!(
        results[0]["result"]["structuredContent"]["stdout"], "first\nsecond\n",
        "{resumed:?}"
    );
    server.stop().await;
}
