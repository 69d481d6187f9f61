//! `POST /execute` as server-sent events.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::common::{self, TestServer};

/// One parsed event and when it arrived.
struct Received {
    event: String,
    data: String,
    at: Instant,
}

async fn stream_events(
    server: &TestServer,
    body: Value,
    accept_header: bool,
) -> (u16, Vec<Received>) {
    let mut request = server
        .client
        .post(format!("{}/execute", server.url))
        .json(&body);
    if accept_header {
        request = request.header("accept", "text/event-stream");
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    let mut events = Vec::new();
    let mut buffer = String::new();
    let mut bytes = resp.bytes_stream();
    while let Some(chunk) = bytes.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = buffer.find("\n\n") {
            let raw: String = buffer.drain(..end + 2).collect();
            let mut event = String::from("message");
            let mut data = Vec::new();
            for line in raw.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim_start().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                }
            }
            if !data.is_empty() {
                let mut data = data.join("\n");
                if event == "stdout" || event == "stderr" {
                    // Output chunks are JSON strings.
                    data = serde_json::from_str::<String>(&data).expect("chunk is a JSON string");
                }
                events.push(Received {
                    event,
                    data,
                    at: Instant::now(),
                });
            }
        }
    }
    (status, events)
}

#[tokio::test]
async fn output_chunks_arrive_while_the_run_goes_on() {
    let server = TestServer::start().await;
    output_streams_as_the_code_writes_it(&server, json!({})).await;
    server.stop().await;
}

/// A request (`extra`, with its code added) whose code prints, sleeps a
/// second and prints again: its output chunks arrive as they are written.
async fn output_streams_as_the_code_writes_it(server: &TestServer, extra: Value) {
    let code = "import time, sys\nprint(1, flush=True)\ntime.sleep(1)\nprint('oops', file=sys.stderr, flush=True)\nprint(2)";
    let mut request = extra;
    request["code"] = json!(code);
    let (status, events) = stream_events(server, request, true).await;
    assert_eq!(status, 200);
    let first = events
        .iter()
        .find(|e| e.event == "stdout")
        .expect("a stdout event");
    // print() may write "1" and "\n" separately: chunks are as the run wrote them.
    assert!(first.data.starts_with('1'), "{}", first.data);
    let result = events.last().unwrap();
    assert_eq!(result.event, "result");
    let gap = result.at - first.at;
    assert!(
        gap >= Duration::from_millis(500),
        "the first chunk came only {gap:?} before the result"
    );
    let stdout: String = events
        .iter()
        .filter(|e| e.event == "stdout")
        .map(|e| e.data.as_str())
        .collect();
    assert_eq!(stdout, "1\n2\n");
    let stderr: String = events
        .iter()
        .filter(|e| e.event == "stderr")
        .map(|e| e.data.as_str())
        .collect();
    assert_eq!(stderr, "oops\n");
    // The result event is the whole non-streaming result.
    let result: Value = serde_json::from_str(&result.data).unwrap();
    assert_eq!(result["stdout"], "1\n2\n");
    assert_eq!(result["stderr"], "oops\n");
    assert_eq!(result["exit_code"], 0);
}

#[tokio::test]
async fn streamed_text_is_the_results_text_even_after_an_invalid_byte() {
    // An invalid byte, then "€" written in two parts with a pause between:
    // the events' text joined is the result's stdout, "€" whole.
    let server = TestServer::start().await;
    let code =
        "import os, time\nos.write(1, b'\\xff\\xe2\\x82')\ntime.sleep(0.3)\nos.write(1, b'\\xacz')";
    let (status, events) = stream_events(&server, json!({"code": code}), true).await;
    assert_eq!(status, 200);
    let streamed: Vec<&str> = events
        .iter()
        .filter(|e| e.event == "stdout")
        .map(|e| e.data.as_str())
        .collect();
    let result: Value = serde_json::from_str(&events.last().unwrap().data).unwrap();
    assert_eq!(result["stdout"], "\u{fffd}€z");
    assert_eq!(streamed.concat(), "\u{fffd}€z", "events: {streamed:?}");
    server.stop().await;
}

