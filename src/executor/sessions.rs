//! Sessions: a warm worker leaves its pool and forks the session's process.

use std::sync::atomic::Ordering;

use super::run::{HARD_DEADLINE_SLACK, RETIRED_RETRIES};
use super::{Executor, pool_refusal};
use crate::api::{CreateSessionRequest, SessionInfo};
use crate::error::error_chain;
use crate::error::{ExecError, WorkerError};
use crate::limits::{capped_secs, narrow_limits, run_timeout};
use crate::protocol::{self, SessionFrame};

impl Executor {
    /// Start a session: a warm worker of the environment leaves its pool
    /// (which refills) and forks the session's process.
    pub async fn create_session(
        &self,
        req: CreateSessionRequest,
    ) -> Result<SessionInfo, ExecError> {
        if self.closing.load(Ordering::Acquire) || self.replica.is_draining() {
            // A session made now would end with this replica in seconds:
            // the client retries (503), and the balancer sends it elsewhere.
            return Err(ExecError::Draining {
                replica: self.replica.id().to_string(),
            });
        }
        let config = self.sessions.config();
        self.find_env(req.env.as_deref()).await;
        let entry = self.available_entry(req.env.as_deref())?;
        let index = entry.id;
        let ttl = match req.ttl {
            None => config.ttl,
            Some(t) if t.is_finite() && t > 0.0 => capped_secs(t, config.max_ttl),
            Some(t) => {
                return Err(ExecError::BadRequest(format!(
                    "ttl must be a positive number of seconds, got {t}"
                )));
            }
        };
        let timeout = run_timeout(
            req.timeout,
            entry.settings.timeout,
            entry.settings.max_timeout,
        )?;
        let mut limits = entry.settings.run_limits.clone();
        if let Some(asked) = &req.limits {
            limits = narrow_limits(&limits, asked)?;
        }
        if limits.disk_bytes.is_some() {
            return Err(ExecError::BadRequest(format!(
                "limits.disk_bytes applies to single runs; a session's files are capped by the \
                 environment's disk_bytes ({} bytes)",
                entry.settings.disk_bytes
            )));
        }
        let reservation = self.sessions.reserve(index, &entry.spec.name)?;
        // The worker serves this session alone from now on: a lower
        // `processes` stays in its cgroup for the session's life.
        let processes = req
            .limits
            .as_ref()
            .and_then(|l| l.processes)
            .and(limits.processes);
        let frame = protocol::encode_frame(&SessionFrame {
            t: "session",
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            limits: &limits,
            grace: config.interrupt_grace.as_secs_f64(),
        })
        .map_err(ExecError::Encode)?;
        let mut attempts = 0;
        let worker = loop {
            attempts += 1;
            let worker = entry
                .pool
                .get()
                .await
                .map_err(|e| pool_refusal(&entry, e))?;
            let mut worker = entry.pool.detach(worker);
            if let Err(e) = worker.set_run_processes(processes) {
                tokio::spawn(worker.terminate(self.sessions.grace()));
                return Err(ExecError::Cgroup(e));
            }
            match worker.execute(&frame, HARD_DEADLINE_SLACK, None).await {
                Ok(_) => break worker,
                Err(e) => {
                    tokio::spawn(worker.terminate(self.sessions.grace()));
                    if matches!(e, WorkerError::Retired(_)) && attempts < RETIRED_RETRIES {
                        continue;
                    }
                    tracing::warn!(env = %entry.spec.name, "session failed to start: {}", error_chain(&e));
                    return Err(ExecError::Worker(e));
                }
            }
        };
        self.sessions
            .insert(reservation, entry.spec.name.clone(), ttl, timeout, worker)
    }

    /// Whether session `id` is live (it may still end before its next call).
    pub fn has_session(&self, id: &str) -> bool {
        self.sessions.contains(id)
    }

    /// Every live session, oldest first.
    pub fn list_sessions(&self) -> Vec<SessionInfo> {
        self.sessions.list()
    }

    /// End a session: later calls get `unknown_session`; calls already
    /// accepted finish first.
    pub fn close_session(&self, id: &str) -> Result<SessionInfo, ExecError> {
        self.sessions.close(id)
    }
}
