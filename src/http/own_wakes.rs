//! A connection's future polled again at once when it wakes itself.
//!
//! hyper serves a request body through a channel between the connection's
//! dispatcher and the handler, both polled by one task: the handler asking
//! for the body wakes the dispatcher, and the dispatcher sending it wakes
//! the handler. Each of those wakes lands while the task is being polled,
//! and tokio's multi-thread scheduler then queues the task as yielded and
//! wakes a parked worker thread to take it: two thread wake-ups per `POST`
//! that carry nothing (measured: 2.9 context switches per answered `POST`,
//! 1.0 per `GET /health`). [`OwnWakes`] keeps such wakes inside the poll:
//! a wake that comes while the inner future is polled makes it polled again
//! at once, and only a wake that comes between polls reaches the scheduler.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::Mutex;

/// Most polls in a row within one poll of the task: a future that keeps
/// waking itself is handed back to the scheduler after this many.
const MAX_POLLS: usize = 8;

/// Not being polled: a wake goes to the task's waker.
const IDLE: u8 = 0;
/// Being polled, not woken yet.
const POLLING: u8 = 1;
/// Woken while being polled: poll again before returning.
const WOKEN: u8 = 2;

/// `inner`, polled again at once when it wakes itself (see the module).
pub(crate) struct OwnWakes<F> {
    inner: Pin<Box<F>>,
    waker: Arc<Relay>,
}

impl<F: Future> OwnWakes<F> {
    pub(crate) fn new(inner: F) -> OwnWakes<F> {
        OwnWakes {
            inner: Box::pin(inner),
            waker: Arc::new(Relay {
                state: AtomicU8::new(IDLE),
                task: Mutex::new(Waker::noop().clone()),
            }),
        }
    }
}

/// The waker the inner future sees.
struct Relay {
    state: AtomicU8,
    /// The task's own waker, as of its last poll.
    task: Mutex<Waker>,
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
        {
            // The poll in progress sees it and polls again.
            Ok(_) | Err(WOKEN) => {}
            Err(_) => self.task.lock().wake_by_ref(),
        }
    }
}

impl<F: Future> Future for OwnWakes<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        {
            let mut task = this.waker.task.lock();
            if !task.will_wake(cx.waker()) {
                task.clone_from(cx.waker());
            }
        }
        let waker = Waker::from(this.waker.clone());
        let mut inner_cx = Context::from_waker(&waker);
        this.waker.state.store(POLLING, Ordering::Release);
        for _ in 0..MAX_POLLS {
            if let Poll::Ready(out) = this.inner.as_mut().poll(&mut inner_cx) {
                this.waker.state.store(IDLE, Ordering::Release);
                return Poll::Ready(out);
            }
            // Not woken meanwhile: whatever wakes it later goes to the task.
            if this
                .waker
                .state
                .compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Poll::Pending;
            }
            // Woken during the poll. With its cooperative budget spent, its
            // resources would only answer `Pending` again.
            if !tokio::task::coop::has_budget_remaining() {
                break;
            }
            this.waker.state.store(POLLING, Ordering::Release);
        }
        this.waker.state.store(IDLE, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Pending until polled `ready_at` times; wakes itself on the polls in
    /// `self_wakes`, and hands its waker out for a wake from outside.
    struct Script {
        polls: Arc<AtomicUsize>,
        ready_at: usize,
        self_wakes: usize,
        outside: Arc<Mutex<Option<Waker>>>,
    }

    impl Future for Script {
        type Output = usize;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            let n = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
            if n >= self.ready_at {
                return Poll::Ready(n);
            }
            if n <= self.self_wakes {
                cx.waker().wake_by_ref();
            }
            *self.outside.lock() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// Counts the wakes the task got.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A [`Script`] in [`OwnWakes`], polled by a task that counts its wakes.
    struct Setup {
        future: OwnWakes<Script>,
        polls: Arc<AtomicUsize>,
        outside: Arc<Mutex<Option<Waker>>>,
        task: Arc<Count>,
    }

    impl Setup {
        fn new(ready_at: usize, self_wakes: usize) -> Setup {
            let polls = Arc::new(AtomicUsize::new(0));
            let outside = Arc::new(Mutex::new(None));
            let future = OwnWakes::new(Script {
                polls: polls.clone(),
                ready_at,
                self_wakes,
                outside: outside.clone(),
            });
            let task = Arc::new(Count(AtomicUsize::new(0)));
            Setup {
                future,
                polls,
                outside,
                task,
            }
        }

        fn poll(&mut self) -> Poll<usize> {
            let waker = Waker::from(self.task.clone());
            Pin::new(&mut self.future).poll(&mut Context::from_waker(&waker))
        }

        fn polls(&self) -> usize {
            self.polls.load(Ordering::SeqCst)
        }

        fn wakes(&self) -> usize {
            self.task.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn wakes_during_a_poll_poll_again_without_waking_the_task() {
        let mut setup = Setup::new(3, 2);
        assert_eq!(setup.poll(), Poll::Ready(3));
        assert_eq!(setup.polls(), 3);
        assert_eq!(setup.wakes(), 0);
    }

    #[test]
    fn a_wake_between_polls_reaches_the_task() {
        let mut setup = Setup::new(2, 0);
        assert_eq!(setup.poll(), Poll::Pending);
        assert_eq!(setup.wakes(), 0);
        setup
            .outside
            .lock()
            .take()
            .expect("a waker handed out")
            .wake();
        assert_eq!(setup.wakes(), 1);
        assert_eq!(setup.poll(), Poll::Ready(2));
        assert_eq!(setup.polls(), 2);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_goes_back_to_the_scheduler() {
        let mut setup = Setup::new(usize::MAX, usize::MAX);
        assert_eq!(setup.poll(), Poll::Pending);
        assert_eq!(setup.polls(), MAX_POLLS);
        assert_eq!(setup.wakes(), 1, "the task is woken to be polled later");
    }
}
