//! `POST /grade` and MCP `grade_code`: one submission against many cases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use code_executor::Executor;
use serde_json::{Value, json};

use crate::common::mcp::{call, connect_in_process, text};
use crate::common::{self, TestServer};

/// POST /grade and insist on a 200; the result.
async fn grade(server: &TestServer, body: Value) -> Value {
    let (status, result) = server.post("/grade", body).await;
    assert_eq!(status, 200, "unexpected answer: {result}");
    result
}

fn verdicts(result: &Value) -> Vec<String> {
    result["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["verdict"].as_str().unwrap().to_string())
        .collect()
}

const ADD: &str = "a, b = map(int, input().split())\nprint(a + b)\n";

fn sum_cases(pairs: &[(i64, i64, i64)]) -> Value {
    pairs
        .iter()
        .map(|(a, b, sum)| json!({"stdin": format!("{a} {b}\n"), "expected_stdout": format!("{sum}\n")}))
        .collect()
}

#[tokio::test]
async fn a_correct_solution_is_ok_everywhere_with_os_measurements() {
    let server = TestServer::start().await;
    let mut tests = sum_cases(&[(1, 2, 3), (10, 20, 30), (-5, 5, 0), (7, 8, 15)]);
    tests.as_array_mut().unwrap()[0]["name"] = json!("small");
    let result = grade(&server, json!({"code": ADD, "tests": tests})).await;
    assert_eq!(verdicts(&result), ["ok", "ok", "ok", "ok"], "{result}");
    assert_eq!(result["passed"], 4);
    assert_eq!(result["total"], 4);
    assert_eq!(result["counts"]["ok"], 4);
    assert_eq!(result["counts"]["wrong_answer"], 0);
    let first = &result["cases"][0];
    assert_eq!(first["name"], "small");
    assert_eq!(first["index"], 0);
    assert_eq!(first["exit_code"], 0);
    assert_eq!(first["stdout"], "3\n");
    assert!(first["diff"].is_null());
    for case in result["cases"].as_array().unwrap() {
        let cpu = case["cpu_ms"].as_f64().expect("cpu_ms");
        assert!((0.0..1000.0).contains(&cpu), "{case}");
        // A Python process holds megabytes resident, never nothing.
        let rss = case["peak_rss_kb"].as_u64().expect("peak_rss_kb");
        assert!(rss > 1000, "{case}");
        assert!(case["wall_ms"].as_f64().unwrap() > 0.0, "{case}");
    }
    // Plain /execute stays as it was: no rusage fields.
    let body = server.run("print(1)").await;
    assert!(body.get("cpu_ms").is_none(), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_wrong_solution_gets_wrong_answer_with_a_diff() {
    let server = TestServer::start().await;
    let code = "a, b = map(int, input().split())\nprint(a + b + (1 if a > 5 else 0))\n";
    let result = grade(
        &server,
        json!({"code": code, "tests": sum_cases(&[(1, 2, 3), (10, 20, 30)])}),
    )
    .await;
    assert_eq!(verdicts(&result), ["ok", "wrong_answer"], "{result}");
    assert_eq!(result["passed"], 1);
    assert_eq!(result["counts"]["wrong_answer"], 1);
    let wrong = &result["cases"][1];
    assert_eq!(wrong["stdout"], "31\n");
    assert_eq!(wrong["exit_code"], 0);
    assert_eq!(wrong["diff"], "line 1: expected \"30\", got \"31\"");
    server.stop().await;
}

#[tokio::test]
async fn a_raise_or_crash_on_one_input_fails_only_there_and_grading_is_repeatable() {
    let server = TestServer::start().await;
    let code = "import os, signal\nn = int(input())\nif n == 99:\n    os.kill(os.getpid(), signal.SIGSEGV)\nprint(100 // n)\n";
    let tests: Vec<Value> = [5, 0, 10, 99, 1]
        .iter()
        .map(|n: &i64| {
            let expected = if *n == 0 || *n == 99 {
                String::new()
            } else {
                format!("{}\n", 100 / n)
            };
            json!({"stdin": n.to_string(), "expected_stdout": expected})
        })
        .collect();
    let body = json!({"code": code, "tests": tests});
    let result = grade(&server, body.clone()).await;
    assert_eq!(
        verdicts(&result),
        ["ok", "runtime_error", "ok", "runtime_error", "ok"],
        "{result}"
    );
    let raised = &result["cases"][1];
    assert_eq!(raised["error"]["type"], "ZeroDivisionError");
    assert_eq!(raised["error"]["line"], 5);
    assert_eq!(raised["exit_code"], 1);
    assert!(
        raised["stderr"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError")
    );
    assert!(raised["diff"].is_null());
    let crashed = &result["cases"][3];
    assert_eq!(crashed["signal"], "SIGSEGV");
    assert_eq!(crashed["exit_code"], -11);
    assert_eq!(result["counts"]["runtime_error"], 2);

    for _ in 0..2 {
        let again = grade(&server, body.clone()).await;
        assert_eq!(verdicts(&again), verdicts(&result));
    }
    server.stop().await;
}

#[tokio::test]
async fn hangs_time_out_alone_and_in_parallel() {
    let server = TestServer::start().await;
    let code = "s = input()\nif s == 'hang':\n    while True: pass\nprint(s)\n";
    let tests: Vec<Value> = ["a", "hang", "b", "c", "hang", "d"]
        .iter()
        .map(|s| {
            let expected = if *s == "hang" {
                String::new()
            } else {
                format!("{s}\n")
            };
            json!({"stdin": s, "expected_stdout": expected, "timeout": 2})
        })
        .collect();
    let started = Instant::now();
    let result = grade(&server, json!({"code": code, "tests": tests})).await;
    let elapsed = started.elapsed();
    assert_eq!(
        verdicts(&result),
        ["ok", "timeout", "ok", "ok", "timeout", "ok"],
        "{result}"
    );
    let hung = &result["cases"][1];
    assert_eq!(hung["signal"], "SIGKILL");
    // It burned CPU (how much depends on the machine's load: the test
    // machine's cores are shared).
    assert!(hung["cpu_ms"].as_f64().unwrap() > 0.0, "{hung}");
    // Two two-second hangs on two workers: about one timeout (2 s), not
    // the sum (4 s); the bound sits halfway.
    assert!(elapsed >= Duration::from_millis(1950), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(3000), "took {elapsed:?}");
    server.stop().await;
}

/// Seconds and scores in messages read as written, not as a row of 300 zeros.
#[tokio::test]
async fn numbers_in_messages_are_written_as_a_person_reads_them() {
    let server = TestServer::start().await;
    let hang = "while True: pass\n";
    for (timeout, written) in [(json!(1e-300), "1e-300"), (json!(0.25), "0.25")] {
        let result = grade(
            &server,
            json!({"code": hang, "timeout": timeout, "tests": [{"expected_stdout": ""}]}),
        )
        .await;
        assert_eq!(
            result["cases"][0]["message"],
            format!("killed after the timeout of {written} s"),
            "{result}"
        );
    }
    let checker = "def check(input, expected, output):\n    return float(expected)\n";
    let result = grade(
        &server,
        json!({"code": "pass", "checker": {"code": checker}, "tests": [{"expected_stdout": "1e-300"}]}),
    )
    .await;
    assert_eq!(
        result["cases"][0]["diff"], "the checker scored it 1e-300",
        "{result}"
    );
    let (status, body) = server
        .post("/execute", json!({"code": "pass", "timeout": -1e-300}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"]["message"],
        "timeout must be a positive number of seconds, got -1e-300"
    );
    let (status, body) = server.post("/sessions", json!({"ttl": -1e-300})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"]["message"],
        "ttl must be a positive number of seconds, at least 0.001 (session times are kept to \
         the millisecond), got -1e-300"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_memory_hog_hits_memory_limit() {
    let server = TestServer::start().await;
    let code = "n = int(input())\nif n < 0:\n    chunks = []\n    while True:\n        chunks.append(bytearray(8 << 20))\nblob = bytearray(n << 20)\nprint(len(blob) >> 20)\n";
    let tests = json!([
        {"stdin": "16", "expected_stdout": "16\n"},
        {"stdin": "4096", "expected_stdout": "4096\n"},
        {"stdin": "-1", "expected_stdout": ""},
    ]);
    let result = grade(
        &server,
        json!({"code": code, "tests": tests, "limits": {"memory_bytes": 512u64 << 20}}),
    )
    .await;
    assert_eq!(
        verdicts(&result),
        ["ok", "memory_limit", "memory_limit"],
        "{result}"
    );
    assert_eq!(result["cases"][1]["error"]["type"], "MemoryError");
    assert!(
        result["cases"][2]["message"]
            .as_str()
            .unwrap()
            .contains("536870912"),
        "{result}"
    );
    assert!(result["cases"][0]["peak_rss_kb"].as_u64().unwrap() >= 16 << 10);
    server.stop().await;
}

#[tokio::test]
async fn comparison_modes_decide_what_matches() {
    let server = TestServer::start().await;
    let code = "print('1 2  \\n3\\n')";
    let case = json!([{"expected_stdout": "1 2\n3"}]);
    let mut seen = Vec::new();
    for mode in ["exact", "trim", "tokens"] {
        let result = grade(
            &server,
            json!({"code": code, "tests": case, "compare": mode}),
        )
        .await;
        seen.push(verdicts(&result)[0].clone());
    }
    assert_eq!(seen, ["wrong_answer", "ok", "ok"]);

    let tests = json!([
        {"stdin": "1", "expected_stdout": "0.3333333 2"},
        {"stdin": "2", "expected_stdout": "0.33 2"},
    ]);
    let code = "k = int(input())\nprint(round(1/3, 8 if k == 1 else 4), 2)";
    let float = grade(
        &server,
        json!({"code": code, "tests": tests, "compare": "float:1e-6"}),
    )
    .await;
    assert_eq!(verdicts(&float), ["ok", "wrong_answer"], "{float}");
    assert!(
        float["cases"][1]["diff"]
            .as_str()
            .unwrap()
            .starts_with("token 1: expected \"0.33\", got \"0.3333\""),
        "{float}"
    );
    let tokens = grade(
        &server,
        json!({"code": code, "tests": tests, "compare": "tokens"}),
    )
    .await;
    assert_eq!(verdicts(&tokens), ["wrong_answer", "wrong_answer"]);

    let (status, body) = server
        .post(
            "/grade",
            json!({"code": code, "tests": tests, "compare": "fuzzy"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(crate::common::error_message(&body).contains("fuzzy"));
    server.stop().await;
}

#[tokio::test]
async fn function_mode_reads_and_writes_json_with_the_standard_library_whatever_a_case_sends() {
    // A case's own json.py is the json its code imports; the harness that
    // reads the case's input and writes the value keeps the standard
    // library's. Graded four times over: the first cases may run in processes
    // forked before their zygote imported json.
    let server = TestServer::start().await;
    let code = "import json\ndef solve(a):\n    return [a, json.WHO]\n";
    let tests =
        json!([{"input": [1], "expected": [1, "mine"]}, {"input": [2], "expected": [2, "mine"]}]);
    for round in 0..4 {
        let result = grade(
            &server,
            json!({"code": code, "tests": tests, "entry": "solve",
                   "files": {"json.py": "WHO = 'mine'\ndef dumps(*a, **k):\n    return 'forged'\n"}}),
        )
        .await;
        assert_eq!(verdicts(&result), ["ok", "ok"], "round {round}: {result}");
    }
    server.stop().await;
}

#[tokio::test]
async fn function_mode_calls_the_entry_and_compares_return_values() {
    let server = TestServer::start().await;
    let code = "def solve(a, b=0):\n    print('noise')\n    if a == 'boom':\n        raise ValueError('bad input')\n    return {'sum': a + b, 'items': [a, b, 0.1 + 0.2]}\n";
    let expected = |sum: i64, a: i64, b: i64| json!({"sum": sum, "items": [a, b, 0.3]});
    let tests = json!([
        {"input": [1, 2], "expected": expected(3, 1, 2)},
        {"input": {"a": 5, "b": 6}, "expected": expected(11, 5, 6)},
        {"input": 4, "expected": expected(4, 4, 0)},
        {"input": [1, 2], "expected": expected(4, 1, 2)},
        {"input": ["boom"], "expected": null},
    ]);
    let result = grade(
        &server,
        json!({"code": code, "tests": tests, "entry": "solve", "compare": "float:1e-9"}),
    )
    .await;
    assert_eq!(
        verdicts(&result),
        ["ok", "ok", "ok", "wrong_answer", "runtime_error"],
        "{result}"
    );
    assert_eq!(result["cases"][0]["returned"]["sum"], 3);
    assert_eq!(result["cases"][0]["stdout"], "noise\n");
    assert_eq!(
        result["cases"][3]["diff"], "at $.sum: expected 4, got 3",
        "{result}"
    );
    let raised = &result["cases"][4];
    assert_eq!(raised["error"]["type"], "ValueError");
    assert_eq!(raised["error"]["line"], 4);

    // Without the tolerance 0.1 + 0.2 is not 0.3.
    let exact = grade(
        &server,
        json!({"code": code, "tests": [tests[0].clone()], "entry": "solve"}),
    )
    .await;
    assert_eq!(verdicts(&exact), ["wrong_answer"]);
    assert!(
        exact["cases"][0]["diff"]
            .as_str()
            .unwrap()
            .starts_with("at $.items[2]")
    );

    let missing = grade(
        &server,
        json!({"code": code, "tests": [{"input": 1}], "entry": "solver"}),
    )
    .await;
    assert_eq!(verdicts(&missing), ["runtime_error"]);
    assert_eq!(missing["cases"][0]["error"]["type"], "NameError");

    let exits_first = grade(
        &server,
        json!({"code": "import sys\nsys.exit(0)\ndef f(): return 1", "tests": [{"expected": 1}], "entry": "f"}),
    )
    .await;
    assert_eq!(verdicts(&exits_first), ["runtime_error"]);
    server.stop().await;
}

#[tokio::test]
async fn stop_on_first_failure_skips_the_rest_without_running_it() {
    let server = TestServer::start().await;
    let code = "import time\ns = input()\nif s == 'slow':\n    time.sleep(1)\nprint(s)\n";
    let mut tests = vec![
        json!({"stdin": "a", "expected_stdout": "a\n"}),
        json!({"stdin": "b", "expected_stdout": "not b\n", "name": "the bad one"}),
    ];
    for _ in 0..6 {
        tests.push(json!({"stdin": "slow", "expected_stdout": "slow\n"}));
    }
    let started = Instant::now();
    let result = grade(
        &server,
        json!({"code": code, "tests": tests, "stop_on_first_failure": true}),
    )
    .await;
    let elapsed = started.elapsed();
    let mut expected = vec!["ok", "wrong_answer"];
    expected.extend(["skipped"; 6]);
    assert_eq!(verdicts(&result), expected, "{result}");
    assert_eq!(result["counts"]["skipped"], 6);
    assert_eq!(result["passed"], 1);
    assert_eq!(result["total"], 8);
    let skipped = &result["cases"][5];
    assert!(skipped["exit_code"].is_null());
    assert_eq!(
        skipped["message"],
        "skipped: test 1 failed and stop_on_first_failure is set"
    );
    // Six one-second cases on two workers take 3 s; at most one of them
    // was already running when test 1 failed (1 s).
    assert!(elapsed < Duration::from_millis(2000), "took {elapsed:?}");
    server.stop().await;
}

#[tokio::test]
async fn two_hundred_cases_in_one_request_come_back_in_order() {
    let server = TestServer::start().await;
    let tests: Vec<Value> = (0..200)
        .map(|i| json!({"stdin": i.to_string(), "args": [format!("arg{i}")], "expected_stdout": format!("{} arg{i}\n", i * 2)}))
        .collect();
    let code = "import sys\nprint(int(input()) * 2, *sys.argv[1:])";
    let result = grade(&server, json!({"code": code, "tests": tests})).await;
    assert_eq!(result["passed"], 200, "{}", result["counts"]);
    assert_eq!(result["total"], 200);
    for (i, case) in result["cases"].as_array().unwrap().iter().enumerate() {
        assert_eq!(case["index"], i);
        assert_eq!(case["stdout"], format!("{} arg{i}\n", i * 2));
    }
    server.stop().await;
}

#[tokio::test]
async fn cpu_ms_counts_cpu_burned_not_time_waited() {
    let server = TestServer::start().await;
    let code = "import time\nif input() == 'burn':\n    t = time.process_time()\n    while time.process_time() - t < 0.2: pass\nelse:\n    time.sleep(0.3)\n";
    let result = grade(
        &server,
        json!({"code": code, "tests": [{"stdin": "burn"}, {"stdin": "sleep"}]}),
    )
    .await;
    assert_eq!(verdicts(&result), ["ok", "ok"], "{result}");
    let (burn, sleep) = (&result["cases"][0], &result["cases"][1]);
    assert!(burn["cpu_ms"].as_f64().unwrap() >= 150.0, "{burn}");
    assert!(sleep["cpu_ms"].as_f64().unwrap() < 100.0, "{sleep}");
    assert!(sleep["wall_ms"].as_f64().unwrap() >= 290.0, "{sleep}");
    server.stop().await;
}

#[tokio::test]
async fn bad_grading_requests_are_refused_with_a_reason() {
    let server = TestServer::with_config(code_executor::Config {
        max_grade_cases: 3,
        ..common::config()
    })
    .await;
    let refusals = [
        (json!({"code": "1", "tests": []}), 400, "at least one"),
        (
            json!({"code": "1", "tests": [{}, {}, {}, {}]}),
            413,
            "max_grade_cases",
        ),
        (
            json!({"code": "1", "tests": [{"expected_output": "x"}]}),
            400,
            "expected_output",
        ),
        (
            json!({"code": "1", "tests": [{"input": 1}]}),
            400,
            "need entry",
        ),
        (
            json!({"code": "1", "tests": [{"input": 1}], "entry": "f()"}),
            400,
            "not a Python function name",
        ),
        (
            json!({"code": "1", "tests": [{}], "checker": {"code": "", "entry": "a b"}}),
            400,
            "checker.entry \"a b\" is not a Python function name",
        ),
        (
            json!({"code": "1", "tests": [{}, {"files": {"../x": "y"}}]}),
            400,
            "test 1",
        ),
        (
            json!({"code": "1", "tests": [{}], "env": "nope"}),
            404,
            "nope",
        ),
    ];
    for (body, status, needle) in refusals {
        let (got, answer) = server.post("/grade", body.clone()).await;
        assert_eq!(got, status, "{body} -> {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(needle), "{body} -> {answer}");
    }
    // What the request sets for every case is named as the request's, and
    // refused even where every case sets its own.
    let request_level = [
        (
            json!({"tests": [{"timeout": 1}, {"timeout": 2}, {}], "timeout": 0}),
            "request: timeout must be a positive number of seconds, got 0",
        ),
        (
            json!({"tests": [{"timeout": 1}], "timeout": -3}),
            "request: timeout must be a positive number of seconds, got -3",
        ),
        (
            json!({"tests": [{}], "files": {"/x": "a"}}),
            "request: file path \"/x\" must be relative",
        ),
        (
            json!({"tests": [{}], "limits": {"memory_bytes": 0}}),
            "request: limits.memory_bytes must be positive",
        ),
        (
            json!({"tests": [{}], "int_max_str_digits": 5}),
            "request: int_max_str_digits must be 0 (no limit) or at least 640, got 5",
        ),
    ];
    for (mut body, message) in request_level {
        body["code"] = json!("print(1)");
        let (got, answer) = server.post("/grade", body.clone()).await;
        assert_eq!(got, 400, "{body} -> {answer}");
        assert_eq!(common::error_message(&answer), message, "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_reserved_file_name_is_blamed_on_the_part_that_sent_it() {
    let server = TestServer::start().await;
    let refusals = [
        (
            json!({"code": "1", "test_code": "pass", "files": {"__tests__.py": "x"}}),
            "request: the file name __tests__.py is reserved by the grader",
        ),
        (
            json!({"code": "def f(): pass", "entry": "f", "tests": [{}, {}],
                   "files": {"./__grade_input__.json": "x"}}),
            "request: the file name __grade_input__.json is reserved by the grader",
        ),
        (
            json!({"code": "1", "test_code": "pass",
                   "tests": [{}, {"name": "b", "files": {"__submission__.py": "x"}}]}),
            "test 1 (\"b\"): the file name __submission__.py is reserved by the grader",
        ),
    ];
    for (body, message) in refusals {
        let (status, answer) = server.post("/grade", body.clone()).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        assert_eq!(common::error_message(&answer), message, "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn too_large_grading_requests_are_named_as_the_requests() {
    let mut config = common::config();
    config.max_grade_cases = 2;
    config.request_limits.max_code_bytes = 64;
    config.request_limits.max_files_bytes = 16;
    let server = TestServer::with_config(config).await;
    let refusals = [
        (
            json!({"code": "1", "tests": [{}, {}, {}]}),
            "request: 3 test cases exceed the limit of 2 per request (max_grade_cases)",
        ),
        (
            json!({"code": "#".repeat(100), "tests": [{}]}),
            "request: code is 100 bytes, over the max_code_bytes limit of 64",
        ),
        (
            json!({"code": "1", "tests": [{}], "files": {"a": "x".repeat(20)}}),
            "request: files total over the max_files_bytes limit of 16 bytes",
        ),
        // A case's own files are that case's.
        (
            json!({"code": "1", "tests": [{}, {"files": {"a": "x".repeat(20)}}]}),
            "test 1: files total over the max_files_bytes limit of 16 bytes",
        ),
    ];
    for (body, message) in refusals {
        let (status, answer) = server.post("/grade", body.clone()).await;
        assert_eq!(status, 413, "{body} -> {answer}");
        assert_eq!(answer["error"]["code"], "too_large", "{answer}");
        assert_eq!(common::error_message(&answer), message, "{body}");
    }
    // In a batch, after the submission's name.
    let (status, answer) = server
        .post(
            "/grade/batch",
            json!({"submissions": [{"code": "1", "tests": [{}]}, {"code": "1", "tests": [{}, {}, {}]}]}),
        )
        .await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(
        common::error_message(&answer),
        "submission 1: request: 3 test cases exceed the limit of 2 per request (max_grade_cases)"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_case_file_replaces_the_requests_however_its_path_is_spelt() {
    let server = TestServer::start().await;
    let result = grade(
        &server,
        json!({"code": "print(open('d/b').read())", "files": {"d/b": "req"}, "tests": [
            {"files": {"d//b": "case"}, "expected_stdout": "case\n"},
            {"files": {"./d/b": "dot"}, "expected_stdout": "dot\n"},
            {"expected_stdout": "req\n"},
        ]}),
    )
    .await;
    assert_eq!(verdicts(&result), ["ok", "ok", "ok"], "{result}");
    // Within one case two spellings of a path are still a mistake.
    let (status, answer) = server
        .post(
            "/grade",
            json!({"code": "1", "tests": [{"files": {"d/b": "x", "d//b": "y"}}]}),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        common::error_message(&answer).starts_with("test 0: file paths"),
        "{answer}"
    );
    server.stop().await;
}

#[tokio::test]
async fn mcp_grade_code_returns_the_summary_and_structured_verdicts() {
    let config = common::config();
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor.clone(), &config).await;
    let args = json!({
        "code": ADD,
        "tests": [
            {"name": "easy", "stdin": "1 2", "expected_stdout": "3\n"},
            {"name": "hard", "stdin": "2 2", "expected_stdout": "5\n"},
        ],
    });
    let result = call(&client, "grade_code", args).await.unwrap();
    assert_eq!(result.is_error, Some(false));
    let summary = text(&result);
    assert!(
        summary.starts_with("passed 1/2 (ok 1, wrong_answer 1)"),
        "{summary}"
    );
    assert!(
        summary.contains("test 1 (hard): wrong_answer: line 1: expected \"5\", got \"4\""),
        "{summary}"
    );
    let structured = result.structured_content.expect("structuredContent");
    assert_eq!(structured["passed"], 1);
    assert_eq!(structured["cases"][1]["verdict"], "wrong_answer");
    assert!(structured["cases"][0]["cpu_ms"].is_number());

    let refused = call(&client, "grade_code", json!({"code": "1", "tests": []}))
        .await
        .unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert!(text(&refused).contains("bad_request"));
    let _ = client.cancel().await;
    executor.shutdown().await;
}

#[tokio::test]
async fn mcp_grade_code_gives_each_case_not_ok_one_line() {
    let config = common::config();
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor.clone(), &config).await;
    let args = json!({
        "code": "raise ValueError('line one\\nline two')",
        "tests": [{}, {"name": "a\nb"}],
    });
    let result = call(&client, "grade_code", args).await.unwrap();
    // A line break in a message or a name is written as \n: one line each.
    assert_eq!(
        text(&result),
        "passed 0/2 (runtime_error 2)\n\
         test 0: runtime_error: ValueError: line one\\nline two\n\
         test 1 (a\\nb): runtime_error: ValueError: line one\\nline two"
    );
    let structured = result.structured_content.expect("structuredContent");
    assert_eq!(
        structured["cases"][0]["message"],
        "ValueError: line one\nline two"
    );
    let _ = client.cancel().await;
    executor.shutdown().await;
}

/// An exception with an empty message is named as Python's traceback
/// names it, with no colon after it, over HTTP and in MCP's text.
#[tokio::test]
async fn an_exception_without_a_message_is_named_alone() {
    let config = common::config();
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor.clone(), &config).await;
    let args = json!({
        "code": "n = int(input())\nraise ValueError() if n else KeyError('k')",
        "tests": [{"stdin": "1"}, {"stdin": "0"}],
    });
    let result = call(&client, "grade_code", args).await.unwrap();
    assert_eq!(
        text(&result),
        "passed 0/2 (runtime_error 2)\n\
         test 0: runtime_error: ValueError\n\
         test 1: runtime_error: KeyError: 'k'"
    );
    let structured = result.structured_content.expect("structuredContent");
    assert_eq!(structured["cases"][0]["message"], "ValueError");
    assert_eq!(structured["cases"][0]["error"]["message"], "");
    let _ = client.cancel().await;
    executor.shutdown().await;
}

/// `/grade` and `/execute` tell a limit from the same report: the same
/// failure names the same limit in both.
#[tokio::test]
async fn grading_and_execute_name_the_same_limit() {
    let server = TestServer::start().await;
    let cases = [
        // MemoryError under the address-space limit.
        (
            "blob = bytearray(1 << 30)\nprint(len(blob))",
            json!({"memory_bytes": 256u64 << 20}),
            "memory",
            "memory_limit",
        ),
        // EFBIG past the largest file a run may write (CPython ignores SIGXFSZ).
        (
            "open('big', 'wb').write(b'x' * 100000)",
            json!({"file_size_bytes": 10000}),
            "file_size",
            "runtime_error",
        ),
        // ENOMEM raised by hand is no limit's: only what the limit causes is.
        (
            "raise ValueError('No space left on device')",
            json!({}),
            "",
            "runtime_error",
        ),
    ];
    for (code, limits, limit, verdict) in cases {
        let (status, run) = server
            .execute(json!({"code": code, "limits": limits}))
            .await;
        assert_eq!(status, 200, "{run}");
        let graded = grade(
            &server,
            json!({"code": code, "limits": limits, "tests": [{"expected_stdout": ""}]}),
        )
        .await;
        let case = &graded["cases"][0];
        assert_eq!(case["verdict"], verdict, "{code}: {graded}");
        if limit.is_empty() {
            assert!(run["limit"].is_null(), "{code}: {run}");
            assert!(case.get("limit").is_none(), "{code}: {case}");
        } else {
            assert_eq!(run["limit"], limit, "{code}: {run}");
            assert_eq!(case["limit"], limit, "{code}: {case}");
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn function_mode_says_why_no_value_came_back() {
    let server = TestServer::start().await;
    let code = "import sys\n\
                def f(kind=None):\n    \
                    if kind == 'set':\n        return {1}\n    \
                    if kind == 'nan':\n        return float('nan')\n    \
                    if kind == 'exit':\n        sys.exit(0)\n    \
                    if kind == 'big':\n        return 'x' * (11 << 20)\n    \
                    if kind == 'raise':\n        raise KeyError(kind)\n    \
                    return kind\n\
                class Shown:\n    \
                    def __repr__(self):\n        print('repr ran')\n        return 'shown'\n\
                Shown()\n";
    let result = grade(
        &server,
        json!({"code": code, "entry": "f", "tests": [
            {"input": null, "expected": null},
            {"input": "set"},
            {"input": "nan"},
            {"input": "exit"},
            {"input": "big"},
            {"input": "raise"},
            {"input": {"kind": "named"}, "expected": "named"},
        ]}),
    )
    .await;
    assert_eq!(
        verdicts(&result),
        [
            "ok",
            "runtime_error",
            "runtime_error",
            "runtime_error",
            "output_limit",
            "runtime_error",
            "ok"
        ],
        "{result}"
    );
    let cases = &result["cases"];
    assert_eq!(cases[0]["returned"], Value::Null, "{result}");
    assert_eq!(cases[1]["error"]["type"], "TypeError");
    assert_eq!(
        cases[1]["error"]["message"],
        "f() returned a value that is not JSON: Object of type set is not JSON serializable"
    );
    assert_eq!(cases[2]["error"]["type"], "TypeError");
    assert!(
        cases[2]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not JSON compliant"),
        "{result}"
    );
    assert_eq!(cases[3]["exit_code"], 0, "{result}");
    assert_eq!(
        cases[3]["message"],
        "the entry function was never called or did not return (the program exited first)"
    );
    let big = cases[4]["message"].as_str().unwrap();
    assert!(
        big.starts_with(&format!(
            "the returned value ({} bytes of JSON)",
            (11 << 20) + 2
        )),
        "{big}"
    );
    // The traceback is the submission's own: its line, no grader's frame.
    let raised = &cases[5]["error"];
    assert_eq!(raised["type"], "KeyError");
    assert_eq!(raised["line"], 12, "{result}");
    let traceback = raised["traceback"].as_str().unwrap();
    assert!(
        traceback
            .starts_with("Traceback (most recent call last):\n  File \"<code>\", line 12, in f\n"),
        "{traceback}"
    );
    assert_eq!(cases[6]["returned"], "named");
    // The submission's last expression runs; its repr is not made.
    for case in cases.as_array().unwrap() {
        assert!(
            !case["stdout"].as_str().unwrap().contains("repr ran"),
            "{result}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn function_mode_names_an_async_entry() {
    let server = TestServer::start().await;
    let result = grade(
        &server,
        json!({"code": "async def f(x):\n    return x\n", "entry": "f",
               "tests": [{"input": 1, "expected": 1}]}),
    )
    .await;
    let case = &result["cases"][0];
    assert_eq!(case["verdict"], "runtime_error", "{result}");
    assert_eq!(case["error"]["type"], "TypeError", "{result}");
    assert_eq!(
        case["error"]["message"],
        "f() is an async def function: grading calls it and does not await the coroutine it returns",
        "{result}"
    );
    // Its coroutine is closed, not left to warn from the grader's code:
    // stderr is the error alone.
    assert_eq!(
        case["stderr"],
        format!(
            "TypeError: {}\n",
            case["error"]["message"].as_str().unwrap()
        ),
        "{result}"
    );
    server.stop().await;
}

#[tokio::test]
async fn float_compare_holds_infinities_and_nan_to_themselves() {
    let server = TestServer::start().await;
    let case = |stdin: &str, expected: &str| json!({"stdin": stdin, "expected_stdout": expected});
    let result = grade(
        &server,
        json!({"code": "print(input())", "compare": "float", "tests": [
            case("5", "inf"),
            case("-inf", "inf"),
            case("inf", "0"),
            case("1e308", "-1e308"),
            case("nan", "0"),
            case("0", "nan"),
            case("inf", "inf"),
            case("-inf", "-Infinity"),
            case("nan", "NaN"),
            case("1.0000000001e308", "1e308"),
            // Past the largest double a number is no infinity: its text
            // tells it from another.
            case("1e500", "1e400"),
            case("-1e400", "-inf"),
            case("1e400", "1e400"),
        ]}),
    )
    .await;
    let mut expected = vec!["wrong_answer"; 6];
    expected.extend(["ok"; 4]);
    expected.extend(["wrong_answer", "wrong_answer", "ok"]);
    assert_eq!(verdicts(&result), expected, "{result}");
    assert_eq!(
        result["cases"][0]["diff"],
        "token 1: expected \"inf\", got \"5\" (tolerance 1e-6)"
    );
    server.stop().await;
}

/// POST `body` (JSON text, so that it may hold integers no `Value` holds)
/// to `path`; the status and the answer's text.
async fn post_text(server: &TestServer, path: &str, body: String) -> (u16, String) {
    let answer = server
        .client
        .post(format!("{}{path}", server.url))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request is answered");
    let status = answer.status().as_u16();
    (status, answer.text().await.expect("an answer"))
}

#[tokio::test]
async fn deeply_nested_values_are_refused_and_the_server_lives_on() {
    let server = TestServer::start().await;
    // An `expected` nested 100,000 deep is a 400 naming the limit.
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    let (status, text) = post_text(
        &server,
        "/grade",
        format!(
            r#"{{"code": "def f():\n    return 1", "entry": "f", "tests": [{{"expected": {deep}}}]}}"#
        ),
    )
    .await;
    assert_eq!(status, 400, "{}", &text[..text.len().min(300)]);
    assert!(text.contains("nested deeper than 128"), "{text}");
    // A returned value nested past the limit is the case's runtime error.
    let code = "def f():\n    v = []\n    for _ in range(200):\n        v = [v]\n    return v";
    let (status, text) = post_text(
        &server,
        "/grade",
        json!({"code": code, "entry": "f", "tests": [{"expected": 1}]}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let result: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(verdicts(&result), ["runtime_error"], "{result}");
    assert!(
        result["cases"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("nested deeper than 128")),
        "{result}"
    );
    let (status, _) = server.get("/health").await;
    assert_eq!(status, 200);
    server.stop().await;
}

#[tokio::test]
async fn function_mode_keeps_big_integers_exact_end_to_end() {
    let server = TestServer::start().await;
    let two_70 = "1180591620717411303424"; // 2**70
    let ten_20 = "100000000000000000000"; // 10**20
    let checker = "def check(input, expected, output, returned=None):\n    \
                   return returned == [expected, input[0] + 1] and type(input[0]) is int, repr(returned)\n";
    let (status, text) = post_text(
        &server,
        "/grade",
        format!(
            r#"{{"code": "def f(x):\n    return [type(x).__name__, repr(x), x]", "entry": "f", "tests": [
                {{"input": [{two_70}], "expected": ["int", "{two_70}", {two_70}]}},
                {{"input": [{ten_20}], "expected": ["int", "{ten_20}", {ten_20}1]}},
                {{"input": {{"x": -{ten_20}}}, "expected": ["int", "-{ten_20}", -{ten_20}.0]}}
            ]}}"#
        ),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let result: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(verdicts(&result), ["ok", "wrong_answer", "ok"], "{result}");
    assert_eq!(
        result["cases"][1]["diff"],
        format!("at $[2]: expected {ten_20}1, got {ten_20}")
    );
    // The answer shows the value as it was, every digit.
    assert!(
        text.contains(&format!(r#""returned":["int","{two_70}",{two_70}]"#)),
        "{text}"
    );

    // 10**20 and 10**20 + 1 differ in float mode too: two integers compare
    // exactly.
    let (status, text) = post_text(
        &server,
        "/grade",
        format!(
            r#"{{"code": "def f(x): return x", "entry": "f", "compare": "float",
                "tests": [{{"input": [{ten_20}], "expected": {ten_20}1}}]}}"#
        ),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let result: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(verdicts(&result), ["wrong_answer"], "{result}");

    // A checker gets the input, the expected value and the returned one as
    // Python ints.
    let (status, text) = post_text(
        &server,
        "/grade",
        format!(
            r#"{{"code": "def f(x): return [x, x + 1]", "entry": "f",
                "checker": {{"code": {checker}}},
                "tests": [{{"input": [{two_70}], "expected": {two_70}}}]}}"#,
            checker = serde_json::to_string(checker).unwrap()
        ),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let result: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(verdicts(&result), ["ok"], "{result}");
    assert_eq!(
        result["cases"][0]["message"],
        format!("[{two_70}, 1180591620717411303425]"),
        "{result}"
    );
    server.stop().await;
}

/// Over MCP too, an integer of 2**64 or more reaches the function as a
/// Python int and comes back with every digit.
#[tokio::test]
async fn grade_code_keeps_big_integers_exact() {
    let two_70 = "1180591620717411303424"; // 2**70
    let ten_20 = "100000000000000000000"; // 10**20
    let config = common::config();
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor.clone(), &config).await;
    let args: Value = serde_json::from_str(&format!(
        r#"{{"code": "def f(x):\n    return [type(x).__name__, repr(x), x, x + 1]", "entry": "f",
            "tests": [
                {{"input": [{two_70}], "expected": ["int", "{two_70}", {two_70}, {two_70_plus}]}},
                {{"input": [-{ten_20}], "expected": ["int", "-{ten_20}", -{ten_20}, -{ten_20}]}}
            ]}}"#,
        two_70_plus = "1180591620717411303425",
    ))
    .unwrap();
    let result = call(&client, "grade_code", args).await.unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let structured = result.structured_content.expect("structuredContent");
    assert_eq!(structured["cases"][0]["verdict"], "ok", "{structured}");
    // 10**20 - 1 is not -10**20: an exact comparison.
    assert_eq!(
        structured["cases"][1]["verdict"], "wrong_answer",
        "{structured}"
    );
    assert_eq!(
        structured["cases"][1]["diff"],
        format!("at $[3]: expected -{ten_20}, got -99999999999999999999"),
        "{structured}"
    );
    // The returned value, as the client sees it, keeps every digit.
    let returned = serde_json::to_string(&structured["cases"][0]["returned"]).unwrap();
    assert_eq!(
        returned,
        format!(r#"["int","{two_70}",{two_70},1180591620717411303425]"#)
    );
    let _ = client.cancel().await;
    executor.shutdown().await;
}

#[tokio::test]
async fn mcp_tools_refuse_an_array_in_place_of_a_nested_object() {
    let config = common::config();
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor, &config).await;
    let refused = call(
        &client,
        "grade_code",
        json!({"code": "print(1)", "tests": [["x", "", ["a"]]]}),
    )
    .await
    .unwrap();
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let message = text(&refused);
    assert!(
        message.contains("every item of tests must be a JSON object ({...}), not an array"),
        "{message}"
    );
    let refused = call(&client, "create_session", json!({"network": [[]]}))
        .await
        .unwrap();
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let message = text(&refused);
    assert!(
        message.contains("network must be a JSON object ({...}), not an array"),
        "{message}"
    );
}

#[tokio::test]
async fn an_exact_diff_counts_lines_by_their_breaks() {
    let server = TestServer::start().await;
    // A missing last line break is the difference, and the diff quotes it;
    // "1\n2\n" is two lines, not three.
    let result = grade(
        &server,
        json!({"code": "print(1)\nprint(2, end='')", "tests": [
            {"expected_stdout": "1\n2\n"},
            {"expected_stdout": "1\n"},
        ]}),
    )
    .await;
    assert_eq!(
        result["cases"][0]["diff"], "line 2: expected \"2\\n\", got \"2\"",
        "{result}"
    );
    assert_eq!(
        result["cases"][1]["diff"],
        "line 2: expected end of output, got \"2\" (1 line expected, 2 got)",
        "{result}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_diff_of_long_lines_shows_where_they_differ() {
    let server = TestServer::start().await;
    let a = "a".repeat(300);
    let tail = "a".repeat(60);
    // A line, a token and a returned string that first differ at their
    // 301st character: the diff quotes that part of each, and says where.
    let lines = grade(
        &server,
        json!({"code": format!("print('{a}b')"), "tests": [{"expected_stdout": format!("{a}c\n")}]}),
    )
    .await;
    assert_eq!(
        lines["cases"][0]["diff"],
        format!("line 1, column 301: expected ...\"{tail}c\", got ...\"{tail}b\""),
        "{lines}"
    );
    let digits = grade(
        &server,
        json!({"code": "print(2**1000 + 1)", "compare": "tokens",
               "tests": [{"expected_stdout": format!("{}\n", crate::grading_code::num_pow_2(1000))}]}),
    )
    .await;
    let diff = digits["cases"][0]["diff"].as_str().unwrap();
    assert!(
        diff.starts_with("token 1, character 302: expected ..."),
        "{diff}"
    );
    assert!(
        diff.contains("205668069376\", got ...") && diff.ends_with("205668069377\""),
        "{diff}"
    );
    let value = grade(
        &server,
        json!({"code": format!("def f():\n    return ['{a}b']"), "entry": "f",
               "tests": [{"expected": [format!("{a}c")]}]}),
    )
    .await;
    assert_eq!(
        value["cases"][0]["diff"],
        format!("at $[0], character 301: expected ...\"{tail}c\", got ...\"{tail}b\""),
        "{value}"
    );
    // A difference near the start is quoted from the start, as before.
    let short = grade(
        &server,
        json!({"code": format!("print('b{a}')"), "tests": [{"expected_stdout": format!("c{a}\n")}]}),
    )
    .await;
    let diff = short["cases"][0]["diff"].as_str().unwrap();
    assert!(diff.starts_with("line 1: expected \"caaa"), "{diff}");
    server.stop().await;
}

#[tokio::test]
async fn float_zero_compares_numbers_by_value() {
    let server = TestServer::start().await;
    let result = grade(
        &server,
        json!({"code": "print(input())", "compare": "float:0", "tests": [
            {"stdin": "1.0 1e3 2.50", "expected_stdout": "1 1000 2.5"},
            {"stdin": "1.5", "expected_stdout": "1"},
        ]}),
    )
    .await;
    assert_eq!(verdicts(&result), ["ok", "wrong_answer"], "{result}");
    // At a tolerance of 0 the diff names none; another, as a person writes it.
    assert_eq!(
        result["cases"][1]["diff"],
        "token 1: expected \"1\", got \"1.5\""
    );
    let result = grade(
        &server,
        json!({"code": "print(1.5)", "compare": "float:0.25", "tests": [{"expected_stdout": "1"}]}),
    )
    .await;
    assert_eq!(
        result["cases"][0]["diff"],
        "token 1: expected \"1\", got \"1.5\" (tolerance 0.25)"
    );
    server.stop().await;
}

/// A submission that printed nothing is said to have printed nothing, in
/// every comparison mode.
#[tokio::test]
async fn a_diff_of_no_output_says_so() {
    let server = TestServer::start().await;
    for (mode, unit) in [
        ("exact", "line"),
        ("trim", "line"),
        ("tokens", "token"),
        ("float", "token"),
    ] {
        let result = grade(
            &server,
            json!({"code": "pass", "compare": mode, "tests": [{"expected_stdout": "42\n"}]}),
        )
        .await;
        assert_eq!(
            result["cases"][0]["diff"],
            format!("{unit} 1: expected \"42\", got no output"),
            "{mode}: {result}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn output_that_is_not_utf8_never_matches() {
    let server = TestServer::start().await;
    let code = "import sys\nsys.stdout.buffer.write(b'ok\\n\\xff x\\n')";
    for mode in ["exact", "trim", "tokens"] {
        let result = grade(
            &server,
            json!({"code": code, "compare": mode,
                   "tests": [{"expected_stdout": "ok\n\u{fffd} x\n"}]}),
        )
        .await;
        assert_eq!(verdicts(&result), ["wrong_answer"], "{mode}: {result}");
        assert_eq!(
            result["cases"][0]["diff"],
            "line 2, column 1: got the byte 0xff, which is not UTF-8 text",
            "{mode}"
        );
        // What the client sees of stdout is still there, lossily decoded.
        assert_eq!(result["cases"][0]["stdout"], "ok\n\u{fffd} x\n");
    }
    server.stop().await;
}
