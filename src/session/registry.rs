//! The live sessions of a server: caps, lookup, calls, the idle-TTL reaper,
//! closing, shutdown, and a bounded record of sessions that ended so that a
//! call to one says why it is gone.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::SessionConfig;
use super::live::{ActiveCall, Session};
use crate::api::SessionInfo;
use crate::env::ServedName;
use crate::error::ExecError;
use crate::error::error_chain;
use crate::pool::{EnvPool, PooledWorker};
use crate::protocol::WireLimits;
use crate::worker::{OutputSink, RunOutput, kill_process_tree};

/// How much longer than the termination grace a closed session's worker has
/// to end the session and clear what it left (see `worker_release`).
const RELEASE_SLACK: Duration = Duration::from_secs(3);

/// Ended sessions remembered for their 404 message.
const ENDED_KEPT: usize = 1024;

/// Every live session, with the caps on them.
pub struct Sessions {
    config: SessionConfig,
    /// Worker termination grace (close stdin, SIGTERM, SIGKILL steps).
    grace: Duration,
    inner: Mutex<Inner>,
    /// Set by `shutdown`: no session is created any more.
    closed: AtomicBool,
    /// This replica's id: every session id names it, so that a call that
    /// reaches another replica is told where its session lives.
    replica: Arc<str>,
    /// The audit log, for sessions that expire (no request is there).
    audit: std::sync::OnceLock<Arc<crate::audit::Audit>>,
}

#[derive(Default)]
struct Inner {
    live: HashMap<String, Arc<Session>>,
    /// Sessions being created, per environment index: they count against
    /// the caps before their process exists.
    starting: HashMap<usize, usize>,
    /// Sessions being created, per client.
    starting_by: HashMap<Arc<str>, usize>,
    /// Why recently ended sessions ended, oldest first, with the client
    /// that owned each (only it is told why).
    ended: VecDeque<Ended>,
}

impl Inner {
    fn count(&self, env: usize) -> (usize, usize) {
        let starting_total: usize = self.starting.values().sum();
        let in_env = self.live.values().filter(|s| s.env == env).count()
            + self.starting.get(&env).copied().unwrap_or(0);
        (self.live.len() + starting_total, in_env)
    }

    fn remember(&mut self, session: &Session, reason: String) {
        if self.ended.len() >= ENDED_KEPT {
            self.ended.pop_front();
        }
        self.ended.push_back(Ended {
            id: session.id.clone(),
            owner: session.owner.clone(),
            reason,
        });
    }
}

/// A session that ended recently: why, told to its owner.
struct Ended {
    id: String,
    owner: Option<Arc<str>>,
    reason: String,
}

/// A slot under the caps, held while a session is being created; given
/// back when dropped unless the session went live.
pub struct Reservation {
    sessions: Arc<Sessions>,
    env: usize,
    /// The client it is for, counted in `starting_by`.
    owner: Option<Arc<str>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut inner = self.sessions.inner.lock();
        if let Some(owner) = &self.owner
            && let Some(n) = inner.starting_by.get_mut(owner)
        {
            *n -= 1;
            if *n == 0 {
                inner.starting_by.remove(owner);
            }
        }
        if let Some(n) = inner.starting.get_mut(&self.env) {
            *n -= 1;
            if *n == 0 {
                inner.starting.remove(&self.env);
            }
        }
    }
}

impl Sessions {
    /// The registry of replica `replica`, with its reaper running until
    /// shutdown.
    pub fn start(config: SessionConfig, grace: Duration, replica: &str) -> Arc<Sessions> {
        let sessions = Arc::new(Sessions {
            config,
            grace,
            inner: Mutex::new(Inner::default()),
            closed: AtomicBool::new(false),
            replica: Arc::from(replica),
            audit: std::sync::OnceLock::new(),
        });
        tokio::spawn(reap(Arc::downgrade(&sessions)));
        sessions
    }

    /// Where expiries are recorded (set once, at start).
    pub fn set_audit(&self, audit: Arc<crate::audit::Audit>) {
        let _ = self.audit.set(audit);
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Grace between the steps of terminating a session's worker.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// A slot for a new session in environment `env` (named `env_name`)
    /// for client `owner` (holding at most `owner_max`), or
    /// `too_many_sessions`.
    pub fn reserve(
        self: &Arc<Self>,
        env: usize,
        env_name: &str,
        owner: Option<(&Arc<str>, Option<usize>)>,
    ) -> Result<Reservation, ExecError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        let mut inner = self.inner.lock();
        let (total, in_env) = inner.count(env);
        if total >= self.config.max_sessions {
            return Err(ExecError::TooManySessions {
                env: None,
                client: None,
                limit: self.config.max_sessions,
            });
        }
        if in_env >= self.config.max_sessions_per_env {
            return Err(ExecError::TooManySessions {
                env: Some(env_name.to_string()),
                client: None,
                limit: self.config.max_sessions_per_env,
            });
        }
        if let Some((name, Some(max))) = owner {
            let held = inner
                .live
                .values()
                .filter(|s| s.owner.as_ref() == Some(name))
                .count()
                + inner.starting_by.get(name).copied().unwrap_or(0);
            if held >= max {
                return Err(ExecError::TooManySessions {
                    env: None,
                    client: Some(name.to_string()),
                    limit: max,
                });
            }
        }
        *inner.starting.entry(env).or_default() += 1;
        if let Some((name, _)) = owner {
            *inner.starting_by.entry(name.clone()).or_default() += 1;
        }
        Ok(Reservation {
            sessions: self.clone(),
            env,
            owner: owner.map(|(name, _)| name.clone()),
        })
    }

