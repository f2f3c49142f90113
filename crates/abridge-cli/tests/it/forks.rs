//! Sessions that branch. A fork reads its parent's turns up to its fork
//! point where they are: it writes a bounded number of rows whatever the
//! parent's length, every step of parent and fork rebuilds to its hash, a
//! fork continued through the runner compacts on its own without touching
//! a row of its parent, and deleting or redacting a parent that forks read
//! is refused (verify checks the lineage). On PostgreSQL too, with
//! `ABRIDGE_TEST_POSTGRES` set.

use crate::common;
use abridge::{Error, Store, Threshold};
use abridge_testkit::demo::user_turn;

/// Every row count of the store, by table.
fn row_counts(store: &Store) -> Vec<(String, i64)> {
    store
        .with_conn(|c| {
            let mut out = Vec::new();
            for t in [
                "sessions",
                "turns",
                "steps",
                "tool_invocations",
                "compactions",
                "pins",
                "session_lineage",
            ] {
                out.push((
                    t.to_string(),
                    c.query_row(&format!("SELECT count(*) FROM {t}"), [], |r| r.get(0))?,
                ));
            }
            Ok(out)
        })
        .unwrap()
}

/// Every row of the session's own, as text: what "unchanged" is checked on.
fn own_rows(store: &Store, sid: abridge::SessionId) -> String {
    let cols = |cs: &[&str]| {
        cs.iter()
            .map(|c| format!("coalesce(CAST({c} AS TEXT), '-')"))
            .collect::<Vec<_>>()
            .join(" || '|' || ")
    };
    let queries = [
        format!("SELECT {} FROM sessions WHERE id = ?1", cols(&["id", "external_id", "model", "system_prompt", "config"])),
        format!("SELECT {} FROM turns WHERE session_id = ?1 ORDER BY id", cols(&["id", "idx", "input", "status", "output", "error", "lease_epoch", "finished_at"])),
        format!("SELECT {} FROM steps s JOIN turns t ON t.id = s.turn_id WHERE t.session_id = ?1 ORDER BY s.id", cols(&["s.id", "s.idx", "s.status", "s.compaction_id", "s.messages_sha256", "s.response"])),
        format!("SELECT {} FROM tool_invocations i JOIN steps s ON s.id = i.step_id JOIN turns t ON t.id = s.turn_id WHERE t.session_id = ?1 ORDER BY i.id", cols(&["i.id", "i.status", "i.result"])),
        format!("SELECT {} FROM compactions WHERE session_id = ?1 ORDER BY id", cols(&["id", "up_to_turn_index", "status", "summary"])),
        format!("SELECT {} FROM pins WHERE session_id = ?1 ORDER BY id", cols(&["id", "value", "superseded_by", "superseded_at"])),
    ];
    store
        .with_conn(move |c| {
            let mut out = String::new();
            for sql in &queries {
                let mut st = c.prepare(sql)?;
                let mut rows = st.query([sid])?;
                while let Some(r) = rows.next()? {
                    out.push_str(&r.get::<_, String>(0)?);
                    out.push('\n');
                }
            }
            Ok(out)
        })
        .unwrap()
}

