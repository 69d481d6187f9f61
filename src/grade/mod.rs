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
use serde_json::Value;

pub(crate) use compare::Compare;
use compare::Json;

use crate::api::{
    ArtifactSelection, CaseResult, ExecRequest, FileContent, GradeBatchRequest, GradeBatchResult,
    GradeRequest, GradeResult, JsonText, RunError, TestCase, Verdict, normal_file_path,
};
use crate::error::ExecError;
use crate::error::error_chain;
use crate::executor::{Executor, PreparedRun, RunOptions, RunReport};
use crate::outcome::{Limit, Outcome};
use crate::protocol::EntryCall;
use crate::worker::RunOutput;

/// Bytes of stdout and of stderr kept per case in a grading result, and
/// of its `diff` and `message`.
pub(crate) const CASE_OUTPUT_BYTES: usize = 8 << 10;
/// Characters of an assertion's or a checker's message a harness sends back:
/// one more than a case keeps, so that the cut shows (see [`cut_message`]),
/// and the answer stays far under the artifact cap that would drop it.
const MESSAGE_CHARS: usize = CASE_OUTPUT_BYTES + 1;

/// Names the grader reserves in a run directory of function or test-code
/// mode, unused by either.
const INPUT_FILE: &str = "__grade_input__.json";
const RESULT_FILE: &str = "__grade_result__.json";
/// The test-code harness's function, which the run's process calls once
/// the harness is defined; it returns the tests' answer.
const TESTS_ENTRY: &str = "__grade_tests";

/// A batch may carry this many times `max_grade_cases` cases in all.
const MAX_BATCH_FACTOR: usize = 16;

/// Test-code mode: the submission and the test code, as files of the run
/// (so that tracebacks show their own names and line numbers).
const SUBMISSION_FILE: &str = "__submission__.py";
const TESTS_FILE: &str = "__tests__.py";
/// The checker harness's function, which the run's process calls with the
/// case once the checker's code has run; it returns the score and message.
const CHECKER_ENTRY: &str = "__grade_check";

/// A validated batch, ready to run.
pub struct PreparedBatch {
    submissions: Vec<(Plan, Vec<Ready>)>,
    /// Cases run at once: the largest pool among the submissions' envs.
    width: usize,
}

/// What every case of one request shares.
struct Plan {
    compare: Compare,
    function: bool,
    stop_on_first_failure: bool,
    /// The checker's run, encoded but for each case's arguments.
    checker: Option<CheckerPlan>,
    /// What the audit log keeps of the submission, and its env's name
    /// (`None` without an audit log).
    audit: Option<(crate::audit::CodeFacts, String)>,
}

/// A checker ready to run once per case.
struct CheckerPlan {
    code: String,
    env: Option<String>,
    timeout: Option<f64>,
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
    stdin: Option<String>,
    expected_stdout: Option<String>,
    input: Option<JsonText>,
    /// Function mode: the expected value, as sent (for a checker) and
    /// parsed (for the comparison).
    expected: Option<(JsonText, Json)>,
    /// Test-code mode: the verdict is in the harness's result file.
    tests: bool,
    weight: f64,
}

impl Executor {
    /// Grade `req.code` against every case of `req.tests`.
    pub async fn grade(&self, req: GradeRequest) -> Result<GradeResult, ExecError> {
        self.find_env(req.env.as_deref()).await;
        let width = self.pool_size(req.env.as_deref())?;
        let prepared = vec![self.prepare_grade(req)?];
        let mut results = self.grade_prepared(prepared, width, None).await;
        Ok(results.pop().expect("one submission"))
    }

    /// Grade every submission of a batch, their cases fanned out over the
    /// pool together; `done` receives each submission's result as it
    /// completes (in any order, with its index).
    pub async fn grade_batch(
        &self,
        req: GradeBatchRequest,
        done: Option<&tokio::sync::mpsc::UnboundedSender<(usize, GradeResult)>>,
    ) -> Result<GradeBatchResult, ExecError> {
        for sub in &req.submissions {
            self.find_env(sub.env.as_deref()).await;
        }
        let batch = self.prepare_grade_batch(req)?;
        Ok(self.grade_prepared_batch(batch, done).await)
    }

