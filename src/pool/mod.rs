//! A pool of warm workers for one environment, on `deadpool::managed`.
//!
//! Workers are started ahead of need: at start-up the pool is filled to
//! `pool_size`, and whenever a worker is discarded (crash, timeout, retired
//! after `max_runs`, killed from outside) a replacement is started in the
//! background and parked as a *spare*. `Manager::create` hands out a spare
//! when there is one, so a request only pays for a Python start when the pool
//! is sized below its load. deadpool creates objects only when none is idle,
//! so a ready spare also takes the turn of the idle worker deadpool picks,
//! which rests as a spare in its place (`Manager::recycle`): every live
//! worker takes turns, and one just used has time to prepare its next run.
//!
//! A worker that served a session comes back when the session is closed,
//! cleared (see `Worker::release_session`), and is kept for the next
//! session as a *session spare* ([`EnvPool::keep_for_session`]): that
//! session then starts no worker, and the pool no replacement. Session
//! spares are not counted in the pool's size; at most `size` of them are
//! kept, each for the sessions' `keep_worker`, and they are the first
//! workers retired when the worker budget is short.
//!
//! A *lazy* pool (an environment discovered but not configured) starts no
//! worker ahead of need and keeps no spares: its first request waits for a
//! worker, later ones reuse it, and [`EnvPool::shrink_if_idle`] retires its
//! workers after an idle period. Every worker of every pool holds a permit
//! of one shared [`WorkerBudget`], the server-wide cap on live workers.

mod budget;
mod spares;

pub(crate) use budget::{PooledWorker, WorkerBudget};
use spares::{Spare, Spares};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, Object, RecycleError, RecycleResult, Timeouts, WeakPool};
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::{PoolError, WorkerError, error_chain};
use crate::worker::{Worker, WorkerSpec};

/// Sizing and timing of one pool.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Workers kept alive (busy + idle + spare).
    pub size: usize,
    /// How long a request waits for a free worker before `busy`.
    pub queue_timeout: Duration,
    /// Runs after which a worker is replaced (0: never).
    pub max_runs: u64,
}

/// Counts reported by `/health` and `/list-envs`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct PoolStatus {
    pub size: usize,
    pub idle: usize,
    pub busy: usize,
    pub starting: usize,
    /// Workers clearing the many files a run left before they serve again
    /// (counted in `size`, not in `busy`).
    pub cleaning: usize,
    /// Requests waiting for a worker now (each gives up after the queue
    /// timeout with `503 busy`).
    pub waiting: usize,
    /// Workers of closed sessions kept for the next session (not counted
    /// in `size`).
    pub session_spares: usize,
    /// Why the last worker start failed, while no worker is alive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a worker was replaced (the `cause` of the restart metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartCause {
    /// It did not answer within the run's hard deadline.
    Timeout,
    /// It died, or broke the protocol.
    Crash,
    /// Its request was dropped mid-run (client gone, cancelled) and the
    /// worker could not be kept: it did not answer the cancel in time, or
    /// the call was a session's.
    Cancelled,
    /// It was retired: `max_runs` reached, or replaced after an install.
    Recycle,
    /// Its scratch root could not be cleared after a run: it refused the
    /// next request rather than run it where an earlier run left state.
    Dirty,
}

impl RestartCause {
    pub const ALL: [RestartCause; 5] = [
        RestartCause::Timeout,
        RestartCause::Crash,
        RestartCause::Cancelled,
        RestartCause::Recycle,
        RestartCause::Dirty,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RestartCause::Timeout => "timeout",
            RestartCause::Crash => "crash",
            RestartCause::Cancelled => "cancelled",
            RestartCause::Recycle => "recycle",
            RestartCause::Dirty => "dirty",
        }
    }
}