async fn seeded(turns: i64) -> (tempfile::TempDir, Store, abridge::SessionId) {
    let (dir, path) = common::temp_db();
    let store = common::store_at(&path);
    let r = common::demo_runner(&store, 1, Threshold::Off, None);
    let sid = common::demo_session(&r, 1, 0).await;
    let shape = abridge_testkit::seed::SeedShape {
        turns,
        tool_result_bytes: vec![300, 900],
        compact_every: Some(25),
        tool_steps: 1,
    };
    store
        .with_conn(|c| abridge_testkit::seed::seed_history(c, sid, &shape))
        .unwrap();
    (dir, store, sid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_writes_the_same_bounded_number_of_rows_at_100_and_1000_turns() {
    let mut written = Vec::new();
    for turns in [100, 1_000] {
        let (_dir, store, sid) = seeded(turns).await;
        let before = row_counts(&store);
        let fork = store.fork(sid, turns - 2, "the-fork").await.unwrap();
        let after = row_counts(&store);
        let grew: Vec<(String, i64)> = before
            .iter()
            .zip(&after)
            .map(|((t, a), (_, b))| (t.clone(), b - a))
            .collect();
        // The fork reads the parent's newest completed compaction at or
        // before its fork point.
        let parent_latest = store
            .with_conn(move |c| abridge::inspect::compactions(c, sid))
            .unwrap()
            .into_iter()
            .filter(|c| c.up_to_turn_index <= turns - 2)
            .map(|c| c.id)
            .max();
        assert_eq!(fork.base_compaction, parent_latest);
        assert_eq!(fork.fork_point(), Some(turns - 2));
        written.push(grew);
    }
    assert_eq!(
        written[0], written[1],
        "the rows a fork writes do not grow with the parent"
    );
    let total: i64 = written[0].iter().map(|(_, n)| n).sum();
    assert!(total <= 2 + 100, "{written:?}");
    assert_eq!(written[0][0], ("sessions".to_string(), 1));
    assert_eq!(written[0][1], ("turns".to_string(), 0));
    assert_eq!(written[0][2], ("steps".to_string(), 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_continued_through_the_runner_compacts_on_its_own_without_touching_the_parents_rows()
{
    let (_dir, path) = common::temp_db();
    let store = common::open(&path);
    let runner = common::demo_runner(&store, 3, Threshold::Tokens(1_500), None);
    let sid = common::demo_session(&runner, 3, 0).await;
    for t in 0..16 {
        runner
            .run_turn_at(sid, t, &user_turn(3, 0, t as u64))
            .await
            .unwrap();
    }
    let parent_before = own_rows(&store, sid);
    let effects_before = common::effects(&store);
    assert!(!effects_before.is_empty());
    let fork = runner.fork(sid, 9, "branch-at-9").await.unwrap();
    assert_eq!(own_rows(&store, sid), parent_before);
    for t in 10..30 {
        let out = runner
            .run_turn(
                fork.id,
                &format!("{} (on the branch)", user_turn(3, 1, t as u64)),
            )
            .await
            .unwrap();
        assert_eq!(out.turn.idx, t);
        assert_eq!(out.turn.session_id, fork.id);
    }
    assert_eq!(
        own_rows(&store, sid),
        parent_before,
        "the parent is unchanged"
    );
    let compactions = store
        .with_conn(move |c| abridge::inspect::compactions(c, fork.id))
        .unwrap();
    assert!(
        compactions
            .iter()
            .any(|c| c.status == abridge::store::CompactionStatus::Completed),
        "the fork compacted on its own: {compactions:?}"
    );
    assert!(compactions.iter().all(|c| c.session_id == fork.id));
    // The parent goes on too, beside its fork.
    runner
        .run_turn_at(sid, 16, &user_turn(3, 0, 16))
        .await
        .unwrap();
    assert!(common::assert_all_steps_rebuild(&store) > 0);
    common::assert_verified(&store);
    // The shared history, then the fork's own.
    let export = store
        .with_conn(|c| {
            abridge::inspect::export(c, "branch-at-9", abridge::inspect::ExportFormat::Jsonl)
        })
        .unwrap();
    let first_input = user_turn(3, 0, 0);
    assert!(export.contains(&first_input[..first_input.len().min(40)]));
    assert!(export.contains("(on the branch)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_completed_turn_is_a_fork_point_and_a_fork_of_a_fork_reads_both() {
    let (_dir, path) = common::temp_db();
    let store = common::open(&path);
    let runner = common::demo_runner(&store, 4, Threshold::Tokens(1_500), None);
    let sid = common::demo_session(&runner, 4, 0).await;
    for t in 0..8 {
        runner
            .run_turn_at(sid, t, &user_turn(4, 0, t as u64))
            .await
            .unwrap();
    }
    match store.fork(sid, 8, "too-far").await {
        Err(Error::NotAForkPoint { turn: 8, .. }) => {}
        other => panic!("{other:?}"),
    }
    let a = runner.fork(sid, 5, "a").await.unwrap();
    // The same fork again is the same session; another parent is a conflict.
    assert_eq!(runner.fork(sid, 5, "a").await.unwrap().id, a.id);
    assert!(matches!(
        runner.fork(sid, 4, "a").await,
        Err(Error::SessionConflict {
            field: "parent",
            ..
        })
    ));
    // A turn at or before the fork point is the parent's.
    assert!(matches!(
        runner.run_turn_at(a.id, 5, "again").await,
        Err(Error::TurnConflict { .. })
    ));
    for t in 6..12 {
        runner
            .run_turn_at(a.id, t, &format!("a {t}"))
            .await
            .unwrap();
    }
    // A fork of the fork, inside the grandparent's turns and inside its own.
    let b = runner.fork(a.id, 3, "b").await.unwrap();
    let c = runner.fork(a.id, 9, "c").await.unwrap();
    for t in 4..7 {
        runner
            .run_turn_at(b.id, t, &format!("b {t}"))
            .await
            .unwrap();
    }
    for t in 10..14 {
        runner
            .run_turn_at(c.id, t, &format!("c {t}"))
            .await
            .unwrap();
    }
    let turns = |id| {
        store
            .with_conn(move |cn| abridge::inspect::turns(cn, id))
            .unwrap()
            .into_iter()
            .map(|t| (t.session_id, t.idx))
            .collect::<Vec<_>>()
    };
    let want_c: Vec<_> = (0..=5)
        .map(|i| (sid, i))
        .chain((6..=9).map(|i| (a.id, i)))
        .chain((10..14).map(|i| (c.id, i)))
        .collect();
    assert_eq!(turns(c.id), want_c);
    let want_b: Vec<_> = (0..=3)
        .map(|i| (sid, i))
        .chain((4..7).map(|i| (b.id, i)))
        .collect();
    assert_eq!(turns(b.id), want_b);
    // `b` forks inside the first session's turns, yet names `a` as its
    // parent: `a` is not deleted under it.
    match store.delete_session(a.id).await {
        Err(Error::HasForks { forks, .. }) => {
            assert_eq!(forks, vec!["b".to_string(), "c".to_string()])
        }
        other => panic!("{other:?}"),
    }
    assert!(common::assert_all_steps_rebuild(&store) > 0);
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_or_redacting_a_parent_that_forks_read_is_refused_and_loses_nothing() {
    let (_dir, path) = common::temp_db();
    let store = common::open(&path);
    let runner = common::demo_runner(&store, 5, Threshold::Tokens(1_500), None);
    let sid = common::demo_session(&runner, 5, 0).await;
    for t in 0..6 {
        runner
            .run_turn_at(sid, t, &user_turn(5, 0, t as u64))
            .await
            .unwrap();
    }
    let fork = runner.fork(sid, 3, "kept").await.unwrap();
    runner
        .run_turn(fork.id, "and now something else")
        .await
        .unwrap();
    let before = own_rows(&store, sid);
    match store.delete_session(sid).await {
        Err(Error::HasForks { forks, .. }) => assert_eq!(forks, vec!["kept".to_string()]),
        other => panic!("{other:?}"),
    }
    let pattern = abridge::admin::Pattern::text("order").unwrap();
    assert!(matches!(
        store.redact(sid, pattern).await,
        Err(Error::HasForks { .. })
    ));
    assert_eq!(own_rows(&store, sid), before);
    common::assert_verified(&store);
    // The fork first, then its parent.
    store.delete_session(fork.id).await.unwrap();
    store.delete_session(sid).await.unwrap();
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewind_is_a_fork_at_the_turn_before_plus_the_new_turn() {
    let (_dir, path) = common::temp_db();
    let store = common::open(&path);
    let runner = common::demo_runner(&store, 6, Threshold::Tokens(1_500), None);
    let sid = common::demo_session(&runner, 6, 0).await;
    for t in 0..5 {
        runner
            .run_turn_at(sid, t, &user_turn(6, 0, t as u64))
            .await
            .unwrap();
    }
    let (fork, out) = runner
        .rewind(sid, 3, "redo-3", "say it differently")
        .await
        .unwrap();
    assert_eq!(fork.fork_point(), Some(2));
    assert_eq!(out.turn.idx, 3);
    assert_eq!(out.turn.input, "say it differently");
    // Again: the same fork, the same turn.
    let (again, out2) = runner
        .rewind(sid, 3, "redo-3", "say it differently")
        .await
        .unwrap();
    assert_eq!((again.id, out2.turn.id), (fork.id, out.turn.id));
    // The original turn 3 is still there.
    let original = store
        .with_conn(move |c| abridge::inspect::turns(c, sid))
        .unwrap();
    assert_eq!(original.len(), 5);
    assert_eq!(original[3].input, user_turn(6, 0, 3));
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abridge_fork_branches_a_session_and_inspect_names_the_parent_and_the_fork_point() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.db");
    {
        let store = Store::open(&path).unwrap();
        store
            .with_conn(abridge_testkit::demo_tables::create_demo_tables)
            .unwrap();
        let runner = common::demo_runner(&store, 7, Threshold::Tokens(1_500), None);
        let sid = common::demo_session(&runner, 7, 0).await;
        for t in 0..4 {
            runner
                .run_turn_at(sid, t, &user_turn(7, 0, t as u64))
                .await
                .unwrap();
        }
    }
    let parent = abridge_testkit::demo::session_external_id(7, 0);
    let out = common::abridge_cmd()
        .args(["fork", "--db"])
        .arg(&path)
        .args([
            "--session",
            &parent,
            "--at-turn",
            "2",
            "--as",
            "branch",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["session"], "branch");
    assert_eq!(v["parent"], parent.as_str());
    assert_eq!(v["at_turn"], 2);
    assert_eq!(v["next_turn"], 3);
    // A turn that is not completed (there is no turn 9) is refused, with the reason.
    let out = common::abridge_cmd()
        .args(["fork", "--db"])
        .arg(&path)
        .args(["--session", &parent, "--at-turn", "9", "--as", "other"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such turn"));
    let inspect = |key: &str| {
        let out = common::abridge_cmd()
            .args(["inspect", "--db"])
            .arg(&path)
            .arg(key)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(inspect("branch").contains(&format!("fork of {parent} (id 1) at turn 2")));
    assert!(inspect(&parent).contains("fork branch (id 2) at turn 2"));
    let out = common::abridge_cmd()
        .args(["verify", "--db"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
