//! Stateful sessions over HTTP: persistence, isolation, TTL, caps, interrupts,
//! losses, ordering and shutdown.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, TestServer};

async fn create(server: &TestServer, body: Value) -> String {
    let (status, info) = server.post("/sessions", body).await;
    assert_eq!(status, 201, "{info}");
    info["id"].as_str().expect("an id").to_string()
}

async fn call(server: &TestServer, id: &str, code: &str) -> (u16, Value) {
    server.execute(json!({"code": code, "session": id})).await
}

async fn ok(server: &TestServer, id: &str, code: &str) -> Value {
    let (status, body) = call(server, id, code).await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn variables_imports_functions_and_files_persist() {
    let server = TestServer::start().await;
    let (status, info) = server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{info}");
    assert!(
        info["expires_at"].as_str().unwrap().ends_with('Z'),
        "{info}"
    );
    assert_eq!(info["ttl"], 600.0);
    let id = info["id"].as_str().unwrap();

    let first = ok(
        &server,
        id,
        "import json\nx = 41\ndef inc(v):\n    return v + 1\nopen('state.txt', 'w').write('kept')\nprint('set')",
    )
    .await;
    assert_eq!(first["stdout"], "set\n");
    assert_eq!(first["artifacts"][0]["path"], "state.txt", "{first}");

    let second = ok(
        &server,
        id,
        "print(json.dumps({'x': inc(x)}), open('state.txt').read())\nx",
    )
    .await;
    assert_eq!(second["stdout"], "{\"x\": 42} kept\n", "{second}");
    assert_eq!(second["result"], "41");
    assert_eq!(second["exit_code"], 0);
    // Only files changed by this call come back.
    assert_eq!(second["artifacts"], json!([]), "{second}");

    // An exception does not end the session; the state stays.
    let failed = ok(&server, id, "1/0").await;
    assert_eq!(failed["error"]["type"], "ZeroDivisionError");
    assert_eq!(ok(&server, id, "x").await["result"], "41");

    // Input files land in the session directory and may be replaced.
    let (status, body) = server
        .execute(json!({"code": "print(open('in.txt').read())", "session": id, "files": {"in.txt": "one"}}))
        .await;
    assert_eq!(
        (status, body["stdout"].as_str()),
        (200, Some("one\n")),
        "{body}"
    );
    let (_, body) = server
        .execute(json!({"code": "print(open('in.txt').read())", "session": id, "files": {"in.txt": "two"}}))
        .await;
    assert_eq!(body["stdout"], "two\n", "{body}");

    // A call's stdin is its own: the next call reads nothing.
    let read = "import sys\nprint(repr(sys.stdin.read()))";
    let (_, body) = server
        .execute(json!({"code": read, "session": id, "stdin": "typed\nlines \u{e9}\n"}))
        .await;
    assert_eq!(body["stdout"], "'typed\\nlines \u{e9}\\n'\n", "{body}");
    let (_, body) = server.execute(json!({"code": read, "session": id})).await;
    assert_eq!(body["stdout"], "''\n", "{body}");
    // Even what a call left unread of its stdin: the next call reads EOF.
    let (_, body) = server
        .execute(json!({"code": "input()", "session": id, "stdin": "first\nleft over\n"}))
        .await;
    assert_eq!(body["result"], "'first'", "{body}");
    let (_, body) = server
        .execute(json!({"code": "input()", "session": id}))
        .await;
    assert_eq!(body["error"]["type"], "EOFError", "{body}");
    assert_eq!(ok(&server, id, "x").await["result"], "41");
    server.stop().await;
}

#[tokio::test]
async fn a_long_value_is_cut_as_in_a_clean_run_and_says_so() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let code = "'x' * 100_000";
    let clean = server.run(code).await;
    let called = ok(&server, &id, code).await;
    let result = called["result"].as_str().expect("a result");
    assert!(
        result.ends_with("[truncated, 100002 characters in all]"),
        "{}",
        &result[result.len().saturating_sub(60)..]
    );
    assert_eq!(called["result"], clean["result"]);
    server.stop().await;
}

