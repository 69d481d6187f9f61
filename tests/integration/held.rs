//! Programs the zygote holds (`hold_programs`): a program that runs again
//! (the same code sent again, the cases of a `/grade` call) is loaded once
//! by the zygote, and the runs forked after that find it there instead of
//! in their request. What the runs see does not change. Off by default.

use serde_json::json;

use crate::common::{self, TestServer};

/// A server of one pooled worker (holding programs as `hold` says) whose
/// bootstrap writes, in each run's stderr and before anything else, where
/// each of the run's programs came from: `[held]` from its zygote, `[sent]`
/// in its request.
async fn server_telling_held() -> (TestServer, tempfile::TempDir) {
    server_telling(true).await
}

async fn server_telling(hold: bool) -> (TestServer, tempfile::TempDir) {
    common::server_with_patched_worker(
        "look_up = w.look_up_held\n\
         def telling(compiled):\n    \
             held = type(compiled) is int and compiled in w.HELD\n    \
             os.write(2, b'[held]' if held else b'[sent]')\n    \
             return look_up(compiled)\n\
         w.look_up_held = telling\n",
        |config| config.hold_programs = hold,
    )
    .await
}

/// Run `code`; its stdout and stderr.
async fn run(server: &TestServer, code: &str) -> (String, String) {
    let body = server.run(code).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    (
        body["stdout"].as_str().unwrap().to_string(),
        body["stderr"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn a_program_run_again_is_held_by_the_zygote_from_its_second_run_on() {
    let (server, _dir) = server_telling_held().await;
    let code = "x = 6\nprint(x * 7)\nx";
    let mut told = Vec::new();
    for _ in 0..4 {
        let body = server.run(code).await;
        assert_eq!(body["stdout"], "42\n", "{body}");
        assert_eq!(body["result"], "6", "{body}");
        told.push(body["stderr"].as_str().unwrap().to_string());
    }
    // Run once, then again: the zygote holds it once the second run ended,
    // and the children it forks from then on have it.
    assert_eq!(told, ["[sent]", "[sent]", "[held]", "[held]"]);
    // Another program is sent; the held one stays held.
    assert_eq!(
        run(&server, "print(1)").await,
        ("1\n".into(), "[sent]".into())
    );
    assert_eq!(run(&server, code).await, ("42\n".into(), "[held]".into()));
    // A held program's errors are its own, with its lines.
    let failing = "x = 1\nraise ValueError('no')";
    for expected in ["[sent]", "[sent]", "[held]"] {
        let body = server.run(failing).await;
        assert_eq!(body["exit_code"], 1, "{body}");
        let stderr = body["stderr"].as_str().unwrap();
        assert!(stderr.starts_with(expected), "{expected}: {stderr}");
        assert!(stderr.contains("line 2"), "{stderr}");
        assert_eq!(body["error"]["type"], "ValueError", "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn by_default_no_program_is_held() {
    let (server, _dir) = server_telling(false).await;
    for _ in 0..4 {
        assert_eq!(
            run(&server, "print(6 * 7)").await,
            ("42\n".into(), "[sent]".into())
        );
    }
    let (status, body) = server
        .post(
            "/grade",
            json!({
                "code": "def inc(x):\n    return x + 1\n",
                "entry": "inc",
                "test_code": "def check(candidate):\n    assert candidate(1) == 2\n",
                "tests": (0..4).map(|_| json!({})).collect::<Vec<_>>(),
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["passed"], 4, "{body}");
    for case in body["cases"].as_array().unwrap() {
        assert_eq!(case["stderr"], "[sent][sent][sent]", "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn the_zygote_holds_the_most_recently_used_programs_and_no_more() {
    let (server, _dir) = server_telling_held().await;
    let programs: Vec<String> = (0..5).map(|i| format!("print({i})")).collect();
    for (i, code) in programs.iter().enumerate() {
        for _ in 0..2 {
            assert_eq!(
                run(&server, code).await,
                (format!("{i}\n"), "[sent]".into())
            );
        }
    }
    // Four held, the fifth in: the first one went.
    assert_eq!(run(&server, &programs[4]).await.1, "[held]");
    assert_eq!(run(&server, &programs[1]).await.1, "[held]");
    assert_eq!(run(&server, &programs[0]).await.1, "[sent]");
    // It ran before: held again, in place of the least recently used (2).
    assert_eq!(run(&server, &programs[0]).await.1, "[held]");
    assert_eq!(run(&server, &programs[2]).await.1, "[sent]");
    assert_eq!(run(&server, &programs[1]).await.1, "[held]");
    server.stop().await;
}

#[tokio::test]
async fn a_program_too_big_to_hold_comes_in_every_request() {
    let (server, _dir) = server_telling_held().await;
    // 60,000 characters of source, ~150 KB of code marshalled: over what
    // the zygote holds.
    let code = format!("x = [{}]\nprint(len(x))", "1,".repeat(30_000));
    for _ in 0..3 {
        assert_eq!(
            run(&server, &code).await,
            ("30000\n".into(), "[sent]".into())
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn graded_cases_find_the_submission_and_test_code_held_and_grade_the_same() {
    let (server, _dir) = server_telling_held().await;
    let passing = "def check(candidate):\n    assert candidate(1) == 2\n";
    let mut tests: Vec<_> = (0..6).map(|_| json!({"test_code": passing})).collect();
    tests
        .push(json!({"test_code": "def check(candidate):\n    assert candidate(1) == 3, 'off'\n"}));
    let request = json!({
        "code": "def inc(x):\n    return x + 1\n",
        "entry": "inc",
        "tests": tests,
    });
    let (status, body) = server.post("/grade", request.clone()).await;
    assert_eq!(status, 200, "{body}");
    let cases = body["cases"].as_array().unwrap();
    assert_eq!(body["passed"], 6, "{body}");
    for case in &cases[..6] {
        assert_eq!(case["verdict"], "ok", "{body}");
    }
    // Each case runs the harness with the submission and its test code,
    // three programs: sent in the first two cases, held from the third on.
    let marks: Vec<&str> = cases
        .iter()
        .map(|c| c["stderr"].as_str().unwrap())
        .collect();
    assert_eq!(marks[0].matches("[sent]").count(), 3, "{marks:?}");
    assert_eq!(marks[1].matches("[sent]").count(), 3, "{marks:?}");
    for mark in &marks[2..6] {
        assert_eq!(mark.matches("[held]").count(), 3, "{marks:?}");
    }
    // A test code not run before comes in its request; the rest are held.
    assert_eq!(marks[6].matches("[held]").count(), 2, "{marks:?}");
    assert_eq!(marks[6].matches("[sent]").count(), 1, "{marks:?}");
    assert_eq!(cases[6]["verdict"], "wrong_answer", "{body}");
    let diff = cases[6]["diff"].as_str().unwrap();
    assert!(diff.contains("test code line 2"), "{diff}");
    assert!(diff.contains("off"), "{diff}");
    // The same call again: the same verdicts, every program held but the
    // last case's test code, which ran once before.
    let (_, again) = server.post("/grade", request).await;
    let verdicts = |b: &serde_json::Value| -> Vec<String> {
        b["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["verdict"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(verdicts(&again), verdicts(&body));
    assert_eq!(again["cases"][6]["diff"], body["cases"][6]["diff"]);
    let marks: Vec<&str> = again["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["stderr"].as_str().unwrap())
        .collect();
    for mark in &marks[..6] {
        assert_eq!(*mark, "[held][held][held]", "{marks:?}");
    }
    assert_eq!(marks[6].matches("[sent]").count(), 1, "{marks:?}");
    server.stop().await;
}
