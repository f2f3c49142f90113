//! The runner's fair queue: the parts of a step that work the store and the
//! CPU (claiming, planning and building the messages before the model call;
//! committing the response and the tool results after it; a turn's begin,
//! whose slot goes on to its first step) take one of a fixed number of
//! slots, in the order they asked for one.
//!
//! Without it, a host with many sessions leaves the order to tokio's
//! scheduler, which favours the task a worker just woke: with 1,000 sessions
//! some ran no turn for many seconds while others ran several, and the
//! background summaries the steps wait for queued behind every ready step.
//! With it, only the slots' holders compete for the workers, everything else
//! waits in one first-come, first-served line (tokio's semaphore is fair),
//! and a background summary (which takes no slot) competes with the holders
//! alone.
//!
//! On an SQLite store under `Synchronous::Normal` the slots' holders take
//! the store one at a time (`RunnerConfig::step_alone_for`): a part that has
//! its slot waits, at a one-permit gate, for the part running to end, or to
//! have run for `step_alone_for` (a long history's rebuild, a wait for
//! another process's write lock), and then runs beside it. Parts that
//! overlap there only contend: the store writes one transaction at a time,
//! a connection's page cache is dropped at every other connection's
//! commit, and the group commit's hand-offs cost more on two cores than the
//! commits they share, which under `Normal` are appends to the WAL.
//!
//! The bound: a part that asks for a slot waits for at most the parts queued
//! before it, served `slots` at a time; a turn's begin first lets the tasks
//! ready before it run (and ask for their slots; `let_ready_tasks_run`),
//! so a session whose model answers at once runs one turn, not turn after
//! turn, while others wait. A
//! step holds no slot while it calls the model, waits for or makes a
//! summary, or runs a tool outside its transaction, so a slow model, tool or
//! summariser never holds up other sessions' steps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots, shared by every clone of a runner.
#[derive(Debug)]
pub(crate) struct StepQueue {
    /// None: no queue (`RunnerConfig::step_slots` = 0).
    slots: Option<Arc<Semaphore>>,
    size: usize,
    /// The gate that makes the slots' holders run one at a time (None:
    /// they run at once).
    gate: Option<Gate>,
    /// Parts that found every slot taken and waited.
    waits: AtomicU64,
    /// Their time in the line, in microseconds, in all and at most.
    waited_us: AtomicU64,
    longest_us: AtomicU64,
}

/// One slot, held until dropped (or [`Slot::release`]d): the slot's permit
/// and, when the queue has a gate, the gate's if this part took it.
#[derive(Debug, Default)]
pub(crate) struct Slot(Option<OwnedSemaphorePermit>, Option<OwnedSemaphorePermit>);

impl Slot {
    /// Gives the slot back before a part that holds none (a model call, a
    /// tool run, a summary).
    pub(crate) fn release(&mut self) {
        self.1 = None;
        self.0 = None;
    }
}

/// One permit that the slots' holders take in turn; a holder waits for it
/// at most until the part holding it has held it for `alone_for`.
#[derive(Debug)]
struct Gate {
    permit: Arc<Semaphore>,
    alone_for: Duration,
    /// When the gate was last taken, microseconds after `epoch` (tokio's
    /// clock, which its sleeps read).
    taken_at: AtomicU64,
    epoch: tokio::time::Instant,
    /// Parts that ran beside a part that had held the gate past its time.
    beside: AtomicU64,
}

impl Gate {
    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn took(&self, permit: OwnedSemaphorePermit) -> OwnedSemaphorePermit {
        self.taken_at.store(self.now_us(), Ordering::Relaxed);
        permit
    }

    /// How long the gate's holder has held it.
    fn held_for(&self) -> Duration {
        let since = self.taken_at.load(Ordering::Relaxed);
        Duration::from_micros(self.now_us().saturating_sub(since))
    }

