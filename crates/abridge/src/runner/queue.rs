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
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots, shared by every clone of a runner.
#[derive(Debug)]
pub(crate) struct StepQueue {
    /// None: no queue (`RunnerConfig::step_slots` = 0).
    slots: Option<Arc<Semaphore>>,
    size: usize,
    /// Parts that found every slot taken and waited.
    waits: AtomicU64,
    /// Their time in the line, in microseconds, in all and at most.
    waited_us: AtomicU64,
    longest_us: AtomicU64,
}

/// One slot, held until dropped (or [`Slot::release`]d).
#[derive(Debug, Default)]
pub(crate) struct Slot(Option<OwnedSemaphorePermit>);

impl Slot {
    /// Gives the slot back before a part that holds none (a model call, a
    /// tool run, a summary).
    pub(crate) fn release(&mut self) {
        self.0 = None;
    }
}

/// What the queue has seen since the runner was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// Slots (0: no queue).
    pub slots: usize,
    /// Parts that found every slot taken and waited in line.
    pub waits: u64,
    /// Their time in line, in all, microseconds.
    pub waited_us: u64,
    /// The longest time one waited, microseconds.
    pub longest_us: u64,
}

impl StepQueue {
    /// A queue of `size` slots; 0 makes none (every part goes at once).
    pub(crate) fn new(size: usize) -> Self {
        StepQueue {
            slots: (size > 0).then(|| Arc::new(Semaphore::new(size))),
            size,
            waits: AtomicU64::new(0),
            waited_us: AtomicU64::new(0),
            longest_us: AtomicU64::new(0),
        }
    }

    /// Takes a slot, waiting in line behind those who asked first.
    pub(crate) async fn take(&self) -> Slot {
        let Some(slots) = &self.slots else {
            return Slot(None);
        };
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Slot(Some(p));
        }
        self.wait(slots).await
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
        Slot(permit)
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
            None => Slot(None),
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(p) => Slot(Some(p)),
                Err(_) => return self.wait(slots).await,
            },
        };
        let_ready_tasks_run().await;
        slot
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
        let q = Arc::new(StepQueue::new(1));
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
        let q = Arc::new(StepQueue::new(3));
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

    #[tokio::test]
    async fn a_queue_of_no_slots_never_waits() {
        let q = StepQueue::new(0);
        let mut held = Vec::new();
        for _ in 0..100 {
            held.push(q.take().await);
        }
        assert_eq!(q.stats(), QueueStats::default());
    }
}
