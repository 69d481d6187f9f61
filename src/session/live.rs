//! One live session: the worker that serves it, its calls serialized in
//! arrival order, and its idle deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use super::clock::rfc3339;
use crate::api::SessionInfo;
use crate::env::ServedName;
use crate::pool::{EnvPool, PooledWorker};
use crate::protocol::WireLimits;

/// A live session.
pub struct Session {
    pub(super) id: String,
    /// Index of the session's environment in the executor.
    pub(super) env: usize,
    /// The environment's name as it is served now: a rescan that renames
    /// it (the index stays) shows in the session's info and records.
    pub(super) env_name: ServedName,
    /// The environment's content hash when the session started (its
    /// expiry's audit record names it; no request is there to look it up).
    pub(super) env_hash: Arc<str>,
    /// The client that created it (`None`: created in-process, no
    /// client): only that client's calls find it.
    pub(super) owner: Option<Arc<str>>,
    pub(super) ttl: Duration,
    /// Default wall-clock limit of a call, seconds.
    pub(super) timeout: f64,
    /// The session's limits, fixed at its start: every call runs with
    /// them (`cpu_seconds` a budget per call).
    pub(super) limits: WireLimits,
    pub(super) created: SystemTime,
    /// The worker in session mode; `None` once the session was lost or
    /// closed. Holding the lock is holding the session: tokio's mutex is
    /// fair, so calls run one at a time in the order they arrived.
    pub(super) worker: tokio::sync::Mutex<Option<PooledWorker>>,
    /// The worker's pid, to kill its process tree while a call holds the
    /// lock (shutdown).
    pub(super) pid: u32,
    /// The pool the worker came from, which keeps it for a next session
    /// once this one is closed.
    pub(super) home: EnvPool,
    /// Idle deadline, renewed as each call that runs ends.
    expires: Mutex<Instant>,
    /// Calls waiting or running; a session with any never expires. Changed
    /// under the registry's lock only where the reaper could race.
    pub(super) active: AtomicUsize,
    calls: AtomicU64,
}

impl Session {
    /// A session `id` in `env` (its index, name and content hash).
    pub(super) fn new(
        id: String,
        (env, env_name, env_hash): (usize, ServedName, Arc<str>),
        owner: Option<Arc<str>>,
        ttl: Duration,
        (timeout, limits): (f64, WireLimits),
        (worker, home): (PooledWorker, EnvPool),
    ) -> Session {
        Session {
            id,
            env,
            env_name,
            env_hash,
            owner,
            ttl,
            timeout,
            limits,
            created: SystemTime::now(),
            pid: worker.pid(),
            home,
            worker: tokio::sync::Mutex::new(Some(worker)),
            expires: Mutex::new(Instant::now() + ttl),
            active: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether client `name` may use the session (its creator, or anyone
    /// for a session no client created).
    pub fn owned_by(&self, name: &str) -> bool {
        self.owner.as_deref().is_none_or(|owner| owner == name)
    }

    /// The name its environment is served under now.
    pub fn env_name(&self) -> Arc<str> {
        self.env_name.get()
    }

    /// The client that created the session, if one did.
    pub fn owner(&self) -> Option<&Arc<str>> {
        self.owner.as_ref()
    }

    /// Index of the session's environment in the executor.
    pub fn env(&self) -> usize {
        self.env
    }

    /// Default wall-clock limit of a call, seconds.
    pub fn timeout(&self) -> f64 {
        self.timeout
    }

    /// The session's limits, which each of its calls runs with.
    pub fn limits(&self) -> &WireLimits {
        &self.limits
    }

    pub(super) fn touch(&self) {
        *self.expires.lock() = Instant::now() + self.ttl;
    }

    pub(super) fn expired(&self, now: Instant) -> bool {
        self.active.load(Ordering::Acquire) == 0 && *self.expires.lock() <= now
    }

    pub(super) fn called(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    pub fn info(&self) -> SessionInfo {
        let left = self
            .expires
            .lock()
            .saturating_duration_since(Instant::now());
        let busy = self.active.load(Ordering::Acquire) > 0;
        SessionInfo {
            id: self.id.clone(),
            env: self.env_name.get().to_string(),
            created_at: rfc3339(self.created),
            // A busy session does not expire: its deadline is a full TTL
            // after its last call ends.
            expires_at: rfc3339(SystemTime::now() + if busy { self.ttl } else { left }),
            ttl: self.ttl.as_secs_f64(),
            timeout: self.timeout,
            calls: self.calls.load(Ordering::Relaxed),
            busy,
        }
    }
}

/// A call on a session, from its lookup until it ends: keeps the session
/// from expiring meanwhile. Its TTL is renewed as the call's code ends, not
/// when the call is dropped, so a call refused before it runs renews nothing.
pub struct ActiveCall {
    pub(super) session: Arc<Session>,
}

impl ActiveCall {
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        self.session.active.fetch_sub(1, Ordering::AcqRel);
    }
}