    /// Validate and encode a whole batch: any bad submission refuses it
    /// (naming the submission) before anything runs.
    pub fn prepare_grade_batch(&self, req: GradeBatchRequest) -> Result<PreparedBatch, ExecError> {
        if req.submissions.is_empty() {
            return Err(ExecError::BadRequest(
                "submissions must hold at least one submission".into(),
            ));
        }
        let cases: usize = req.submissions.iter().map(|s| s.tests.len().max(1)).sum();
        let max = self.max_grade_cases() * MAX_BATCH_FACTOR;
        if cases > max {
            return Err(ExecError::TooLarge(format!(
                "{cases} test cases in the batch exceed its limit of {max} ({MAX_BATCH_FACTOR} x max_grade_cases)"
            )));
        }
        let mut width = 1;
        let mut submissions = Vec::with_capacity(req.submissions.len());
        for (i, sub) in req.submissions.into_iter().enumerate() {
            let refused = |e| submission_refusal(e, i);
            width = width.max(self.pool_size(sub.env.as_deref()).map_err(refused)?);
            submissions.push(self.prepare_grade(sub).map_err(refused)?);
        }
        check_weights(
            submissions
                .iter()
                .flat_map(|(_, cases)| cases.iter().map(|r| r.case.weight)),
        )
        .map_err(|e| refusal_of(e, "the batch"))?;
        // One grade record per submission: each has its slot before any runs.
        self.reserve_records(submissions.len())?;
        Ok(PreparedBatch { submissions, width })
    }

    /// Run a prepared batch (see [`Executor::grade_batch`]).
    pub async fn grade_prepared_batch(
        &self,
        batch: PreparedBatch,
        done: Option<&tokio::sync::mpsc::UnboundedSender<(usize, GradeResult)>>,
    ) -> GradeBatchResult {
        let started = Instant::now();
        let results = self
            .grade_prepared(batch.submissions, batch.width, done)
            .await;
        let mut counts: BTreeMap<String, usize> = Verdict::ALL
            .iter()
            .map(|v| (v.as_str().to_string(), 0))
            .collect();
        for r in &results {
            for (k, n) in &r.counts {
                *counts.entry(k.clone()).or_default() += n;
            }
        }
        GradeBatchResult {
            passed: results.iter().filter(|r| r.passed == r.total).count(),
            total: results.len(),
            score: results.iter().map(|r| r.score).sum(),
            max_score: results.iter().map(|r| r.max_score).sum(),
            counts,
            wall_ms: round3(started.elapsed().as_secs_f64() * 1e3),
            results,
        }
    }

    /// Run the cases of prepared submissions, at most `width` at once over
    /// all of them, and shape each submission's result once its last case
    /// is in.
    async fn grade_prepared(
        &self,
        submissions: Vec<(Plan, Vec<Ready>)>,
        width: usize,
        done: Option<&tokio::sync::mpsc::UnboundedSender<(usize, GradeResult)>>,
    ) -> Vec<GradeResult> {
        let started = Instant::now();
        let (plans, cases): (Vec<Plan>, Vec<Vec<Ready>>) = submissions.into_iter().unzip();
        let mut remaining: Vec<usize> = cases.iter().map(Vec::len).collect();
        let mut per: Vec<Vec<CaseResult>> =
            remaining.iter().map(|n| Vec::with_capacity(*n)).collect();
        let mut finished: Vec<Option<GradeResult>> = (0..plans.len()).map(|_| None).collect();
        // Per submission, the index of its first failed case so far; later
        // cases of it do not start.
        let first_failure: Vec<AtomicUsize> =
            plans.iter().map(|_| AtomicUsize::new(usize::MAX)).collect();
        let plans = &plans;
        let first_failure = &first_failure;
        let mut runs = futures_util::stream::iter(
            cases
                .into_iter()
                .enumerate()
                .flat_map(|(s, cases)| cases.into_iter().map(move |c| (s, c))),
        )
        .map(|(s, ready)| async move {
            let plan = &plans[s];
            let index = ready.case.index;
            if plan.stop_on_first_failure && first_failure[s].load(Ordering::Acquire) < index {
                return (s, skipped(index, ready.case.name, &first_failure[s]));
            }
            let result = self.grade_case(plan, ready).await;
            if result.verdict != Verdict::Ok {
                first_failure[s].fetch_min(index, Ordering::AcqRel);
            }
            (s, result)
        })
        .buffer_unordered(width);
        while let Some((s, result)) = runs.next().await {
            per[s].push(result);
            remaining[s] -= 1;
            if remaining[s] == 0 {
                let result = shape(
                    &plans[s],
                    std::mem::take(&mut per[s]),
                    &first_failure[s],
                    started,
                );
                if let Some((facts, env)) = &plans[s].audit {
                    self.audit_record(crate::audit::RecordKind::Grade, |r| {
                        r.set_code(facts);
                        r.env = Some(env.clone());
                        r.cases = Some(result.total);
                        r.verdicts = Some(result.counts.clone());
                        r.outcome = Some(if result.passed == result.total {
                            "ok"
                        } else {
                            "error"
                        });
                        r.wall_ms = Some(result.wall_ms);
                    });
                }
                if let Some(done) = done {
                    let _ = done.send((s, result.clone()));
                }
                finished[s] = Some(result);
            }
        }
        finished
            .into_iter()
            .map(|r| r.expect("every submission finished"))
            .collect()
    }

