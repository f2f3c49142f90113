//! Store calls run on the calling worker thread itself, with no hand-off.
//!
//! [`Blocking::InPlace`](crate::store::Blocking::InPlace) used to wrap every store
//! call in tokio's `block_in_place`, which hands the worker's core (its queue
//! of tasks) to another thread before the call and takes it back after: two
//! thread wake-ups a call, more than the SQL of a short step costs. A step's
//! own calls ([`Store::call_inline`](crate::store::Store::call_inline)) now run on
//! the worker as they are, and hand the core off only at the two things in
//! them that can take long:
//!
//! - a wait on another writer's lock: the connection's busy handler is this
//!   module's, which waits in short steps (the longer ones inside
//!   [`may_block`]), up to the store's busy timeout;
//! - work that grows with a session's history (a context built in full, the
//!   facts of a long turn extracted), which its code wraps in [`may_block`].
//!
//! Everything else in such a call is a few indexed statements and the bytes of
//! one step: tens to hundreds of microseconds, less than the hand-off.

use crate::error::Result;
use crate::store::pool::Checkout;
use crate::store::Connection;
use std::cell::{Cell, RefCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The inline call running on this thread: its store's busy timeout, and
/// where its hand-offs are counted.
struct Running {
    timeout: Duration,
    handoffs: Arc<AtomicU64>,
    /// Microseconds its busy handler slept, added to the store's count.
    slept: Arc<AtomicU64>,
}

thread_local! {
    static RUNNING: RefCell<Option<Running>> = const { RefCell::new(None) };
    /// Set while a `may_block` runs on this thread (one inside it hands
    /// nothing off: the first already did).
    static BLOCKING: Cell<bool> = const { Cell::new(false) };
    /// When the busy handler's current wait for a lock began.
    static WAIT_STARTED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// True on a thread of a multi-thread tokio runtime (a worker, its
/// `block_on` thread or its blocking pool), where `block_in_place` is allowed.
pub(crate) fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Runs `f`, a part of a store call that may take long. On a worker thread
/// of a multi-thread runtime the worker's other tasks are handed to the
/// runtime first (`block_in_place`), so they go on while `f` runs; anywhere
/// else (a blocking-pool thread, a call already handed off, outside a
/// runtime) `f` just runs.
pub(crate) fn may_block<R>(f: impl FnOnce() -> R) -> R {
    if BLOCKING.with(|b| b.get()) || !on_multi_thread_runtime() {
        return f();
    }
    RUNNING.with(|r| {
        if let Some(r) = r.borrow().as_ref() {
            r.handoffs.fetch_add(1, Ordering::Relaxed);
        }
    });
    /// Clears `BLOCKING` however `f` ends.
    struct Unset;
    impl Drop for Unset {
        fn drop(&mut self) {
            BLOCKING.with(|b| b.set(false));
        }
    }
    BLOCKING.with(|b| b.set(true));
    let _unset = Unset;
    tokio::task::block_in_place(f)
}

/// SQLite's busy handler for an inline call, in short steps: a lock held by
/// another process's writer is held for one short transaction (tens to
/// hundreds of microseconds), so the first waits are short: 20 of 100 µs,
/// then 20 of 250 µs, on the worker itself (shorter than handing its other
/// tasks off would cost); past those (about 7 ms), 1 ms waits inside
/// [`may_block`]. SQLite's own schedule (1, 2, 5, ... 100 ms) slept far past
/// the moment the lock was free, and processes on one file spent seconds a
/// run asleep. Ends when the waits so far reach the store's busy timeout.
/// `count` is how many times it ran for this lock before.
fn busy_wait(count: i32) -> bool {
    let Some(timeout) = RUNNING.with(|r| r.borrow().as_ref().map(|r| r.timeout)) else {
        return false;
    };
    let now = Instant::now();
    if count == 0 {
        WAIT_STARTED.with(|w| w.set(Some(now)));
    }
    let started = WAIT_STARTED.with(|w| w.get()).unwrap_or(now);
    let waited = now.saturating_duration_since(started);
    if waited >= timeout {
        return false;
    }
    let step = match count {
        0..20 => Duration::from_micros(100),
        20..40 => Duration::from_micros(250),
        _ => Duration::from_millis(1),
    };
    let step = step.min(timeout - waited);
    if step < Duration::from_millis(1) {
        std::thread::sleep(step);
    } else {
        may_block(|| std::thread::sleep(step));
    }
    let slept = now.elapsed();
    RUNNING.with(|r| {
        if let Some(r) = r.borrow().as_ref() {
            r.slept
                .fetch_add(slept.as_micros() as u64, Ordering::Relaxed);
        }
    });
    true
}

/// Gives `raw`, a connection this thread borrows for a while (the group
/// commit's writer), the busy handler of the call running here: an inline
/// call's short steps ([`busy_wait`]), or anywhere else SQLite's own up to
/// `timeout`.
pub(crate) fn callers_busy_handler(
    raw: &rusqlite::Connection,
    timeout: Duration,
) -> rusqlite::Result<()> {
    if RUNNING.with(|r| r.borrow().is_some()) {
        raw.busy_handler(Some(busy_wait))
    } else {
        raw.busy_timeout(timeout)
    }
}

/// A pooled connection an inline call runs on. While it is alive the
/// connection waits for a lock with [`busy_wait`] and the store's `timeout`,
/// and [`may_block`] counts its hand-offs in the store's `handoffs`. Dropped
/// (however the call ends, a panic included), the connection has its usual
/// busy handler back before it returns to the pool.
pub(crate) struct Inline {
    conn: Checkout,
    timeout: Duration,
    outer: Option<Running>,
}

impl Inline {
    /// None when `conn` is not an SQLite connection.
    pub(crate) fn enter(
        conn: Checkout,
        timeout: Duration,
        handoffs: Arc<AtomicU64>,
        slept: Arc<AtomicU64>,
    ) -> Result<Option<Self>> {
        let Some(raw) = conn.as_sqlite() else {
            return Ok(None);
        };
        raw.busy_handler(Some(busy_wait))?;
        let outer = RUNNING.with(|r| {
            r.replace(Some(Running {
                timeout,
                handoffs,
                slept,
            }))
        });
        Ok(Some(Inline {
            conn,
            timeout,
            outer,
        }))
    }
}

impl Deref for Inline {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl DerefMut for Inline {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        let outer = self.outer.take();
        RUNNING.with(|r| *r.borrow_mut() = outer);
        if let Some(raw) = self.conn.as_sqlite() {
            let _ = raw.busy_timeout(self.timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The waits are short steps, and end once they reach the timeout.
    #[test]
    fn the_busy_wait_sleeps_in_short_steps_up_to_the_timeout_and_then_gives_up() {
        let slept = Arc::new(AtomicU64::new(0));
        let running = Running {
            timeout: Duration::from_millis(12),
            handoffs: Arc::default(),
            slept: slept.clone(),
        };
        RUNNING.with(|r| *r.borrow_mut() = Some(running));
        let t0 = Instant::now();
        let mut count = 0;
        while busy_wait(count) {
            count += 1;
        }
        let took = t0.elapsed();
        RUNNING.with(|r| *r.borrow_mut() = None);
        // At least the 20 waits of 100 µs before the timeout ends them, and
        // never a wait much past it.
        assert!(count > 20, "{count} waits");
        assert!(took >= Duration::from_millis(12), "{took:?}");
        assert!(took < Duration::from_millis(500), "{took:?}");
        let slept = Duration::from_micros(slept.load(Ordering::Relaxed));
        assert!(
            slept >= Duration::from_millis(10) && slept <= took,
            "{slept:?} of {took:?}"
        );
        // No timeout set: no wait at all.
        assert!(!busy_wait(0));
    }

    #[test]
    fn may_block_outside_a_runtime_just_runs() {
        assert!(!on_multi_thread_runtime());
        assert_eq!(may_block(|| may_block(|| 7)), 7);
    }
}