    /// Make a session live on `worker` (already in session mode).
    pub(crate) fn insert(
        &self,
        reservation: Reservation,
        env_name: ServedName,
        env_hash: Arc<str>,
        ttl: Duration,
        call_defaults: (f64, WireLimits),
        (worker, home): (PooledWorker, EnvPool),
    ) -> Result<SessionInfo, ExecError> {
        let id = match new_id() {
            Ok(random) => crate::replica::session_id(&random, &self.replica),
            Err(e) => {
                tokio::spawn(worker.terminate(self.grace));
                return Err(ExecError::SessionId(e));
            }
        };
        let session = Arc::new(Session::new(
            id.clone(),
            (reservation.env, env_name, env_hash),
            reservation.owner.clone(),
            ttl,
            call_defaults,
            (worker, home),
        ));
        let info = session.info();
        let mut inner = self.inner.lock();
        if self.closed.load(Ordering::Acquire) {
            drop(inner);
            kill_process_tree(session.pid);
            return Err(ExecError::ShuttingDown);
        }
        inner.live.insert(id.clone(), session);
        drop(inner);
        drop(reservation);
        tracing::info!(session = %id, env = %info.env, "session created");
        Ok(info)
    }

    /// The live session `id`, marked active until the returned call is
    /// dropped (it cannot expire meanwhile). Only a call that runs renews
    /// the session's TTL: one refused before it runs leaves the session as
    /// it was. For client `caller` (any with `None`), another client's
    /// session is unknown, and stays as it was: a call it may not make
    /// neither holds nor renews it.
    pub fn begin(&self, id: &str, caller: Option<&str>) -> Result<ActiveCall, ExecError> {
        let inner = self.inner.lock();
        match inner.live.get(id) {
            Some(session) if caller.is_some_and(|name| !session.owned_by(name)) => {
                Err(self.not_yours(id))
            }
            Some(session) => {
                session.active.fetch_add(1, Ordering::AcqRel);
                Ok(ActiveCall {
                    session: session.clone(),
                })
            }
            None => Err(self.unknown(&inner, id, caller)),
        }
    }

    /// Run one pre-encoded `exec` frame in the session, after the calls
    /// that arrived before it.
    pub async fn execute(
        &self,
        call: ActiveCall,
        frame: &[u8],
        deadline: Duration,
        output: Option<&OutputSink>,
    ) -> Result<RunOutput, ExecError> {
        let session = call.session.clone();
        let mut slot = session.worker.lock().await;
        let Some(worker) = slot.as_mut() else {
            return Err(self.unknown(&self.inner.lock(), &session.id, None));
        };
        if worker.is_poisoned() || !worker.is_alive() {
            let worker = slot.take();
            self.lose(
                &session,
                worker,
                "the session process was killed: an earlier call was abandoned mid-run (its client went away) or the process died".into(),
            );
            return Err(self.unknown(&self.inner.lock(), &session.id, None));
        }
        let abandoned = Abandoned {
            sessions: self,
            session: &session,
            armed: true,
        };
        let outcome = worker.execute(frame, deadline, output).await;
        abandoned.disarm();
        session.called();
        // A call whose files the session's process refused did not run.
        if !matches!(&outcome, Ok(out) if out.refused.is_some()) {
            session.touch();
        }
        match outcome {
            Ok(out) => {
                if let Some(reason) = &out.session_lost {
                    let worker = slot.take();
                    self.lose(&session, worker, reason.clone());
                } else {
                    // Runs once this task yields, as a rule after the answer
                    // is written; a call that comes first settles itself.
                    drop(slot);
                    tokio::spawn(async move {
                        if let Some(worker) = session.worker.lock().await.as_mut() {
                            worker.settle();
                        }
                    });
                }
                Ok(out)
            }
            Err(e) => {
                let worker = slot.take();
                self.lose(
                    &session,
                    worker,
                    format!("the session's worker failed: {}", error_chain(&e)),
                );
                Err(ExecError::Worker(e))
            }
        }
    }

