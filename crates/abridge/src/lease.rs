//! The heartbeat: keeps a lease (a turn's or a compaction row's) while its
//! holder works. A runner's turns share one renewal task, and its
//! compactor's claims another ([`Renewals`]): a turn or a summary starts and
//! ends none.

use crate::store::Connection;
use crate::store::Store;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::debug;

/// What renews one lease: `Ok(false)` when it was lost.
type Renew = Arc<dyn Fn(&mut Connection) -> crate::error::Result<bool> + Send + Sync>;

/// The leases of a runner's running turns (or of its compactor's claims),
/// all renewed by one task: a holder registers its lease as it starts and
/// drops it as it ends, a lock taken and released
/// with no task spawned, aborted or woken. The task checks every `period / 2`
/// and renews each lease `period` after its last renewal (or its start), so
/// a lease is renewed every `period` to `1.5 × period`; it stops renewing a
/// lease reported lost, renews nothing once the store's file is gone, and
/// ends once its runner is dropped. Its time is the store's clock
/// ([`crate::Clock`]): with a manual one, renewals happen as it is moved.
pub(crate) struct Renewals {
    inner: Arc<RenewalsInner>,
}

struct RenewalsInner {
    store: Store,
    period: Duration,
    leases: Mutex<Leases>,
}

#[derive(Default)]
struct Leases {
    next: u64,
    /// Each lease's renewal, and when it is due (ms, by the store's clock).
    kept: HashMap<u64, (Renew, i64)>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// A lease kept by [`Renewals`] while this is alive: dropped (whatever ends
/// the turn, a dropped future included), the lease is renewed no more.
pub(crate) struct Kept {
    inner: Arc<RenewalsInner>,
    id: u64,
}

impl Drop for Kept {
    fn drop(&mut self) {
        if lock(&self.inner.leases).kept.remove(&self.id).is_some() {
            self.inner.store.lease_kept(-1);
        }
    }
}

fn lock(m: &Mutex<Leases>) -> std::sync::MutexGuard<'_, Leases> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Renewals {
    /// Renewals for leases of `ttl` on `store`: every `ttl / 3`.
    pub(crate) fn new(store: &Store, ttl: Duration) -> Renewals {
        Renewals {
            inner: Arc::new(RenewalsInner {
                store: store.clone(),
                period: ttl / 3,
                leases: Mutex::default(),
            }),
        }
    }

    /// Keeps a lease, renewed with `renew`, until the returned guard is
    /// dropped. Starts the runner's renewal task on the current runtime if it
    /// is not running (the first lease, or the runtime it ran on is gone).
    pub(crate) fn keep<F>(&self, renew: F) -> Kept
    where
        F: Fn(&mut Connection) -> crate::error::Result<bool> + Send + Sync + 'static,
    {
        let mut leases = lock(&self.inner.leases);
        let id = leases.next;
        leases.next += 1;
        let due = self.inner.store.now_ms() + ms(self.inner.period);
        leases.kept.insert(id, (Arc::new(renew), due));
        self.inner.store.lease_kept(1);
        if leases.task.as_ref().is_none_or(|t| t.is_finished()) {
            leases.task = Some(tokio::spawn(renew_all(Arc::downgrade(&self.inner))));
        }
        Kept {
            inner: self.inner.clone(),
            id,
        }
    }
}

impl Drop for Renewals {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.inner.leases).task.take() {
            task.abort();
        }
    }
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// The leases kept now (a test's look at what the renewal task would renew).
#[cfg(test)]
impl Renewals {
    pub(crate) fn kept(&self) -> usize {
        lock(&self.inner.leases).kept.len()
    }
}