    /// Validate a grading request and encode every case.
    fn prepare_grade(&self, mut req: GradeRequest) -> Result<(Plan, Vec<Ready>), ExecError> {
        if let Some(caller) = crate::auth::current()
            && let Err(err) = caller.client.require(crate::auth::Scope::Grade)
        {
            self.audit_refusal(&err, req.env.as_deref());
            return Err(err);
        }
        let submission = match (req.prompt.take(), req.completion.take()) {
            (None, None) => std::mem::take(&mut req.code),
            (Some(prompt), Some(completion)) if req.code.is_empty() => prompt + &completion,
            (Some(_), Some(_)) => {
                return Err(ExecError::BadRequest(
                    "give the submission as code, or as prompt and completion, not both".into(),
                ));
            }
            _ => {
                return Err(ExecError::BadRequest(
                    "prompt and completion go together: the submission is prompt + completion"
                        .into(),
                ));
            }
        };
        // A byte order mark before the code is dropped, as Python drops it
        // from a file (and /execute from its code): test-code mode writes
        // the submission to a file the harness reads as text.
        let submission = match submission.strip_prefix('\u{feff}') {
            Some(rest) => rest.to_string(),
            None => submission,
        };
        if req.tests.is_empty() && req.test_code.is_some() {
            req.tests.push(TestCase::default());
        }
        if req.tests.is_empty() {
            return Err(ExecError::BadRequest(
                "tests must hold at least one test case (or give test_code)".into(),
            ));
        }
        let max = self.max_grade_cases();
        if req.tests.len() > max {
            return Err(refusal_of(
                ExecError::TooLarge(format!(
                    "{} test cases exceed the limit of {max} per request (max_grade_cases)",
                    req.tests.len()
                )),
                "request",
            ));
        }
        let compare = match &req.compare {
            None => Compare::Exact,
            Some(text) => Compare::parse(text).map_err(ExecError::BadRequest)?,
        };
        let checker_entry = req.checker.as_ref().and_then(|c| c.entry.as_ref());
        for (field, name) in req
            .entry
            .iter()
            .map(|e| ("entry", e))
            .chain(checker_entry.map(|e| ("checker.entry", e)))
        {
            if !is_identifier(name) {
                return Err(ExecError::BadRequest(format!(
                    "{field} {name:?} is not a Python function name"
                )));
            }
        }
        let tests_mode = req.test_code.is_some() || req.tests.iter().any(|t| t.test_code.is_some());
        if tests_mode && req.checker.is_some() {
            return Err(ExecError::BadRequest(
                "test_code and checker are two ways to judge: give one".into(),
            ));
        }
        let digits = Some(req.int_max_str_digits.unwrap_or(0));
        let function = req.entry.is_some() && !tests_mode;
        // Function mode runs the submission as it is: the run's process
        // calls the entry once the code has run (the `exec` frame's `call`).
        let code = if tests_mode {
            tests_harness(req.entry.as_deref())
        } else {
            submission.clone()
        };
        let audit_code = self
            .audit()
            .enabled()
            .then(|| crate::audit::CodeFacts::of(&submission, self.audit().include_code()));
        let checker = req.checker.as_ref().map(|c| CheckerPlan {
            code: checker_harness(&c.code, c.entry.as_deref().unwrap_or("check")),
            env: req.env.clone(),
            timeout: req.timeout,
        });
        // What the request sets for every case is checked on its own, so
        // that a mistake in it is named as the request's (not blamed on
        // the first case to use it), and refused even where every case
        // overrides it.
        let shared = ExecRequest {
            code: code.clone(),
            env: req.env.clone(),
            timeout: req.timeout,
            files: req.files.clone(),
            artifacts: Some(ArtifactSelection::All(false)),
            limits: req.limits.clone(),
            network: req.network.clone(),
            int_max_str_digits: digits,
            ..ExecRequest::default()
        };
        let graded = RunOptions {
            graded: true,
            ..RunOptions::default()
        };
        self.prepare_with(&shared, &graded)
            .map_err(|e| refusal_of(e, "request"))?;
        if function || tests_mode {
            refuse_reserved(req.files.as_ref(), || "request".to_string())?;
        }
        let mut ready = Vec::with_capacity(req.tests.len());
        for (index, case) in req.tests.into_iter().enumerate() {
            let label = || match &case.name {
                Some(name) => format!("test {index} ({name:?})"),
                None => format!("test {index}"),
            };
            let weight = case.weight.unwrap_or(1.0);
            if !(weight.is_finite() && weight >= 0.0) {
                return Err(ExecError::BadRequest(format!(
                    "{}: weight must be a finite number of at least 0, got {weight}",
                    label()
                )));
            }
            let test_code = case.test_code.as_ref().or(req.test_code.as_ref());
            if tests_mode {
                if test_code.is_none() {
                    return Err(ExecError::BadRequest(format!(
                        "{}: has no test_code while other cases do; give the request a test_code for all",
                        label()
                    )));
                }
                if case.expected_stdout.is_some() || case.expected.is_some() || case.input.is_some()
                {
                    return Err(ExecError::BadRequest(format!(
                        "{}: in test-code mode the test code judges; expected_stdout, input and expected do not apply",
                        label()
                    )));
                }
            } else if function && case.expected_stdout.is_some() {
                return Err(ExecError::BadRequest(format!(
                    "{}: expected_stdout applies without entry; in function mode use expected",
                    label()
                )));
            } else if !function && (case.input.is_some() || case.expected.is_some()) {
                return Err(ExecError::BadRequest(format!(
                    "{}: input and expected need entry (function mode); use stdin and expected_stdout",
                    label()
                )));
            }
            if function || tests_mode {
                refuse_reserved(case.files.as_ref(), label)?;
            }
            let mut files = case_files(req.files.as_ref(), case.files.as_ref());
            if let Some(tests) = test_code {
                files.insert(
                    SUBMISSION_FILE.into(),
                    FileContent::Text(submission.clone()),
                );
                let tests = tests.strip_prefix('\u{feff}').unwrap_or(tests);
                files.insert(TESTS_FILE.into(), FileContent::Text(tests.to_string()));
            }
            let expected = match case.expected {
                Some(sent) => match Json::parse(sent.get()) {
                    Ok(tree) => Some((sent, tree)),
                    Err(e) => {
                        return Err(ExecError::BadRequest(format!("{}: expected: {e}", label())));
                    }
                },
                None => None,
            };
            let exec = ExecRequest {
                code: code.clone(),
                env: req.env.clone(),
                timeout: case.timeout.or(req.timeout),
                files: Some(files),
                stdin: case.stdin.clone(),
                session: None,
                artifacts: Some(ArtifactSelection::All(false)),
                stream: None,
                limits: req.limits.clone(),
                network: req.network.clone(),
                int_max_str_digits: digits,
            };
            let options = RunOptions {
                argv: case.args.clone().unwrap_or_default(),
                rusage: true,
                graded: true,
                call: if tests_mode {
                    Some(EntryCall {
                        entry: TESTS_ENTRY.into(),
                        args: None,
                    })
                } else {
                    req.entry
                        .as_ref()
                        .filter(|_| function)
                        .map(|entry| EntryCall {
                            entry: entry.clone(),
                            args: case.input.as_ref().map(|input| input.get().to_string()),
                        })
                },
                compile: if tests_mode {
                    vec![SUBMISSION_FILE.into(), TESTS_FILE.into()]
                } else {
                    Vec::new()
                },
                ..RunOptions::default()
            };
            let prepared = self
                .prepare_with(&exec, &options)
                .map_err(|e| refusal_of(e, label()))?;
            ready.push(Ready {
                case: Expect {
                    index,
                    name: case.name,
                    stdin: case.stdin,
                    expected_stdout: case.expected_stdout,
                    input: case.input,
                    expected,
                    tests: tests_mode,
                    weight,
                },
                prepared,
            });
        }
        check_weights(ready.iter().map(|r| r.case.weight))?;
        Ok((
            Plan {
                compare,
                function,
                stop_on_first_failure: req.stop_on_first_failure,
                checker,
                audit: audit_code.map(|facts| {
                    let env = ready
                        .first()
                        .map(|r| self.env_name(&r.prepared).to_string())
                        .unwrap_or_default();
                    (facts, env)
                }),
            },
            ready,
        ))
    }

