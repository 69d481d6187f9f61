//! `/grade` and `/grade/batch` (MCP `grade_code`): requests, verdicts and
//! results.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::object::{self, RequestObject};
use super::{FileContent, RunError, RunLimits};
use crate::outcome::Limit;

/// `POST /grade`, MCP `grade_code`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GradeRequest {
    /// The submission: Python source run as a script for every case. Or give
    /// `prompt` and `completion` as benchmark files split them: the
    /// submission is then `prompt + completion`.
    #[serde(default)]
    pub code: String,
    /// The first part of the submission (a benchmark's prompt), with
    /// `completion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The second part of the submission (a model's completion), with
    /// `prompt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<String>,
    /// Test-code mode: Python run after the submission in the same clean run
    /// and the same namespace, for every case that sets none of its own. A
    /// clean finish is `ok`, an `AssertionError` `wrong_answer` (its line and
    /// message in `diff`), any other exception `runtime_error`. With `entry`
    /// the submission's function is bound as `candidate`, and a `check`
    /// function the test code defines but never calls is called with it (the
    /// HumanEval convention). Without `tests`, one case runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_code: Option<String>,
    /// A custom checker, run per case in its own clean run after the
    /// submission's (which cannot reach or alter it).
    #[serde(
        default,
        deserialize_with = "object::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub checker: Option<Checker>,
    /// CPython's int/str digit limit in every run of the request: `0`
    /// (the default for grading) lifts it, so exact big-integer answers grade
    /// as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int_max_str_digits: Option<u32>,
    /// Environment name or prefix path; the default environment if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// The test cases (at least one, unless `test_code` is set; at most the
    /// server's `max_grade_cases`).
    #[serde(default, deserialize_with = "object::list")]
    pub tests: Vec<TestCase>,
    /// `exact` (default), `trim` (trailing whitespace of each line and
    /// trailing blank lines ignored), `tokens` (whitespace-separated tokens)
    /// or `float:<tolerance>` (tokens; numbers equal within the tolerance,
    /// absolute or relative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compare: Option<String>,
    /// Function mode: the name of a function the submission defines. Each
    /// case calls it with its `input` and compares the return value with
    /// `expected` (JSON equality; numbers within the `float` tolerance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// Stop at the first case that is not `ok`: cases after it are reported
    /// as `skipped` and no new runs start.
    #[serde(default)]
    pub stop_on_first_failure: bool,
    /// Wall-clock limit of each case in seconds, unless the case sets its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// Resource limits of every case (may only lower the server's).
    #[serde(
        default,
        deserialize_with = "object::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub limits: Option<RunLimits>,
    /// The network of every case: narrows the environment's allow-list.
    #[serde(
        default,
        deserialize_with = "object::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub network: Option<super::NetworkRequest>,
    /// Input files every case gets (a case's own `files` win on a clash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, FileContent>>,
}

/// One test case.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    /// A label echoed in the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Standard input of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Command-line arguments: `sys.argv[1:]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Input files of this case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, FileContent>>,
    /// Expected standard output (stdout mode). Without it, a run that ends
    /// cleanly is `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_stdout: Option<String>,
    /// Function mode: the arguments. A list is passed as positional
    /// arguments, an object as keyword arguments, any other value as the one
    /// argument; absent or null calls the function with none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<JsonText>,
    /// Function mode: the expected return value. Without it, a call that
    /// returns is `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<JsonText>,
    /// Wall-clock limit of this case in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// Test-code mode for this case (see the request's `test_code`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_code: Option<String>,
    /// What the case counts in `score` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
}

impl RequestObject for GradeRequest {
    const FIELD: &'static str = "submissions";
}

impl RequestObject for TestCase {
    const FIELD: &'static str = "tests";
}

impl RequestObject for Checker {
    const FIELD: &'static str = "checker";
}

/// A JSON value kept as JSON text (`input`, `expected`, `returned`): its
/// numbers keep every digit, as written, and it goes to the run as it came,
/// never parsed into a tree. Serialized as the value itself.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(transparent)]
pub struct JsonText(Box<RawValue>);

impl JsonText {
    /// `text`, which must be one JSON value.
    pub fn parse(text: String) -> Result<JsonText, serde_json::Error> {
        RawValue::from_string(text).map(JsonText)
    }

    /// A JSON string holding `text`.
    pub fn string(text: &str) -> JsonText {
        JsonText(serde_json::value::to_raw_value(text).expect("a string is JSON"))
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl JsonSchema for JsonText {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        serde_json::Value::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        serde_json::Value::json_schema(generator)
    }
}

/// A custom checker ("special judge"): `entry(input, expected, output)`,
/// with `returned=` the entry function's value in function mode. It returns
/// a bool, a score in `[0, 1]`, or `(score, message)`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Checker {
    /// Python source defining the checker function.
    pub code: String,
    /// The function's name (default `check`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
}

/// `POST /grade/batch`: many submissions, each with its own tests, in one
/// call; fanned out over the pool together and answered in order.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GradeBatchRequest {
    /// The submissions, each a whole `/grade` request.
    #[serde(deserialize_with = "object::list")]
    pub submissions: Vec<GradeRequest>,
}