/// State shared by the manager, the supervisor and the pool handle.
struct Shared {
    spec: WorkerSpec,
    config: PoolConfig,
    /// Whether workers are started ahead of need (configured envs) or only
    /// on demand (lazy, discovered envs).
    keep_warm: bool,
    /// The server-wide cap on live workers; every worker holds a permit.
    budget: Arc<WorkerBudget>,
    /// The deadpool pool itself, for retiring idle workers from outside.
    pool: OnceLock<WeakPool<WorkerManager>>,
    /// Bumped by [`EnvPool::replace`]: workers of an older generation are
    /// retired instead of reused (after an install, for instance).
    generation: AtomicU64,
    /// When a worker was last handed out or returned; orders eviction and
    /// drives the idle shrink of lazy pools.
    last_used: Mutex<Instant>,
    /// Started workers not yet handed to deadpool, plus the number starting.
    spares: Mutex<Spares<PooledWorker>>,
    /// Woken when a spare is ready, fails to start, or is taken, and while
    /// `warming`, when a worker comes back from a run.
    spares_changed: tokio::sync::Notify,
    /// Workers of closed sessions kept for the next session, the one kept
    /// last at the end, each with the token of its keeping (its expiry
    /// timer retires it only if it was not taken since).
    session_spares: Mutex<Vec<(PooledWorker, u64)>>,
    /// The token of the next session spare kept.
    next_keep: AtomicU64,
    /// Set while [`EnvPool::warm_first_then_rest`] waits for the first run.
    warming: AtomicBool,
    /// Reports the pid of every worker process that ends.
    exited_tx: mpsc::UnboundedSender<u32>,
    /// Last start failure, cleared by the next success.
    last_error: Mutex<Option<String>>,
    /// Python version from the first successful handshake.
    python_version: Mutex<Option<String>>,
    closed: AtomicBool,
    /// Woken by [`EnvPool::close`]: workers clearing out of turn are then
    /// terminated at once.
    closing: tokio::sync::Notify,
    /// Workers replaced so far, per [`RestartCause`] (in `ALL` order); read
    /// by the metrics at scrape time.
    restarts: [AtomicU64; RestartCause::ALL.len()],
    /// Runs whose files their worker cleared out of turn (see
    /// [`EnvPool::rest_until_clean`]).
    cleared_out_of_turn: AtomicU64,
}

/// The deadpool manager: creates workers (a spare if one is ready) and
/// checks them before reuse.
pub struct WorkerManager {
    shared: Arc<Shared>,
}

impl managed::Manager for WorkerManager {
    type Type = PooledWorker;
    type Error = WorkerError;

    async fn create(&self) -> Result<PooledWorker, WorkerError> {
        let shared = &self.shared;
        if let Some(spare) = shared.spare_or_wait().await {
            return Ok(spare);
        }
        let permit = shared
            .budget
            .acquire(shared, shared.config.queue_timeout)
            .await?;
        let generation = shared.generation.load(Ordering::Acquire);
        let result = Worker::create(&shared.spec, Some(shared.exited_tx.clone())).await;
        shared.record(&result);
        result.map(|worker| PooledWorker::new(worker, generation, permit))
    }

    async fn recycle(&self, worker: &mut PooledWorker, _: &Metrics) -> RecycleResult<WorkerError> {
        let max = self.shared.config.max_runs;
        let cause = if worker.is_poisoned() {
            Some(RestartCause::Cancelled)
        } else if !worker.is_alive() {
            Some(RestartCause::Crash)
        } else if (max > 0 && worker.runs() >= max)
            || worker.generation != self.shared.generation.load(Ordering::Acquire)
        {
            Some(RestartCause::Recycle)
        } else {
            None
        };
        if let Some(cause) = cause {
            // Dropped by deadpool (which kills it); the exit report refills.
            self.shared.count_restart(cause);
            return Err(RecycleError::message("worker is not reusable"));
        }
        self.shared.take_turn_of(worker);
        Ok(())
    }
}

