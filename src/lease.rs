//! The heartbeat: keeps a lease (a turn's or a compaction row's) while its
//! holder works. A runner's turns share one renewal task, and its
//! compactor's claims another ([`Renewals`]): a turn or a summary starts and
//! ends none.

use crate::store::Connection;
use crate::store::Store;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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
/// ends once its runner is dropped.
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
    kept: HashMap<u64, (Renew, Instant)>,
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
        lock(&self.inner.leases).kept.remove(&self.id);
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
        let due = Instant::now() + self.inner.period;
        leases.kept.insert(id, (Arc::new(renew), due));
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

/// The renewal task of a [`Renewals`]: holds it only while it renews.
async fn renew_all(renewals: std::sync::Weak<RenewalsInner>) {
    let Some(period) = renewals.upgrade().map(|r| r.period) else {
        return;
    };
    let mut tick = tokio::time::interval((period / 2).max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(r) = renewals.upgrade() else {
            return; // the runner is gone
        };
        let now = Instant::now();
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
                        *at = Instant::now() + r.period;
                    }
                }
                Ok(false) => {
                    leases.kept.remove(&id);
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

    /// One task renews every kept lease, each about once a period; a lease
    /// reported lost is renewed no more, nor one whose guard is dropped; the
    /// task ends with its renewals.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_task_renews_every_kept_lease_until_it_is_dropped_or_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("r.db")).unwrap();
        let metrics = tokio::runtime::Handle::current().metrics();
        let tasks = metrics.num_alive_tasks();
        let renewals = Renewals::new(&store, Duration::from_millis(60)); // every 20 ms
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
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n = kept.load(Ordering::SeqCst);
        // 200 ms: at most 10 renewals each (never sooner than 20 ms apart),
        // about 7 on a quiet machine; at least 2 on a loaded one.
        assert!((8 * 2..=8 * 10).contains(&n), "{n} renewals of 8 leases");
        assert_eq!(
            lost.load(Ordering::SeqCst),
            1,
            "a lost lease is renewed once"
        );
        assert_eq!(dropped.load(Ordering::SeqCst), 0, "a dropped one never");
        drop(guards);
        tokio::time::sleep(Duration::from_millis(40)).await;
        let after = kept.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(kept.load(Ordering::SeqCst), after, "renewed after the drop");
        drop(renewals);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            metrics.num_alive_tasks(),
            tasks,
            "the task ends with its runner"
        );
    }
}