/// The answer to `POST /grade/batch`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct GradeBatchResult {
    /// Submissions whose every case is `ok`.
    pub passed: usize,
    /// Submissions in the request.
    pub total: usize,
    /// The sum of the submissions' `score`s, not rounded.
    pub score: f64,
    /// What the submissions could score together: the sum of their
    /// `max_score`s.
    pub max_score: f64,
    /// Cases per verdict over every submission.
    pub counts: BTreeMap<String, usize>,
    /// Wall time of the whole batch on the server.
    pub wall_ms: f64,
    /// One result per submission, in request order.
    pub results: Vec<GradeResult>,
}

/// How a case ended.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Ran cleanly and matched.
    Ok,
    /// Ran cleanly and did not match (see `diff`).
    WrongAnswer,
    /// Non-zero exit, uncaught exception or crash signal.
    RuntimeError,
    /// Over the wall-clock timeout, or over the CPU-time limit (SIGXCPU).
    Timeout,
    /// Over the memory limit (MemoryError, or killed near the limit).
    MemoryLimit,
    /// Output (or the returned value) over the server's cap.
    OutputLimit,
    /// The server could not run the case (worker crash, busy pool): not
    /// the submission's fault; see `message`.
    Error,
    /// Not run, or not reported: an earlier case failed and
    /// `stop_on_first_failure` is set.
    Skipped,
}

impl Verdict {
    /// Every verdict, in the order `counts` lists them.
    pub const ALL: [Verdict; 8] = [
        Verdict::Ok,
        Verdict::WrongAnswer,
        Verdict::RuntimeError,
        Verdict::Timeout,
        Verdict::MemoryLimit,
        Verdict::OutputLimit,
        Verdict::Error,
        Verdict::Skipped,
    ];

    /// The verdict as the API writes it (`wrong_answer`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::WrongAnswer => "wrong_answer",
            Verdict::RuntimeError => "runtime_error",
            Verdict::Timeout => "timeout",
            Verdict::MemoryLimit => "memory_limit",
            Verdict::OutputLimit => "output_limit",
            Verdict::Error => "error",
            Verdict::Skipped => "skipped",
        }
    }
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct CaseResult {
    /// Position of the case in `tests`, from 0.
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The case's `name`, when it has one.
    pub name: Option<String>,
    /// How the case ended.
    pub verdict: Verdict,
    /// Exit status; `-N` when killed by signal N. Null when the case did not
    /// run.
    pub exit_code: Option<i32>,
    /// Name of the signal that killed the run, if any.
    pub signal: Option<String>,
    /// Which limit stopped the run, as `/execute` reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Limit>,
    /// User + system CPU time of the run's process, from the OS.
    pub cpu_ms: Option<f64>,
    /// Wall time of the run inside the worker.
    pub wall_ms: Option<f64>,
    /// Peak resident set of the run's process in KiB, from the OS.
    pub peak_rss_kb: Option<u64>,
    /// Standard output, at most 8 KiB kept.
    pub stdout: String,
    /// Standard error, at most 8 KiB kept.
    pub stderr: String,
    /// stdout or stderr above was cut (here or by the server's output cap).
    pub truncated: bool,
    /// Wrong answers: where the output (or value) first differs.
    pub diff: Option<String>,
    /// Function mode: the value the entry function returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned: Option<JsonText>,
    /// The submission's uncaught exception, if any.
    pub error: Option<RunError>,
    /// Why the verdict is `error`, `runtime_error` (its exception as the
    /// traceback's last line names it: `ValueError: bad`, `ValueError`),
    /// `skipped`, or a limit.
    pub message: Option<String>,
    /// What the case scored, not rounded: its weight when `ok`, its weight
    /// times a checker's score, else 0.
    pub score: f64,
    /// What it could score (its `weight`, default 1).
    pub max_score: f64,
}

impl CaseResult {
    pub(crate) fn empty(
        index: usize,
        name: Option<String>,
        verdict: Verdict,
        message: String,
    ) -> Self {
        CaseResult {
            index,
            name,
            verdict,
            exit_code: None,
            signal: None,
            limit: None,
            cpu_ms: None,
            wall_ms: None,
            peak_rss_kb: None,
            stdout: String::new(),
            stderr: String::new(),
            truncated: false,
            diff: None,
            returned: None,
            error: None,
            message: Some(message),
            score: 0.0,
            max_score: 1.0,
        }
    }
}

/// The outcome of a grading request.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct GradeResult {
    /// Cases that are `ok`.
    pub passed: usize,
    /// Cases in the request.
    pub total: usize,
    /// Number of cases per verdict; every verdict is listed.
    pub counts: BTreeMap<String, usize>,
    /// The sum of the cases' scores, in case order, not rounded.
    pub score: f64,
    /// What the cases could score together: the sum of their weights.
    pub max_score: f64,
    /// Wall time of the whole request on the server.
    pub wall_ms: f64,
    /// One result per case, in case order.
    pub cases: Vec<CaseResult>,
}

impl GradeResult {
    /// `passed 3/4 (ok 3, wrong_answer 1)`.
    pub fn summary(&self) -> String {
        let counts: Vec<String> = self
            .counts
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(v, n)| format!("{v} {n}"))
            .collect();
        format!(
            "passed {}/{} ({})",
            self.passed,
            self.total,
            counts.join(", ")
        )
    }
}
