//! Turn leases: two runners never run one turn at once; an expired lease is
//! taken over; a stale holder's writes are refused (fenced).
//!
//! Scenario: runners with distinct owner identities share one store. A holder
//! is held inside its model call by a gate the test opens; a frozen holder has
//! its heartbeat off as well, so its lease runs out while the call is parked;
//! the runner that takes over completes the turn, and the frozen one's late
//! write fails with `LeaseLost`. The order of events comes from the gate and
//! from conditions read in the store, never from sleeping.

use crate::common;
use abridge::{Error, Runner, Threshold};
use abridge_testkit::demo::{user_turn, ScriptedModel};
use common::*;
use std::sync::Arc;
use std::time::Duration;

fn runner(
    store: &abridge::Store,
    model: Arc<dyn abridge::ModelClient>,
    owner: &str,
    ttl_ms: u64,
    heartbeat: bool,
) -> Runner {
    let mut cfg = test_config(Threshold::Off, None, owner);
    cfg.lease_ttl = Duration::from_millis(ttl_ms);
    cfg.testing.heartbeat = heartbeat;
    Runner::builder(store.clone(), model)
        .tools(abridge_testkit::demo::demo_tools(None, Duration::ZERO))
        .config(cfg)
        .build()
        .unwrap()
}

fn quick() -> ScriptedModel {
    ScriptedModel::new(3)
}

/// The demo's model behind a gate: every call says it has started, then waits
/// until the test opens the gate (once opened, it stays open).
struct Gated {
    inner: ScriptedModel,
    started: tokio::sync::Notify,
    gate: tokio::sync::Semaphore,
    calls: std::sync::atomic::AtomicUsize,
}

impl Gated {
    fn new() -> Arc<Gated> {
        Arc::new(Gated {
            inner: quick(),
            started: tokio::sync::Notify::new(),
            gate: tokio::sync::Semaphore::new(0),
            calls: Default::default(),
        })
    }
    fn open(&self) {
        self.gate
            .add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
    }
}

#[abridge::async_trait]
impl abridge::ModelClient for Gated {
    async fn complete(
        &self,
        req: &abridge::ModelRequest,
    ) -> Result<abridge::ModelResponse, abridge::ModelError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.started.notify_one();
        let _pass = self.gate.acquire().await.unwrap();
        self.inner.complete(req).await
    }
}

/// Polls `f` until it gives a value (failing after 20 s instead of hanging).
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn only_turn_id(store: &abridge::Store) -> abridge::TurnId {
    store
        .with_conn(|c| c.query_row("SELECT id FROM turns", [], |r| r.get(0)))
        .unwrap()
}