    async fn grade_case(&self, plan: &Plan, ready: Ready) -> CaseResult {
        let Ready { case, prepared } = ready;
        let memory_limit = prepared.memory_bytes();
        let timeout = prepared.timeout();
        let mut result = match self.run_output(prepared, None).await {
            Ok(report) => {
                // The checker sees the whole output, not the capped copy.
                let output = plan
                    .checker
                    .as_ref()
                    .map(|_| String::from_utf8_lossy(&report.output.stdout).into_owned());
                let mut result = judge(plan, &case, report, memory_limit, timeout);
                if let (Some(checker), Some(output), Verdict::Ok) =
                    (&plan.checker, output, result.verdict)
                {
                    self.run_checker(checker, &case, output, &mut result).await;
                }
                result
            }
            Err(err) => CaseResult::empty(
                case.index,
                case.name.clone(),
                Verdict::Error,
                format!("the server could not run this case: {}", error_chain(&err)),
            ),
        };
        for text in [&mut result.diff, &mut result.message]
            .into_iter()
            .flatten()
        {
            cut_message(text);
        }
        result.max_score = case.weight;
        result.score = match result.verdict {
            Verdict::Ok => case.weight,
            Verdict::WrongAnswer => result.score * case.weight,
            _ => 0.0,
        };
        result
    }

