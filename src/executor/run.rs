//! Running a prepared request on a worker of its environment, and shaping
//! the worker's report into the result a client sees.

use std::time::{Duration, Instant};

use base64::Engine;

use super::prepare::PreparedRun;
use super::{EnvEntry, Executor, pool_refusal};
use crate::api::{Artifact, ExecRequest, ExecResult, RunError};
use crate::error::error_chain;
use crate::error::{ExecError, PoolError, WorkerError};
use crate::metrics::RunOutcome;
use crate::outcome::{Limit, Outcome};
use crate::pool::{EnvPool, RestartCause};
use crate::worker::{OutputSink, RunOutput};

/// Extra time the server grants a worker beyond the run's own timeout before
/// it declares the worker unresponsive and kills it.
pub(super) const HARD_DEADLINE_SLACK: Duration = Duration::from_secs(3);

/// Workers a request may try when each in turn refuses it for a scratch
/// root it could not clear (see `WorkerError::Retired`).
pub(super) const RETIRED_RETRIES: u32 = 3;

/// A pool worker while its run is in flight. If the request is dropped
/// before the run answers (the client went away), the run is cancelled and
/// the worker goes back to its pool ([`EnvPool::cancel`]).
struct InFlight<'a> {
    worker: Option<deadpool::managed::Object<crate::pool::WorkerManager>>,
    pool: &'a EnvPool,
    restore_processes: bool,
}

impl InFlight<'_> {
    /// The worker, no longer cancelled on drop.
    fn take(&mut self) -> deadpool::managed::Object<crate::pool::WorkerManager> {
        self.worker.take().expect("taken once")
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            self.pool.cancel(worker, self.restore_processes);
        }
    }
}

/// A run's report as the worker sent it, with how the run ended.
#[derive(Debug)]
pub struct RunReport {
    /// What the worker reported.
    pub output: RunOutput,
    /// How the run ended, computed from the report once.
    pub outcome: Outcome,
    /// The content hash of the environment the run ran in.
    pub env_hash: std::sync::Arc<str>,
}

/// The result a client sees.
fn shape_result(report: RunReport) -> ExecResult {
    let RunReport {
        output: out,
        outcome,
        env_hash,
    } = report;
    let truncated = out.stdout_truncated || out.stderr_truncated;
    ExecResult {
        stdout: utf8(out.stdout),
        stderr: utf8(out.stderr),
        exit_code: out.exit_code,
        artifacts: out
            .artifacts
            .into_iter()
            .map(|a| Artifact {
                path: a.path,
                size: a.size,
                mime: a.mime,
                base64: a
                    .data
                    .map(|d| base64::engine::general_purpose::STANDARD.encode(d)),
                omitted: a.omitted,
                uri: None,
            })
            .collect(),
        timed_out: out.timed_out,
        truncated,
        duration_ms: (out.duration_ms * 1000.0).round() / 1000.0,
        signal: out.signal,
        result: out.result,
        error: out.error.map(|e| RunError {
            kind: e.kind,
            message: e.message,
            traceback: e.traceback,
            line: e.line,
        }),
        limit: outcome.limit,
        session_lost: out.session_lost,
        env_hash: env_hash.to_string(),
    }
}

