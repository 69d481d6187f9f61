//! Grading: one submission against many test cases (`POST /grade`, MCP
//! `grade_code`), each case an independent clean run on the environment's
//! pool, with a verdict, CPU time and peak memory from the OS.
//!
//! Cases are validated and encoded up front (a bad case refuses the whole
//! request before anything runs), then run at most `pool_size` at a time and
//! reported in case order.

mod compare;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures_util::StreamExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use compare::Compare;

use crate::error::ExecError;
use crate::executor::{Executor, PreparedRun, RunOptions};
use crate::pool::error_chain;
use crate::protocol::RunLimits;
use crate::types::{ArtifactSelection, ExecRequest, FileContent, RunError};
use crate::worker::RunOutput;

/// Bytes of stdout and of stderr kept per case in a grading result.
pub const CASE_OUTPUT_BYTES: usize = 8 << 10;

/// Input of the entry function in function mode, written into the run dir.
const INPUT_FILE: &str = "__grade_input__.json";
/// Where the function-mode harness writes `json.dumps(return value)`.
const RESULT_FILE: &str = "__grade_result__.json";

/// A peak resident set at least this fraction of the memory limit makes a
/// run killed by a crash signal a `memory_limit` verdict.
const NEAR_LIMIT: f64 = 0.5;

/// `POST /grade`, MCP `grade_code`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GradeRequest {
    /// The submission: Python source run as a script for every case.
    pub code: String,
    /// Environment name or prefix path; the default environment if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// The test cases (at least one; at most the server's `max_grade_cases`).
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
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
    pub input: Option<Value>,
    /// Function mode: the expected return value. Without it, a call that
    /// returns is `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<Value>,
    /// Wall-clock limit of this case in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
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
    pub name: Option<String>,
    pub verdict: Verdict,
    /// Exit status; `-N` when killed by signal N. Null when the case did not
    /// run.
    pub exit_code: Option<i32>,
    /// Name of the signal that killed the run, if any.
    pub signal: Option<String>,
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
    pub returned: Option<Value>,
    /// The submission's uncaught exception, if any.
    pub error: Option<RunError>,
    /// Why the verdict is `error`, `skipped`, or a limit.
    pub message: Option<String>,
}