    /// Takes the gate, waiting in its line (the slots' holders, first come
    /// first served) until it is free or its holder has held it past
    /// `alone_for`. Some: this part holds it; None: it runs beside a part
    /// past its time (`beside` counts it).
    async fn pass(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = self.permit.clone().try_acquire_owned() {
            return Some(self.took(p));
        }
        let take = self.permit.clone().acquire_owned();
        tokio::pin!(take);
        loop {
            let left = self.alone_for.saturating_sub(self.held_for());
            tokio::select! {
                biased;
                // The semaphore is never closed: acquiring fails only then.
                p = &mut take => return p.ok().map(|p| self.took(p)),
                _ = tokio::time::sleep(left) => {
                    if self.held_for() >= self.alone_for {
                        self.beside.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                }
            }
        }
    }
}

/// What the queue has seen since the runner was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// Slots (0: no queue).
    pub slots: usize,
    /// Parts that found every slot taken and waited in line.
    pub waits: u64,
    /// Parts that ran beside a part that had worked the store alone for
    /// `RunnerConfig::step_alone_for` (0 when the slots' holders run at
    /// once).
    pub beside_slow: u64,
    /// Their time in line, in all, microseconds.
    pub waited_us: u64,
    /// The longest time one waited, microseconds.
    pub longest_us: u64,
}

impl StepQueue {
    /// A queue of `size` slots; 0 makes none (every part goes at once).
    /// `alone_for`: the slots' holders run one at a time, each waiting for
    /// the one running at most this long (see the module's doc); None (or
    /// fewer than two slots): they run at once.
    pub(crate) fn new(size: usize, alone_for: Option<Duration>) -> Self {
        StepQueue {
            slots: (size > 0).then(|| Arc::new(Semaphore::new(size))),
            size,
            gate: alone_for.filter(|_| size > 1).map(|alone_for| Gate {
                permit: Arc::new(Semaphore::new(1)),
                alone_for,
                taken_at: AtomicU64::new(0),
                epoch: tokio::time::Instant::now(),
                beside: AtomicU64::new(0),
            }),
            waits: AtomicU64::new(0),
            waited_us: AtomicU64::new(0),
            longest_us: AtomicU64::new(0),
        }
    }

    /// Takes a slot, waiting in line behind those who asked first.
    pub(crate) async fn take(&self) -> Slot {
        let Some(slots) = &self.slots else {
            return Slot(None, None);
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(p) => Slot(Some(p), None),
            Err(_) => self.wait(slots).await,
        };
        self.pass_gate(slot).await
    }

    /// The gate's part of taking a slot (nothing without a gate).
    async fn pass_gate(&self, mut slot: Slot) -> Slot {
        if let Some(gate) = &self.gate {
            slot.1 = gate.pass().await;
        }
        slot
    }

    /// Waits in the line for a slot, counting the wait.
    async fn wait(&self, slots: &Arc<Semaphore>) -> Slot {
        let began = Instant::now();
        // The semaphore is never closed: acquiring fails only then.
        let permit = slots.clone().acquire_owned().await.ok();
        let us = began.elapsed().as_micros().min(u64::MAX as u128) as u64;
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.waited_us.fetch_add(us, Ordering::Relaxed);
        self.longest_us.fetch_max(us, Ordering::Relaxed);
        Slot(permit, None)
    }

