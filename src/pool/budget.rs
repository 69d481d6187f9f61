//! The server-wide cap on live workers, shared by every environment's pool.
//!
//! Each worker holds one permit of a semaphore from its start until its
//! process is gone. A pool that needs a worker while the cap is reached asks
//! the budget to retire a worker kept from a closed session (of any pool),
//! else an idle worker of the least recently used *other* pool, then waits
//! (bounded) for the permit that frees.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Shared;
use crate::error::WorkerError;
use crate::worker::Worker;

/// How often a waiting request re-checks for a permit (and may evict again).
const POLL: Duration = Duration::from_millis(100);

/// Minimum time between two evictions for the same waiting request: gives
/// the retired worker time to exit and hand its permit back.
const EVICT_INTERVAL: Duration = Duration::from_secs(1);

/// The cap on live workers across all pools.
pub struct WorkerBudget {
    /// One permit per live worker.
    permits: Arc<Semaphore>,
    max: usize,
    /// Requests waiting for a permit: background refills stand back while
    /// there are any, so that freed permits go to requests.
    waiting: AtomicUsize,
    /// Pools that can give back idle workers.
    members: Mutex<Vec<Weak<Shared>>>,
}

impl WorkerBudget {
    pub fn new(max: usize) -> Arc<WorkerBudget> {
        Arc::new(WorkerBudget {
            permits: Arc::new(Semaphore::new(max)),
            max,
            waiting: AtomicUsize::new(0),
            members: Mutex::new(Vec::new()),
        })
    }

    /// Workers alive (or starting) now.
    pub fn live(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// Permits free now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub(super) fn register(&self, pool: &Arc<Shared>) {
        let mut members = self.members.lock();
        members.retain(|m| m.strong_count() > 0);
        members.push(Arc::downgrade(pool));
    }

    /// A permit if one is free and no request is waiting for one.
    pub(super) fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        if self.waiting.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.permits.clone().try_acquire_owned().ok()
    }

    /// A permit for a worker of `requester`: at once if the cap allows,
    /// else after retiring a worker kept for sessions or an idle worker of
    /// the least recently used other pool (see [`WorkerBudget::evict_lru`]);
    /// gives up after `wait`.
    pub(super) async fn acquire(
        &self,
        requester: &Arc<Shared>,
        wait: Duration,
    ) -> Result<OwnedSemaphorePermit, WorkerError> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(permit);
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = WaitingGuard(&self.waiting);
        let deadline = Instant::now() + wait;
        let mut last_eviction: Option<Instant> = None;
        loop {
            if let Ok(permit) = self.permits.clone().try_acquire_owned() {
                return Ok(permit);
            }
            if last_eviction.is_none_or(|t| t.elapsed() >= EVICT_INTERVAL)
                && self.evict_lru(requester)
            {
                last_eviction = Some(Instant::now());
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(WorkerError::AtCapacity(self.max));
            }
            if let Ok(Ok(permit)) =
                tokio::time::timeout(remaining.min(POLL), self.permits.clone().acquire_owned())
                    .await
            {
                return Ok(permit);
            }
        }
    }

    /// Retire one worker kept for sessions (of any pool, `requester`'s
    /// first), else one idle worker of the least recently used pool other
    /// than `requester`. Returns whether one was found.
    fn evict_lru(&self, requester: &Arc<Shared>) -> bool {
        let mut pools: Vec<(Instant, Arc<Shared>)> = self
            .members
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|p| !Arc::ptr_eq(p, requester))
            .map(|p| {
                let used = *p.last_used.lock();
                (used, p)
            })
            .collect();
        // A session spare first, of any pool: it serves no request now,
        // and its loss costs only the start of the next session's worker.
        if std::iter::once(requester)
            .chain(pools.iter().map(|(_, p)| p))
            .any(|p| p.retire_session_spares(1) == 1)
        {
            tracing::info!(
                max_workers = self.max,
                "worker cap reached: retired a worker kept for sessions"
            );
            return true;
        }
        pools.sort_by_key(|(used, _)| *used);
        for (_, pool) in pools {
            if pool.retire_idle(1) == 1 {
                tracing::info!(
                    python = %pool.spec.python.display(),
                    max_workers = self.max,
                    "worker cap reached: retired an idle worker of the least recently used environment"
                );
                return true;
            }
        }
        false
    }
}

struct WaitingGuard<'a>(&'a AtomicUsize);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A worker in a pool: the process, the pool generation it belongs to and
/// its permit of the worker budget, held until the process is gone.
pub struct PooledWorker {
    worker: Worker,
    /// The pool generation the worker was started in (see `EnvPool::replace`).
    pub(super) generation: u64,
    /// Released when the worker is dropped or terminated.
    _permit: OwnedSemaphorePermit,
}

impl PooledWorker {
    pub(super) fn new(worker: Worker, generation: u64, permit: OwnedSemaphorePermit) -> Self {
        PooledWorker {
            worker,
            generation,
            _permit: permit,
        }
    }

    /// The ordered termination path of [`Worker::terminate`]; the permit is
    /// given back once the process is reaped.
    pub async fn terminate(self, grace: Duration) {
        let PooledWorker {
            worker, _permit, ..
        } = self;
        worker.terminate(grace).await;
        drop(_permit);
    }
}

impl Deref for PooledWorker {
    type Target = Worker;
    fn deref(&self) -> &Worker {
        &self.worker
    }
}

impl DerefMut for PooledWorker {
    fn deref_mut(&mut self) -> &mut Worker {
        &mut self.worker
    }
}

impl std::fmt::Debug for PooledWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.worker.fmt(f)
    }
}

impl super::Spare for PooledWorker {
    fn generation(&self) -> u64 {
        self.generation
    }

    fn is_alive(&mut self) -> bool {
        self.worker.is_alive()
    }
}
