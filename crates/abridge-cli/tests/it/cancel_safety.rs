//! Every public future is cancel-safe: dropped at any await point, it stops
//! every lease renewal it started, and another owner finishes the work.
//!
//! Scenario: a host wraps `run_turn`, `run_turn_at`, `resume_turn`, `ensure`
//! and `compact_now` in a timeout. For each, the timeout grows from 1 ms past
//! the whole call (a slow model and a slow summariser, short leases), so the
//! future is dropped at each of its await points in turn: waiting for the
//! store, the model, the summariser, a tool. After each drop: no lease in the
//! store is renewed any more (so another process takes over after the lease's
//! time), and a second runner of this process finishes the same work at once,
//! with every guarantee holding.

use crate::common;
use abridge::compaction::{SummaryRequest, SummaryResponse};
use abridge::{Error, ModelError, Runner, Store, Summariser, Threshold};
use abridge_testkit::demo::{demo_tools, user_turn};
use common::*;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

const SEED: u64 = 5;
const TTL: Duration = Duration::from_millis(150);
const HISTORY: u64 = 4;

struct SlowSummary;

#[abridge::async_trait]
impl Summariser for SlowSummary {
    async fn summarise(&self, _: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        tokio::time::sleep(Duration::from_millis(120)).await;
        Ok(SummaryResponse {
            text: "the user asked about orders".into(),
            usage: Default::default(),
        })
    }
}

fn runner(store: &Store, owner: &str, compact: bool, hook: Option<abridge::FaultHook>) -> Runner {
    let mut cfg = test_config(
        if compact {
            Threshold::Tokens(1)
        } else {
            Threshold::Off
        },
        hook,
        owner,
    );
    cfg.lease_ttl = TTL;
    cfg.compaction.lease_ttl = TTL;
    let mut model = demo_model(SEED, &["notify_customer", "charge_card"]);
    model.latency = Duration::from_millis(15);
    Runner::builder(store.clone(), Arc::new(model))
        .tools(demo_tools(None, Duration::from_millis(10)))
        .summariser(SlowSummary)
        .config(cfg)
        .build()
        .unwrap()
}

/// Lease expiries of every running turn and pending compaction.
fn leases(store: &Store) -> Vec<(String, i64, Option<i64>)> {
    store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT 'turn', id, lease_expires_at FROM turns WHERE status = 'running' \
                 UNION ALL SELECT 'compaction', id, lease_expires_at FROM compactions \
                 WHERE status = 'pending' ORDER BY 1, 2",
            )?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .unwrap()
}

/// After a drop: nothing is left for a renewal task to renew (every lease
/// the dropped call kept was let go as it was dropped), and no lease in the
/// store is renewed while the store's clock moves three lease lengths on. A
/// store call started before the drop goes on on the blocking pool (a lease
/// taken, a renewal; on PostgreSQL a few round trips) and may commit once:
/// it is let end first, and it writes an expiry from the clock before the
/// move, so any expiry past the moved clock's time is a renewal after it.
async fn assert_no_renewals(s: &Setup, what: &str, after: Duration) {
    assert_eq!(
        s.store.leases_kept(),
        0,
        "{what}: a lease still kept after a drop at {after:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while s.store.calls_in_flight() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: a store call never ended"
        );
        tokio::task::yield_now().await;
    }
    let moved = s.store.now_ms() + (TTL * 3).as_millis() as i64;
    s.clock.advance(TTL * 3);
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    for (kind, id, expires) in leases(&s.store) {
        assert!(
            expires.is_none_or(|e| e < moved),
            "{what}: {kind} {id}'s lease renewed after a drop at {after:?}"
        );
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    store: Store,
    /// The store's clock: moved by hand.
    clock: abridge::ManualClock,
    session: abridge::store::SessionRow,
}

async fn setup() -> Setup {
    let (dir, path) = temp_db();
    let clock = abridge::ManualClock::now();
    let store = open_with_clock(&path, &clock);
    let r = runner(&store, "setup", false, None);
    let sid = demo_session(&r, SEED, 0).await;
    for t in 0..HISTORY {
        r.run_turn_at(sid, t as i64, &user_turn(SEED, 0, t))
            .await
            .unwrap();
    }
    let session = store
        .with_conn(move |c| Ok(abridge::inspect::sessions(c)?.remove(0).session))
        .unwrap();
    Setup {
        _dir: dir,
        store,
        clock,
        session,
    }
}

