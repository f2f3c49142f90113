//! Time, as a store reads it: the one seam through which the engine learns
//! what time it is and waits for time to pass. Leases (their expiry and
//! their renewals), turn and compaction timestamps, idle sessions and
//! `verify`'s stalled turns all read the store's [`Clock`]. The
//! [`SystemClock`] is the default; a [`ManualClock`] moves only when told,
//! so a test of expiry advances it instead of sleeping.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// What time it is, and a way to wait for time to pass.
pub trait Clock: Send + Sync + Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// Completes once `d` has passed on this clock.
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
}

/// The wall clock, and tokio's timers for waiting.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        system_now_ms()
    }

    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// Milliseconds since the Unix epoch, by the system's clock (0 before it).
pub fn system_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis().min(i64::MAX as u128) as i64)
        .unwrap_or(0)
}

/// A clock that moves only when told ([`ManualClock::advance`],
/// [`ManualClock::set`]): a sleep on it completes when the clock has been
/// moved past its end. For tests of leases, expiry and idleness that must
/// not wait for real time. Clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<tokio::sync::watch::Sender<i64>>,
    begun: Arc<std::sync::atomic::AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `ms` (milliseconds since the epoch).
    pub fn starting_at(ms: i64) -> ManualClock {
        ManualClock {
            now: Arc::new(tokio::sync::watch::Sender::new(ms)),
            begun: Arc::default(),
        }
    }

    /// A clock standing at the system's time now.
    pub fn now() -> ManualClock {
        ManualClock::starting_at(system_now_ms())
    }

    /// Moves the clock forward by `d`, waking every sleep that ends by then.
    pub fn advance(&self, d: Duration) {
        let d = d.as_millis().min(i64::MAX as u128) as i64;
        self.now.send_modify(|t| *t = t.saturating_add(d));
    }

    /// Sets the clock to `ms` (it may go back: a test of a clock step).
    pub fn set(&self, ms: i64) {
        self.now.send_replace(ms);
    }

    /// Sleeps not yet ended, waiting on this clock.
    pub fn sleepers(&self) -> usize {
        self.now.receiver_count()
    }

    /// Sleeps begun on this clock so far: a test that moves the clock waits
    /// for this to grow to know a task woken by the move has done its work
    /// and gone back to sleep.
    pub fn sleeps_begun(&self) -> u64 {
        self.begun.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        *self.now.borrow()
    }

    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let end = self
            .now_ms()
            .saturating_add(d.as_millis().min(i64::MAX as u128) as i64);
        let mut rx = self.now.subscribe();
        self.begun.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            // The sender lives as long as any clone of the clock: once all
            // are gone, time stands still and the sleep never ends.
            while *rx.borrow_and_update() < end {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

/// The clock a store reads when none is given.
pub(crate) fn default_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_sleep_ends_when_the_clock_is_moved_past_it_and_not_before() {
        let clock = ManualClock::starting_at(1_000);
        let sleep = clock.sleep(Duration::from_millis(50));
        let task = tokio::spawn(sleep);
        tokio::task::yield_now().await;
        clock.advance(Duration::from_millis(49));
        tokio::task::yield_now().await;
        assert!(!task.is_finished(), "ended 1 ms early");
        clock.advance(Duration::from_millis(1));
        task.await.unwrap();
        assert_eq!(clock.now_ms(), 1_050);
        assert_eq!(clock.sleepers(), 0);
    }

    #[test]
    fn the_system_clock_reads_the_wall_clock() {
        let a = system_now_ms();
        let b = SystemClock.now_ms();
        assert!(b >= a && b - a < 60_000);
    }
}