/// The renewal task of a [`Renewals`]: holds it only while it renews. It
/// wakes every half period of the store's clock.
async fn renew_all(renewals: std::sync::Weak<RenewalsInner>) {
    let Some((period, clock)) = renewals
        .upgrade()
        .map(|r| (r.period, r.store.clock().clone()))
    else {
        return;
    };
    let tick = (period / 2).max(Duration::from_millis(1));
    loop {
        clock.sleep(tick).await;
        let Some(r) = renewals.upgrade() else {
            return; // the runner is gone
        };
        let now = clock.now_ms();
        let due: Vec<(u64, Renew)> = lock(&r.leases)
            .kept
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(id, (renew, _))| (*id, renew.clone()))
            .collect();
        if due.is_empty() || r.store.check_file().is_err() {
            continue; // once gone, every later store call fails with StoreFileGone
        }
        for (id, renew) in due {
            if !lock(&r.leases).kept.contains_key(&id) {
                continue; // dropped since
            }
            let renewed = r.store.call(move |c| renew(c)).await;
            let mut leases = lock(&r.leases);
            match renewed {
                Ok(true) => {
                    if let Some((_, at)) = leases.kept.get_mut(&id) {
                        *at = clock.now_ms() + ms(r.period);
                    }
                }
                Ok(false) => {
                    if leases.kept.remove(&id).is_some() {
                        r.store.lease_kept(-1);
                    }
                }
                Err(e) => debug!(error = %e, "lease renewal failed; retrying"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counter(
        n: &Arc<AtomicUsize>,
        keep: bool,
    ) -> impl Fn(&mut Connection) -> crate::error::Result<bool> {
        let n = n.clone();
        move |_| {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(keep)
        }
    }

    /// Waits (in real time, for a condition, never for time to pass) until
    /// `f` holds.
    async fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            tokio::task::yield_now().await;
            std::thread::yield_now();
        }
    }

    /// Moves the clock by `step`, `n` times, each time waiting for the
    /// renewal task to have done what was due and gone back to sleep.
    async fn advance(clock: &crate::ManualClock, step: Duration, n: usize) {
        for _ in 0..n {
            let before = clock.sleeps_begun();
            clock.advance(step);
            until("the renewal task sleeps again", || {
                clock.sleeps_begun() > before
            })
            .await;
        }
    }

    /// One task renews every kept lease, once a period of the store's clock
    /// (exactly: the clock is moved by hand); a lease reported lost is
    /// renewed no more, nor one whose guard is dropped; the task ends with
    /// its renewals.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_task_renews_every_kept_lease_until_it_is_dropped_or_lost() {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::ManualClock::now();
        let opts = crate::StoreOptions::default().with_clock(Arc::new(clock.clone()));
        let store = Store::open_with(dir.path().join("r.db"), opts).unwrap();
        let metrics = tokio::runtime::Handle::current().metrics();
        let tasks = metrics.num_alive_tasks();
        // Leases of 60 ms: renewed every 20 ms, looked at every 10 ms.
        let renewals = Renewals::new(&store, Duration::from_millis(60));
        let (kept, lost, dropped) = (Arc::default(), Arc::default(), Arc::default());
        let guards: Vec<Kept> = (0..8)
            .map(|_| renewals.keep(counter(&kept, true)))
            .collect();
        let _lost = renewals.keep(counter(&lost, false));
        let gone = renewals.keep(counter(&dropped, true));
        assert_eq!(
            metrics.num_alive_tasks(),
            tasks + 1,
            "one task for ten leases"
        );
        drop(gone);
        until("the task's first sleep", || clock.sleeps_begun() >= 1).await;
        // 200 ms of the clock: each lease renewed at 20, 40, ..., 200.
        advance(&clock, Duration::from_millis(10), 20).await;
        assert_eq!(kept.load(Ordering::SeqCst), 8 * 10, "renewals of 8 leases");
        assert_eq!(
            lost.load(Ordering::SeqCst),
            1,
            "a lost lease is renewed once"
        );
        assert_eq!(dropped.load(Ordering::SeqCst), 0, "a dropped one never");
        drop(guards);
        advance(&clock, Duration::from_millis(10), 10).await;
        assert_eq!(
            kept.load(Ordering::SeqCst),
            8 * 10,
            "renewed after the drop"
        );
        assert_eq!(renewals.kept(), 0, "nothing left to renew");
        drop(renewals);
        until("the task ends with its runner", || {
            metrics.num_alive_tasks() == tasks
        })
        .await;
    }
}