impl CaseResult {
    fn empty(index: usize, name: Option<String>, verdict: Verdict, message: String) -> Self {
        CaseResult {
            index,
            name,
            verdict,
            exit_code: None,
            signal: None,
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

/// What every case of one request shares.
struct Plan {
    compare: Compare,
    function: bool,
    stop_on_first_failure: bool,
}

/// A case ready to run.
struct Ready {
    case: Expect,
    prepared: PreparedRun,
}

/// Which case it is and what it expects.
struct Expect {
    index: usize,
    name: Option<String>,
    expected_stdout: Option<String>,
    expected: Option<Value>,
}

impl Executor {
    /// Grade `req.code` against every case of `req.tests`.
    pub async fn grade(&self, req: GradeRequest) -> Result<GradeResult, ExecError> {
        let started = Instant::now();
        let env = req.env.clone();
        let (plan, cases) = self.prepare_grade(req)?;
        let total = cases.len();
        // As many runs at once as the env keeps warm workers: more would
        // only queue in the pool (and count against its queue timeout).
        let width = self.pool_size(env.as_deref())?;
        // Index of the first failed case so far; later cases do not start.
        let first_failure = AtomicUsize::new(usize::MAX);
        let plan = &plan;
        let first_failure = &first_failure;
        let mut results: Vec<CaseResult> = futures_util::stream::iter(cases)
            .map(|ready| async move {
                let index = ready.case.index;
                if plan.stop_on_first_failure && first_failure.load(Ordering::Acquire) < index {
                    return skipped(index, ready.case.name, first_failure);
                }
                let result = self.grade_case(plan, ready).await;
                if result.verdict != Verdict::Ok {
                    first_failure.fetch_min(index, Ordering::AcqRel);
                }
                result
            })
            .buffer_unordered(width)
            .collect()
            .await;
        results.sort_by_key(|r| r.index);
        if plan.stop_on_first_failure {
            // Cases after the first failure that were already running when it
            // failed are reported as skipped too: the answer depends only on
            // the verdicts, not on timing.
            let first = first_failure.load(Ordering::Acquire);
            for result in results.iter_mut().filter(|r| r.index > first) {
                *result = skipped(result.index, result.name.take(), first_failure);
            }
        }
        let mut counts: BTreeMap<String, usize> = Verdict::ALL
            .iter()
            .map(|v| (v.as_str().to_string(), 0))
            .collect();
        for result in &results {
            *counts
                .entry(result.verdict.as_str().to_string())
                .or_default() += 1;
        }
        Ok(GradeResult {
            passed: counts["ok"],
            total,
            counts,
            wall_ms: round3(started.elapsed().as_secs_f64() * 1e3),
            cases: results,
        })
    }

    /// Validate a grading request and encode every case.
    fn prepare_grade(&self, req: GradeRequest) -> Result<(Plan, Vec<Ready>), ExecError> {
        if req.tests.is_empty() {
            return Err(ExecError::BadRequest(
                "tests must hold at least one test case".into(),
            ));
        }
        let max = self.max_grade_cases();
        if req.tests.len() > max {
            return Err(ExecError::TooLarge(format!(
                "{} test cases exceed the limit of {max} per request (max_grade_cases)",
                req.tests.len()
            )));
        }
        let compare = match &req.compare {
            None => Compare::Exact,
            Some(text) => Compare::parse(text).map_err(ExecError::BadRequest)?,
        };
        if let Some(entry) = &req.entry
            && !is_identifier(entry)
        {
            return Err(ExecError::BadRequest(format!(
                "entry {entry:?} is not a Python function name"
            )));
        }
        let function = req.entry.is_some();
        let code = match &req.entry {
            Some(entry) => with_harness(&req.code, entry),
            None => req.code.clone(),
        };
        let mut ready = Vec::with_capacity(req.tests.len());
        for (index, case) in req.tests.into_iter().enumerate() {
            let label = || match &case.name {
                Some(name) => format!("test {index} ({name:?})"),
                None => format!("test {index}"),
            };
            if function && case.expected_stdout.is_some() {
                return Err(ExecError::BadRequest(format!(
                    "{}: expected_stdout applies without entry; in function mode use expected",
                    label()
                )));
            }
            if !function && (case.input.is_some() || case.expected.is_some()) {
                return Err(ExecError::BadRequest(format!(
                    "{}: input and expected need entry (function mode); use stdin and expected_stdout",
                    label()
                )));
            }
            let mut files = req.files.clone().unwrap_or_default();
            files.extend(case.files.clone().unwrap_or_default());
            if function {
                if files.contains_key(INPUT_FILE) || files.contains_key(RESULT_FILE) {
                    return Err(ExecError::BadRequest(format!(
                        "{}: file names {INPUT_FILE} and {RESULT_FILE} are reserved in function mode",
                        label()
                    )));
                }
                if let Some(input) = case.input.as_ref().filter(|v| !v.is_null()) {
                    files.insert(INPUT_FILE.into(), FileContent::Text(input.to_string()));
                }
            }
            let exec = ExecRequest {
                code: code.clone(),
                env: req.env.clone(),
                timeout: case.timeout.or(req.timeout),
                files: Some(files),
                stdin: case.stdin.clone(),
                session: None,
                artifacts: Some(if function {
                    ArtifactSelection::Globs(vec![RESULT_FILE.into()])
                } else {
                    ArtifactSelection::All(false)
                }),
                stream: None,
                limits: req.limits.clone(),
            };
            let options = RunOptions {
                argv: case.args.clone().unwrap_or_default(),
                rusage: true,
            };
            let prepared = self.prepare_with(&exec, &options).map_err(|e| match e {
                ExecError::BadRequest(m) => ExecError::BadRequest(format!("{}: {m}", label())),
                other => other,
            })?;
            ready.push(Ready {
                case: Expect {
                    index,
                    name: case.name,
                    expected_stdout: case.expected_stdout,
                    expected: case.expected,
                },
                prepared,
            });
        }
        Ok((
            Plan {
                compare,
                function,
                stop_on_first_failure: req.stop_on_first_failure,
            },
            ready,
        ))
    }

    async fn grade_case(&self, plan: &Plan, ready: Ready) -> CaseResult {
        let Ready { case, prepared } = ready;
        let memory_limit = prepared.memory_bytes();
        let timeout = prepared.timeout();
        match self.run_output(prepared, None).await {
            Ok(out) => judge(plan, &case, out, memory_limit, timeout),
            Err(err) => CaseResult::empty(
                case.index,
                case.name,
                Verdict::Error,
                format!("the server could not run this case: {}", error_chain(&err)),
            ),
        }
    }
}

fn skipped(index: usize, name: Option<String>, first_failure: &AtomicUsize) -> CaseResult {
    let first = first_failure.load(Ordering::Acquire);
    CaseResult::empty(
        index,
        name,
        Verdict::Skipped,
        format!("skipped: test {first} failed and stop_on_first_failure is set"),
    )
}

/// The verdict of a case that ran, with what the client sees of it.
fn judge(
    plan: &Plan,
    case: &Expect,
    mut out: RunOutput,
    memory_limit: Option<u64>,
    timeout: f64,
) -> CaseResult {
    let (mut verdict, mut message) = match limit_verdict(&out, memory_limit, timeout) {
        Some((verdict, message)) => (Some(verdict), Some(message)),
        None => (None, None),
    };
    let mut diff = None;
    let mut returned = None;
    if verdict.is_none() {
        if plan.function {
            let file = out.artifacts.iter_mut().find(|a| a.path == RESULT_FILE);
            match file {
                None => {
                    verdict = Some(Verdict::RuntimeError);
                    message = Some(
                        "the entry function was never called or did not return (the program exited first)"
                            .into(),
                    );
                }
                Some(file) if file.omitted || file.data.is_none() => {
                    verdict = Some(Verdict::OutputLimit);
                    message = Some(format!(
                        "the returned value ({} bytes of JSON) is over the server's artifact cap",
                        file.size
                    ));
                }
                Some(file) => {
                    let data = file.data.take().unwrap_or_default();
                    match serde_json::from_slice::<Value>(&data) {
                        Ok(value) => {
                            diff = case
                                .expected
                                .as_ref()
                                .and_then(|e| plan.compare.json(e, &value));
                            returned = Some(value);
                        }
                        Err(e) => {
                            verdict = Some(Verdict::RuntimeError);
                            message = Some(format!("the returned value is unreadable: {e}"));
                        }
                    }
                }
            }
        } else if let Some(expected) = &case.expected_stdout {
            diff = plan
                .compare
                .text(expected, &String::from_utf8_lossy(&out.stdout));
        }
        if verdict.is_none() {
            verdict = Some(if diff.is_some() {
                Verdict::WrongAnswer
            } else {
                Verdict::Ok
            });
        }
    }
    let (stdout, cut_out) = capped(&out.stdout);
    let (stderr, cut_err) = capped(&out.stderr);
    CaseResult {
        index: case.index,
        name: case.name.clone(),
        verdict: verdict.unwrap_or(Verdict::Error),
        exit_code: Some(out.exit_code),
        signal: out.signal,
        cpu_ms: out.cpu_ms.map(round3),
        wall_ms: Some(round3(out.duration_ms)),
        peak_rss_kb: out.peak_rss_kb,
        stdout,
        stderr,
        truncated: cut_out || cut_err || out.stdout_truncated || out.stderr_truncated,
        diff,
        returned,
        error: out.error.map(|e| RunError {
            kind: e.kind,
            message: e.message,
            traceback: e.traceback,
            line: e.line,
        }),
        message,
    }
}

/// The verdict of a run that did not end cleanly, before any comparison:
/// timeout, memory, output cap, then runtime error.
///
/// Memory: the run's address space is limited (`RLIMIT_AS`), so going over
/// it makes allocations fail. Python raises `MemoryError` (or a subclass
/// such as numpy's `_ArrayMemoryError`); when even reporting it failed, the
/// last line of stderr still names it; C code that does not check its
/// allocations dies of SIGSEGV or SIGABRT instead, and a kernel OOM or cgroup
/// kill is SIGKILL. An OOM kill the worker's memory cgroup counted during the
/// run is `memory_limit`. Otherwise a crash by one of those signals counts as
/// `memory_limit` only when the run's peak resident set reached half the
/// limit (the address space holds more than the resident pages, so a run
/// near its limit never shows an RSS equal to it); below that it is a
/// `runtime_error`.
fn limit_verdict(
    out: &RunOutput,
    memory_limit: Option<u64>,
    timeout: f64,
) -> Option<(Verdict, String)> {
    if out.timed_out {
        return Some((
            Verdict::Timeout,
            format!("killed after the timeout of {timeout} s"),
        ));
    }
    let signal = out.signal.as_deref();
    if signal == Some("SIGXCPU") {
        return Some((Verdict::Timeout, "killed at its CPU-time limit".into()));
    }
    let memory_error = out
        .error
        .as_ref()
        .is_some_and(|e| e.kind == "MemoryError" || e.kind.ends_with("MemoryError"))
        || (out.error.is_none()
            && out.exit_code != 0
            && String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| l.starts_with("MemoryError")));
    let near_limit = match (memory_limit, out.peak_rss_kb) {
        (Some(limit), Some(rss)) => (rss as f64) * 1024.0 >= limit as f64 * NEAR_LIMIT,
        _ => false,
    };
    let crash = matches!(signal, Some("SIGKILL" | "SIGSEGV" | "SIGABRT" | "SIGBUS"));
    if memory_error || out.cgroup.oom_kill || (crash && near_limit) {
        let limit = memory_limit
            .map(|b| format!(" of {b} bytes"))
            .unwrap_or_default();
        return Some((
            Verdict::MemoryLimit,
            format!("ran out of memory under the limit{limit}"),
        ));
    }
    if out.stdout_truncated || out.stderr_truncated {
        return Some((
            Verdict::OutputLimit,
            "output went over the server's per-stream cap".into(),
        ));
    }
    if out.error.is_some() || out.exit_code != 0 || signal.is_some() {
        let message = match (&out.error, signal) {
            (Some(e), _) => format!("{}: {}", e.kind, e.message),
            (None, Some(sig)) => format!("killed by {sig}"),
            (None, None) => format!("exit code {}", out.exit_code),
        };
        return Some((Verdict::RuntimeError, message));
    }
    None
}

/// The submission, then a trailer that calls `entry` with the case's input
/// (from [`INPUT_FILE`]) and writes the JSON of its return value to
/// [`RESULT_FILE`]. Appended, so the submission's line numbers hold.
fn with_harness(code: &str, entry: &str) -> String {
    let mut text = String::with_capacity(code.len() + 1024);
    text.push_str(code);
    if !code.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        r#"
def __grade_call():
    import json, os
    here = os.environ.get("PWD") or "."
    path = os.path.join(here, "{INPUT_FILE}")
    args = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            args = json.load(f)
    fn = globals().get("{entry}")
    if not callable(fn):
        raise NameError("the submission defines no function named {entry}")
    if args is None:
        value = fn()
    elif isinstance(args, list):
        value = fn(*args)
    elif isinstance(args, dict):
        value = fn(**args)
    else:
        value = fn(args)
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError("{entry}() returned a value that is not JSON: %s" % exc) from None
    with open(os.path.join(here, "{RESULT_FILE}"), "w", encoding="utf-8") as f:
        f.write(text)

__grade_call()
"#
    ));
    text
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Text of at most [`CASE_OUTPUT_BYTES`] (cut on a character boundary), and
/// whether it was cut.
fn capped(bytes: &[u8]) -> (String, bool) {
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= CASE_OUTPUT_BYTES {
        return (text.into_owned(), false);
    }
    let mut end = CASE_OUTPUT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_string(), true)
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::WireError;