impl Shared {
    fn count_restart(&self, cause: RestartCause) {
        let i = RestartCause::ALL
            .iter()
            .position(|c| *c == cause)
            .unwrap_or(0);
        self.restarts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A ready spare of the current generation; else, while spares are
    /// starting that no other request waits for, the first of them to be
    /// ready (it comes sooner than a worker started now, and costs no
    /// second start). `None`: the caller starts a worker of its own.
    async fn spare_or_wait(&self) -> Option<PooledWorker> {
        let deadline = tokio::time::Instant::now() + self.spec.start_timeout;
        loop {
            let changed = self.spares_changed.notified();
            let mut changed = std::pin::pin!(changed);
            {
                let mut stale = Vec::new();
                let mut spares = self.spares.lock();
                let spare = spares.take(self.generation.load(Ordering::Acquire), &mut stale);
                let wait = spare.is_none() && spares.starting + spares.cleaning > spares.waiting;
                if wait {
                    spares.waiting += 1;
                    // Registered before the lock is released: a spare made
                    // ready from now on wakes this request.
                    changed.as_mut().enable();
                }
                drop(spares);
                self.terminate_all(stale);
                if spare.is_some() {
                    self.spares_changed.notify_waiters();
                    return spare;
                }
                if !wait {
                    return None;
                }
            }
            let _waiting = Waiting(&self.spares);
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }

    /// Hand out the spare that rested longest in place of `worker`, which
    /// becomes a spare (see [`Spares::take_turn_of`]).
    fn take_turn_of(&self, worker: &mut PooledWorker) {
        let generation = self.generation.load(Ordering::Acquire);
        let mut stale = Vec::new();
        self.spares
            .lock()
            .take_turn_of(worker, generation, &mut stale);
        self.terminate_all(stale);
    }

    /// Terminate `workers` in the background.
    fn terminate_all(&self, workers: Vec<PooledWorker>) {
        for worker in workers {
            tokio::spawn(worker.terminate(self.spec.grace_period));
        }
    }

    fn touch(&self) {
        *self.last_used.lock() = Instant::now();
    }

    /// Take up to `n` session spares, those kept longest first, and
    /// terminate them in the background. Returns how many were taken.
    fn retire_session_spares(&self, n: usize) -> usize {
        let workers: Vec<PooledWorker> = {
            let mut kept = self.session_spares.lock();
            let n = n.min(kept.len());
            kept.drain(..n).map(|(worker, _)| worker).collect()
        };
        let taken = workers.len();
        self.terminate_all(workers);
        taken
    }

    /// Take up to `n` idle workers (spares first) out of the pool and
    /// terminate them in the background. Returns how many were taken.
    fn retire_idle(&self, n: usize) -> usize {
        let mut workers = self.spares.lock().take_up_to(n);
        if workers.len() < n
            && let Some(pool) = self.pool.get().and_then(WeakPool::upgrade)
        {
            let mut left = n - workers.len();
            workers.extend(
                pool.retain(|_, _| {
                    if left > 0 {
                        left -= 1;
                        false
                    } else {
                        true
                    }
                })
                .removed,
            );
        }
        let taken = workers.len();
        self.terminate_all(workers);
        taken
    }

    fn record(&self, result: &Result<Worker, WorkerError>) {
        match result {
            Ok(worker) => {
                *self.last_error.lock() = None;
                self.python_version
                    .lock()
                    .get_or_insert_with(|| worker.info().python_version.clone());
            }
            Err(e) => {
                let text = error_chain(e);
                tracing::error!(python = %self.spec.python.display(), "worker failed to start: {text}");
                *self.last_error.lock() = Some(text);
            }
        }
    }
}

/// One environment's pool.
#[derive(Clone)]
pub struct EnvPool {
    pool: managed::Pool<WorkerManager>,
    shared: Arc<Shared>,
}

impl EnvPool {
    /// Build a pool kept warm, with a budget of its own (no cap beyond its
    /// size), and its supervisor; no worker is started yet (see
    /// [`EnvPool::prewarm`]).
    pub fn new(spec: WorkerSpec, config: PoolConfig) -> EnvPool {
        let budget = WorkerBudget::new(config.size.max(1));
        Self::with_budget(spec, config, budget, true)
    }

    /// Build a pool whose workers count against `budget`. A pool that does
    /// not `keep_warm` starts workers only on demand and keeps no spares.
    pub fn with_budget(
        spec: WorkerSpec,
        config: PoolConfig,
        budget: Arc<WorkerBudget>,
        keep_warm: bool,
    ) -> EnvPool {
        let (exited_tx, exited_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            spec,
            config: config.clone(),
            keep_warm,
            budget: budget.clone(),
            pool: OnceLock::new(),
            generation: AtomicU64::new(0),
            last_used: Mutex::new(Instant::now()),
            spares: Mutex::new(Spares::default()),
            spares_changed: tokio::sync::Notify::new(),
            session_spares: Mutex::new(Vec::new()),
            next_keep: AtomicU64::new(0),
            warming: AtomicBool::new(false),
            exited_tx,
            last_error: Mutex::new(None),
            python_version: Mutex::new(None),
            closed: AtomicBool::new(false),
            closing: tokio::sync::Notify::new(),
            restarts: Default::default(),
            cleared_out_of_turn: AtomicU64::new(0),
        });
        let pool = managed::Pool::builder(WorkerManager {
            shared: shared.clone(),
        })
        .max_size(config.size.max(1))
        .queue_mode(deadpool::managed::QueueMode::Fifo)
        .wait_timeout(Some(config.queue_timeout))
        .create_timeout(Some(shared.spec.start_timeout + Duration::from_secs(1)))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .expect("a runtime is configured");
        let _ = shared.pool.set(pool.weak());
        budget.register(&shared);
        let env_pool = EnvPool { pool, shared };
        tokio::spawn(supervise(env_pool.clone(), exited_rx));
        env_pool
    }

    /// Start workers until the pool holds `size` of them, and wait for them.
    /// Fails only if no worker at all could be started.
    pub async fn prewarm(&self) -> Result<(), WorkerError> {
        let size = self.shared.config.size.max(1);
        let starts = (0..size).map(|_| self.pool.get());
        let results = futures_util::future::join_all(starts).await;
        let mut first_error = None;
        let mut started = 0;
        for r in results {
            match r {
                Ok(_) => started += 1,
                Err(managed::PoolError::Backend(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(WorkerError::Startup {
                        python: self.shared.spec.python.clone(),
                        detail: e.to_string(),
                    });
                }
            }
        }
        match (started, first_error) {
            (0, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// A worker for one request; waits at most the queue timeout.
    pub async fn get(&self) -> Result<Object<WorkerManager>, PoolError> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(PoolError::Closed);
        }
        self.shared.touch();
        let timeouts = Timeouts {
            wait: Some(self.shared.config.queue_timeout),
            ..self.pool.timeouts()
        };
        self.pool.timeout_get(&timeouts).await.map_err(|e| match e {
            managed::PoolError::Timeout(managed::TimeoutType::Wait) => {
                PoolError::Busy(self.shared.config.queue_timeout)
            }
            managed::PoolError::Timeout(_) => PoolError::Unavailable(format!(
                "worker did not start within {:?}",
                self.shared.spec.start_timeout
            )),
            managed::PoolError::Backend(WorkerError::AtCapacity(_)) => {
                PoolError::Busy(self.shared.config.queue_timeout)
            }
            managed::PoolError::Backend(e) => PoolError::Unavailable(error_chain(&e)),
            managed::PoolError::Closed => PoolError::Closed,
            other => PoolError::Unavailable(other.to_string()),
        })
    }

    /// Give a worker back after a run: retired after `max_runs`; resting out
    /// of turn while it clears what a run left (see [`EnvPool::rest_until_clean`]);
    /// else idle, or handed at once to a request that waits for a spare.
    pub fn put(&self, mut worker: Object<WorkerManager>) {
        self.shared.touch();
        let max = self.shared.config.max_runs;
        let stale = worker.generation != self.shared.generation.load(Ordering::Acquire);
        if stale || (max > 0 && worker.runs() >= max) {
            self.discard(worker, RestartCause::Recycle);
            return;
        }
        let mut spares = self.shared.spares.lock();
        // After `close` deadpool drops what comes back; spares are not kept.
        let open = !self.shared.closed.load(Ordering::Acquire);
        if open && worker.is_cleaning() {
            // Out of deadpool and counted in one step (refill counts both).
            let worker = Object::take(worker);
            spares.cleaning += 1;
            drop(spares);
            self.shared
                .cleared_out_of_turn
                .fetch_add(1, Ordering::Relaxed);
            self.rest_until_clean(worker);
        } else if open && spares.waiting > 0 && worker.is_alive() {
            // That request came when no worker was idle, and waits for one
            // being started or cleared: this one is ready now.
            spares.ready.push_back(Object::take(worker));
            drop(spares);
            self.shared.spares_changed.notify_waiters();
        } else {
            drop(spares);
            drop(worker); // back in the pool
            if self.shared.warming.load(Ordering::Acquire) {
                self.shared.spares_changed.notify_waiters();
            }
        }
    }

    /// Keep `worker`, whose last run left many files (its answer said
    /// `cleaning`), out of turn until its `cleaned` frame: the next requests
    /// go to other workers instead of waiting behind the clean-up. It then
    /// rests as a spare. One that does not finish within its clean-up's
    /// budget, or whose clean-up left something, is replaced. The caller
    /// counted it in `Spares::cleaning`.
    fn rest_until_clean(&self, mut worker: PooledWorker) {
        /// The worker's budget for clearing what one run left
        /// (`CLEAN_SECONDS` in the worker), for the scratch root and a
        /// private /dev/shm each.
        const CLEAN_BUDGET: Duration = Duration::from_secs(2);
        let pool = self.clone();
        let within = 2 * CLEAN_BUDGET + self.shared.spec.grace_period;
        tokio::spawn(async move {
            let shared = &pool.shared;
            let closing = shared.closing.notified();
            let mut closing = std::pin::pin!(closing);
            // Registered before the check: a close from now on wakes it.
            closing.as_mut().enable();
            let cleaned = if shared.closed.load(Ordering::Acquire) {
                Ok(())
            } else {
                tokio::select! {
                    cleaned = worker.await_cleaned(within) => cleaned,
                    () = closing => Ok(()),
                }
            };
            let refused = {
                let mut spares = shared.spares.lock();
                spares.cleaning -= 1;
                match cleaned {
                    Ok(())
                        if !shared.closed.load(Ordering::Acquire)
                            && worker.generation == shared.generation.load(Ordering::Acquire) =>
                    {
                        spares.ready.push_back(worker);
                        None
                    }
                    Ok(()) if shared.closed.load(Ordering::Acquire) => Some((worker, None)),
                    // Replaced (`EnvPool::replace`) while it cleared.
                    Ok(()) => Some((worker, Some(RestartCause::Recycle))),
                    Err(e) => {
                        let cause = match e {
                            WorkerError::Retired(_) => RestartCause::Dirty,
                            WorkerError::Unresponsive(_) => RestartCause::Timeout,
                            _ => RestartCause::Crash,
                        };
                        tracing::warn!(
                            worker_pid = worker.pid(),
                            "clean-up after a run failed, replacing the worker: {}",
                            error_chain(&e)
                        );
                        Some((worker, Some(cause)))
                    }
                }
            };
            if refused.is_some() {
                // Before the wake-up: a request waiting for this worker then
                // waits for its replacement, where the budget has room for
                // it now, instead of starting one of its own too.
                pool.refill();
            }
            shared.spares_changed.notify_waiters();
            if let Some((worker, cause)) = refused {
                if let Some(cause) = cause {
                    shared.count_restart(cause);
                }
                worker.terminate(shared.spec.grace_period).await;
            }
        });
    }

    /// Take a worker out of the pool for good, terminate it in the background
    /// and start its replacement; `cause` is counted for the metrics.
    pub fn discard(&self, worker: Object<WorkerManager>, cause: RestartCause) {
        self.shared.count_restart(cause);
        let worker = Object::take(worker);
        let grace = self.shared.spec.grace_period;
        tokio::spawn(worker.terminate(grace));
        self.refill();
    }

    /// The request of `worker`'s run was dropped (its client went away):
    /// the worker kills the run and, once it has answered, serves again
    /// (with its run's pids cap lifted if `restore_processes`). A worker that
    /// cannot be asked, or does not answer within the termination grace, is
    /// killed and replaced, as one that fails.
    pub fn cancel(&self, mut worker: Object<WorkerManager>, restore_processes: bool) {
        if worker.can_cancel()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let pool = self.clone();
            let within = self.shared.spec.grace_period;
            runtime.spawn(async move {
                let kept = match worker.cancel(within).await {
                    Ok(()) if restore_processes => worker.set_run_processes(None).is_ok(),
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(
                            worker_pid = worker.pid(),
                            "cancelled run not answered, discarding worker: {}",
                            error_chain(&e)
                        );
                        false
                    }
                };
                if kept {
                    pool.put(worker);
                } else {
                    worker.kill();
                    pool.discard(worker, RestartCause::Cancelled);
                }
            });
            return;
        }
        worker.kill();
        self.discard(worker, RestartCause::Cancelled);
    }

    /// Take a worker out of the pool and hand it to the caller (a session,
    /// which may give it back through [`EnvPool::keep_for_session`]), starting its replacement in the background. It keeps its
    /// permit of the worker budget until it is terminated.
    pub fn detach(&self, worker: Object<WorkerManager>) -> PooledWorker {
        let worker = Object::take(worker);
        self.refill();
        worker
    }

    /// A worker kept from a closed session (see [`EnvPool::keep_for_session`]),
    /// the one kept last; `None` when none is.
    pub fn take_session_spare(&self) -> Option<PooledWorker> {
        let generation = self.shared.generation.load(Ordering::Acquire);
        let mut stale = Vec::new();
        let found = {
            let mut kept = self.shared.session_spares.lock();
            loop {
                let Some((mut worker, _)) = kept.pop() else {
                    break None;
                };
                if worker.generation == generation && worker.is_alive() {
                    break Some(worker);
                }
                stale.push(worker);
            }
        };
        self.shared.terminate_all(stale);
        if found.is_some() {
            self.shared.touch();
        }
        found
    }

    /// Keep `worker`, whose session was closed and which is ready for
    /// another (see `Worker::release_session`), for this environment's next
    /// session, for at most `keep` (zero: not at all). A worker that may not
    /// serve again (the pool closed or replaced its workers since it
    /// started, or it reached `max_runs`), or one past `size` kept, is
    /// terminated instead; so is one that would hold the worker budget's
    /// last permits.
    pub fn keep_for_session(&self, mut worker: PooledWorker, keep: Duration) {
        let shared = &self.shared;
        let max = shared.config.max_runs;
        let usable = !keep.is_zero()
            && worker.generation == shared.generation.load(Ordering::Acquire)
            && (max == 0 || worker.runs() < max)
            && shared.budget.available() > 0
            && worker.is_alive();
        let token = shared.next_keep.fetch_add(1, Ordering::Relaxed);
        let refused = {
            let mut kept = shared.session_spares.lock();
            // Under the lock: `close` takes every kept worker under it.
            if usable
                && !shared.closed.load(Ordering::Acquire)
                && kept.len() < shared.config.size.max(1)
            {
                kept.push((worker, token));
                None
            } else {
                Some(worker)
            }
        };
        let grace = shared.spec.grace_period;
        if let Some(worker) = refused {
            tokio::spawn(worker.terminate(grace));
            return;
        }
        let weak = Arc::downgrade(shared);
        tokio::spawn(async move {
            tokio::time::sleep(keep).await;
            let Some(shared) = weak.upgrade() else { return };
            let expired = {
                let mut kept = shared.session_spares.lock();
                kept.iter()
                    .position(|(_, t)| *t == token)
                    .map(|i| kept.remove(i).0)
            };
            if let Some(worker) = expired {
                worker.terminate(grace).await;
            }
        });
    }

    /// Start spares until busy + idle + spare + starting reaches the size
    /// (only for pools kept warm, and only within the worker budget).
    pub fn refill(&self) {
        self.start_spares(usize::MAX);
    }

    /// Fill the pool in the background of a server that already answers:
    /// one worker first, alone on the CPU, which the first request takes as
    /// soon as it is ready; then, once that request's run is over, or after
    /// a short while, the rest. (Starting them all at once would make the
    /// first request wait for workers sharing the cores, and its run too.)
    pub async fn warm_first_then_rest(&self) {
        const FIRST_RUN_WITHIN: Duration = Duration::from_millis(250);
        self.shared.warming.store(true, Ordering::Release);
        self.start_spares(1);
        let mut deadline = tokio::time::Instant::now() + self.shared.spec.start_timeout;
        let mut first_ready = false;
        loop {
            let changed = self.shared.spares_changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let (ready, starting) = {
                let spares = self.shared.spares.lock();
                (spares.ready.len(), spares.starting)
            };
            if ready == 0 && starting == 0 {
                // The first run is over, or the first worker failed to start.
                let status = self.pool.status();
                if status.available > 0 || status.size == 0 {
                    break;
                }
            }
            if !first_ready && ready > 0 {
                first_ready = true;
                deadline = tokio::time::Instant::now() + FIRST_RUN_WITHIN;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                break;
            }
        }
        self.shared.warming.store(false, Ordering::Release);
        self.refill();
    }

    /// Start up to `limit` spares, within what [`EnvPool::refill`] allows.
    fn start_spares(&self, limit: usize) {
        if self.shared.closed.load(Ordering::Acquire) || !self.shared.keep_warm {
            return;
        }
        let mut short = 0;
        let permits = {
            let mut spares = self.shared.spares.lock();
            let live =
                self.pool.status().size + spares.ready.len() + spares.starting + spares.cleaning;
            let missing = self.shared.config.size.saturating_sub(live).min(limit);
            let permits: Vec<_> = (0..missing)
                .map_while(|_| self.shared.budget.try_acquire())
                .collect();
            spares.starting += permits.len();
            if permits.len() < missing {
                // The budget is short: session spares make room, and the
                // exit of each brings this refill back (see supervise).
                short = missing - permits.len();
            }
            permits
        };
        if short > 0 {
            self.shared.retire_session_spares(short);
        }
        for permit in permits {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let generation = shared.generation.load(Ordering::Acquire);
                let result = Worker::create(&shared.spec, Some(shared.exited_tx.clone())).await;
                shared.record(&result);
                let worker = result.map(|w| PooledWorker::new(w, generation, permit));
                let mut spares = shared.spares.lock();
                spares.starting -= 1;
                match worker {
                    Ok(worker)
                        if !shared.closed.load(Ordering::Acquire)
                            && generation == shared.generation.load(Ordering::Acquire) =>
                    {
                        spares.ready.push_back(worker);
                    }
                    Ok(worker) => {
                        tokio::spawn(worker.terminate(shared.spec.grace_period));
                    }
                    Err(_) => {}
                }
                drop(spares);
                shared.spares_changed.notify_waiters();
            });
        }
    }

    /// Retire every worker of the current generation: idle ones and spares
    /// now, busy ones when their run returns them. Runs in flight finish on
    /// the old workers; the next request gets a new one.
    pub fn replace(&self) {
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        // Idle workers are replaced now; busy ones count when they come back.
        for _ in 0..self.shared.retire_idle(usize::MAX) {
            self.shared.count_restart(RestartCause::Recycle);
        }
        self.shared.retire_session_spares(usize::MAX);
        self.refill();
    }

    /// A lazy pool unused for `idle` retires its idle workers. Returns how
    /// many were retired.
    pub fn shrink_if_idle(&self, idle: Duration) -> usize {
        if self.shared.keep_warm || self.shared.last_used.lock().elapsed() < idle {
            return 0;
        }
        let retired =
            self.shared.retire_idle(usize::MAX) + self.shared.retire_session_spares(usize::MAX);
        if retired > 0 {
            tracing::info!(
                python = %self.shared.spec.python.display(),
                workers = retired,
                "idle environment: workers stopped"
            );
        }
        retired
    }

    /// Whether this pool starts workers ahead of need.
    pub fn keeps_warm(&self) -> bool {
        self.shared.keep_warm
    }

    /// Whether the pool was closed (shutdown).
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Worker counts and the last start error.
    pub fn status(&self) -> PoolStatus {
        let s = self.pool.status();
        let spares = self.shared.spares.lock();
        let size = s.size + spares.ready.len() + spares.cleaning;
        PoolStatus {
            size,
            idle: s.available + spares.ready.len(),
            busy: s.size.saturating_sub(s.available),
            starting: spares.starting,
            cleaning: spares.cleaning,
            waiting: s.waiting,
            session_spares: self.shared.session_spares.lock().len(),
            error: if size == 0 {
                self.shared.last_error.lock().clone()
            } else {
                None
            },
        }
    }

    /// Workers replaced so far for `cause`.
    pub fn restarts(&self, cause: RestartCause) -> u64 {
        let i = RestartCause::ALL
            .iter()
            .position(|c| *c == cause)
            .unwrap_or(0);
        self.shared.restarts[i].load(Ordering::Relaxed)
    }

    /// Runs so far whose worker cleared what they left out of turn (their
    /// answer said `cleaning`).
    pub fn cleared_out_of_turn(&self) -> u64 {
        self.shared.cleared_out_of_turn.load(Ordering::Relaxed)
    }

    /// Python version reported by the workers' handshake (none before one).
    pub fn python_version(&self) -> Option<String> {
        self.shared.python_version.lock().clone()
    }

    /// Stop handing out workers and terminate the idle and spare ones; busy
    /// workers are terminated when their run returns them.
    pub async fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.closing.notify_waiters();
        let grace = self.shared.spec.grace_period;
        let mut workers: Vec<PooledWorker> = self.pool.retain(|_, _| false).removed;
        workers.extend(std::mem::take(&mut self.shared.spares.lock().ready));
        workers.extend(
            std::mem::take(&mut *self.shared.session_spares.lock())
                .into_iter()
                .map(|(worker, _)| worker),
        );
        self.pool.close();
        futures_util::future::join_all(workers.into_iter().map(|w| w.terminate(grace))).await;
    }
}

/// A request counted in `Spares::waiting` while it waits for a spare.
struct Waiting<'a>(&'a Mutex<Spares<PooledWorker>>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.lock().waiting -= 1;
    }
}

/// Remove workers that died while idle and top the pool back up.
async fn supervise(pool: EnvPool, mut exited: mpsc::UnboundedReceiver<u32>) {
    while let Some(pid) = exited.recv().await {
        if pool.shared.closed.load(Ordering::Acquire) {
            return;
        }
        let removed = pool.pool.retain(|w, _| w.pid() != pid).removed;
        if !removed.is_empty() {
            pool.shared.count_restart(RestartCause::Crash);
            tracing::warn!(worker_pid = pid, "idle worker died; replacing it");
        }
        pool.shared.spares.lock().ready.retain_mut(|w| w.is_alive());
        pool.shared
            .session_spares
            .lock()
            .retain_mut(|(w, _)| w.is_alive());
        drop(removed);
        pool.refill();
    }
}
