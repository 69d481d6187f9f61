//! Running a prepared request on a worker of its environment, and shaping
//! the worker's report into the result a client sees.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;

use super::prepare::PreparedRun;
use super::text::{utf8, utf8_lossy};
use super::{EnvEntry, Executor, pool_refusal};
use crate::api::{Artifact, ExecRequest, ExecResult, RunError};
use crate::audit::{CodeFacts, RecordKind};
use crate::egress::Policy;
use crate::error::error_chain;
use crate::error::{ExecError, PoolError, WorkerError};
use crate::metrics::{ClientMetrics, RunOutcome};
use crate::outcome::{Limit, Outcome};
use crate::pool::{EnvPool, RestartCause};
use crate::protocol;
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

/// What one attempt of a run needs, on whichever worker it gets.
#[derive(Clone, Copy)]
struct Attempt<'a> {
    frame: &'a [u8],
    timeout: f64,
    processes: Option<u64>,
    memory_bytes: Option<u64>,
    network: Option<&'a Arc<Policy>>,
    output: Option<&'a OutputSink>,
    /// The caller's metrics, when it is a named client.
    client: Option<&'a ClientMetrics>,
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

/// A run's audit record while the run goes on: written when it ends, or
/// as `cancelled` if the run's future is dropped first.
struct AuditedRun<'a> {
    executor: &'a Executor,
    facts: CodeFacts,
    env: String,
    /// The environment's content hash when the run started.
    env_hash: Arc<str>,
    session: Option<String>,
    started: Instant,
    done: bool,
}

impl AuditedRun<'_> {
    /// Write the record of a run that ended with `ran`.
    fn finish(&mut self, ran: &Result<RunReport, ExecError>) {
        self.done = true;
        let include = self.executor.audit().include_code();
        let wall_ms = (self.started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        self.executor.audit_record(self.kind(), |r| {
            self.fill(r);
            r.wall_ms = Some(wall_ms);
            match ran {
                Ok(report) => {
                    let out = &report.output;
                    r.outcome = Some(RunOutcome::of(out, &report.outcome).as_str());
                    r.limit = report.outcome.limit.map(Limit::as_str);
                    r.exit_code = Some(out.exit_code);
                    r.wall_ms = Some((out.duration_ms * 1e3).round() / 1e3);
                    r.cpu_ms = out.cpu_ms.map(|ms| (ms * 1e3).round() / 1e3);
                    r.peak_rss_kb = out.peak_rss_kb;
                    r.output_bytes = Some((out.stdout.len() + out.stderr.len()) as u64);
                    if let Some(net) = &out.network {
                        r.net_bytes_out = Some(net.bytes_sent);
                        r.net_bytes_in = Some(net.bytes_received);
                    }
                    if include {
                        r.stdout = Some(utf8_lossy(&out.stdout, out.stdout_truncated).into_owned());
                        r.stderr = Some(utf8_lossy(&out.stderr, out.stderr_truncated).into_owned());
                    }
                    if let Some(err) = out.refused.as_ref().map(refusal) {
                        r.error = Some(err.code());
                        r.status = Some(err.status());
                    }
                }
                Err(err) => {
                    r.outcome = Some(match err {
                        ExecError::Busy(_) => RunOutcome::Busy.as_str(),
                        _ => RunOutcome::Failed.as_str(),
                    });
                    r.error = Some(err.code());
                    r.status = Some(err.status());
                }
            }
        });
    }

    fn kind(&self) -> RecordKind {
        match self.session {
            Some(_) => RecordKind::SessionCall,
            None => RecordKind::Run,
        }
    }

    fn fill(&self, r: &mut crate::audit::Record) {
        r.set_code(&self.facts);
        r.env = Some(self.env.clone());
        r.env_hash = Some(self.env_hash.to_string());
        r.session = self.session.clone();
    }
}

impl Drop for AuditedRun<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let wall_ms = (self.started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        self.executor.audit_record(self.kind(), |r| {
            self.fill(r);
            r.outcome = Some("cancelled");
            r.wall_ms = Some(wall_ms);
        });
    }
}

