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
//!   module's, which sleeps SQLite's own schedule of delays, up to the store's
//!   busy timeout, inside [`may_block`];
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
use std::time::Duration;

/// The inline call running on this thread: its store's busy timeout, and
/// where its hand-offs are counted.
struct Running {
    timeout: Duration,
    handoffs: Arc<AtomicU64>,
}

thread_local! {
    static RUNNING: RefCell<Option<Running>> = const { RefCell::new(None) };
    /// Set while a `may_block` runs on this thread (one inside it hands
    /// nothing off: the first already did).
    static BLOCKING: Cell<bool> = const { Cell::new(false) };
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

/// SQLite's busy handler for an inline call: SQLite's own schedule of sleeps
/// (`sqliteDefaultBusyCallback`: 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50,
/// then 100 ms) up to the busy timeout of the call's store, each sleep inside
/// [`may_block`]. `count` is how many times it ran for this lock before.
fn busy_wait(count: i32) -> bool {
    const DELAYS: [u64; 12] = [1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100];
    const TOTALS: [u64; 12] = [0, 1, 3, 8, 18, 33, 53, 78, 103, 128, 178, 228];
    let timeout = RUNNING.with(|r| r.borrow().as_ref().map(|r| r.timeout));
    let timeout = u64::try_from(timeout.unwrap_or_default().as_millis()).unwrap_or(u64::MAX);
    let count = usize::try_from(count).unwrap_or(0);
    let (mut delay, prior) = match DELAYS.get(count) {
        Some(&d) => (d, TOTALS[count]),
        None => (100, 228u64.saturating_add(100 * (count as u64 - 11))),
    };
    if prior.saturating_add(delay) > timeout {
        if timeout <= prior {
            return false;
        }
        delay = timeout - prior;
    }
    may_block(|| std::thread::sleep(Duration::from_millis(delay)));
    true
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
    ) -> Result<Option<Self>> {
        let Some(raw) = conn.as_sqlite() else {
            return Ok(None);
        };
        raw.busy_handler(Some(busy_wait))?;
        let outer = RUNNING.with(|r| r.replace(Some(Running { timeout, handoffs })));
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

    /// The schedule of sleeps is SQLite's, cut at the timeout: a wait gives
    /// up once the sleeps so far reach it.
    #[test]
    fn the_busy_wait_sleeps_up_to_the_timeout_and_then_gives_up() {
        let running = Running {
            timeout: Duration::from_millis(4),
            handoffs: Arc::default(),
        };
        RUNNING.with(|r| *r.borrow_mut() = Some(running));
        let t0 = std::time::Instant::now();
        let mut count = 0;
        while busy_wait(count) {
            count += 1;
        }
        let took = t0.elapsed();
        RUNNING.with(|r| *r.borrow_mut() = None);
        // 1 + 2 ms, then 1 ms (cut from 5 to what is left of 4), then none.
        assert_eq!(count, 3);
        assert!(took >= Duration::from_millis(4), "{took:?}");
        // No timeout set: no wait at all.
        assert!(!busy_wait(0));
    }

    #[test]
    fn may_block_outside_a_runtime_just_runs() {
        assert!(!on_multi_thread_runtime());
        assert_eq!(may_block(|| may_block(|| 7)), 7);
    }
}
