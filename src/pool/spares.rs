//! Spares: started workers not yet handed to deadpool (and those resting
//! out of it while they clear what a run left), and the rotation that gives
//! each of them its turn.
//!
//! Generic over what a spare is ([`Spare`]), so the rotation is tested with
//! fake workers and no processes.

use std::collections::VecDeque;

/// What the rotation needs to know of a worker.
pub(crate) trait Spare {
    /// The pool generation it was started in (see `EnvPool::replace`).
    fn generation(&self) -> u64;
    /// Whether its process still runs.
    fn is_alive(&mut self) -> bool;
}

/// Ready spares, oldest first, and how many are starting.
#[derive(Debug)]
pub(crate) struct Spares<W> {
    /// Oldest first: the one that rested longest is handed out next.
    pub(crate) ready: VecDeque<W>,
    /// Spares being started now.
    pub(crate) starting: usize,
    /// Workers clearing what their last run left, out of deadpool until
    /// they are done (then ready spares).
    pub(crate) cleaning: usize,
    /// Requests waiting for one of the starting spares instead of starting
    /// a worker of their own.
    pub(crate) waiting: usize,
}

impl<W> Default for Spares<W> {
    fn default() -> Self {
        Spares {
            ready: VecDeque::new(),
            starting: 0,
            cleaning: 0,
            waiting: 0,
        }
    }
}

impl<W: Spare> Spares<W> {
    /// The spare that rested longest and belongs to `generation`, for a
    /// request that found no idle worker. Older spares met on the way are
    /// put in `stale`, for the caller to terminate.
    pub(crate) fn take(&mut self, generation: u64, stale: &mut Vec<W>) -> Option<W> {
        while let Some(spare) = self.ready.pop_front() {
            if spare.generation() == generation {
                return Some(spare);
            }
            stale.push(spare);
        }
        None
    }

    /// Hand out the spare that rested longest in place of `worker`, which
    /// rests as a spare in its turn (at the back). Spares of an older
    /// generation or whose process ended are put in `stale`. Without a usable
    /// spare, `worker` stays as it is.
    ///
    /// Without this a pool whose workers were replaced would run every
    /// request of a single client on one worker (deadpool reuses its idle
    /// objects and creates one only when none is idle), with its spares
    /// never used; that worker would then fork each run's process while the
    /// client waits instead of ahead of the request.
    pub(crate) fn take_turn_of(&mut self, worker: &mut W, generation: u64, stale: &mut Vec<W>) {
        while let Some(mut spare) = self.ready.pop_front() {
            if spare.generation() != generation || !spare.is_alive() {
                stale.push(spare);
                continue;
            }
            std::mem::swap(worker, &mut spare);
            self.ready.push_back(spare);
            return;
        }
    }

    /// Up to `n` ready spares, oldest first, out of the rotation.
    pub(crate) fn take_up_to(&mut self, n: usize) -> Vec<W> {
        let n = n.min(self.ready.len());
        self.ready.drain(..n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Fake {
        id: u32,
        generation: u64,
        alive: bool,
    }

    impl Spare for Fake {
        fn generation(&self) -> u64 {
            self.generation
        }
        fn is_alive(&mut self) -> bool {
            self.alive
        }
    }

    fn fake(id: u32) -> Fake {
        Fake {
            id,
            generation: 1,
            alive: true,
        }
    }

    fn spares(ids: &[u32]) -> Spares<Fake> {
        Spares {
            ready: ids.iter().map(|&id| fake(id)).collect(),
            starting: 0,
            cleaning: 0,
            waiting: 0,
        }
    }

    fn ids(spares: &Spares<Fake>) -> Vec<u32> {
        spares.ready.iter().map(|w| w.id).collect()
    }

    #[test]
    fn every_worker_takes_its_turn() {
        // One idle worker (0) and two spares: a client sending one request
        // at a time is served by 1, 2, 0, 1, 2, ... in turn.
        let mut spares = spares(&[1, 2]);
        let mut idle = fake(0);
        let mut served = Vec::new();
        let mut stale = Vec::new();
        for _ in 0..6 {
            spares.take_turn_of(&mut idle, 1, &mut stale);
            served.push(idle.id);
        }
        assert_eq!(served, [1, 2, 0, 1, 2, 0]);
        assert!(stale.is_empty());
        assert_eq!(ids(&spares).len(), 2);
    }

    #[test]
    fn without_spares_the_idle_worker_serves() {
        let mut spares = spares(&[]);
        let mut idle = fake(7);
        let mut stale = Vec::new();
        spares.take_turn_of(&mut idle, 1, &mut stale);
        assert_eq!(idle.id, 7);
    }

    #[test]
    fn stale_and_dead_spares_are_set_aside_not_served() {
        let mut spares = spares(&[1, 2, 3]);
        spares.ready[0].generation = 0; // from before a replace
        spares.ready[1].alive = false; // killed from outside
        let mut idle = fake(0);
        let mut stale = Vec::new();
        spares.take_turn_of(&mut idle, 1, &mut stale);
        assert_eq!(idle.id, 3);
        assert_eq!(stale.iter().map(|w| w.id).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(ids(&spares), [0]);
    }

    #[test]
    fn a_new_worker_is_the_oldest_spare_of_the_generation() {
        let mut spares = spares(&[1, 2, 3]);
        spares.ready[0].generation = 0;
        let mut stale = Vec::new();
        assert_eq!(spares.take(1, &mut stale).map(|w| w.id), Some(2));
        assert_eq!(stale.len(), 1);
        assert_eq!(ids(&spares), [3]);
        assert_eq!(spares.take_up_to(5).len(), 1);
        assert_eq!(spares.take(1, &mut stale), None);
    }
}