    /// The ids of the live sessions in environment `env` (its index, which a
    /// rename at a rescan keeps, where the name a session was made with may
    /// have changed).
    pub fn in_env(&self, env: usize) -> Vec<String> {
        self.inner
            .lock()
            .live
            .values()
            .filter(|s| s.env() == env)
            .map(|s| s.id.clone())
            .collect()
    }

    /// Every live session client `owner` may use (all with `None`),
    /// oldest first.
    pub fn list(&self, owner: Option<&str>) -> Vec<SessionInfo> {
        let mut sessions: Vec<Arc<Session>> = self
            .inner
            .lock()
            .live
            .values()
            .filter(|s| owner.is_none_or(|o| s.owned_by(o)))
            .cloned()
            .collect();
        sessions.sort_by_key(|s| s.created);
        sessions.iter().map(|s| s.info()).collect()
    }

    /// End session `id` (for client `owner`; any with `None`): later calls
    /// get 404 at once; calls already accepted finish first, then its
    /// process is ended and its worker kept for the next session (see
    /// `worker_release`).
    pub fn close(&self, id: &str, owner: Option<&str>) -> Result<SessionInfo, ExecError> {
        let session = {
            let mut inner = self.inner.lock();
            match inner.live.get(id) {
                Some(s) if owner.is_none_or(|o| s.owned_by(o)) => {}
                Some(_) => return Err(self.not_yours(id)),
                None => return Err(self.unknown(&inner, id, owner)),
            }
            let Some(session) = inner.live.remove(id) else {
                return Err(self.unknown(&inner, id, owner));
            };
            inner.remember(&session, "it was closed".into());
            session
        };
        tracing::info!(session = %id, "session closed");
        let info = session.info();
        self.release_later(session);
        Ok(info)
    }

    /// The session was lost: forget it, remember why, end its worker.
    fn lose(&self, session: &Arc<Session>, worker: Option<PooledWorker>, reason: String) {
        self.forget_if_live(session, reason);
        tokio::spawn(worker_terminate(worker, self.grace));
    }

    /// The session, if still live (not closed, expired or shut down
    /// meanwhile: why it ended then stays), was lost: later calls get
    /// `unknown_session`, with `reason`.
    fn forget_if_live(&self, session: &Arc<Session>, reason: String) {
        tracing::warn!(session = %session.id, "session lost: {reason}");
        let mut inner = self.inner.lock();
        if inner
            .live
            .get(&session.id)
            .is_some_and(|s| Arc::ptr_eq(s, session))
        {
            inner.live.remove(&session.id);
            inner.remember(session, reason);
        }
    }

    /// End sessions idle past their TTL.
    fn expire(&self) {
        let now = Instant::now();
        let expired: Vec<Arc<Session>> = {
            let mut inner = self.inner.lock();
            let ids: Vec<String> = inner
                .live
                .values()
                .filter(|s| s.expired(now))
                .map(|s| s.id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| {
                    let session = inner.live.remove(id)?;
                    let reason = format!(
                        "it expired after {} s without a call",
                        crate::limits::readable(session.ttl.as_secs_f64())
                    );
                    inner.remember(&session, reason);
                    Some(session)
                })
                .collect()
        };
        for session in expired {
            tracing::info!(session = %session.id, "session expired");
            if let Some(audit) = self.audit.get().filter(|a| a.enabled()) {
                let mut record =
                    crate::audit::Record::new(crate::audit::RecordKind::SessionExpire, None);
                record.client = session.owner.clone();
                record.session = Some(session.id.clone());
                record.env = Some(session.env_name().to_string());
                record.env_hash = Some(session.env_hash.to_string());
                audit.emit(record, None);
            }
            self.release_later(session);
        }
    }

    /// Once its calls already accepted are done, end the session's process
    /// and have its pool keep its worker (see `worker_release`).
    fn release_later(&self, session: Arc<Session>) {
        let times = (self.grace, self.config.keep_worker);
        tokio::spawn(async move {
            let worker = session.worker.lock().await.take();
            worker_release(worker, &session.home, times).await;
        });
    }

    /// Refuse new sessions and end every live one; a session whose call is
    /// running has its process tree killed at once.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let sessions: Vec<Arc<Session>> = {
            let mut inner = self.inner.lock();
            let sessions: Vec<_> = inner.live.drain().map(|(_, s)| s).collect();
            for s in &sessions {
                inner.remember(s, format!("replica {:?} shut down", self.replica));
            }
            sessions
        };
        let grace = self.grace;
        futures_util::future::join_all(sessions.into_iter().map(|session| async move {
            match session.worker.try_lock() {
                Ok(mut slot) => worker_terminate(slot.take(), grace).await,
                Err(_) => kill_process_tree(session.pid),
            }
        }))
        .await;
    }

    /// Whether session `id` is live.
    pub fn contains(&self, id: &str) -> bool {
        self.inner.lock().live.contains_key(id)
    }

    /// Live sessions now.
    pub fn live(&self) -> usize {
        self.inner.lock().live.len()
    }
}

