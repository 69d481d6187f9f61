//! A client's quotas: runs in flight (a counter and its guard) and the
//! token bucket behind `rate_per_minute`. Both are plain atomics or a
//! short `parking_lot` lock: never held across an await.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use crate::metrics::ClientMetrics;

/// A client's counters, kept by name across reloads of the clients file.
pub(crate) struct ClientState {
    /// Runs in flight now.
    in_flight: Arc<AtomicUsize>,
    /// The rate bucket; locked only to take a token.
    pub(super) bucket: Mutex<Bucket>,
    /// The client's metrics handles (label resolved once).
    pub(crate) metrics: ClientMetrics,
}

impl ClientState {
    pub(super) fn new(metrics: ClientMetrics) -> ClientState {
        ClientState {
            in_flight: Arc::new(AtomicUsize::new(0)),
            bucket: Mutex::new(Bucket::default()),
            metrics,
        }
    }

    /// A slot under `max`, if one is free.
    pub(super) fn enter(&self, max: usize) -> Option<InFlight> {
        let mut now = self.in_flight.load(Ordering::Relaxed);
        loop {
            if now >= max {
                return None;
            }
            match self.in_flight.compare_exchange_weak(
                now,
                now + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(InFlight {
                        count: self.in_flight.clone(),
                    });
                }
                Err(seen) => now = seen,
            }
        }
    }
}

/// One run in flight of a client; the slot is given back when dropped.
#[derive(Debug)]
pub struct InFlight {
    count: Arc<AtomicUsize>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A token bucket: `burst` tokens at most, refilled at `per_sec`.
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    /// Tokens left at `at`; `None` until first used (starts full).
    tokens: Option<f64>,
    at: Option<Instant>,
}

impl Bucket {
    /// Take a token, or the whole seconds until one is there.
    pub(super) fn take(&mut self, per_sec: f64, burst: f64) -> Result<(), u64> {
        let now = Instant::now();
        let elapsed = self
            .at
            .map_or(0.0, |at| now.duration_since(at).as_secs_f64());
        let tokens = (self.tokens.unwrap_or(burst) + elapsed * per_sec).min(burst);
        self.at = Some(now);
        if tokens >= 1.0 {
            self.tokens = Some(tokens - 1.0);
            Ok(())
        } else {
            self.tokens = Some(tokens);
            Err((((1.0 - tokens) / per_sec).ceil() as u64).max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_gives_its_burst_then_waits() {
        let mut b = Bucket::default();
        assert!(b.take(1.0, 2.0).is_ok());
        assert!(b.take(1.0, 2.0).is_ok());
        assert_eq!(b.take(1.0, 2.0), Err(1));
        let mut slow = Bucket::default();
        assert!(slow.take(1.0 / 60.0, 1.0).is_ok());
        let wait = slow.take(1.0 / 60.0, 1.0).unwrap_err();
        assert!((59..=60).contains(&wait), "{wait}");
    }
}
