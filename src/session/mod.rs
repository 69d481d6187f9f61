//! Stateful sessions: a persistent Python namespace per session, kept by a
//! dedicated process, with an idle TTL, caps, interrupts and limits.
//!
//! A session is started by taking a worker kept from a closed session, or
//! else a warm worker out of its environment's pool (the pool refills
//! itself), and switching it into session mode with a
//! `session` frame: the worker's zygote forks one long-lived session child,
//! with the same limits and setup as a clean run's child, that keeps one `__main__`
//! and one working directory for every call (see `python/worker.py`,
//! "Sessions"). Calls to a session are ordinary `exec` frames on that
//! worker, serialized in arrival order.
//!
//! * [`registry`]: the live sessions, their caps, the TTL reaper, closing
//!   and shutdown, and the record of sessions that ended (for clear 404s).
//! * [`live`]: one live session: its worker, serialized calls, expiry.
//! * [`clock`]: RFC 3339 timestamps for the API.

pub(crate) mod clock;
mod live;
mod registry;

use std::time::Duration;

pub(crate) use live::ActiveCall;
pub(crate) use registry::Sessions;

/// Lifetimes and caps of sessions.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Idle time after which a session ends, when its creator names none.
    pub ttl: Duration,
    /// Longest idle TTL a session may ask for.
    pub max_ttl: Duration,
    /// Live sessions across all environments.
    pub max_sessions: usize,
    /// Live sessions in one environment.
    pub max_sessions_per_env: usize,
    /// How long a timed-out call may take to stop after its interrupt
    /// before the session process is killed (and the session lost).
    pub interrupt_grace: Duration,
    /// How long a closed session's worker, cleared, is kept for the next
    /// session of its environment (zero: it is ended at once).
    pub keep_worker: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            ttl: Duration::from_secs(600),
            max_ttl: Duration::from_secs(24 * 3600),
            max_sessions: 16,
            max_sessions_per_env: 8,
            interrupt_grace: Duration::from_secs(2),
            keep_worker: Duration::from_secs(60),
        }
    }
}