#[tokio::test]
async fn sessions_are_isolated_from_each_other_and_from_clean_runs() {
    let server = TestServer::start().await;
    let a = create(&server, json!({})).await;
    let b = create(&server, json!({})).await;
    ok(
        &server,
        &a,
        "secret = 'a'\nopen('mine.txt', 'w').write('a')",
    )
    .await;
    let other = ok(
        &server,
        &b,
        "print('secret' in globals())\nimport os\nprint(os.path.exists('mine.txt'))",
    )
    .await;
    assert_eq!(other["stdout"], "False\nFalse\n", "{other}");
    let clean = server.run("print('secret' in globals())").await;
    assert_eq!(clean["stdout"], "False\n");
    assert_eq!(ok(&server, &a, "secret").await["result"], "'a'");

    let (status, listing) = server.get("/sessions").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = listing["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [a.as_str(), b.as_str()], "{listing}");
    assert_eq!(listing["sessions"][0]["calls"], 2);

    let (status, closed) = server.delete(&format!("/sessions/{a}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        (closed["id"].as_str(), closed["closed"].as_bool()),
        (Some(a.as_str()), Some(true))
    );
    let (status, body) = call(&server, &a, "secret").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_session");
    assert!(
        crate::common::error_message(&body).contains("closed"),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn unknown_ids_and_bad_requests_are_refused() {
    let server = TestServer::start().await;
    let (status, body) = call(&server, "nope", "print(1)").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_session");
    let resp = server
        .client
        .delete(format!("{}/sessions/nope", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let (status, body) = server.post("/sessions", json!({"ttl": -1})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let (status, body) = server.post("/sessions", json!({"env": "nowhere"})).await;
    assert_eq!(status, 404, "{body}");
    let id = create(&server, json!({})).await;
    let (status, body) = server
        .execute(json!({"code": "1", "session": id, "limits": {"processes": 10}}))
        .await;
    assert_eq!(status, 400, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_timeout_that_comes_while_a_call_is_set_up_ends_the_call_not_the_session() {
    let server = TestServer::start().await;
    let (status, info) = server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap();
    ok(&server, id, "x = 5").await;
    // Writing 20 MB of files takes the session's process milliseconds: the
    // call's 1 ms timeout comes as it does. The code does not run, and the
    // session keeps its state and the call's files.
    for round in 0..2 {
        let started = Instant::now();
        let (status, body) = server
            .execute(json!({
                "session": id,
                "code": "import time; time.sleep(10); print('ran')",
                "timeout": 0.001,
                "files": {format!("big{round}.txt"): "x".repeat(20_000_000)},
            }))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["timed_out"], true, "{body}");
        assert_eq!(body["limit"], "timeout", "{body}");
        assert_eq!(body["error"]["type"], "KeyboardInterrupt", "{body}");
        assert_eq!(body["stdout"], "", "{body}");
        assert!(
            body.get("session_lost").is_none_or(Value::is_null),
            "{body}"
        );
        // Interrupted, not killed after the 2 s grace.
        assert!(started.elapsed() < Duration::from_millis(1900), "{body}");
        let body = ok(
            &server,
            id,
            "import os\nprint(x, sorted(os.listdir('.')), os.path.getsize('big0.txt'))",
        )
        .await;
        let listed = if round == 0 {
            "['big0.txt']"
        } else {
            "['big0.txt', 'big1.txt']"
        };
        assert_eq!(body["stdout"], format!("5 {listed} 20000000\n"), "{body}");
    }

    // The session's process tells an early interrupt by a clock its code
    // cannot replace: one frozen at 0 (as a test library may leave it)
    // changes nothing.
    ok(&server, id, "import time\ntime.monotonic = lambda: 0.0").await;
    let (status, body) = server
        .execute(json!({
            "session": id,
            "code": "import time; time.sleep(10)",
            "timeout": 0.001,
            "files": {"big2.txt": "x".repeat(20_000_000)},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["error"]["type"], "KeyboardInterrupt", "{body}");
    assert!(
        body.get("session_lost").is_none_or(Value::is_null),
        "{body}"
    );
    assert_eq!(ok(&server, id, "print(x)").await["stdout"], "5\n");

    // A session whose calls time out at once: each call's interrupt comes
    // as the call is read or set up, often before its code could start.
    let (status, info) = server.post("/sessions", json!({"timeout": 1e-300})).await;
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap();
    let (_, body) = server
        .execute(json!({"session": id, "code": "x = 5", "timeout": 5}))
        .await;
    assert_eq!(body["exit_code"], 0, "{body}");
    for size in [0, 1_000, 100_000, 0, 1_000, 100_000] {
        let mut call = json!({"session": id, "code": "import time; time.sleep(10)"});
        if size > 0 {
            call["files"] = json!({"f.txt": "x".repeat(size)});
        }
        let (status, body) = server.execute(call).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["timed_out"], true, "{size}: {body}");
        assert_eq!(body["error"]["type"], "KeyboardInterrupt", "{size}: {body}");
        assert!(
            body.get("session_lost").is_none_or(Value::is_null),
            "{size}: {body}"
        );
    }
    let (_, body) = server
        .execute(json!({"session": id, "code": "print(x)", "timeout": 5}))
        .await;
    assert_eq!(body["stdout"], "5\n", "{body}");
    server.stop().await;
}

/// A ttl under a millisecond (the resolution of session times) would end
/// the session before its first call: it is refused naming `ttl`, written
/// readably; a millisecond is taken as asked. A session's tiny `timeout` is
/// taken as `/execute` takes it: a call that takes any time times out at
/// once, and nothing prints 300 zeros.
#[tokio::test]
async fn a_ttl_under_a_millisecond_is_refused_and_a_tiny_timeout_times_out() {
    let server = TestServer::start().await;
    for (ttl, shown) in [
        (json!(5e-324), "5e-324"),
        (json!(1e-9), "1e-9"),
        (json!(0.0009), "0.0009"),
        (json!(0), "0"),
        (json!(-1), "-1"),
        (json!(-1e300), "-1e300"),
    ] {
        let (status, body) = server.post("/sessions", json!({"ttl": ttl})).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("bad_request")),
            "{body}"
        );
        assert_eq!(
            common::error_message(&body),
            format!(
                "ttl must be a positive number of seconds, at least 0.001 (session times are \
                 kept to the millisecond), got {shown}"
            )
        );
    }
    assert!(server.get("/sessions").await.1["sessions"] == json!([]));
    let (status, info) = server.post("/sessions", json!({"ttl": 0.001})).await;
    assert_eq!(status, 201, "{info}");
    assert_eq!(info["ttl"], 0.001, "{info}");

    let (status, body) = server.post("/sessions", json!({"timeout": -1e-300})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        common::error_message(&body),
        "timeout must be a positive number of seconds, got -1e-300"
    );
    let (status, info) = server.post("/sessions", json!({"timeout": 1e-300})).await;
    assert_eq!(status, 201, "{info}");
    assert_eq!(info["timeout"], 1e-300, "{info}");
    let id = info["id"].as_str().unwrap();
    // A call that takes any time at all is cut (a trivial one may end
    // first), as /execute cuts one with the same timeout.
    let slow = "import time; time.sleep(5)";
    let body = ok(&server, id, slow).await;
    assert_eq!(body["timed_out"], true, "{body}");
    let (status, body) = server
        .execute(json!({"code": slow, "timeout": 1e-300}))
        .await;
    assert_eq!((status, &body["timed_out"]), (200, &json!(true)), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn idle_sessions_expire_and_calls_renew_them() {
    let mut config = common::config();
    config.sessions.ttl = Duration::from_millis(1000);
    let server = TestServer::with_config(config).await;
    let kept = create(&server, json!({})).await;
    let idle = create(&server, json!({})).await;
    let started = Instant::now();
    // Calls every 0.2 s keep one alive (a fifth of its TTL); the other idles
    // for 2.5 TTLs.
    while started.elapsed() < Duration::from_millis(2500) {
        ok(&server, &kept, "1").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, body) = call(&server, &idle, "1").await;
    assert_eq!(status, 404, "{body}");
    assert!(
        crate::common::error_message(&body).contains("expired"),
        "{body}"
    );
    assert_eq!(ok(&server, &kept, "2").await["result"], "2");
    server.stop().await;
}

#[tokio::test]
async fn a_call_refused_before_it_runs_does_not_renew_the_session() {
    let mut config = common::config();
    config.sessions.ttl = Duration::from_millis(1000);
    let server = TestServer::with_config(config).await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "import os\nos.mkdir('d')\nx = 1").await;
    let started = Instant::now();
    // Refused calls every 0.1 s for 3 TTLs: what only the session's
    // creation sets, a bad timeout, another environment, a file where the
    // session's process has a directory (refused by that process).
    let refused = [
        json!({"session": id, "code": "x", "limits": {"memory_bytes": 100000000}}),
        json!({"session": id, "code": "x", "timeout": -1}),
        json!({"session": id, "code": "x", "env": "no-such-env"}),
        json!({"session": id, "code": "x", "files": {"d": "in the way"}}),
    ];
    let mut refusals = 0;
    let mut expired_after = None;
    while started.elapsed() < Duration::from_millis(3000) {
        let body = &refused[refusals % refused.len()];
        let (status, answer) = server.execute(body.clone()).await;
        if answer["error"]["code"] == "unknown_session" {
            expired_after = Some(started.elapsed());
            break;
        }
        let code = answer["error"]["code"].as_str().unwrap_or_default();
        assert!(
            matches!(
                (status, code),
                (400, "bad_request") | (404, "unknown_env") | (409, "conflict")
            ),
            "{status} {answer} for {body}"
        );
        refusals += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It ended one TTL after its last call, however many refusals came.
    let expired_after = expired_after.expect("the session outlived 3 TTLs of refused calls");
    assert!(refusals >= 5, "only {refusals} refused calls were sent");
    assert!(
        expired_after < Duration::from_millis(2500),
        "expired after {expired_after:?}"
    );
    let (status, body) = call(&server, &id, "print(x)").await;
    assert_eq!(status, 404, "{body}");
    assert!(
        crate::common::error_message(&body).contains("expired"),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn caps_refuse_sessions_with_429() {
    let mut config = common::config();
    config.sessions.max_sessions = 2;
    let server = TestServer::with_config(config).await;
    let first = create(&server, json!({})).await;
    create(&server, json!({})).await;
    let (status, body) = server.post("/sessions", json!({})).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "too_many_sessions");
    let resp = server
        .client
        .delete(format!("{}/sessions/{first}", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    create(&server, json!({})).await;
    server.stop().await;

    let mut config = common::config();
    config.sessions.max_sessions_per_env = 1;
    let server = TestServer::with_config(config).await;
    create(&server, json!({})).await;
    let (status, body) = server.post("/sessions", json!({})).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        crate::common::error_message(&body).contains("environment"),
        "{body}"
    );
    // Clean runs still work beside a full session cap.
    assert_eq!(server.run("print(1)").await["stdout"], "1\n");
    server.stop().await;
}

#[tokio::test]
async fn a_timeout_interrupts_and_keeps_the_state() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 1").await;
    let started = Instant::now();
    let (status, body) = server
        .execute(json!({"session": id, "timeout": 0.5, "code": "import time\nwhile True:\n    time.sleep(0.01)\n    x = 1"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(body["limit"], "timeout");
    assert_eq!(body["error"]["type"], "KeyboardInterrupt", "{body}");
    assert!(body.get("session_lost").is_none(), "{body}");
    assert_eq!(ok(&server, &id, "x").await["result"], "1");
    server.stop().await;
}

#[tokio::test]
async fn a_call_that_keeps_its_report_pipe_full_is_still_interrupted_at_its_timeout() {
    // Reports on no call, written to the session process's report pipe (and
    // any other pipe it may write to, but its output) as fast as the server
    // reads them, until the interrupt. (A write cut short would leave half
    // a frame before the call's own report, which then cannot be read: the
    // session would be lost, as its code asked for.)
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 1").await;
    let flood = common::with_writable_pipes(&format!(
        r#"{FORGE_TOOLS}
# Whole frames, at most PIPE_BUF bytes a write: no write is cut short.
junk = report_on(None) * (4096 // len(report_on(None)))
try:
    while True:
        for fd in pipes:
            os.write(fd, junk)
except KeyboardInterrupt:
    print("interrupted", len(pipes) > 0)
"#
    ));
    let started = Instant::now();
    let answered = tokio::time::timeout(
        Duration::from_secs(60),
        server.execute(json!({"session": id, "timeout": 1.0, "code": flood})),
    )
    .await;
    let (status, body) = answered.expect("the call was never answered");
    assert_eq!(status, 200, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(body["stdout"], "interrupted True\n", "{body}");
    assert!(body.get("session_lost").is_none(), "{body}");
    assert_eq!(ok(&server, &id, "x").await["result"], "1");
    server.stop().await;
}

#[tokio::test]
async fn an_interrupt_shows_the_calls_line_and_a_calls_own_handler_lasts_one_call() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let spin = "import time\nwhile True:\n    time.sleep(0.01)\n";
    let (status, body) = server
        .execute(json!({"session": id, "timeout": 0.5, "code": spin}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["error"]["type"], "KeyboardInterrupt", "{body}");
    assert_eq!(body["error"]["line"], 3, "{body}");
    let traceback = body["error"]["traceback"].as_str().unwrap();
    assert!(
        traceback.contains("line 3") && traceback.ends_with("KeyboardInterrupt\n"),
        "{traceback}"
    );
    assert!(!traceback.contains("worker"), "{traceback}");
    assert_eq!(body["stderr"].as_str().unwrap(), traceback, "{body}");
    // A call that takes SIGINT for itself keeps it for that call only: the
    // next call's timeout interrupts it as usual, and the session lives.
    let own = "import signal\nseen = []\nsignal.signal(signal.SIGINT, lambda *a: seen.append(1))\n";
    ok(&server, &id, own).await;
    let (status, body) = server
        .execute(json!({"session": id, "timeout": 0.5, "code": spin}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(body["error"]["type"], "KeyboardInterrupt", "{body}");
    assert!(body.get("session_lost").is_none(), "{body}");
    assert_eq!(ok(&server, &id, "seen").await["result"], "[]");
    // Nor does one that puts back SIGINT's default (death) make an interrupt
    // that comes as the next call is set up fatal.
    ok(
        &server,
        &id,
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)",
    )
    .await;
    let (status, body) = server
        .execute(json!({
            "session": id,
            "timeout": 0.001,
            "code": "import time; time.sleep(10)",
            "files": {"big.txt": "x".repeat(20_000_000)},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(body["error"]["type"], "KeyboardInterrupt", "{body}");
    assert!(body.get("session_lost").is_none(), "{body}");
    assert_eq!(ok(&server, &id, "seen").await["result"], "[]");
    server.stop().await;
}

#[tokio::test]
async fn the_same_code_sent_again_runs_again_with_its_warnings() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let count = "n = globals().get('n', 0) + 1\nprint(n)\nn";
    for n in 1..=3 {
        let body = ok(&server, &id, count).await;
        assert_eq!(body["stdout"], format!("{n}\n"), "{body}");
        assert_eq!(body["result"], n.to_string(), "{body}");
    }
    // A warning of the compiler's belongs on every call's stderr.
    let warns = "x = 1\nx is 1";
    for _ in 0..2 {
        let body = ok(&server, &id, warns).await;
        assert!(
            body["stderr"].as_str().unwrap().contains("SyntaxWarning"),
            "{body}"
        );
        assert_eq!(body["result"], "True", "{body}");
    }
    // So does an error, and a fixed call after it runs.
    for _ in 0..2 {
        let body = ok(&server, &id, "def f(:\n    pass").await;
        assert_eq!(body["error"]["type"], "SyntaxError", "{body}");
        assert_eq!(body["error"]["line"], 1, "{body}");
    }
    assert_eq!(ok(&server, &id, "n").await["result"], "3");
    server.stop().await;
}

#[tokio::test]
async fn a_warning_shows_once_per_place_across_calls_as_in_one_interpreter() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let body = ok(
        &server,
        &id,
        "import warnings\ndef f():\n    warnings.warn('once per place')\nf()",
    )
    .await;
    assert!(
        body["stderr"].as_str().unwrap().contains("once per place"),
        "{body}"
    );
    // Later calls, each a program not seen before, reach the same place.
    for n in 0..3 {
        let body = ok(&server, &id, &format!("f()\nprint({n})")).await;
        assert_eq!(body["stdout"], format!("{n}\n"), "{body}");
        assert_eq!(body["stderr"], "", "{body}");
    }
    // Under a "once" filter the compiler's warning shows the first time only.
    ok(&server, &id, "warnings.simplefilter('once')").await;
    for first in [true, false] {
        let body = ok(&server, &id, "y = 1\ny is 1").await;
        let stderr = body["stderr"].as_str().unwrap();
        assert_eq!(stderr.contains("SyntaxWarning"), first, "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn an_uninterruptible_run_loses_the_session() {
    let mut config = common::config();
    config.sessions.interrupt_grace = Duration::from_millis(300);
    let server = TestServer::with_config(config).await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 1").await;
    let (status, body) = server
        .execute(json!({"session": id, "timeout": 0.5, "code": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('spinning', flush=True)\nwhile True:\n    pass"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(body["signal"], "SIGKILL", "{body}");
    assert_eq!(body["stdout"], "spinning\n", "{body}");
    let lost = body["session_lost"].as_str().expect("the loss is reported");
    assert!(
        lost.contains("did not stop") && lost.contains("interrupt"),
        "{lost}"
    );
    let (status, body) = call(&server, &id, "x").await;
    assert_eq!(status, 404, "{body}");
    assert!(
        crate::common::error_message(&body).contains("did not stop"),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_crash_reports_the_loss_and_later_calls_get_404() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let (status, body) = call(
        &server,
        &id,
        "import os\nprint('bye', flush=True)\nos._exit(3)",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 3, "{body}");
    assert_eq!(body["stdout"], "bye\n", "{body}");
    let lost = body["session_lost"].as_str().expect("the loss is reported");
    assert!(lost.contains("exited with status 3"), "{lost}");
    let (status, body) = call(&server, &id, "1").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_session");
    let (_, listing) = server.get("/sessions").await;
    assert_eq!(listing["sessions"], json!([]));
    server.stop().await;
}

#[tokio::test]
async fn concurrent_calls_to_one_session_run_in_arrival_order() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "log = []").await;
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (client, url, id) = (server.client.clone(), server.url.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            let code = format!("import time\nlog.append({i})\ntime.sleep(0.05)\nlog.append({i})");
            client
                .post(format!("{url}/execute"))
                .json(&json!({"code": code, "session": id}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
        // Arrivals spaced so that their order is known.
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 200);
    }
    let log = ok(&server, &id, "log").await;
    assert_eq!(
        log["result"], "[0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]",
        "{log}"
    );
    server.stop().await;
}

#[tokio::test]
async fn shutdown_leaves_no_session_process() {
    let server = TestServer::start().await;
    let base = server.executor.base_dir().to_path_buf();
    let idle = create(&server, json!({})).await;
    let busy = create(&server, json!({})).await;
    ok(&server, &idle, "x = 1").await;
    // Every worker and session process has the base dir in its command line
    // (pids seen inside a run are those of its own pid namespace).
    assert!(common::processes_mentioning(&base).len() >= 2);
    let running = tokio::spawn({
        let (client, url) = (server.client.clone(), server.url.clone());
        async move {
            let _ = client
                .post(format!("{url}/execute"))
                .json(&json!({"code": "import time; time.sleep(30)", "session": busy}))
                .send()
                .await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let executor = server.executor.clone();
    executor.shutdown().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = common::processes_mentioning(&base);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "processes left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.abort();
    server.stop().await;
}

/// The session's processes that have children of their own: its worker
/// and, in the namespace tier, the launcher above it; and every other
/// worker, launcher and zygote. The session's own process has none.
fn processes_with_children(server: &TestServer) -> Vec<u32> {
    let ours = common::processes_mentioning(server.executor.base_dir());
    ours.iter()
        .copied()
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|task| {
                    std::fs::read_to_string(task.path().join("children"))
                        .is_ok_and(|c| !c.trim().is_empty())
                })
        })
        .collect()
}

/// Sends SIGCONT to the processes it holds when dropped, so that a failed
/// assertion leaves nothing stopped.
struct Stopped(Vec<u32>);

impl Drop for Stopped {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
    }
}

#[tokio::test]
async fn a_session_call_is_answered_by_the_session_process_while_its_worker_is_stopped() {
    // The server writes a call to the session's process and reads its
    // output and report itself: no worker is on a call's path.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 41").await;
    let stopped = Stopped(processes_with_children(&server));
    assert!(!stopped.0.is_empty(), "no worker found");
    for pid in &stopped.0 {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
    }
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        call(
            &server,
            &id,
            "import sys\nprint(x + 1)\nsys.stderr.write('e')\nopen('f.txt', 'w').write('data')\nx",
        ),
    )
    .await
    .expect("the call is answered with the worker stopped");
    let (status, body) = answered;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "42\n", "{body}");
    assert_eq!(body["stderr"], "e", "{body}");
    assert_eq!(body["result"], "41", "{body}");
    assert_eq!(body["artifacts"][0]["path"], "f.txt", "{body}");
    drop(stopped);
    // The worker, resumed, still interrupts a call at its timeout.
    let (status, body) = server
        .execute(json!({"code": "import time\ntime.sleep(30)", "session": id, "timeout": 1}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(body["error"]["type"], "KeyboardInterrupt", "{body}");
    assert_eq!(ok(&server, &id, "x").await["result"], "41");
    server.stop().await;
}

#[tokio::test]
async fn a_session_calls_output_is_capped_and_the_rest_does_not_reach_the_next_call() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let body = ok(
        &server,
        &id,
        "import sys\nsys.stdout.write('x' * (5 * 1024 * 1024))\nprint('tail', file=sys.stderr)",
    )
    .await;
    assert_eq!(body["truncated"], true, "{}", body["stderr"]);
    assert_eq!(body["limit"], "output");
    assert_eq!(body["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(body["stderr"], "tail\n");
    let next = ok(&server, &id, "print('next')").await;
    assert_eq!(next["stdout"], "next\n", "{next}");
    assert_eq!(next["truncated"], false);
    server.stop().await;
}

#[tokio::test]
async fn a_session_call_that_fills_both_pipes_in_turns_gets_all_its_output() {
    // Each write is more than a pipe holds, and each stream waits on the
    // other: the server must read both while the call runs.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let code = "import sys\n\
                for i in range(4):\n    \
                    sys.stderr.write(str(i) * 100000); sys.stderr.flush()\n    \
                    sys.stdout.write(chr(97 + i) * 100000); sys.stdout.flush()\n\
                'done'";
    let started = Instant::now();
    let (status, body) = server
        .execute(json!({"code": code, "session": id, "timeout": 20}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], false, "{}", body["error"]);
    assert_eq!(body["exit_code"], 0, "{}", body["error"]);
    assert_eq!(body["result"], "'done'");
    assert_eq!(body["truncated"], false);
    let stdout: String = "abcd"
        .chars()
        .map(|c| c.to_string().repeat(100_000))
        .collect();
    let stderr: String = "0123"
        .chars()
        .map(|c| c.to_string().repeat(100_000))
        .collect();
    assert!(
        body["stdout"] == stdout.as_str(),
        "stdout is not the 4 x 100000 letters written"
    );
    assert!(
        body["stderr"] == stderr.as_str(),
        "stderr is not the 4 x 100000 digits written"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let next = ok(&server, &id, "print('next')").await;
    assert_eq!(next["stdout"], "next\n", "{next}");
    assert_eq!(next["stderr"], "", "{next}");
    server.stop().await;
}

#[tokio::test]
async fn a_forged_report_cannot_name_files_outside_the_session_directory() {
    // User code can write to the session process's report pipe: a report
    // without its call's id is skipped; one that found the id (in the
    // session process's own frames) answers its own call, and paths that
    // leave the session directory are dropped from it.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let forge = |with_id: bool| {
        format!(
            "{FORGE_TOOLS}\nto_every_pipe(report_on({}))",
            if with_id { "this_call()" } else { "None" }
        )
    };
    let (status, body) = call(&server, &id, &forge(false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["artifacts"], json!([]), "{body}");
    let (status, body) = call(&server, &id, &forge(true)).await;
    assert_eq!(status, 200, "{body}");
    // The forged report came first and answered the call.
    assert_eq!(body["exit_code"], 7, "{body}");
    let paths = artifact_paths(&body);
    assert_eq!(paths, ["ok.txt"], "{body}");
    // The call's own report, which came after, is not the next call's.
    let (status, body) = call(&server, &id, "print('after')\n6 * 7").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "after\n", "{body}");
    assert_eq!(body["result"], "42", "{body}");
    server.stop().await;
}

/// Python for user code that forges reports: `report_on(call_id)` is a
/// framed report (status 7, two artifacts, one outside the session
/// directory) on that call, `to_every_pipe(data)` writes `data` to every
/// pipe the process holds, `this_call()` is the id of the call running.
const FORGE_TOOLS: &str = r#"
import os, stat, struct, sys
def this_call():
    f = sys._getframe()
    while f.f_code.co_name != 'session_main':
        f = f.f_back
    return f.f_locals['call']
def pack(obj):
    # msgpack of nil, ints, short strs, and lists and maps of under 16 items
    if isinstance(obj, dict):
        return bytes([0x80 | len(obj)]) + b''.join(pack(k) + pack(v) for k, v in obj.items())
    if isinstance(obj, list):
        return bytes([0x90 | len(obj)]) + b''.join(pack(v) for v in obj)
    if obj is None:
        return b'\xc0'
    if isinstance(obj, int):
        return b'\xcf' + struct.pack('!Q', obj) if obj > 127 else bytes([obj])
    data = obj.encode()
    return bytes([0xa0 | len(data)]) + data
def report_on(call_id):
    report = pack({'id': call_id, 'status': 7, 'artifacts': [{'path': '../../etc/passwd', 'size': 1, 'mime': 'text/plain'}, {'path': 'ok.txt', 'size': 1, 'mime': 'text/plain'}]})
    return struct.pack('!I', len(report)) + report
def to_every_pipe(data):
    for fd in range(3, 64):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISFIFO(st.st_mode):
            try:
                os.write(fd, data)
            except OSError:
                pass
"#;

#[tokio::test]
async fn a_report_forged_between_calls_never_answers_the_next_call() {
    // A thread the call leaves running writes reports on the next calls'
    // ids once the call has been answered (a quick call, whose report the
    // server read without the runtime's help): each later call still gets
    // its own answer.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 1").await;
    let code = format!(
        "{FORGE_TOOLS}\nimport threading, time\nfirst = this_call()\ndef later():\n    time.sleep(0.05)\n    to_every_pipe(b''.join(report_on(i) for i in range(first + 1, first + 6)))\nthreading.Thread(target=later).start()\nprint('forging')"
    );
    for round in 0..3 {
        let body = ok(&server, &id, &code).await;
        assert_eq!(body["exit_code"], 0, "round {round}: {body}");
        assert_eq!(body["stdout"], "forging\n", "round {round}: {body}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let body = ok(&server, &id, "print('mine')\nx").await;
        assert_eq!(body["exit_code"], 0, "round {round}: {body}");
        assert_eq!(body["stdout"], "mine\n", "round {round}: {body}");
        assert_eq!(body["result"], "1", "round {round}: {body}");
        assert_eq!(body["artifacts"], json!([]), "round {round}: {body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_session_whose_worker_dies_mid_call_answers_with_an_error_and_is_gone() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 1").await;
    let worker = common::session_worker(&server);
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(worker as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    });
    let started = Instant::now();
    let (status, body) = call(
        &server,
        &id,
        "import time\nprint('started', flush=True)\ntime.sleep(20)",
    )
    .await;
    killer.await.unwrap();
    answered_promptly(started);
    assert!(status >= 500, "{status} {body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    let (status, body) = call(&server, &id, "x").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_session");
    server.stop().await;
}

#[tokio::test]
async fn a_session_process_that_closes_or_floods_its_report_pipe_is_lost_clearly() {
    // What user code does to the pipes it shares with the server: closing
    // the report pipe (the call cannot be answered by a report) or
    // announcing a report larger than any real one.
    let server = TestServer::start().await;
    for (what, code) in [
        ("closed", "os.close(fd)"),
        (
            "flooded",
            "os.write(fd, struct.pack('!I', 0xFFFFFFF0) + b'x' * 64)",
        ),
    ] {
        let id = create(&server, json!({})).await;
        ok(&server, &id, "x = 1").await;
        let each = format!(
            "import os, stat, struct\nfor fd in range(3, 64):\n    try:\n        st = os.fstat(fd)\n    except OSError:\n        continue\n    if stat.S_ISFIFO(st.st_mode):\n        try:\n            {code}\n        except OSError:\n            pass\nprint('done', flush=True)\nimport time\ntime.sleep(0.2)"
        );
        let started = Instant::now();
        let (status, body) = call(&server, &id, &each).await;
        assert_eq!(status, 200, "{what}: {body}");
        assert!(
            body["session_lost"].is_string(),
            "{what}: the loss is reported: {body}"
        );
        answered_promptly(started);
        let (status, body) = call(&server, &id, "x").await;
        assert_eq!(status, 404, "{what}: {body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_lost_call_still_returns_the_files_it_wrote() {
    let mut config = common::config();
    config.sessions.interrupt_grace = Duration::from_millis(300);
    let server = TestServer::with_config(config).await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "open('old.txt', 'w').write('before')").await;
    let (status, body) = server
        .execute(json!({"session": id, "timeout": 0.5, "files": {"in.txt": "input"}, "code": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nopen('plot.txt', 'w').write('drawn')\nwhile True:\n    pass"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["session_lost"].is_string(), "{body}");
    let paths = artifact_paths(&body);
    // The file the call wrote; not the input it was sent, nor a file an
    // earlier call wrote.
    assert_eq!(paths, ["plot.txt"], "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_session_process_that_dies_is_seen_even_when_a_process_it_forked_holds_its_pipes() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    // A forked process keeps every pipe of the session's process open.
    ok(
        &server,
        &id,
        "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)",
    )
    .await;
    let started = Instant::now();
    let (status, body) = server
        .execute(json!({"session": id, "timeout": 20, "code": "import os\nos._exit(5)"}))
        .await;
    assert_eq!(status, 200, "{body}");
    answered_promptly(started);
    let lost = body["session_lost"].as_str().expect("the loss is reported");
    assert!(lost.contains("exited with status 5"), "{lost}");
    assert_eq!(body["timed_out"], false, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_session_whose_zygote_dies_is_lost_and_says_so() {
    // The session's process is its worker's zygote's child, and dies with it.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 1").await;
    let process = common::session_process(&server);
    common::kill_zygote(common::session_worker(&server)).await;
    common::wait_gone(process, "the session's process, its zygote killed").await;
    let started = Instant::now();
    let (status, body) = call(&server, &id, "print(x)").await;
    answered_promptly(started);
    assert_eq!(status, 200, "{body}");
    assert!(body["session_lost"].is_string(), "{body}");
    let (status, body) = call(&server, &id, "x").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_session");
    let body = server.run("print('clean')").await;
    assert_eq!(body["stdout"], "clean\n", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_fork_in_a_session_while_a_thread_runs_exits_cleanly() {
    // threading's after-fork handler runs in a session's forks, as in a
    // clean interpreter: the forked child knows only its own thread.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let body = ok(
        &server,
        &id,
        r#"
import os, threading, time
stop = threading.Event()
t = threading.Thread(target=stop.wait)
t.start()
pid = os.fork()
if pid == 0:
    print("child threads", threading.active_count(), threading.current_thread() is threading.main_thread(), flush=True)
    os._exit(0)
deadline = time.monotonic() + 5
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    status = -1
stop.set()
t.join()
print("child exit", status)
"#,
    )
    .await;
    assert_eq!(
        body["stdout"], "child threads 1 True\nchild exit 0\n",
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_module_a_call_sends_is_the_one_it_imports_even_if_the_zygote_imported_its_name() {
    // `json` is imported by every zygote (see learned imports); a call that
    // sends its own json.py imports that, as a fresh interpreter would, and
    // the session keeps it.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let (status, body) = server
        .execute(json!({
            "session": id,
            "code": "import json\nprint(json.WHO)",
            "files": {"json.py": "WHO = 'the call'\n"},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "the call\n", "{body}");
    let body = ok(&server, &id, "import json\nprint(json.WHO)").await;
    assert_eq!(body["stdout"], "the call\n", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_module_a_call_leaves_in_the_session_directory_does_not_break_its_artifacts() {
    // The session directory is first on sys.path: what the artifact walk
    // imports was imported before any user code ran.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(
        &server,
        &id,
        "for name in ('mimetypes', 'fnmatch'):\n    open(name + '.py', 'w').write('raise SystemExit(9)')",
    )
    .await;
    let body = ok(&server, &id, "open('data.csv', 'w').write('a,b')").await;
    assert!(artifact_paths(&body).contains(&"data.csv"), "{body}");
    assert_eq!(ok(&server, &id, "6 * 7").await["result"], "42");
    server.stop().await;
}

#[tokio::test]
async fn a_module_a_call_sends_under_the_artifact_walks_names_is_never_the_walks() {
    // A kept worker's zygote has imported what the artifact walk needs
    // (fnmatch, mimetypes), so a call sending its own mimetypes.py has the
    // zygote's taken out of sys.modules for it; the walk keeps its own.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "1").await;
    let (status, _) = server.delete(&format!("/sessions/{id}")).await;
    assert_eq!(status, 200);
    common::wait_for_session_spares(&server, 1).await;
    let id = create(&server, json!({})).await;
    assert_eq!(
        server.pool().await["session_spares"],
        0,
        "on the kept worker"
    );
    for (name, source) in [
        ("mimetypes.py", "raise SystemExit(9)\n"),
        ("fnmatch.py", "import os\nos._exit(9)\n"),
    ] {
        let (status, body) = server
            .execute(json!({
                "session": id,
                "code": "open('data.csv', 'w').write('a,b')",
                "files": {name: source},
            }))
            .await;
        assert_eq!(status, 200, "{name}: {body}");
        assert!(body.get("session_lost").is_none(), "{name}: {body}");
        let csv = body["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["path"] == "data.csv")
            .unwrap_or_else(|| panic!("{name}: {body}"));
        assert_eq!(csv["mime"], "text/csv", "{name}: {body}");
    }
    // The call's own module is the one the call imports.
    let (status, body) = call(&server, &id, "import mimetypes").await;
    assert_eq!((status, &body["exit_code"]), (200, &json!(9)), "{body}");
    assert_eq!(
        ok(&server, &id, "print('alive')").await["stdout"],
        "alive\n"
    );
    server.stop().await;
}

/// The paths of the artifacts in a result.
fn artifact_paths(body: &Value) -> Vec<&str> {
    body["artifacts"]
        .as_array()
        .expect("artifacts")
        .iter()
        .map(|a| a["path"].as_str().expect("a path"))
        .collect()
}

/// A call that cannot end by its report is still answered in seconds, not
/// at its timeout.
fn answered_promptly(started: Instant) {
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_session_call_gets_every_file_change_since_the_last_call_and_only_those() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let mkdir = "import os\nos.makedirs('sub/deep')\nopen('sub/deep/a.txt', 'w').write('A' * 10)";
    changes(&server, &id, mkdir, &["sub/deep/a.txt"]).await;
    // A call that touches no file.
    changes(&server, &id, "x = 1", &[]).await;
    // Rewritten in place, same size, deep in the tree.
    let rewrite = "f = open('sub/deep/a.txt', 'r+')\nf.write('B')\nf.close()";
    let body = changes(&server, &id, rewrite, &["sub/deep/a.txt"]).await;
    assert_eq!(body["artifacts"][0]["base64"], "QkFBQUFBQUFBQQ==", "{body}");
    // Only its times changed.
    let touch = "import os\nos.utime('sub/deep/a.txt', (1, 1))";
    changes(&server, &id, touch, &["sub/deep/a.txt"]).await;
    // Moved in from outside the session directory, into a new directory.
    let move_in = "import os, shutil, tempfile\nfd, path = tempfile.mkstemp()\nos.write(fd, b'moved')\nos.close(fd)\nos.mkdir('new')\nshutil.move(path, 'new/m.txt')";
    changes(&server, &id, move_in, &["new/m.txt"]).await;
    // Written by a thread after its call ended: it comes back with the next.
    let later = "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), open('new/late.txt', 'w').write('late'))).start()";
    changes(&server, &id, later, &[]).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    changes(&server, &id, "x = 2", &["new/late.txt"]).await;
    changes(&server, &id, "x = 3", &[]).await;
    // Changed through a shared mapping the call before made (and closed the
    // file): a write that raises no file event.
    let map =
        "import mmap\nwith open('sub/deep/a.txt', 'r+b') as f:\n    m = mmap.mmap(f.fileno(), 0)";
    changes(&server, &id, map, &[]).await;
    let body = changes(
        &server,
        &id,
        "m[1:2] = b'C'\nm.flush()",
        &["sub/deep/a.txt"],
    )
    .await;
    assert_eq!(body["artifacts"][0]["base64"], "QkNBQUFBQUFBQQ==", "{body}");
    changes(&server, &id, "import shutil\nshutil.rmtree('new')", &[]).await;
    server.stop().await;
}

/// Run `code` in session `id` and check the paths of its artifacts.
async fn changes(server: &TestServer, id: &str, code: &str, expected: &[&str]) -> Value {
    let body = ok(server, id, code).await;
    assert_eq!(artifact_paths(&body), expected, "{code}: {body}");
    body
}

#[tokio::test]
async fn a_session_whose_code_closes_the_harness_file_watch_still_gets_its_files() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "open('first.txt', 'w').write('1')").await;
    // What a call that closes every descriptor it does not know does.
    let body = ok(
        &server,
        &id,
        "import os\nclosed = 0\nfor fd in os.listdir('/proc/self/fd'):\n    try:\n        if os.readlink('/proc/self/fd/' + fd) == 'anon_inode:inotify':\n            os.close(int(fd))\n            closed += 1\n    except OSError:\n        pass\nprint(closed)",
    )
    .await;
    assert_eq!(body["stdout"], "1\n", "{body}");
    changes(
        &server,
        &id,
        "open('second.txt', 'w').write('2')",
        &["second.txt"],
    )
    .await;
    changes(&server, &id, "x = 1", &[]).await;
    changes(
        &server,
        &id,
        "open('first.txt', 'a').write('1')",
        &["first.txt"],
    )
    .await;
    server.stop().await;
}

/// The launchers of the server's workers, sorted.
fn workers(server: &TestServer) -> Vec<u32> {
    let mut pids = common::worker_pids(server);
    pids.sort_unstable();
    pids
}

#[tokio::test]
async fn a_closed_sessions_worker_opens_the_next_session_and_no_worker_starts() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "planted = 1").await;
    let worker = common::session_worker(&server);
    let (status, _) = server.delete(&format!("/sessions/{id}")).await;
    assert_eq!(status, 200);
    common::wait_for_session_spares(&server, 1).await;
    server.wait_for_pool_size(2, Duration::from_secs(10)).await;
    let metrics = crate::ops::parse_metrics(&crate::ops::scrape(&server, None).await.1);
    let env = server.executor.default_env();
    let gauge =
        |state: &str| metrics[&format!(r#"code_executor_workers{{env="{env}",state="{state}"}}"#)];
    assert_eq!(gauge("session_spare"), 1.0, "the kept worker is counted");
    let before = workers(&server);
    assert_eq!(
        before.len(),
        3,
        "the pool's two and the kept one: {before:?}"
    );

    // The next session takes it: no worker starts, the pool stays whole.
    let id = create(&server, json!({})).await;
    let body = ok(&server, &id, "print('planted' in globals())").await;
    assert_eq!(body["stdout"], "False\n", "{body}");
    assert_eq!(
        common::session_worker(&server),
        worker,
        "served by the kept worker"
    );
    let pool = server.pool().await;
    assert_eq!(
        (&pool["session_spares"], &pool["size"], &pool["starting"]),
        (&json!(0), &json!(2), &json!(0)),
        "{pool}"
    );
    assert_eq!(workers(&server), before, "no worker started");

    // A session that expires leaves its worker kept as well.
    let (status, _) = server.delete(&format!("/sessions/{id}")).await;
    assert_eq!(status, 200);
    common::wait_for_session_spares(&server, 1).await;
    let id = create(&server, json!({"ttl": 1.0})).await;
    ok(&server, &id, "1").await;
    assert_eq!(common::session_worker(&server), worker);
    common::wait_for_session_spares(&server, 0).await;
    let started = Instant::now();
    while server.executor.has_session(&id) {
        assert!(started.elapsed() < Duration::from_secs(10), "never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    common::wait_for_session_spares(&server, 1).await;
    assert_eq!(workers(&server), before, "no worker started or ended");
    // Clean runs never take it.
    for _ in 0..4 {
        assert_eq!(server.run("print(1)").await["stdout"], "1\n");
    }
    assert_eq!(server.pool().await["session_spares"], 1);
    server.stop().await;
}

#[tokio::test]
async fn a_closed_session_whose_zygote_is_gone_leaves_no_worker_kept() {
    // Its process went with the zygote; the worker cannot fork the next
    // session and is ended, not kept.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 1").await;
    let worker = common::session_worker(&server);
    common::kill_zygote(worker).await;
    let (status, _) = server.delete(&format!("/sessions/{id}")).await;
    assert_eq!(status, 200);
    common::wait_gone(worker, "the session's worker without a zygote").await;
    let pool = server.pool().await;
    assert_eq!(pool["session_spares"], 0, "{pool}");
    // The next session opens on a pool worker.
    let id = create(&server, json!({})).await;
    assert_eq!(ok(&server, &id, "print(2)").await["stdout"], "2\n");
    server.stop().await;
}

#[tokio::test]
async fn a_closed_sessions_worker_is_ended_when_not_to_be_kept_or_the_budget_is_full() {
    for (what, keep, max_workers) in [
        ("session_keep_worker_secs = 0", Duration::ZERO, 32),
        ("max_workers reached", Duration::from_secs(60), 3),
    ] {
        let mut config = common::config();
        config.sessions.keep_worker = keep;
        config.max_workers = max_workers;
        let server = TestServer::with_config(config).await;
        let id = create(&server, json!({})).await;
        ok(&server, &id, "1").await;
        let worker = common::session_worker(&server);
        server.wait_for_pool_size(2, Duration::from_secs(10)).await;
        let (status, _) = server.delete(&format!("/sessions/{id}")).await;
        assert_eq!(status, 200);
        common::wait_gone(worker, what).await;
        let pool = server.pool().await;
        assert_eq!(pool["session_spares"], 0, "{what}: {pool}");
        // The next session starts a worker, as every session did before.
        let id = create(&server, json!({})).await;
        assert_eq!(
            ok(&server, &id, "print(3)").await["stdout"],
            "3\n",
            "{what}"
        );
        server.stop().await;
    }
}

fn burn(seconds: f64) -> String {
    format!(
        "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\nprint('burnt')"
    )
}

#[tokio::test]
async fn a_sessions_limits_hold_in_every_call_and_each_call_gets_its_whole_cpu_budget() {
    let server = TestServer::start().await;
    let id = create(
        &server,
        json!({"timeout": 20, "limits": {"cpu_seconds": 1}}),
    )
    .await;
    // Each call may use its second, whatever the calls before it used.
    for round in 0..2 {
        let body = ok(&server, &id, &burn(0.6)).await;
        assert_eq!(body["stdout"], "burnt\n", "call {round}: {body}");
        assert_eq!(body["limit"], Value::Null, "call {round}: {body}");
    }
    // A call past it is stopped by it, as a clean run is: not by the
    // environment's budget (the call's timeout and a second).
    let started = Instant::now();
    let body = ok(&server, &id, &burn(10.0)).await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "stopped after {:?}: {body}",
        started.elapsed()
    );
    assert_eq!(body["limit"], "cpu", "{body}");
    assert_eq!(body["signal"], "SIGXCPU", "{body}");
    assert_eq!(body["stdout"], "", "{body}");
    let lost = body["session_lost"].as_str().expect("the loss is reported");
    assert!(lost.contains("was killed by SIGXCPU"), "{lost}");
    server.stop().await;
}

#[tokio::test]
async fn a_call_larger_than_a_pipe_holds_to_a_session_that_died_is_answered_at_once() {
    // A process the session's process forked keeps the request pipe open
    // after it died: writing a large call there never fails.
    let server = TestServer::start().await;
    let id = create(&server, json!({"timeout": 20})).await;
    ok(
        &server,
        &id,
        "import os, threading, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\nthreading.Timer(0.3, os._exit, (5,)).start()",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = Instant::now();
    let (status, body) = server
        .execute(json!({
            "session": id,
            "code": "print('ran')",
            "files": {"big.txt": "x".repeat(300_000)},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    answered_promptly(started);
    assert_eq!(
        body["session_lost"], "the session process had already exited",
        "{body}"
    );
    assert_eq!(body["stdout"], "", "{body}");
    let (status, body) = call(&server, &id, "1").await;
    assert_eq!(status, 404, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_call_its_client_abandons_ends_the_session_at_once() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 1").await;
    let (_, health) = server.get("/health").await;
    assert_eq!(health["sessions"], 1, "{health}");
    let abandoned = server
        .client
        .post(format!("{}/execute", server.url))
        .json(&json!({"session": id, "code": "import time\ntime.sleep(30)"}))
        .timeout(Duration::from_millis(800))
        .send()
        .await;
    assert!(abandoned.is_err(), "the client gave up: {abandoned:?}");
    // The session's process was killed with the call: the session is gone
    // from the list and the count at once, not at its next call or expiry.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, listing) = server.get("/sessions").await;
        let (_, health) = server.get("/health").await;
        if listing["sessions"] == json!([]) && health["sessions"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "still live: {listing} {health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = call(&server, &id, "x").await;
    assert_eq!(status, 404, "{body}");
    assert!(common::error_message(&body).contains("abandoned"), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn an_exception_whose_text_utf8_cannot_carry_keeps_the_session() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(&server, &id, "x = 1").await;
    let body = ok(&server, &id, "raise ValueError(chr(0xd800))").await;
    assert_eq!(body["error"]["type"], "ValueError", "{body}");
    assert_eq!(body["error"]["message"], "\\ud800", "{body}");
    assert_eq!(body["exit_code"], 1, "{body}");
    assert_eq!(body["session_lost"], Value::Null, "{body}");
    let body = ok(
        &server,
        &id,
        "class A:\n    def __repr__(self):\n        return chr(0xdcff)\nA()",
    )
    .await;
    assert_eq!(body["result"], "\\xff", "{body}");
    assert_eq!(ok(&server, &id, "x").await["result"], "1");
    server.stop().await;
}

#[tokio::test]
async fn a_calls_own_traceback_module_is_its_codes_and_its_traceback_still_shows() {
    // The session may start before its worker's zygote has imported
    // traceback for the bootstrap: its process then imports its own first.
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    let (status, body) = server
        .execute(json!({
            "session": id,
            "code": "import traceback\nprint(traceback.WHO)\nraise KeyError('shown')",
            "files": {"traceback.py": "WHO = 'mine'\n"},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "mine\n", "{body}");
    assert_eq!(body["error"]["type"], "KeyError", "{body}");
    let stderr = body["stderr"].as_str().unwrap();
    assert!(
        stderr.starts_with("Traceback (most recent call last):\n")
            && stderr.contains("line 3, in <module>")
            && stderr.ends_with("KeyError: 'shown'\n"),
        "{stderr}"
    );
    assert_eq!(ok(&server, &id, "traceback.WHO").await["result"], "'mine'");
    server.stop().await;
}

#[tokio::test]
async fn a_session_directory_past_the_walk_budget_still_gets_only_each_calls_files() {
    let (server, _dir) = common::server_with_patched_worker("w.WALK_ENTRIES = 100\n", |c| {
        c.sessions.interrupt_grace = Duration::from_millis(300);
    })
    .await;
    let id = create(&server, json!({})).await;
    let make =
        "import os\nos.mkdir('old')\nfor i in range(150):\n    open('old/f%03d' % i, 'w').close()";
    let body = ok(&server, &id, make).await;
    assert_eq!(body["artifacts_truncated"], true, "{body}");
    let listed = artifact_paths(&body);
    assert!(
        (50..100).contains(&listed.len()),
        "the first 99 entries' files: {body}"
    );
    // Older than the next call by more than a timer tick (file times lag
    // the clock by up to one).
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Files the last walk did not reach come into this one's reach: they
    // are not this call's, and are not listed.
    let remove: Vec<String> = listed[..10]
        .iter()
        .map(|p| format!("os.remove({p:?})"))
        .collect();
    let code = format!(
        "import os\n{}\nopen('new.txt', 'w').write('n')",
        remove.join("\n")
    );
    let body = ok(&server, &id, &code).await;
    assert_eq!(artifact_paths(&body), ["new.txt"], "{body}");
    assert_eq!(body["artifacts_truncated"], true, "{body}");
    let body = ok(&server, &id, "x = 1").await;
    assert_eq!(artifact_paths(&body), Vec::<&str>::new(), "{body}");
    assert_eq!(body["artifacts_truncated"], true, "{body}");
    let body = ok(&server, &id, "open('new.txt', 'a').write('m')").await;
    assert_eq!(artifact_paths(&body), ["new.txt"], "{body}");
    // Written by a thread after its call ended: it comes back with the next.
    let later = "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), open('late.txt', 'w').close())).start()";
    let body = ok(&server, &id, later).await;
    assert_eq!(artifact_paths(&body), Vec::<&str>::new(), "{body}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let body = ok(&server, &id, "x = 2").await;
    assert_eq!(artifact_paths(&body), ["late.txt"], "{body}");
    // A call killed at its timeout: its files are those written since it
    // began (after a timer tick: files' times may lag the clock by one),
    // cut alike.
    let (status, body) = server
        .execute(json!({"session": id, "timeout": 0.5, "code": "import os, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(0.05)\nos.mkdir('more')\nfor i in range(150):\n    open('more/g%03d' % i, 'w').close()\nwhile True:\n    pass"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert!(body["session_lost"].is_string(), "{body}");
    assert_eq!(body["artifacts_truncated"], true, "{body}");
    let listed = artifact_paths(&body);
    assert!(
        !listed.is_empty() && listed.iter().all(|p| p.starts_with("more/")),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_call_whose_files_the_session_has_something_else_in_the_way_of_is_refused() {
    let server = TestServer::start().await;
    let id = create(&server, json!({})).await;
    ok(
        &server,
        &id,
        "import os\nkept = 7\nos.mkdir('d.txt')\nos.symlink('/etc/hostname', 'l.txt')\nopen('f', 'w').close()\nos.mkfifo('p')\nos.mkdir('real')\nos.symlink('real', 'linked')",
    )
    .await;
    let refused = [
        ("d.txt", "the session has a directory there"),
        ("l.txt", "the session has a symbolic link there"),
        ("p", "the session has a named pipe there"),
        ("f/x", "\"f\" in its path is not a directory in the session"),
    ];
    for (path, why) in refused {
        let (status, body) = server
            .execute(json!({"session": id, "code": "kept += 1", "files": {path: "input"}}))
            .await;
        assert_eq!(status, 409, "{path}: {body}");
        assert_eq!(body["error"]["code"], "conflict", "{body}");
        assert_eq!(
            body["error"]["message"],
            format!("file \"{path}\" cannot be written: {why}; the call did not run"),
            "{body}"
        );
    }
    // None of those calls ran, nothing was written through the link, and
    // the session goes on with its state.
    let body = ok(
        &server,
        &id,
        "import os\nprint(kept, os.path.isdir('d.txt'), os.readlink('l.txt'), os.listdir('d.txt'))",
    )
    .await;
    assert_eq!(body["stdout"], "7 True /etc/hostname []\n", "{body}");
    // A directory of the path may be a link to one, and a file that is
    // there is replaced.
    let (status, body) = server
        .execute(json!({"session": id, "code": "print(open('real/x').read(), open('f').read())", "files": {"linked/x": "through", "f": "replaced"}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "through replaced\n", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_call_file_over_the_sessions_file_size_limit_is_refused_and_the_session_goes_on() {
    let server = TestServer::start().await;
    let id = create(&server, json!({"limits": {"file_size_bytes": 1000}})).await;
    ok(&server, &id, "kept = 1").await;
    let (status, body) = server
        .execute(json!({"session": id, "code": "kept = 2", "files": {"small.txt": "s", "big.txt": "b".repeat(2000)}}))
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "too_large", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("file \"big.txt\" is 2000 bytes, over the session's file_size_bytes of 1000; the call did not run"),
        "{message}"
    );
    let body = ok(
        &server,
        &id,
        "import os\nprint(kept, os.path.exists('big.txt'))",
    )
    .await;
    assert_eq!(body["stdout"], "1 False\n", "{body}");
    server.stop().await;
}

/// A session's process tells an interrupt noted while no code ran by the
/// call's time (python/worker.py's `session_call`): once that time has
/// come it is the call's own, raised in place of its code, and the report
/// says the call timed out, since the server may not have sent its own yet;
/// before then it was a late one for the last call, and the code runs.
#[test]
fn an_interrupt_noted_before_a_call_is_its_timeout_only_once_due() {
    let script = r#"
import importlib.util, os, sys, types
spec = importlib.util.spec_from_file_location("bootstrap", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
devnull = os.open(os.devnull, os.O_RDONLY)
clock = worker.SessionClock()
for due in (0.0, worker._monotonic() + 3600):
    worker._interrupted[0] = True
    report = worker.session_call("print('ran', flush=True)", None, [], [], None, 1000,
                                 types.ModuleType("__main__"), os.getcwd(), devnull, clock, due)
    error = report["error"]["type"] if report["error"] else None
    print("report", report["status"], error, report.get("timed_out"), worker._interrupted[0],
          flush=True)
"#;
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::python())
        .args(["-c", script])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/python/worker.py"))
        .current_dir(dir.path())
        .output()
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "report 1 KeyboardInterrupt True False\nran\nreport 0 None None False\n"
    );
}