    /// Takes a slot for a turn's begin. A slot found free is held while the
    /// task hands itself back to the runtime ([`let_ready_tasks_run`]), so
    /// the tasks ready to run before it (another session's turn, woken but
    /// not yet polled) run and ask for their slots, and wait in the line if
    /// none is left. A session whose model and tools answer at once (a
    /// scripted or cached model, an offline demo) otherwise never returned
    /// to the runtime inside a turn: it found a slot free, ran its turn and
    /// began the next while the others had not reached the line (with 10,000
    /// sessions on one runtime worker, 300 of them ran 21-35 turns one after
    /// another before the rest began their first).
    pub(crate) async fn take_for_turn(&self) -> Slot {
        let slot = match &self.slots {
            None => Slot(None, None),
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(p) => Slot(Some(p), None),
                Err(_) => return self.pass_gate(self.wait(slots).await).await,
            },
        };
        let_ready_tasks_run().await;
        self.pass_gate(slot).await
    }

    /// Takes a slot again after a part that held none.
    pub(crate) async fn retake(&self, slot: &mut Slot) {
        if slot.0.is_none() {
            *slot = self.take().await;
        }
    }

    pub(crate) fn stats(&self) -> QueueStats {
        QueueStats {
            slots: self.size,
            waits: self.waits.load(Ordering::Relaxed),
            beside_slow: self
                .gate
                .as_ref()
                .map_or(0, |g| g.beside.load(Ordering::Relaxed)),
            waited_us: self.waited_us.load(Ordering::Relaxed),
            longest_us: self.longest_us.load(Ordering::Relaxed),
        }
    }
}

/// Hands the task back to the runtime until the tasks ready before it have
/// been polled: once (tokio polls a yielded task again once its worker's
/// queue is empty, or at the worker's periodic check, every 61 polls), then
/// again while the runtime's global queue holds tasks, at most once for each
/// task it held at the first look. A worker's own queue holds 256 tasks; the
/// tasks woken past that (a host with more sessions ready at once than its
/// workers' queues hold) wait in the global queue, which a worker takes from
/// only every 61 polls or when its own queue is empty, while the tasks its
/// polls wake (the line's, this one's) go to its own queue. Without the
/// second part, with 300 sessions ready at once on one worker, one ran its
/// third turn while 86 had not finished their first.
async fn let_ready_tasks_run() {
    tokio::task::yield_now().await;
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let metrics = runtime.metrics();
    let mut left = metrics.global_queue_depth();
    while left > 0 && metrics.global_queue_depth() > 0 {
        left -= 1;
        tokio::task::yield_now().await;
    }
}

/// The queue's time for a part alone (see [`StepQueue::new`]) from the
/// runner's `step_alone_for` and the store's durability: only an SQLite
/// store under `Synchronous::Normal` has one. On PostgreSQL a part's round
/// trips leave the CPU to the others, and under `Synchronous::Full` the
/// group commit shares each commit's `fsync` among the parts that overlap.
pub(crate) fn alone_for(
    set: Option<Duration>,
    synchronous: Option<crate::Synchronous>,
) -> Option<Duration> {
    set.filter(|_| synchronous == Some(crate::Synchronous::Normal))
}