/// Bytes as text without a copy when they are valid UTF-8.
fn utf8(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl Executor {
    /// Run one request to completion.
    pub async fn execute(&self, req: ExecRequest) -> Result<ExecResult, ExecError> {
        self.find_env(req.env.as_deref()).await;
        let prepared = self.prepare(&req)?;
        self.run(prepared, None).await
    }

    /// Run a prepared request on a worker of its environment. With `output`,
    /// the worker streams output chunks there while the run goes on.
    /// Dropping the returned future kills the run.
    pub async fn run(
        &self,
        prepared: PreparedRun,
        output: Option<OutputSink>,
    ) -> Result<ExecResult, ExecError> {
        self.run_output(prepared, output).await.map(shape_result)
    }

    /// [`Executor::run`], returning the worker's report as it came and how
    /// the run ended.
    pub async fn run_output(
        &self,
        prepared: PreparedRun,
        output: Option<OutputSink>,
    ) -> Result<RunReport, ExecError> {
        let PreparedRun {
            env,
            frame,
            timeout,
            session,
            processes,
            memory_bytes,
        } = prepared;
        let entry = &*env;
        if let Some(call) = session {
            let deadline = Duration::from_secs_f64(timeout)
                + self.sessions.config().interrupt_grace
                + HARD_DEADLINE_SLACK;
            let output = self
                .sessions
                .execute(call, &frame, deadline, output.as_ref())
                .await?;
            let outcome = Outcome::of(&output, memory_bytes);
            return Ok(RunReport {
                output,
                outcome,
                env_hash: entry.hash(),
            });
        }
        let env_name = entry.spec.name.as_str();
        // A worker that ran nothing because its scratch root stayed dirty
        // hands the request on: the next worker runs it.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self
                .run_on_pool(
                    entry,
                    &frame,
                    timeout,
                    processes,
                    memory_bytes,
                    output.as_ref(),
                )
                .await
            {
                Err(ExecError::Worker(WorkerError::Retired(why))) if attempts < RETIRED_RETRIES => {
                    tracing::info!(
                        env = env_name,
                        "worker retired before the run ({why}); running it on another"
                    );
                }
                other => return other,
            }
        }
    }

    /// One attempt of [`Executor::run_output`] on a worker of `entry`'s pool.
    async fn run_on_pool(
        &self,
        entry: &EnvEntry,
        frame: &[u8],
        timeout: f64,
        processes: Option<u64>,
        memory_bytes: Option<u64>,
        output: Option<&OutputSink>,
    ) -> Result<RunReport, ExecError> {
        let env_name = entry.spec.name.as_str();
        let queued = Instant::now();
        let got = entry.pool.get().await;
        entry.metrics.queue_wait(queued.elapsed().as_secs_f64());
        let worker = got.map_err(|e| {
            let outcome = match e {
                PoolError::Busy(_) => RunOutcome::Busy,
                PoolError::Closed | PoolError::Unavailable(_) => RunOutcome::Failed,
            };
            entry.metrics.outcome(outcome);
            tracing::info!(env = env_name, %outcome, "run refused: {e}");
            pool_refusal(entry, e)
        })?;
        let worker_pid = worker.pid();
        let mut in_flight = InFlight {
            worker: Some(worker),
            pool: &entry.pool,
            restore_processes: processes.is_some(),
        };
        let worker = in_flight.worker.as_mut().expect("set above");
        if processes.is_some()
            && let Err(e) = worker.set_run_processes(processes)
        {
            entry.pool.discard(in_flight.take(), RestartCause::Crash);
            return Err(ExecError::Cgroup(e));
        }
        let started = Instant::now();
        let deadline = Duration::from_secs_f64(timeout) + HARD_DEADLINE_SLACK;
        let ran = worker.execute_cancellable(frame, deadline, output).await;
        let mut worker = in_flight.take();
        let seconds = started.elapsed().as_secs_f64();
        match ran {
            Ok(out) => {
                if processes.is_some()
                    && let Err(e) = worker.set_run_processes(None)
                {
                    // It would cap the next runs too low: replace it.
                    tracing::warn!(worker_pid, "cannot restore the worker's pids.max: {e}");
                    entry.pool.discard(worker, RestartCause::Crash);
                } else {
                    entry.pool.put(worker);
                }
                let outcome = Outcome::of(&out, memory_bytes);
                let label = RunOutcome::of(&out, &outcome);
                entry.metrics.run(label, seconds);
                // One line per run; never the code or its output.
                tracing::info!(
                    env = env_name,
                    outcome = %label,
                    limit = outcome.limit.map(Limit::as_str),
                    duration_ms = (seconds * 1e6).round() / 1e3,
                    exit_code = out.exit_code,
                    worker_pid,
                    "run finished"
                );
                Ok(RunReport {
                    output: out,
                    outcome,
                    env_hash: entry.hash(),
                })
            }
            Err(WorkerError::Retired(why)) => {
                entry.pool.discard(worker, RestartCause::Dirty);
                Err(ExecError::Worker(WorkerError::Retired(why)))
            }
            Err(e) => {
                let cause = match e {
                    WorkerError::Unresponsive(_) => RestartCause::Timeout,
                    _ => RestartCause::Crash,
                };
                entry.metrics.run(RunOutcome::Failed, seconds);
                tracing::warn!(
                    env = env_name,
                    outcome = %RunOutcome::Failed,
                    duration_ms = (seconds * 1e6).round() / 1e3,
                    worker_pid,
                    "run failed, discarding worker: {}",
                    error_chain(&e)
                );
                entry.pool.discard(worker, cause);
                Err(ExecError::Worker(e))
            }
        }
    }
}
