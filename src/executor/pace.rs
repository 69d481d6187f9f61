//! Whether a run comes after a pause: no other run in flight on this server
//! when it came, and none for at least [`PAUSE`] before. Its worker then has
//! the next child warm up at once, in what is likely its client's next
//! pause, when a CPU is free; a run that came back to back tells it to wait
//! (see `WARM_AFTER_MS` in `python/worker.py`), since there the warm-up would
//! take CPU from the runs in flight.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The shortest gap between runs that counts as a pause. A child's warm-up
/// costs ~0.3–0.5 ms of CPU. A client sending its runs back to back leaves
/// gaps the server sees as ~0.1 ms (a Rust client) to 0.5–1 ms (Python's
/// `http.client`, which reads an answer and sends the next request slowly):
/// at 1 ms, a fifth of the latter's runs count as paused, and all of a
/// client's that pauses 1 ms or more.
pub(crate) const PAUSE: Duration = Duration::from_millis(1);

/// Runs in flight and when the last one ended.
pub(crate) struct Pace {
    origin: Instant,
    in_flight: AtomicUsize,
    /// Nanoseconds from `origin` to when the count last fell to zero.
    idle_since: AtomicU64,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace {
            origin: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
        }
    }
}

impl Pace {
    /// A run starts: what ends it in the count when dropped (however the
    /// run ends, a dropped future too), and whether it came after a pause.
    pub(crate) fn begin(&self) -> (Running<'_>, bool) {
        let paused = self.begin_at(self.origin.elapsed());
        (Running(self), paused)
    }

    /// A run starts at `now` (from `origin`): whether it came after a pause.
    fn begin_at(&self, now: Duration) -> bool {
        let before = self.in_flight.fetch_add(1, Ordering::SeqCst);
        before == 0 && {
            let idle = Duration::from_nanos(self.idle_since.load(Ordering::SeqCst));
            now.saturating_sub(idle) >= PAUSE
        }
    }

    /// A run ended at `now`.
    fn end_at(&self, now: Duration) {
        // Written before the count falls, so that a run that finds none in
        // flight reads when the last one ended.
        self.idle_since
            .fetch_max(now.as_nanos() as u64, Ordering::SeqCst);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A run counted in flight by [`Pace::begin`].
pub(crate) struct Running<'a>(&'a Pace);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.end_at(self.0.origin.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1e3)
    }

    #[test]
    fn a_run_after_a_gap_with_none_in_flight_came_after_a_pause() {
        let pace = Pace::default();
        assert!(pace.begin_at(ms(10.0)), "the first run, after a gap");
        assert!(!pace.begin_at(ms(10.1)), "another while it is in flight");
        pace.end_at(ms(11.0));
        assert!(
            !pace.begin_at(ms(20.0)),
            "one of two has ended: one is still in flight"
        );
        pace.end_at(ms(20.5));
        pace.end_at(ms(21.0));
        assert!(!pace.begin_at(ms(21.1)), "back to back: 0.1 ms after");
        pace.end_at(ms(22.0));
        assert!(!pace.begin_at(ms(22.0) + PAUSE - ms(0.01)));
        pace.end_at(ms(23.0));
        assert!(pace.begin_at(ms(23.0) + PAUSE), "a gap of the pause");
        pace.end_at(ms(24.0));
    }

    #[test]
    fn a_dropped_run_leaves_the_count() {
        let pace = Pace::default();
        let (run, _) = pace.begin();
        assert_eq!(pace.in_flight.load(Ordering::SeqCst), 1);
        drop(run);
        assert_eq!(pace.in_flight.load(Ordering::SeqCst), 0);
        assert!(pace.idle_since.load(Ordering::SeqCst) > 0);
    }
}