/// Whether the turn's lease has run out by the store's clock.
fn lease_expired(store: &abridge::Store, turn_id: abridge::TurnId) -> bool {
    let exp: Option<i64> = store
        .with_conn(move |c| {
            c.query_row(
                "SELECT lease_expires_at FROM turns WHERE id = ?1",
                [turn_id],
                |r| r.get(0),
            )
        })
        .unwrap();
    exp.is_some_and(|e| e < store.now_ms())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runners_racing_for_one_turn_one_runs_it_the_other_is_refused() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let model = Gated::new();
    let a = runner(&store, model.clone(), "a", 5_000, true);
    let b = runner(&store, model.clone(), "b", 5_000, true);
    let sid = demo_session(&a, 3, 0).await;
    let input = user_turn(3, 0, 0);
    let (ia, ib) = (input.clone(), input.clone());
    let mut ta = tokio::spawn(async move { a.run_turn_at(sid, 0, &ia).await });
    let mut tb = tokio::spawn(async move { b.run_turn_at(sid, 0, &ib).await });
    // Whichever claimed the turn is inside its first model call, the gate
    // shut: the other ends, refused, while the winner is still there.
    model.started.notified().await;
    let (refused, winner) = tokio::select! {
        r = &mut ta => (r, tb),
        r = &mut tb => (r, ta),
    };
    let refused = refused.unwrap().unwrap_err();
    assert!(matches!(refused, Error::LeaseHeld { .. }), "{refused}");
    model.open();
    let out = winner.await.unwrap().unwrap();
    // Every model call belongs to exactly one persisted step: nothing ran twice.
    let calls = model.calls.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(calls as i64, out.steps);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_lease_holder_is_fenced_and_the_taker_finishes_the_turn() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let parked = Gated::new();
    let frozen = runner(&store, parked.clone(), "frozen", 150, false);
    let taker = runner(&store, Arc::new(quick()), "taker", 5_000, true);
    let sid = demo_session(&frozen, 3, 0).await;
    let input = user_turn(3, 0, 0);
    let f = frozen.clone();
    let stale = tokio::spawn(async move { f.run_turn_at(sid, 0, &input).await });
    // Frozen inside its model call, heartbeat off: wait for its lease to run out.
    parked.started.notified().await;
    let turn_id = only_turn_id(&store);
    until("the frozen lease expires", || async {
        lease_expired(&store, turn_id).then_some(())
    })
    .await;
    // The live holder's lease expired: taken over, not refused.
    let done = taker.resume_turn(turn_id).await.unwrap();
    let holder = done.turn.lease_owner.as_deref().unwrap();
    assert_eq!(abridge::owner::owner_name(holder), "taker");
    // Only now does the frozen runner's model answer.
    parked.open();
    let late = stale.await.unwrap();
    assert!(matches!(late, Err(Error::LeaseLost { .. })), "{late:?}");
    // Nothing the frozen runner did after losing the lease reached the store.
    let steps: i64 = store
        .with_conn(|c| c.query_row("SELECT count(*) FROM steps", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(steps, done.steps);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_lease_is_respected() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let parked = Gated::new();
    let holder = runner(&store, parked.clone(), "holder", 5_000, true);
    let other = runner(&store, Arc::new(quick()), "other", 5_000, true);
    let sid = demo_session(&holder, 3, 0).await;
    let input = user_turn(3, 0, 0);
    let h = holder.clone();
    let task = tokio::spawn(async move { h.run_turn_at(sid, 0, &input).await });
    parked.started.notified().await;
    let turn_id = only_turn_id(&store);
    match other.resume_turn(turn_id).await {
        Err(Error::LeaseHeld { owner, .. }) => assert_eq!(owner, "holder"),
        r => panic!("expected LeaseHeld, got {r:?}"),
    }
    assert!(other.recoverable_turns().await.unwrap().is_empty());
    parked.open();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_left_running_by_a_crash_are_listed_and_resumed() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let mut cfg = test_config(
        Threshold::Off,
        Some(fail_at(abridge::FaultPoint::AfterResponseWritten, 1)),
        "crashed",
    );
    cfg.lease_ttl = Duration::from_secs(30);
    let crashed = Runner::builder(store.clone(), Arc::new(quick()))
        .tools(abridge_testkit::demo::demo_tools(None, Duration::ZERO))
        .config(cfg)
        .build()
        .unwrap();
    let sid = demo_session(&crashed, 3, 0).await;
    let err = crashed
        .run_turn_at(sid, 0, &user_turn(3, 0, 0))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Injected(_)));
    drop(crashed);
    // The crashed claim belonged to this very process and has ended, so it is
    // provably gone: a host under another name lists the turn at once, long
    // before its lease runs out. (A claim of another process, alive or not
    // provably dead, is waited out: `process_kill`, `host_patterns`.)
    let host = runner(&store, Arc::new(quick()), "restarted", 5_000, true);
    assert!(!lease_expired(&store, only_turn_id(&store)));
    let left = host.recoverable_turns().await.unwrap();
    assert_eq!(left.len(), 1);
    let out = host.resume_turn(left[0].id).await.unwrap();
    assert!(!out.output.is_empty());
    assert!(host.recoverable_turns().await.unwrap().is_empty());
    assert_verified(&store);
}

/// Turns parked in their model calls for several times their lease's
/// length keep their leases: the runner's renewal task renews every running
/// turn's lease (one task for all of them), so another runner is refused
/// throughout, and each turn completes once the call returns. The store's
/// clock is moved by hand: four lease lengths pass without a sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_longer_than_their_lease_keep_it_by_the_runners_heartbeat() {
    let (_d, path) = temp_db();
    let clock = abridge::ManualClock::now();
    let store = open_with_clock(&path, &clock);
    let parked = Gated::new();
    let holder = runner(&store, parked.clone(), "holder", 150, true);
    let other = runner(&store, Arc::new(quick()), "other", 150, true);
    let mut running = Vec::new();
    for i in 0..3 {
        let sid = demo_session(&holder, 3, i).await;
        let (h, input) = (holder.clone(), user_turn(3, i, 0));
        running.push(tokio::spawn(
            async move { h.run_turn_at(sid, 0, &input).await },
        ));
    }
    until("three model calls parked", || async {
        (parked.calls.load(std::sync::atomic::Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
    let turns: Vec<abridge::TurnId> = store
        .with_conn(|c| {
            let mut st = c.prepare("SELECT id FROM turns ORDER BY id")?;
            let rows = st.query_map([], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .unwrap();
    assert_eq!(turns.len(), 3);
    // Four lease lengths of the clock in all (150 ms leases, renewed every
    // 50 ms, looked at every 25 ms: one move of the clock each).
    let started = store.now_ms();
    for _ in 0..24 {
        advance_clock(&clock, Duration::from_millis(25), 1).await;
        for &t in &turns {
            assert!(!lease_expired(&store, t), "turn {t:?}'s lease ran out");
        }
    }
    assert_eq!(store.now_ms() - started, 600);
    for &t in &turns {
        match other.resume_turn(t).await {
            Err(Error::LeaseHeld { owner, .. }) => assert_eq!(owner, "holder"),
            r => panic!("expected LeaseHeld, got {r:?}"),
        }
    }
    parked.open();
    for t in running {
        t.await.unwrap().unwrap();
    }
}