    /// Judge a case that ran cleanly with the request's checker, in a clean
    /// run of its own: its score and message replace the comparison.
    async fn run_checker(
        &self,
        checker: &CheckerPlan,
        case: &Expect,
        output: String,
        result: &mut CaseResult,
    ) {
        // As JSON text throughout, so that big integers reach it exactly.
        let text = |text: &Option<String>| text.as_deref().map(JsonText::string);
        let args = CheckerArgs {
            input: case.input.clone().or_else(|| text(&case.stdin)),
            expected: case
                .expected
                .as_ref()
                .map(|(sent, _)| sent.clone())
                .or_else(|| text(&case.expected_stdout)),
            output: &output,
            returned: result.returned.as_ref(),
            function: result.returned.is_some(),
        };
        let exec = ExecRequest {
            code: checker.code.clone(),
            env: checker.env.clone(),
            timeout: checker.timeout,
            artifacts: Some(ArtifactSelection::All(false)),
            int_max_str_digits: Some(0),
            ..ExecRequest::default()
        };
        // The harness's function, called with the case as its one argument.
        let options = RunOptions {
            call: Some(EntryCall {
                entry: CHECKER_ENTRY.into(),
                args: Some(serde_json::to_string(&[args]).expect("the case is JSON")),
            }),
            ..RunOptions::default()
        };
        let failed = |result: &mut CaseResult, why: String| {
            result.verdict = Verdict::Error;
            result.message = Some(format!(
                "the checker failed (not the submission's fault): {why}"
            ));
        };
        let out = match self.prepare_with(&exec, &options) {
            Ok(prepared) => self.run_output(prepared, None).await,
            Err(e) => Err(e),
        };
        let mut out = match out {
            Ok(report) => report.output,
            Err(e) => return failed(result, error_chain(&e)),
        };
        if out.timed_out {
            return failed(result, "it timed out".into());
        }
        if let Some(e) = &out.error {
            return failed(result, exception_line(&e.kind, &e.message));
        }
        if out.exit_code != 0 {
            return failed(result, format!("it exited with {}", out.exit_code));
        }
        let answer = take_returned(&mut out);
        let Some(score) = answer.as_ref().and_then(|a| a["score"].as_f64()) else {
            return failed(result, "it gave no answer".into());
        };
        let message = answer
            .as_ref()
            .and_then(|a| a["message"].as_str().map(str::to_string));
        result.score = score;
        if score >= 1.0 {
            result.message = message;
        } else {
            result.verdict = Verdict::WrongAnswer;
            result.diff = Some(message.unwrap_or_else(|| {
                format!("the checker scored it {}", crate::limits::readable(score))
            }));
        }
    }
}

/// What a checker's function gets: the case, the output and the value.
#[derive(serde::Serialize)]
struct CheckerArgs<'a> {
    input: Option<JsonText>,
    expected: Option<JsonText>,
    output: &'a str,
    returned: Option<&'a JsonText>,
    function: bool,
}

/// The entry function's value from its JSON (as the worker's `json.dumps`
/// wrote it): parsed for the comparison, and as compact text for the
/// result, its numbers as written.
fn returned_value(data: &str) -> Result<(Json, JsonText), serde_json::Error> {
    let value = Json::parse(data)?;
    let text = JsonText::parse(value.to_text())?;
    Ok((value, text))
}

/// A `bad_request` or `too_large` about part of a grading request, its
/// message saying which part (`request`, `test 3`, `submission 2`); other
/// errors pass as they are.
fn refusal_of(err: ExecError, part: impl std::fmt::Display) -> ExecError {
    match err {
        ExecError::BadRequest(m) => ExecError::BadRequest(format!("{part}: {m}")),
        ExecError::TooLarge(m) => ExecError::TooLarge(format!("{part}: {m}")),
        other => other,
    }
}

