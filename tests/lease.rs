//! Turn leases: two runners never run one turn at once; an expired lease is
//! taken over; a stale holder's writes are refused (fenced).
//!
//! Scenario: runners with distinct owner identities share one store. A frozen
//! holder is simulated by turning its heartbeat off, so its lease runs out while
//! its model call is still in flight; the runner that takes over completes the
//! turn, and the frozen one's late write fails with `LeaseLost`.

mod common;
use abridge::demo::{user_turn, ScriptedModel};
use abridge::{Error, Runner, Threshold};
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
    cfg.heartbeat = heartbeat;
    Runner::builder(store.clone(), model)
        .tools(abridge::demo::demo_tools(None, Duration::ZERO))
        .config(cfg)
        .build()
        .unwrap()
}

fn slow(ms: u64) -> ScriptedModel {
    let mut m = ScriptedModel::new(3);
    m.latency = Duration::from_millis(ms);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runners_racing_for_one_turn_one_runs_it_the_other_is_refused() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let model = Counting::new(slow(60));
    let a = runner(&store, model.clone(), "a", 5_000, true);
    let b = runner(&store, model.clone(), "b", 5_000, true);
    let sid = demo_session(&a, 3, 0).await;
    let input = user_turn(3, 0, 0);
    let (ra, rb) = tokio::join!(a.run_turn_at(sid, 0, &input), b.run_turn_at(sid, 0, &input));
    let (ok, refused) = match (ra, rb) {
        (Ok(o), Err(e)) | (Err(e), Ok(o)) => (o, e),
        other => panic!("expected one winner: {other:?}"),
    };
    assert!(matches!(refused, Error::LeaseHeld { .. }), "{refused}");
    // Every model call belongs to exactly one persisted step: nothing ran twice.
    assert_eq!(model.count() as i64, ok.steps);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_lease_holder_is_fenced_and_the_taker_finishes_the_turn() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let frozen = runner(&store, Arc::new(slow(700)), "frozen", 150, false);
    let taker = runner(&store, Arc::new(slow(0)), "taker", 5_000, true);
    let sid = demo_session(&frozen, 3, 0).await;
    let input = user_turn(3, 0, 0);
    let f = frozen.clone();
    let inp = input.clone();
    let stale = tokio::spawn(async move { f.run_turn_at(sid, 0, &inp).await });
    tokio::time::sleep(Duration::from_millis(350)).await;
    // The live holder's lease expired: taken over, not refused.
    let turn_id = store
        .with_conn(|c| Ok(c.query_row("SELECT id FROM turns", [], |r| r.get::<_, i64>(0))?))
        .unwrap();
    let done = taker.resume_turn(turn_id).await.unwrap();
    let holder = done.turn.lease_owner.as_deref().unwrap();
    assert_eq!(abridge::owner::owner_name(holder), "taker");
    let late = stale.await.unwrap();
    assert!(matches!(late, Err(Error::LeaseLost { .. })), "{late:?}");
    // Nothing the frozen runner did after losing the lease reached the store.
    let steps: i64 = store
        .with_conn(|c| Ok(c.query_row("SELECT count(*) FROM steps", [], |r| r.get(0))?))
        .unwrap();
    assert_eq!(steps, done.steps);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_lease_is_respected() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let holder = runner(&store, Arc::new(slow(400)), "holder", 5_000, true);
    let other = runner(&store, Arc::new(slow(0)), "other", 5_000, true);
    let sid = demo_session(&holder, 3, 0).await;
    let input = user_turn(3, 0, 0);
    let h = holder.clone();
    let task = tokio::spawn(async move { h.run_turn_at(sid, 0, &input).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let turn_id = store
        .with_conn(|c| Ok(c.query_row("SELECT id FROM turns", [], |r| r.get::<_, i64>(0))?))
        .unwrap();
    match other.resume_turn(turn_id).await {
        Err(Error::LeaseHeld { owner, .. }) => assert_eq!(owner, "holder"),
        r => panic!("expected LeaseHeld, got {r:?}"),
    }
    assert!(other.recoverable_turns().await.unwrap().is_empty());
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
    cfg.lease_ttl = Duration::from_millis(100);
    let crashed = Runner::builder(store.clone(), Arc::new(slow(0)))
        .tools(abridge::demo::demo_tools(None, Duration::ZERO))
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
    tokio::time::sleep(Duration::from_millis(150)).await;
    let host = runner(&store, Arc::new(slow(0)), "restarted", 5_000, true);
    let left = host.recoverable_turns().await.unwrap();
    assert_eq!(left.len(), 1);
    let out = host.resume_turn(left[0].id).await.unwrap();
    assert!(!out.output.is_empty());
    assert!(host.recoverable_turns().await.unwrap().is_empty());
    assert_verified(&store);
}