/// Drops `call` at growing timeouts; after each, `finish` (another runner)
/// completes the work. Returns how many drops happened (before the call
/// finished within its timeout).
async fn drop_everywhere<C, F, D, G>(what: &str, call: C, finish: D) -> usize
where
    C: Fn(Setup) -> (Setup, F),
    F: Future<Output = ()>,
    D: Fn(Setup) -> G,
    G: Future<Output = Setup>,
{
    let mut drops = 0;
    for ms in [1u64, 3, 8, 15, 25, 40, 60, 90, 130, 180, 250, 350, 500] {
        let s = setup().await;
        let (s, fut) = call(s);
        let after = Duration::from_millis(ms);
        if tokio::time::timeout(after, fut).await.is_err() {
            drops += 1;
            assert_no_renewals(&s, what, after).await;
        }
        let s = tokio::time::timeout(Duration::from_secs(10), finish(s))
            .await
            .unwrap_or_else(|_| panic!("{what}: not finished after a drop at {after:?}"));
        assert!(
            leases(&s.store).is_empty(),
            "{what}: work left after {after:?}"
        );
        assert_verified(&s.store);
    }
    assert!(drops >= 5, "{what}: only {drops} drops");
    drops
}

async fn finish_turn(s: Setup) -> Setup {
    let second = runner(&s.store, "second", true, None);
    let input = user_turn(SEED, 0, HISTORY);
    second
        .run_turn_at(s.session.id, HISTORY as i64, &input)
        .await
        .unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_turn_dropped_anywhere_stops_renewing_and_is_finished_by_another() {
    drop_everywhere(
        "run_turn",
        |s| {
            let r = runner(&s.store, "first", true, None);
            let sid = s.session.id;
            let fut = async move {
                r.run_turn(sid, &user_turn(SEED, 0, HISTORY)).await.unwrap();
            };
            (s, fut)
        },
        finish_turn,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_turn_at_dropped_anywhere_stops_renewing_and_is_finished_by_another() {
    drop_everywhere(
        "run_turn_at",
        |s| {
            let r = runner(&s.store, "first", true, None);
            let sid = s.session.id;
            let fut = async move {
                r.run_turn_at(sid, HISTORY as i64, &user_turn(SEED, 0, HISTORY))
                    .await
                    .unwrap();
            };
            (s, fut)
        },
        finish_turn,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_turn_dropped_anywhere_stops_renewing_and_is_finished_by_another() {
    drop_everywhere(
        "resume_turn",
        |s| {
            let store = s.store.clone();
            let sid = s.session.id;
            let fut = async move {
                // A turn left running by a crash right after its first claim.
                let crashed = runner(
                    &store,
                    "crashed",
                    true,
                    Some(fail_at(abridge::FaultPoint::AfterClaim, 1)),
                );
                let err = crashed
                    .run_turn_at(sid, HISTORY as i64, &user_turn(SEED, 0, HISTORY))
                    .await
                    .unwrap_err();
                assert!(matches!(err, Error::Injected(_)), "{err}");
                let turn_id = store
                    .with_conn(|c| {
                        c.query_row("SELECT id FROM turns WHERE status = 'running'", [], |r| {
                            r.get(0)
                        })
                    })
                    .unwrap();
                runner(&store, "first", true, None)
                    .resume_turn(turn_id)
                    .await
                    .unwrap();
            };
            (s, fut)
        },
        finish_turn,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_dropped_anywhere_stops_renewing_and_is_finished_by_another() {
    drop_everywhere(
        "ensure",
        |s| {
            let r = runner(&s.store, "first", true, None);
            let session = s.session.clone();
            let fut = async move {
                r.compactor()
                    .ensure(&session, HISTORY as i64, 0)
                    .await
                    .unwrap()
                    .unwrap();
            };
            (s, fut)
        },
        |s| async move {
            let second = runner(&s.store, "second", true, None);
            let row = second
                .compactor()
                .ensure(&s.session, HISTORY as i64, 0)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(row.status, abridge::store::CompactionStatus::Completed);
            s
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_now_dropped_anywhere_stops_renewing_and_is_finished_by_another() {
    drop_everywhere(
        "compact_now",
        |s| {
            let r = runner(&s.store, "first", true, None);
            let sid = s.session.id;
            let fut = async move {
                r.compact_now(sid, Some("orders".into())).await.unwrap();
            };
            (s, fut)
        },
        |s| async move {
            let second = runner(&s.store, "second", true, None);
            let row = second.compact_now(s.session.id, None).await.unwrap();
            assert_eq!(row.status, abridge::store::CompactionStatus::Completed);
            s
        },
    )
    .await;
}
