//! Sessions: a warm worker leaves its pool and forks the session's process;
//! once the session is closed, the pool keeps it for the next session.

use std::sync::atomic::Ordering;

use super::run::{HARD_DEADLINE_SLACK, RETIRED_RETRIES};
use super::{Executor, pool_refusal};
use crate::api::{CreateSessionRequest, SessionInfo};
use crate::error::error_chain;
use crate::error::{ExecError, WorkerError};
use crate::limits::{MIN_SESSION_TTL, capped_secs, narrow_limits, readable, run_timeout};
use crate::protocol::{self, SessionFrame};

impl Executor {
    /// Start a session: a worker a closed session left, or a warm worker
    /// of the environment that leaves its pool (which refills), forks the
    /// session's process.
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
        let caller = crate::auth::current();
        if let Some(caller) = &caller
            && let Err(err) = caller.client.require(crate::auth::Scope::Sessions)
        {
            self.audit_refusal(&err, req.env.as_deref());
            return Err(err);
        }
        let client = caller.as_ref().map(|c| &*c.client);
        self.find_env(req.env.as_deref()).await;
        let entry = self.available_entry(req.env.as_deref())?;
        let index = entry.id;
        let ttl = match req.ttl {
            None => config.ttl,
            Some(t) if t.is_finite() && t >= MIN_SESSION_TTL => capped_secs(t, config.max_ttl),
            Some(t) => {
                return Err(ExecError::BadRequest(format!(
                    "ttl must be a positive number of seconds, at least {MIN_SESSION_TTL} (session \
                     times are kept to the millisecond), got {}",
                    readable(t)
                )));
            }
        };
        let max_timeout = match client.and_then(|c| c.max_timeout()) {
            Some(ceiling) => entry.settings.max_timeout.min(ceiling),
            None => entry.settings.max_timeout,
        };
        let timeout = run_timeout(
            req.timeout,
            entry.settings.timeout.min(max_timeout),
            max_timeout,
        )?;
        let mut limits = entry.settings.run_limits.clone();
        if let Some(ceiling) = client.and_then(|c| c.limits()) {
            limits = narrow_limits(&limits, ceiling)?;
        }
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
        let network = super::prepare::run_network(
            entry.egress.as_ref().map(|e| &e.policy),
            req.network.as_ref(),
        )?;
        let reservation = self
            .sessions
            .reserve(
                index,
                &entry.spec.name,
                client.map(|c| (c.name_arc(), c.max_sessions())),
            )
            .inspect_err(|err| {
                if let (
                    Some(c),
                    ExecError::TooManySessions {
                        client: Some(_), ..
                    },
                ) = (client, err)
                {
                    c.metrics().refused("sessions");
                    self.audit_refusal(err, Some(&entry.spec.name));
                }
            })?;
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
            direct: true,
        })
        .map_err(ExecError::Encode)?;
        let mut attempts = 0;
        let worker = loop {
            attempts += 1;
            // A worker a closed session left, else one of the pool's (which
            // starts its replacement).
            let mut worker = match entry.pool.take_session_spare() {
                Some(worker) => worker,
                None => {
                    let worker = entry
                        .pool
                        .get()
                        .await
                        .map_err(|e| pool_refusal(&entry, e))?;
                    entry.pool.detach(worker)
                }
            };
            if let Some(policy) = &network {
                // Fixed for the session's life: every call begins with it.
                worker.set_egress_policy(policy.clone());
            }
            if let Err(e) = worker.set_run_processes(processes) {
                tokio::spawn(worker.terminate(self.sessions.grace()));
                return Err(ExecError::Cgroup(e));
            }
            let started = match worker.execute(&frame, HARD_DEADLINE_SLACK, None).await {
                Ok(_) => {
                    worker
                        .attach_session(config.interrupt_grace, HARD_DEADLINE_SLACK)
                        .await
                }
                Err(e) => Err(e),
            };
            match started {
                Ok(()) => break worker,
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
        let env_hash = entry.hash();
        let info = self.sessions.insert(
            reservation,
            entry.served_name.clone(),
            env_hash.clone(),
            ttl,
            (timeout, limits),
            (worker, entry.pool.clone()),
        )?;
        self.audit_record(crate::audit::RecordKind::SessionCreate, |r| {
            r.env = Some(info.env.clone());
            r.env_hash = Some(env_hash.to_string());
            r.session = Some(info.id.clone());
            r.outcome = Some("ok");
        });
        Ok(info)
    }

    /// Whether session `id` is live (it may still end before its next call).
    pub fn has_session(&self, id: &str) -> bool {
        self.sessions.contains(id)
    }

    /// Every live session the caller may use, oldest first.
    pub fn list_sessions(&self) -> Vec<SessionInfo> {
        let caller = crate::auth::current();
        self.sessions.list(caller.as_ref().map(|c| c.client.name()))
    }

    /// End a session: later calls get `unknown_session`; calls already
    /// accepted finish first. Another client's session is `unknown_session`.
    pub fn close_session(&self, id: &str) -> Result<SessionInfo, ExecError> {
        let caller = crate::auth::current();
        if let Some(caller) = &caller
            && let Err(err) = caller.client.require(crate::auth::Scope::Sessions)
        {
            self.audit_refusal(&err, None);
            return Err(err);
        }
        self.reserve_records(1)?;
        let info = self
            .sessions
            .close(id, caller.as_ref().map(|c| c.client.name()))?;
        self.audit_record(crate::audit::RecordKind::SessionClose, |r| {
            r.env = Some(info.env.clone());
            r.session = Some(info.id.clone());
            r.outcome = Some("ok");
        });
        Ok(info)
    }
}
