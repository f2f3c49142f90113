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