/// The default number of slots: two per CPU the process may use (a part
/// waiting for another process's write lock leaves its CPU to the other
/// holder), at least 4.
pub(crate) fn default_slots() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() * 2)
        .unwrap_or(4)
        .max(4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::Mutex;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slots_are_served_in_the_order_they_were_asked_for() {
        let q = Arc::new(StepQueue::new(1, None));
        let first = q.take().await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..20 {
            let (q, order) = (q.clone(), order.clone());
            let mut asks = Box::pin(async move {
                let _slot = q.take().await;
                order.lock().unwrap().push(i);
            });
            // Each in line before the next asks: polled once here, it waits
            // in the semaphore's line (a sleep between spawns did not make
            // sure of that on a loaded machine).
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(asks.as_mut().poll(&mut cx).is_pending());
            tasks.push(tokio::spawn(asks));
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
        let s = q.stats();
        assert_eq!((s.slots, s.waits), (1, 20));
        assert!(s.longest_us > 0 && s.waited_us >= s.longest_us);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_parts_hold_a_slot_than_there_are_slots() {
        let q = Arc::new(StepQueue::new(3, None));
        let (inside, most) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (q, inside, most) = (q.clone(), inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let mut slot = q.take().await;
                    let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    slot.release();
                    // Released, then taken again: the same line.
                    q.retake(&mut slot).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 3);
    }

    /// Lets the tasks spawned so far run as far as they can.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn gated(slots: usize) -> Arc<StepQueue> {
        Arc::new(StepQueue::new(slots, Some(Duration::from_millis(5))))
    }

    fn take_later(q: &Arc<StepQueue>) -> tokio::task::JoinHandle<Slot> {
        let q = q.clone();
        tokio::spawn(async move { q.take().await })
    }

    /// A part that takes a slot, and a second that asks for one after it,
    /// `ms` milliseconds after which it is looked at.
    async fn two_parts(q: &Arc<StepQueue>, ms: u64) -> (Slot, tokio::task::JoinHandle<Slot>) {
        let first = q.take().await;
        let second = take_later(q);
        settle().await;
        tokio::time::advance(Duration::from_millis(ms)).await;
        settle().await;
        (first, second)
    }

    #[tokio::test(start_paused = true)]
    async fn the_slots_holders_take_the_store_one_at_a_time() {
        let q = gated(4);
        // Not yet past its time: the second waits though slots are free.
        let (first, second) = two_parts(&q, 4).await;
        assert!(!second.is_finished());
        drop(first);
        let second = second.await.unwrap();
        assert!(second.1.is_some(), "the next part holds the gate");
        assert_eq!(q.stats().beside_slow, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_part_runs_beside_one_that_has_worked_alone_past_its_time() {
        let q = gated(4);
        let (slow, second) = two_parts(&q, 6).await;
        assert!(second.is_finished(), "it waited no longer than 5 ms");
        let second = second.await.unwrap();
        assert!(second.1.is_none(), "beside the slow part, without the gate");
        // Another one now goes beside it at once.
        let third = q.take().await;
        assert!(third.1.is_none());
        assert_eq!(q.stats().beside_slow, 2);
        // Once the slow part ends, the next takes the gate again.
        drop(slow);
        let fourth = q.take().await;
        assert!(fourth.1.is_some());
        assert_eq!(q.stats().beside_slow, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_is_passed_in_the_order_it_was_asked_for() {
        let q = gated(4);
        let first = q.take().await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (q, order) = (q.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let slot = q.take().await;
                order.lock().unwrap().push(i);
                slot
            }));
            settle().await;
        }
        // Each part hands the gate on after 1 ms, well within its time.
        drop(first);
        let mut held = Vec::new();
        for t in tasks {
            let slot = t.await.unwrap();
            assert!(slot.1.is_some());
            tokio::time::advance(Duration::from_millis(1)).await;
            held.push(slot);
            held.clear();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert_eq!(q.stats().beside_slow, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_parts_than_slots_run_beside_slow_ones() {
        let q = gated(2);
        let (_slow, second) = two_parts(&q, 6).await;
        let second = second.await.unwrap();
        // Both slots held: a third waits for a slot however long it takes.
        let third = take_later(&q);
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
        assert!(!third.is_finished());
        drop(second);
        assert!(third.await.unwrap().0.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_time_the_slots_holders_run_at_once() {
        for q in [
            StepQueue::new(4, None),
            StepQueue::new(1, Some(Duration::from_millis(5))),
        ] {
            let held = vec![q.take().await];
            let next = tokio::time::timeout(Duration::from_millis(1), q.take()).await;
            // One slot: the next waits for it; more: it runs at once.
            assert_eq!(next.is_ok(), q.stats().slots > 1);
            drop(held);
        }
    }

    #[test]
    fn only_an_sqlite_store_under_normal_has_its_parts_alone() {
        use crate::Synchronous;
        let t = Some(Duration::from_millis(5));
        assert_eq!(alone_for(t, Some(Synchronous::Normal)), t);
        assert_eq!(alone_for(t, Some(Synchronous::Full)), None);
        assert_eq!(alone_for(t, None), None, "PostgreSQL");
        assert_eq!(alone_for(None, Some(Synchronous::Normal)), None);
    }

    #[tokio::test]
    async fn a_queue_of_no_slots_never_waits() {
        let q = StepQueue::new(0, None);
        let mut held = Vec::new();
        for _ in 0..100 {
            held.push(q.take().await);
        }
        assert_eq!(q.stats(), QueueStats::default());
    }
}