/// A batch's refusal of its submission `i`, named in the message whatever
/// refused it: a bad field, or an environment that is unknown, unavailable
/// or not the client's to use (whose error keeps its code and status; its
/// audit record was written as it was refused).
fn submission_refusal(err: ExecError, i: usize) -> ExecError {
    let part = format!("submission {i}");
    match err {
        ExecError::UnknownEnv { .. }
        | ExecError::DefaultEnvDeleted { .. }
        | ExecError::EnvUnavailable { .. }
        | ExecError::Forbidden(_) => ExecError::Part {
            part,
            error: Box::new(err),
        },
        other => refusal_of(other, part),
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

/// One submission's result from its cases' (in any order).
fn shape(
    plan: &Plan,
    mut results: Vec<CaseResult>,
    first_failure: &AtomicUsize,
    started: Instant,
) -> GradeResult {
    results.sort_by_key(|r| r.index);
    if plan.stop_on_first_failure {
        // Cases after the first failure that were already running when it
        // failed are reported as skipped too: the answer depends only on
        // the verdicts, not on timing.
        let first = first_failure.load(Ordering::Acquire);
        for result in results.iter_mut().filter(|r| r.index > first) {
            let max_score = result.max_score;
            *result = skipped(result.index, result.name.take(), first_failure);
            result.max_score = max_score;
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
    GradeResult {
        passed: counts["ok"],
        total: results.len(),
        counts,
        score: results.iter().map(|r| r.score).sum(),
        max_score: results.iter().map(|r| r.max_score).sum(),
        wall_ms: round3(started.elapsed().as_secs_f64() * 1e3),
        cases: results,
    }
}

/// The verdict of a case that ran, with what the client sees of it.
fn judge(
    plan: &Plan,
    case: &Expect,
    report: RunReport,
    memory_limit: Option<u64>,
    timeout: f64,
) -> CaseResult {
    let RunReport {
        output: mut out,
        outcome,
        ..
    } = report;
    let (mut verdict, mut message) = match limit_verdict(&out, &outcome, memory_limit, timeout) {
        Some((verdict, message)) => (Some(verdict), Some(message)),
        None => (None, None),
    };
    let mut diff = None;
    let mut returned = None;
    if verdict.is_none() && case.tests {
        (verdict, message, diff) = tests_verdict(&mut out);
    }
    if verdict.is_none() {
        if plan.function {
            match (out.returned.take(), out.returned_size) {
                (None, None) => {
                    verdict = Some(Verdict::RuntimeError);
                    message = Some(
                        "the entry function was never called or did not return (the program exited first)"
                            .into(),
                    );
                }
                (None, Some(size)) => {
                    verdict = Some(Verdict::OutputLimit);
                    message = Some(format!(
                        "the returned value ({size} bytes of JSON) is over the server's artifact cap"
                    ));
                }
                (Some(data), _) => match returned_value(&data) {
                    Ok((value, text)) => {
                        diff = case
                            .expected
                            .as_ref()
                            .filter(|_| plan.checker.is_none())
                            .and_then(|(_, e)| plan.compare.json(e, &value));
                        returned = Some(text);
                    }
                    Err(e) => {
                        verdict = Some(Verdict::RuntimeError);
                        message = Some(format!("the returned value is unreadable: {e}"));
                    }
                },
            }
        } else if let Some(expected) = &case.expected_stdout
            && plan.checker.is_none()
        {
            // Output that is not UTF-8 text matches no expected text: read
            // lossily, its bytes would pass for U+FFFD.
            diff = match std::str::from_utf8(&out.stdout) {
                Ok(stdout) => plan.compare.text(expected, stdout),
                Err(e) => Some(compare::not_utf8(&out.stdout, e.valid_up_to())),
            };
        }
        if plan.checker.is_some() {
            diff = None; // the checker judges
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
        limit: outcome.limit,
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
        score: 0.0,
        max_score: case.weight,
    }
}

/// An exception as the last line of Python's traceback names it:
/// `ValueError: bad`, or `ValueError` alone when its message is empty.
fn exception_line(kind: &str, message: &str) -> String {
    if message.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}: {message}")
    }
}

/// Test-code mode, for a run that ended cleanly: the harness's answer (what
/// its function returned) says whether the test code finished (`ok`) or
/// failed an assertion (`wrong_answer`, with its line); without it the
/// program exited before the tests ended.
fn tests_verdict(out: &mut RunOutput) -> (Option<Verdict>, Option<String>, Option<String>) {
    let Some(answer) = take_returned(out) else {
        return (
            Some(Verdict::RuntimeError),
            Some("the tests did not run to their end (the program exited first)".into()),
            None,
        );
    };
    match answer["verdict"].as_str() {
        Some("ok") => (Some(Verdict::Ok), None, None),
        _ => {
            let line = answer["line"]
                .as_u64()
                .map(|l| format!("test code line {l}"))
                .unwrap_or_else(|| "the test code".into());
            let source = answer["source"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            let message = answer["message"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(|s| format!(" ({s})"))
                .unwrap_or_default();
            (
                Some(Verdict::WrongAnswer),
                None,
                Some(format!("AssertionError at {line}{source}{message}")),
            )
        }
    }
}

/// The verdict of a run that did not end cleanly, before any comparison,
/// from how it ended ([`Outcome`]): the wall clock or the CPU-time limit is
/// `timeout`, the memory limit `memory_limit`, the output cap
/// `output_limit`; any other failure is `runtime_error`, naming the limit
/// that stopped it if one did (processes, file size, disk).
fn limit_verdict(
    out: &RunOutput,
    outcome: &Outcome,
    memory_limit: Option<u64>,
    timeout: f64,
) -> Option<(Verdict, String)> {
    match outcome.limit {
        Some(Limit::Timeout) => {
            return Some((
                Verdict::Timeout,
                format!(
                    "killed after the timeout of {} s",
                    crate::limits::readable(timeout)
                ),
            ));
        }
        Some(Limit::Cpu) => {
            return Some((Verdict::Timeout, "killed at its CPU-time limit".into()));
        }
        Some(Limit::Memory) => {
            let limit = memory_limit
                .map(|b| format!(" of {b} bytes"))
                .unwrap_or_default();
            return Some((
                Verdict::MemoryLimit,
                format!("ran out of memory under the limit{limit}"),
            ));
        }
        Some(Limit::Output) => {
            return Some((
                Verdict::OutputLimit,
                "output went over the server's per-stream cap".into(),
            ));
        }
        _ => {}
    }
    if !outcome.failed {
        return None;
    }
    let message = match (&out.error, &out.signal) {
        (Some(e), _) => exception_line(&e.kind, &e.message),
        (None, Some(sig)) => format!("killed by {sig}"),
        (None, None) => format!("exit code {}", out.exit_code),
    };
    let message = match outcome.limit {
        Some(limit) => format!("{message} (stopped at its {limit} limit)"),
        None => message,
    };
    Some((Verdict::RuntimeError, message))
}

/// What a grading harness's function returned (the run's `call`), taken
/// out of the run's output; `None` if it did not return or its JSON is
/// unreadable.
fn take_returned(out: &mut RunOutput) -> Option<Value> {
    serde_json::from_str(&out.returned.take()?).ok()
}

/// `code`, then `trailer` on lines of its own: appended, so the line numbers
/// of `code` hold.
fn with_trailer(code: &str, trailer: &str) -> String {
    let mut text = String::with_capacity(code.len() + trailer.len() + 1);
    text.push_str(code);
    if !code.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(trailer);
    text
}

/// The run's code in test-code mode: a function, [`TESTS_ENTRY`], that the
/// run's process calls once it is defined (the `exec` frame's `call`). It
/// executes the submission ([`SUBMISSION_FILE`]), then the test code
/// ([`TESTS_FILE`]) in the same namespace, each as compiled under its own
/// file name (by the worker, see `__compiled__`, or here) so that
/// tracebacks show the user's own line numbers; with `entry`, it binds
/// `candidate` and calls a `check` the tests define but never call. It
/// returns the answer only at the end of the tests or at an
/// `AssertionError` in them (not one the submission raised).
fn tests_harness(entry: Option<&str>) -> String {
    let bind = match entry {
        Some(entry) => format!(
            r#"    fn = ns.get("{entry}")
    if not callable(fn):
        raise NameError("the submission defines no function named {entry}")
    ns["candidate"] = fn
"#
        ),
        None => String::new(),
    };
    let call_check = if entry.is_some() { "True" } else { "False" };
    format!(
        r#"def __grade_tests():
    import os, traceback
    here = os.environ.get("PWD") or "."
    ns = {{"__name__": "__main__", "__builtins__": __builtins__}}
    compiled = globals().get("__compiled__") or {{}}
    def module(name):
        # As the worker compiled it, else compiled here: the code, and the
        # functions its top-level expression statements call.
        done = compiled.get(name)
        if done is not None:
            return done
        import _ast
        with open(os.path.join(here, name), encoding="utf-8") as f:
            tree = compile(f.read(), name, "exec", _ast.PyCF_ONLY_AST)
        calls = [node.value.func.id for node in tree.body
                 if isinstance(node, _ast.Expr) and isinstance(node.value, _ast.Call)
                 and isinstance(node.value.func, _ast.Name)]
        return compile(tree, name, "exec"), calls
    exec(module("{SUBMISSION_FILE}")[0], ns)
{bind}    tests, calls = module("{TESTS_FILE}")
    calls_check = "check" in calls
    try:
        exec(tests, ns)
        if {call_check} and not calls_check and callable(ns.get("check")):
            ns["check"](ns["candidate"])
        answer = {{"verdict": "ok"}}
    except AssertionError as exc:
        # The test code's failure, unless the submission raised it (its
        # own frame the innermost of the two files'): that is its error.
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if f.filename in ("{TESTS_FILE}", "{SUBMISSION_FILE}")]
        if frames and frames[-1].filename != "{TESTS_FILE}":
            raise
        last = frames[-1] if frames else None
        answer = {{"verdict": "wrong_answer", "line": last and last.lineno,
                  "source": last and last.line, "message": str(exc)[:{MESSAGE_CHARS}]}}
    return answer
"#
    )
}

/// The checker's run: its code, then a trailer that defines
/// [`CHECKER_ENTRY`], which the run's process calls with the case (the
/// `exec` frame's `call`): it calls `entry` and returns its score and
/// message.
fn checker_harness(code: &str, entry: &str) -> String {
    with_trailer(
        code,
        &format!(
            r#"
def __grade_check(a):
    fn = globals().get("{entry}")
    if not callable(fn):
        raise NameError("the checker defines no function named {entry}")
    kwargs = {{"returned": a["returned"]}} if a["function"] else {{}}
    value = fn(a["input"], a["expected"], a["output"], **kwargs)
    message = None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        value, message = value
        message = None if message is None else str(message)[:{MESSAGE_CHARS}]
    if isinstance(value, bool):
        score = 1.0 if value else 0.0
    elif isinstance(value, (int, float)):
        score = float(value)
    else:
        raise TypeError("the checker must return a bool, a score in [0, 1] or (score, message), not %r" % (value,))
    if not 0.0 <= score <= 1.0:
        raise ValueError("the checker's score %r is outside [0, 1]" % score)
    return {{"score": score, "message": message}}
"#
        ),
    )
}

/// Refuse weights whose sum (the answer's `max_score`) is not a finite
/// number, which JSON would show as null. Each weight is finite already.
fn check_weights(weights: impl Iterator<Item = f64>) -> Result<(), ExecError> {
    let sum: f64 = weights.sum();
    if sum.is_finite() {
        return Ok(());
    }
    Err(ExecError::BadRequest(format!(
        "the weights of the cases sum to more than the largest number a score can be ({:e})",
        f64::MAX
    )))
}

/// Refuse `files` that use a name the grader reserves in a run directory
/// (function and test-code mode), however its path is spelt, as the part
/// of the request `whose` names.
fn refuse_reserved(
    files: Option<&BTreeMap<String, FileContent>>,
    whose: impl FnOnce() -> String,
) -> Result<(), ExecError> {
    let Some(files) = files else {
        return Ok(());
    };
    match [INPUT_FILE, RESULT_FILE, SUBMISSION_FILE, TESTS_FILE]
        .into_iter()
        .find(|name| files.keys().any(|p| normal_file_path(p) == *name))
    {
        Some(name) => Err(ExecError::BadRequest(format!(
            "{}: the file name {name} is reserved by the grader",
            whose()
        ))),
        None => Ok(()),
    }
}

/// A case's input files: the request's, and its own, which replace any of
/// the request's with the same path however spelt (`d//b` replaces `d/b`).
fn case_files(
    shared: Option<&BTreeMap<String, FileContent>>,
    own: Option<&BTreeMap<String, FileContent>>,
) -> BTreeMap<String, FileContent> {
    let mut files = shared.cloned().unwrap_or_default();
    if let Some(own) = own {
        let replaced: std::collections::HashSet<String> =
            own.keys().map(|p| normal_file_path(p)).collect();
        files.retain(|path, _| !replaced.contains(&normal_file_path(path)));
        files.extend(own.iter().map(|(p, c)| (p.clone(), c.clone())));
    }
    files
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
    (
        text[..text.floor_char_boundary(CASE_OUTPUT_BYTES)].to_string(),
        true,
    )
}

/// Cut `text` (a case's `diff` or `message`) to [`CASE_OUTPUT_BYTES`], on a
/// character boundary, `...` marking the cut.
fn cut_message(text: &mut String) {
    if text.len() > CASE_OUTPUT_BYTES {
        text.truncate(text.floor_char_boundary(CASE_OUTPUT_BYTES));
        text.push_str("...");
    }
}

/// `v` rounded to three decimals; past 1e305 (where `v * 1000` is no
/// longer finite) as it is, since no decimal is left to round there.
fn round3(v: f64) -> f64 {
    let scaled = v * 1000.0;
    if scaled.is_finite() {
        scaled.round() / 1000.0
    } else {
        v
    }
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
        limit_verdict(out, &Outcome::of(out, limit), limit, 1.0).map(|(v, _)| v)
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
            errno: Some(nix::errno::Errno::ENOMEM as i32),
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
        // Other limits are runtime errors that name the limit, as /execute does.
        let mut out = output(1);
        out.error = Some(WireError {
            kind: "OSError".into(),
            message: "[Errno 27] File too large".into(),
            errno: Some(nix::errno::Errno::EFBIG as i32),
            ..WireError::default()
        });
        let outcome = Outcome::of(&out, None);
        assert_eq!(outcome.limit, Some(Limit::FileSize));
        let (verdict, message) = limit_verdict(&out, &outcome, None, 1.0).unwrap();
        assert_eq!(verdict, Verdict::RuntimeError);
        assert!(
            message.ends_with("(stopped at its file_size limit)"),
            "{message}"
        );
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
    fn case_output_is_capped_on_a_char_boundary() {
        let (text, cut) = capped("é".repeat(CASE_OUTPUT_BYTES).as_bytes());
        assert!(cut);
        assert!(text.len() <= CASE_OUTPUT_BYTES);
        assert_eq!(capped(b"hi"), ("hi".to_string(), false));
    }
}