/// A session call in flight. Dropped before [`Abandoned::disarm`] (its
/// client went away mid-call), the call killed the session's process tree
/// (see `Worker::execute`): the session is lost then, not at its next call
/// or its expiry, and its worker ended once the call lets go of it.
struct Abandoned<'a> {
    sessions: &'a Sessions,
    session: &'a Arc<Session>,
    armed: bool,
}

impl Abandoned<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.session.called();
        self.sessions.forget_if_live(
            self.session,
            "the session process was killed: a call was abandoned mid-run (its client went away)"
                .into(),
        );
        // Never a panic in a drop: without a runtime (its own shutdown),
        // the worker's process tree is already killed.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (session, grace) = (self.session.clone(), self.sessions.grace);
            runtime.spawn(async move {
                let worker = session.worker.lock().await.take();
                worker_terminate(worker, grace).await;
            });
        }
    }
}

/// A closed session's worker, made ready for another session within
/// `grace` and kept by its pool for one for `keep`; terminated if it
/// cannot be (or `keep` is zero).
async fn worker_release(
    worker: Option<PooledWorker>,
    home: &EnvPool,
    (grace, keep): (Duration, Duration),
) {
    let Some(mut worker) = worker else { return };
    if keep.is_zero() {
        return worker.terminate(grace).await;
    }
    // The worker's clean-up has up to 2 s (`CLEAN_SECONDS`) of its own.
    match worker.release_session(grace + RELEASE_SLACK).await {
        Ok(()) => home.keep_for_session(worker, keep),
        Err(e) => {
            tracing::info!(
                worker_pid = worker.pid(),
                "a closed session's worker is not kept: {}",
                error_chain(&e)
            );
            worker.terminate(grace).await;
        }
    }
}

async fn worker_terminate(worker: Option<PooledWorker>, grace: Duration) {
    if let Some(worker) = worker {
        worker.terminate(grace).await;
    }
}

impl Sessions {
    /// `unknown_session` for a session of another client: the same answer
    /// as for an id that never named a session here, so that a client
    /// holding another's id cannot tell whether it is live.
    pub fn not_yours(&self, id: &str) -> ExecError {
        self.gone(id, None)
    }

    /// `unknown_session` for client `caller` (any with `None`), saying why
    /// the session ended when it is remembered and was the caller's (to
    /// another client, an id that never named a session), and where it
    /// lives when its id names another replica.
    fn unknown(&self, inner: &Inner, id: &str, caller: Option<&str>) -> ExecError {
        let reason = inner
            .ended
            .iter()
            .rev()
            .find(|ended| ended.id == id)
            .filter(|ended| match (caller, &ended.owner) {
                (Some(caller), Some(owner)) => **owner == *caller,
                _ => true,
            })
            .map(|ended| ended.reason.as_str());
        self.gone(id, reason)
    }

    /// `unknown_session` for `id`, which ended for `reason` if known.
    fn gone(&self, id: &str, reason: Option<&str>) -> ExecError {
        let here = &*self.replica;
        let message = match (reason, crate::replica::replica_of(id)) {
            (Some(reason), _) => format!("session {id:?} no longer exists: {reason}"),
            (None, Some(there)) if there != here => format!(
                "session {id:?} lives on replica {there:?}, but this call reached replica {here:?}: \
                 a session stays in the memory of the replica that created it, so every call to it \
                 must reach that replica (the load balancer's affinity cookie, see docs/scaling.md); \
                 if that replica was drained or lost, the session ended with it"
            ),
            (None, Some(_)) => format!(
                "session {id:?} is not known to replica {here:?}: it ended or was lost when this \
                 replica restarted (sessions live in a replica's memory)"
            ),
            (None, None) => return no_such_session(id),
        };
        ExecError::UnknownSession {
            message,
            create_one: false,
        }
    }
}

/// `unknown_session` for an id that never named a session here: the way on
/// is a new one.
fn no_such_session(id: &str) -> ExecError {
    ExecError::UnknownSession {
        message: format!("unknown session {id:?}"),
        create_one: true,
    }
}

/// 128 random bits from the kernel, as hex.
fn new_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Expire idle sessions a few times per TTL until the registry is gone or
/// shut down.
async fn reap(sessions: Weak<Sessions>) {
    let tick = match sessions.upgrade() {
        Some(s) => (s.config.ttl.min(s.config.max_ttl) / 10)
            .clamp(Duration::from_millis(50), Duration::from_secs(1)),
        None => return,
    };
    loop {
        tokio::time::sleep(tick).await;
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        if sessions.closed.load(Ordering::Acquire) {
            return;
        }
        sessions.expire();
    }
}