    fn output(exit_code: i32) -> RunOutput {
        RunOutput {
            exit_code,
            duration_ms: 1.0,
            cpu_ms: Some(1.0),
            peak_rss_kb: Some(10_000),
            ..RunOutput::default()
        }
    }

    fn verdict(out: &RunOutput, limit: Option<u64>) -> Option<Verdict> {
        limit_verdict(out, limit, 1.0).map(|(v, _)| v)
    }

    #[test]
    fn limits_are_told_apart_from_crashes() {
        assert_eq!(verdict(&output(0), None), None);
        assert_eq!(verdict(&output(3), None), Some(Verdict::RuntimeError));
        let mut out = output(-9);
        out.timed_out = true;
        out.signal = Some("SIGKILL".into());
        assert_eq!(verdict(&out, Some(1 << 30)), Some(Verdict::Timeout));
        let mut out = output(1);
        out.error = Some(WireError {
            kind: "numpy.core._exceptions._ArrayMemoryError".into(),
            ..WireError::default()
        });
        assert_eq!(verdict(&out, None), Some(Verdict::MemoryLimit));
        let mut out = output(1);
        out.stderr = b"Traceback...\nMemoryError\n".to_vec();
        assert_eq!(verdict(&out, None), Some(Verdict::MemoryLimit));
        // A segfault far below the limit is the program's own crash ...
        let mut out = output(-11);
        out.signal = Some("SIGSEGV".into());
        assert_eq!(verdict(&out, Some(1 << 30)), Some(Verdict::RuntimeError));
        // ... near it, the limit's doing.
        out.peak_rss_kb = Some(900 * 1024);
        assert_eq!(verdict(&out, Some(1 << 30)), Some(Verdict::MemoryLimit));
        // A SIGKILL at any size is the limit's doing when the memory cgroup
        // counted an OOM kill.
        let mut out = output(-9);
        out.signal = Some("SIGKILL".into());
        assert_eq!(verdict(&out, Some(1 << 30)), Some(Verdict::RuntimeError));
        out.cgroup.oom_kill = true;
        assert_eq!(verdict(&out, Some(1 << 30)), Some(Verdict::MemoryLimit));
        let mut out = output(0);
        out.stdout_truncated = true;
        assert_eq!(verdict(&out, None), Some(Verdict::OutputLimit));
        let mut out = output(-24);
        out.signal = Some("SIGXCPU".into());
        assert_eq!(verdict(&out, None), Some(Verdict::Timeout));
    }

    #[test]
    fn entry_names_are_identifiers() {
        assert!(is_identifier("solve"));
        assert!(is_identifier("_f2"));
        assert!(!is_identifier("2f"));
        assert!(!is_identifier("a.b"));
        assert!(!is_identifier("f()"));
        assert!(!is_identifier(""));
    }

    #[test]
    fn harness_keeps_line_numbers_and_names_the_entry() {
        let code = with_harness("def solve(x):\n    return x", "solve");
        assert!(code.starts_with("def solve(x):\n    return x\n"));
        assert!(code.contains("globals().get(\"solve\")"));
        assert!(code.trim_end().ends_with("__grade_call()"));
    }

    #[test]
    fn case_output_is_capped_on_a_char_boundary() {
        let (text, cut) = capped("é".repeat(CASE_OUTPUT_BYTES).as_bytes());
        assert!(cut);
        assert!(text.len() <= CASE_OUTPUT_BYTES);
        assert_eq!(capped(b"hi"), ("hi".to_string(), false));
    }
}