/// The client's error for a session call whose input files its session
/// refused: `too_large` where they did not fit, else `conflict`.
fn refusal(refused: &protocol::WireRefusal) -> ExecError {
    match refused.code.as_str() {
        "too_large" => ExecError::TooLarge(refused.message.clone()),
        _ => ExecError::Conflict(refused.message.clone()),
    }
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
        stdout: utf8(out.stdout, out.stdout_truncated),
        stderr: utf8(out.stderr, out.stderr_truncated),
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
        artifacts_truncated: out.artifacts_cut,
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
        network: out.network,
        env_hash: env_hash.to_string(),
    }
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
            mut frame,
            timeout,
            session,
            processes,
            memory_bytes,
            network,
            audit,
        } = prepared;
        let entry = &*env;
        let (_running, paused) = self.pace.begin();
        let caller = crate::auth::current();
        let client = caller.as_ref().map(|c| c.client.metrics());
        // The run's audit record, written however the run ends (a dropped
        // future — the client went away — is `cancelled`).
        let mut record = audit.map(|facts| AuditedRun {
            executor: self,
            facts,
            env: entry.spec.name.clone(),
            env_hash: entry.hash(),
            session: session.as_ref().map(|c| c.session().id().to_string()),
            started: Instant::now(),
            done: false,
        });
        if let Some(call) = session {
            let deadline = Duration::from_secs_f64(timeout)
                + self.sessions.config().interrupt_grace
                + HARD_DEADLINE_SLACK;
            let ran = self
                .sessions
                .execute(call, &frame, deadline, output.as_ref())
                .await
                .map(|output| {
                    let outcome = Outcome::of(&output, memory_bytes);
                    RunReport {
                        output,
                        outcome,
                        env_hash: entry.hash(),
                    }
                });
            if let Some(record) = &mut record {
                record.finish(&ran);
            }
            if let (Some(client), Ok(report)) = (client, &ran) {
                client.run(RunOutcome::of(&report.output, &report.outcome));
            }
            // A call whose files its session could not take did not run,
            // and the client is told so. The refusal is the session
            // process's word, as the rest of its report is: the record
            // above keeps all the report held, output and CPU too.
            return ran.and_then(|report| match report.output.refused.as_ref() {
                Some(refused) => Err(refusal(refused)),
                None => Ok(report),
            });
        }
        let env_name = entry.spec.name.as_str();
        if paused {
            let added = protocol::add_marshal_flag(&mut frame, "paused");
            debug_assert!(added, "a clean run's frame is a marshal dict");
        }
        // A worker that ran nothing because its scratch root stayed dirty
        // hands the request on: the next worker runs it.
        let mut attempts = 0;
        let ran = loop {
            attempts += 1;
            let attempt = Attempt {
                frame: &frame,
                timeout,
                processes,
                memory_bytes,
                network: network.as_ref(),
                output: output.as_ref(),
                client,
            };
            match self.run_on_pool(entry, &attempt).await {
                Err(ExecError::Worker(WorkerError::Retired(why))) if attempts < RETIRED_RETRIES => {
                    tracing::info!(
                        env = env_name,
                        "worker retired before the run ({why}); running it on another"
                    );
                }
                other => break other,
            }
        };
        if let Some(record) = &mut record {
            record.finish(&ran);
        }
        ran
    }

    /// One attempt of [`Executor::run_output`] on a worker of `entry`'s pool.
    #[allow(clippy::too_many_arguments)]
    async fn run_on_pool(
        &self,
        entry: &EnvEntry,
        attempt: &Attempt<'_>,
    ) -> Result<RunReport, ExecError> {
        let Attempt {
            frame,
            timeout,
            processes,
            memory_bytes,
            network,
            output,
            client,
        } = *attempt;
        let env_name = entry.spec.name.as_str();
        let queued = Instant::now();
        let got = entry.pool.get().await;
        let waited = queued.elapsed().as_secs_f64();
        entry.metrics.queue_wait(waited);
        if let Some(client) = client {
            client.queue_wait(waited);
        }
        let worker = got.map_err(|e| {
            let outcome = match e {
                PoolError::Busy(_) => RunOutcome::Busy,
                PoolError::Closed | PoolError::Unavailable(_) => RunOutcome::Failed,
            };
            entry.metrics.outcome(outcome);
            if let Some(client) = client {
                client.run(outcome);
            }
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
        if let Some(policy) = network {
            worker.set_egress_policy(policy.clone());
        }
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
                if let Some(client) = client {
                    client.run(label);
                }
                // One line per run; never the code or its output.
                tracing::info!(
                    env = env_name,
                    outcome = %label,
                    limit = outcome.limit.map(Limit::as_str),
                    connections = out.network.as_ref().map(|n| n.connections),
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
                if let Some(client) = client {
                    client.run(RunOutcome::Failed);
                }
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
