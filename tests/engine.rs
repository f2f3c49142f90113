//! End-to-end runs of the engine on the demo workload.

mod common;
use abridge::Threshold;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_run_with_tools_in_all_three_modes() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let runner = demo_runner(&store, 1, Threshold::Off, None);
    let sid = demo_session(&runner, 1, 0).await;
    for i in 0..6 {
        let input = abridge::demo::user_turn(1, 0, i);
        let out = runner.run_turn_at(sid, i as i64, &input).await.unwrap();
        assert!(!out.output.is_empty());
    }
    let n = assert_all_steps_rebuild(&store);
    assert!(n >= 12, "{n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_on_many_turns_verifies() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let runner = demo_runner(&store, 2, Threshold::Tokens(600), None);
    let sid = demo_session(&runner, 2, 0).await;
    for i in 0..20 {
        let input = abridge::demo::user_turn(2, 0, i);
        runner.run_turn_at(sid, i as i64, &input).await.unwrap();
    }
    let report = store.with_conn(|c| abridge::verify::verify(c)).unwrap();
    assert!(report.ok, "{report:#?}");
    let detail = store
        .with_conn(|c| abridge::inspect::session_detail(c, &sid.to_string()))
        .unwrap();
    assert!(
        detail.summary.counts.compactions_completed >= 3,
        "{:?}",
        detail.summary.counts
    );
}

/// `Blocking::InPlace` runs store calls on the calling worker (multi-thread
/// runtime) and falls back to the blocking pool on a current-thread runtime; the
/// guarantees hold either way.
#[test]
fn in_place_blocking_runs_turns_on_both_runtime_flavors() {
    for multi in [true, false] {
        let rt = if multi {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let (_d, path) = temp_db();
        let store = abridge::Store::open_with(
            &path,
            abridge::StoreOptions {
                blocking: abridge::Blocking::InPlace,
                ..Default::default()
            },
        )
        .unwrap();
        store
            .with_conn(abridge::store::demo::create_demo_tables)
            .unwrap();
        rt.block_on(async {
            let runner = demo_runner(&store, 4, Threshold::Tokens(600), None);
            let sid = demo_session(&runner, 4, 0).await;
            for i in 0..8 {
                runner
                    .run_turn_at(sid, i as i64, &abridge::demo::user_turn(4, 0, i))
                    .await
                    .unwrap();
            }
        });
        assert_verified(&store);
        assert!(assert_all_steps_rebuild(&store) > 8);
    }
}

/// A runner like `demo_runner`'s, keeping `cache_bytes` of contexts between turns.
fn runner_with_cache(
    store: &abridge::Store,
    seed: u64,
    owner: &str,
    cache_bytes: usize,
) -> abridge::Runner {
    let mut cfg = test_config(Threshold::Tokens(900), None, owner);
    cfg.context_cache_bytes = cache_bytes;
    abridge::Runner::builder(store.clone(), std::sync::Arc::new(demo_model(seed, &[])))
        .tools(abridge::demo::demo_tools(
            Some(store.path().to_path_buf()),
            std::time::Duration::ZERO,
        ))
        .config(cfg)
        .build()
        .unwrap()
}

/// Every executed step's (turn idx, step idx, recorded hash), in order.
fn step_hashes(store: &abridge::Store) -> Vec<(i64, i64, String)> {
    store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT t.idx, s.idx, s.messages_sha256 FROM steps s JOIN turns t \
                 ON t.id = s.turn_id WHERE s.messages_sha256 IS NOT NULL ORDER BY t.idx, s.idx",
            )?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap()
}

/// Scenario: two runners (two hosts) take turns on one session, each keeping
/// the session's message context between its turns; each runner's kept
/// context is behind by the turns the other ran, and compactions complete in
/// between. Every step's messages, extended from a kept context, hash the same
/// as in a control run by one runner that keeps no context (each turn's first
/// step built in full), and every step rebuilds from the store to its hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_contexts_extend_over_turns_other_runners_ran() {
    const SEED: u64 = 5;
    const TURNS: i64 = 18;
    let (_c, control_path) = temp_db();
    let control = open(&control_path);
    let single = runner_with_cache(&control, SEED, "host", 0);
    let sid = demo_session(&single, SEED, 0).await;
    for t in 0..TURNS {
        let input = abridge::demo::user_turn(SEED, 0, t as u64);
        single.run_turn_at(sid, t, &input).await.unwrap();
    }

    let (_d, path) = temp_db();
    let store = open(&path);
    let a = runner_with_cache(&store, SEED, "host", 64 << 20);
    let b = runner_with_cache(&store, SEED, "host", 64 << 20);
    let sid = demo_session(&a, SEED, 0).await;
    for t in 0..TURNS {
        // a, a, b, a, b, b, a, ...: both runners fall behind by one or two turns.
        let runner = if [0, 1, 3, 6, 7, 9, 12, 15].contains(&t) {
            &a
        } else {
            &b
        };
        let input = abridge::demo::user_turn(SEED, 0, t as u64);
        runner.run_turn_at(sid, t, &input).await.unwrap();
    }
    let compactions: i64 = store
        .with_conn(|c| {
            Ok(c.query_row(
                "SELECT count(*) FROM compactions WHERE status = 'completed'",
                [],
                |r| r.get(0),
            )?)
        })
        .unwrap();
    assert!(
        compactions >= 2,
        "{compactions} compactions: the run must cross several"
    );
    assert_eq!(step_hashes(&store), step_hashes(&control));
    assert_eq!(transcript(&store, SEED, 0), transcript(&control, SEED, 0));
    assert_all_steps_rebuild(&store);
    assert_verified(&store);
}