#[tokio::test]
async fn stream_flag_in_the_body_also_streams_and_refusals_keep_their_status() {
    let server = TestServer::start().await;
    let (status, events) = stream_events(
        &server,
        json!({"code": "print('x')\n1+1", "stream": true}),
        false,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(events[0].event, "stdout");
    let result: Value = serde_json::from_str(&events.last().unwrap().data).unwrap();
    assert_eq!(result["result"], "2");

    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .header("accept", "text/event-stream")
        .json(&json!({"code": "1", "env": "nope"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_env");

    // A worker crash mid-stream ends it with an error event. (A run cannot
    // kill its own worker, pid 1 of its pid namespace: kill them from here.)
    let base = server.executor.base_dir().to_path_buf();
    let killer = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        for pid in crate::common::processes_mentioning(&base) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    });
    let (_, events) = stream_events(
        &server,
        json!({"code": "print('a', flush=True)\nimport time; time.sleep(5)", "stream": true}),
        false,
    )
    .await;
    killer.await.unwrap();
    let last = events.last().unwrap();
    assert_eq!(last.event, "error");
    let err: Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(err["error"]["code"], "internal");
    server.stop().await;
}

/// `POST /execute` with `body` and the header `Accept: accept`: the
/// answer's `Content-Type` and text (its status must be 200).
async fn execute_accepting(server: &TestServer, accept: &str, body: Value) -> (String, String) {
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .header("accept", accept)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "Accept: {accept}");
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
    (content_type, resp.text().await.unwrap())
}

/// `Accept: text/event-stream` streams whatever the body's `stream` says:
/// `"stream": false` does not turn it off, and an Accept that lists JSON
/// first streams too. Without the header, `"stream": false` is JSON, and so
/// with one that refuses events (`q=0`) or lists only a type that merely
/// begins like theirs.
#[tokio::test]
async fn the_accept_header_streams_even_when_the_body_says_stream_false() {
    let server = TestServer::start().await;
    for accept in [
        "text/event-stream",
        "application/json, text/event-stream",
        "application/json;q=0.9, Text/Event-Stream ; q=0.5",
    ] {
        let body = json!({"code": "print('x')\n1+1", "stream": false});
        let (content_type, text) = execute_accepting(&server, accept, body).await;
        assert_eq!(content_type, "text/event-stream", "Accept: {accept}");
        assert!(
            text.starts_with("event: stdout\ndata: \"x")
                && text.contains("event: result\ndata: {\"stdout\":\"x\\n\""),
            "Accept: {accept}: {text}"
        );
    }
    let (status, body) = server
        .execute(json!({"code": "print('x')", "stream": false}))
        .await;
    assert_eq!(
        (status, body["stdout"].as_str()),
        (200, Some("x\n")),
        "{body}"
    );
    for accept in [
        "application/json, text/event-stream;q=0",
        "text/event-stream; q=0.000",
        "text/event-streams, application/json",
    ] {
        let (content_type, text) =
            execute_accepting(&server, accept, json!({"code": "print('x')"})).await;
        assert_eq!(content_type, "application/json", "Accept: {accept}");
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["stdout"], "x\n", "Accept: {accept}: {body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_its_run() {
    let server = TestServer::start().await;
    // A sleep with a duration no other process uses marks the run's subprocess.
    let marker = format!("1000.{}", std::process::id());
    let code = format!(
        "import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\nprint('started', flush=True)\ntime.sleep(60)"
    );
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .json(&json!({"code": code, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut bytes = resp.bytes_stream();
    let first = bytes.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("started"));
    let started = Instant::now();
    while common::processes_mentioning(std::path::Path::new(&marker)).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the run's subprocess never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(bytes);
    let deadline = Instant::now() + Duration::from_secs(3);
    while !common::processes_mentioning(std::path::Path::new(&marker)).is_empty() {
        assert!(Instant::now() < deadline, "the run outlived its client");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.wait_for_pool_size(2, Duration::from_secs(3)).await;
    assert_eq!(server.run("print('ok')").await["stdout"], "ok\n");
    server.stop().await;
}

#[tokio::test]
async fn a_session_call_streams_its_output_as_it_goes() {
    let server = TestServer::start().await;
    let (status, info) = server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{info}");
    output_streams_as_the_code_writes_it(&server, json!({ "session": info["id"] })).await;
    server.stop().await;
}

/// The text of every event named `name`, joined.
fn joined(events: &[Received], name: &str) -> String {
    events
        .iter()
        .filter(|e| e.event == name)
        .map(|e| e.data.as_str())
        .collect()
}

#[tokio::test]
async fn output_cut_inside_a_character_ends_on_a_whole_one() {
    // 1000 bytes of output: "a" and 499 "é" fit, the 500th "é" is cut in two.
    let server = TestServer::with_config(code_executor::Config {
        max_output_bytes: 1000,
        ..common::config()
    })
    .await;
    let code = "import sys\nsys.stdout.write('a' + 'é' * 5000)\nsys.stderr.write('€' * 5000)";
    let (status, plain) = server.execute(json!({ "code": code })).await;
    assert_eq!(status, 200, "{plain}");
    let (status, events) = stream_events(&server, json!({ "code": code }), true).await;
    assert_eq!(status, 200);
    let streamed: Value = serde_json::from_str(&events.last().unwrap().data).unwrap();
    let stdout = format!("a{}", "é".repeat(499));
    let stderr = "€".repeat(333);
    for result in [&plain, &streamed] {
        assert_eq!(result["stdout"], stdout, "{result}");
        assert_eq!(result["stderr"], stderr, "{result}");
        assert_eq!(result["truncated"], true, "{result}");
        assert_eq!(result["limit"], "output", "{result}");
    }
    assert_eq!(joined(&events, "stdout"), stdout);
    assert_eq!(joined(&events, "stderr"), stderr);
    server.stop().await;
}

#[tokio::test]
async fn a_character_left_incomplete_at_the_end_is_streamed_as_the_result_has_it() {
    // The run ends with the first two bytes of "€": the result replaces
    // them, and so do the events, which end as the result does.
    let server = TestServer::start().await;
    let code = "import os\nos.write(1, b'a\\xe2\\x82')\nos.write(2, b'\\xe2')";
    let (status, events) = stream_events(&server, json!({ "code": code }), true).await;
    assert_eq!(status, 200);
    let result: Value = serde_json::from_str(&events.last().unwrap().data).unwrap();
    assert_eq!(result["stdout"], "a\u{fffd}", "{result}");
    assert_eq!(result["stderr"], "\u{fffd}", "{result}");
    assert_eq!(joined(&events, "stdout"), "a\u{fffd}");
    assert_eq!(joined(&events, "stderr"), "\u{fffd}");
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_reads_nothing_does_not_hold_the_run_past_its_timeout() {
    let server = TestServer::start().await;
    // A small receive buffer, and output that SSE makes six times larger
    // (every byte a `\u0001` escape): the stream cannot fit in the sockets.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let address = server.url.trim_start_matches("http://").parse().unwrap();
    let mut stream = socket.connect(address).await.unwrap();
    let body = json!({
        "code": "import sys, time\nwhile True:\n    sys.stdout.write(chr(1) * 4000)\n    sys.stdout.flush()\n    time.sleep(0.001)",
        "timeout": 2,
        "stream": true,
    })
    .to_string();
    let request = format!(
        "POST /execute HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
        .await
        .unwrap();
    // Unread, the run still ends at its timeout and its worker serves on.
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut seen_busy = false;
    loop {
        let pool = server.pool().await;
        if pool["busy"] == 0 && seen_busy {
            break;
        }
        seen_busy |= pool["busy"] == 1;
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "the run outlived its 2 s timeout by far: {pool}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Read at last, the stream ends with the run's result.
    let mut answer = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut answer),
    )
    .await
    .expect("the stream ends")
    .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let last = answer
        .rsplit("\n\n")
        .find(|event| !event.trim().is_empty())
        .unwrap();
    let data = last
        .strip_prefix("event: result\ndata: ")
        .unwrap_or_else(|| panic!("the last event is no result: {:?}", &last[..200]));
    let result: Value = serde_json::from_str(data).unwrap();
    assert_eq!(result["timed_out"], true);
    assert_eq!(result["limit"], "timeout");
    assert_eq!(result["truncated"], true);
    let wall_ms = result["duration_ms"].as_f64().unwrap();
    assert!(wall_ms < 5000.0, "ran {wall_ms} ms");
    assert_eq!(server.run("print('ok')").await["stdout"], "ok\n");
    server.stop().await;
}
