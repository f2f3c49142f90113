//! Deleting sessions: the one exception to append-only history. A deleted
//! session's text leaves the file's bytes, every other session still
//! verifies and replays, a runner still on it is refused, a prune deletes
//! what its dry run lists, and a new store is private to its owner.

use crate::common;

use abridge::{Error, Store, Threshold};
use abridge_testkit::demo::{run_demo, user_turn, DemoOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn demo_store(dir: &Path, sessions: u64, turns: u64) -> PathBuf {
    let db = common::db_for(&dir.join("demo.db"));
    let opts = DemoOptions {
        db: db.clone(),
        sessions,
        turns,
        compact_at: Threshold::Tokens(2_000),
        owner: Some("erase-test".into()),
        background: false,
        ..DemoOptions::default()
    };
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(run_demo(&opts, |_| {}))
        .unwrap();
    db
}

fn file_bytes(db: &Path) -> Vec<u8> {
    common::stored_bytes(db)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn verify_and_replay(store: &Store) {
    store
        .with_conn(|c| {
            for id in abridge::inspect::executed_step_ids(c)? {
                assert!(abridge::replay::rebuild_step(c, id)?.matches(), "step {id}");
            }
            let r = abridge::verify::verify(c)?;
            assert!(r.ok, "{r:#?}");
            Ok(())
        })
        .unwrap();
}

/// After the delete (and its checkpoint) none of the session's own text is
/// in the database file or its WAL: inputs, summaries, its external id. The
/// other session verifies and replays step for step; the deletion is
/// recorded, and verify finds nothing of the session left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_sessions_text_is_gone_from_the_file_and_the_others_still_verify() {
    let dir = tempfile::tempdir().unwrap();
    let db = tokio::task::spawn_blocking({
        let d = dir.path().to_path_buf();
        move || demo_store(&d, 2, 16)
    })
    .await
    .unwrap();
    let store = Store::open(common::db_for(&db)).unwrap();
    // Text only session 0 holds: its inputs (not said in session 1) and summaries.
    let others: Vec<String> = (0..16).map(|t| user_turn(42, 1, t)).collect();
    let mut secrets: Vec<String> = (0..16)
        .map(|t| user_turn(42, 0, t))
        .filter(|i| !others.iter().any(|o| o == i))
        .collect();
    let summaries: Vec<String> = store
        .with_conn(|c| {
            let mut q = c.prepare(
                "SELECT c.summary FROM compactions c JOIN sessions s ON s.id = c.session_id \
                 WHERE s.external_id = 'demo-42-0' AND c.summary IS NOT NULL",
            )?;
            let v = q
                .query_map([], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            Ok(v)
        })
        .unwrap();
    assert!(!summaries.is_empty());
    secrets.extend(summaries.into_iter().map(|s| s.chars().take(60).collect()));
    secrets.push("demo-42-0".into());
    let before = file_bytes(&db);
    assert!(
        secrets.iter().all(|s| contains(&before, s)),
        "the test's strings are in the file"
    );

    let deleted = store.delete_session("demo-42-0").await.unwrap();
    assert_eq!(deleted.turns, 16);
    assert!(deleted.steps >= 16 && deleted.compactions >= 1 && deleted.pins >= 1);
    assert!(deleted.checkpointed);
    let after = file_bytes(&db);
    for s in &secrets {
        assert!(!contains(&after, s), "{s:?} is still in the file's bytes");
    }
    verify_and_replay(&store);
    let (erasures, gate): (i64, i64) = store
        .with_conn(|c| {
            c.query_row(
                "SELECT (SELECT count(*) FROM erasures), (SELECT count(*) FROM erasing)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap();
    assert_eq!((erasures, gate), (1, 0));
    // By its old row id it is known as deleted, not as never there.
    assert!(matches!(
        store.session(deleted.session_id).await,
        Err(Error::SessionDeleted { session_id }) if session_id == deleted.session_id
    ));
    // The schema still refuses any other delete.
    let refused = store.with_conn(|c| c.execute("DELETE FROM turns", []));
    assert!(refused.is_err());
    // VACUUM returns the space (of a file; on a server, to its tables).
    if common::on_postgres() {
        store.vacuum().await.unwrap();
    } else {
        let size = std::fs::metadata(&db).unwrap().len();
        store.vacuum().await.unwrap();
        assert!(std::fs::metadata(&db).unwrap().len() < size);
    }
    verify_and_replay(&store);
}

/// A new session or turn never takes the id of a deleted one (SQLite would
/// reuse the highest), so a runner still holding a deleted turn matches
/// nothing new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_of_deleted_rows_are_never_taken_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = tokio::task::spawn_blocking({
        let d = dir.path().to_path_buf();
        move || demo_store(&d, 2, 6)
    })
    .await
    .unwrap();
    let store = Store::open(common::db_for(&db)).unwrap();
    let max = |table: &'static str| {
        store
            .with_conn(move |c| {
                c.query_row(&format!("SELECT max(id) FROM {table}"), [], |r| {
                    r.get::<_, i64>(0)
                })
            })
            .unwrap()
    };
    let (turns, compactions) = (max("turns"), max("compactions"));
    // The newest session holds the highest ids.
    let newest = store
        .with_conn(|c| c.query_row("SELECT max(id) FROM sessions", [], |r| r.get::<_, i64>(0)))
        .unwrap();
    store
        .delete_session(abridge::SessionId(newest))
        .await
        .unwrap();
    // Then an older one: the floors recorded with it stay past the newest's.
    store
        .delete_session(abridge::SessionId(newest - 1))
        .await
        .unwrap();
    let runner = abridge_testkit::demo::demo_runner(
        &store,
        &DemoOptions {
            compact_at: Threshold::Tokens(500),
            owner: Some("after".into()),
            background: false,
            ..DemoOptions::default()
        },
    )
    .unwrap();
    let s = runner
        .create_session("new", abridge_testkit::demo::DEMO_MODEL, "sys")
        .await
        .unwrap();
    assert!(s.id.0 > newest);
    for t in 0..4 {
        runner.run_turn(s.id, &user_turn(7, 0, t)).await.unwrap();
    }
    let first_turn = store.turns(s.id).await.unwrap()[0].id.0;
    assert!(first_turn > turns, "{first_turn} <= {turns}");
    let first_compaction = store.compactions(s.id).await.unwrap()[0].id.0;
    assert!(first_compaction > compactions);
    verify_and_replay(&store);
}

/// A runner in another process working on the session when it is deleted
/// gets a typed error at its next write and writes nothing more; the
/// session is never seen half-deleted, and the other session is intact.
#[test]
fn a_delete_racing_a_running_turn_in_another_process_refuses_its_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::db_for(&dir.path().join("race.db"));
    let child = Command::new(env!("CARGO_BIN_EXE_abridge"))
        .args([
            "demo",
            "--db",
            db.to_str().unwrap(),
            "--sessions",
            "2",
            "--turns",
            "60",
        ])
        .args([
            "--model-latency",
            "20",
            "--compact-at",
            "2000",
            "--background",
            "off",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until session demo-42-0 is well under way.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the demo did not start"
        );
        let done = abridge::store::open_read_only(&db).ok().and_then(|c| {
            c.query_row(
                "SELECT count(*) FROM turns t JOIN sessions s ON s.id = t.session_id \
                 WHERE s.external_id = 'demo-42-0' AND t.status = 'completed'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .ok()
        });
        if done.unwrap_or(0) >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let store = Store::open(common::db_for(&db)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let deleted = rt.block_on(store.delete_session("demo-42-0")).unwrap();
    assert!(deleted.turns >= 3);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the demo went on: {stderr}");
    assert!(stderr.contains("deleted"), "{stderr}");
    // Nothing of the session came back, and the rest verifies.
    let left: i64 = store
        .with_conn(|c| {
            c.query_row(
                "SELECT (SELECT count(*) FROM turns WHERE session_id = ?1) \
                      + (SELECT count(*) FROM compactions WHERE session_id = ?1) \
                      + (SELECT count(*) FROM pins WHERE session_id = ?1) \
                      + (SELECT count(*) FROM sessions WHERE id = ?1)",
                [deleted.session_id],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert_eq!(left, 0);
    verify_and_replay(&store);
}

/// `prune` deletes exactly the sessions its dry run lists: those with no
/// turn begun within the age; a session active since is kept. Idleness is
/// by the store's clock, moved 600 ms past the demo's run without a sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_exactly_what_its_dry_run_lists() {
    let dir = tempfile::tempdir().unwrap();
    let db = tokio::task::spawn_blocking({
        let d = dir.path().to_path_buf();
        move || demo_store(&d, 3, 3)
    })
    .await
    .unwrap();
    let clock = abridge::ManualClock::starting_at(abridge::store::now_ms() + 600);
    let opts = abridge::StoreOptions::default().with_clock(std::sync::Arc::new(clock.clone()));
    let store = Store::open_with(common::db_for(&db), opts).unwrap();
    // Session demo-42-2 becomes active again.
    let runner = abridge_testkit::demo::demo_runner(
        &store,
        &DemoOptions {
            owner: Some("active".into()),
            background: false,
            ..DemoOptions::default()
        },
    )
    .unwrap();
    let active = store.session("demo-42-2").await.unwrap();
    runner
        .run_turn(active.id, &user_turn(42, 2, 3))
        .await
        .unwrap();
    let age = Duration::from_millis(400);
    let mut listed: Vec<String> = store
        .idle_sessions(age)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.external_id)
        .collect();
    listed.sort();
    assert_eq!(listed, ["demo-42-0", "demo-42-1"]);
    let mut deleted: Vec<String> = store
        .prune(age)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.external_id)
        .collect();
    deleted.sort();
    assert_eq!(deleted, listed);
    let left: Vec<String> = store
        .with_conn(|c| abridge::inspect::sessions(c))
        .unwrap()
        .into_iter()
        .map(|s| s.session.external_id)
        .collect();
    assert_eq!(left, ["demo-42-2"]);
    verify_and_replay(&store);
}

/// A new store, its WAL and its shared-memory file are readable by their
/// owner only; a file the host created keeps its mode.
#[cfg(unix)]
#[test]
fn a_new_store_is_private_and_an_existing_file_keeps_its_mode() {
    if common::on_postgres() {
        return; // a file's mode; a server's tables are the server's to guard
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let db = dir.path().join("new.db");
    let store = Store::open(common::db_for(&db)).unwrap();
    store
        .with_conn(|c| {
            c.execute_batch("CREATE TABLE host_notes (x); INSERT INTO host_notes VALUES (1);")?;
            Ok(())
        })
        .unwrap();
    assert_eq!(mode(&db), 0o600);
    for suffix in ["-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", db.display()));
        assert_eq!(mode(&p), 0o600, "{suffix}");
    }
    let shared = dir.path().join("shared.db");
    rusqlite::Connection::open(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    Store::open(common::db_for(&shared)).unwrap();
    assert_eq!(mode(&shared), 0o644);
}

/// `abridge delete` and `abridge prune` (its dry run too) as a user runs them.
#[test]
fn delete_and_prune_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_store(dir.path(), 3, 2);
    let d = db.to_str().unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_abridge"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    let out: serde_json::Value = serde_json::from_str(&run(&[
        "delete",
        "--db",
        d,
        "--session",
        "demo-42-1",
        "--json",
        "--vacuum",
    ]))
    .unwrap();
    assert_eq!(out["external_id"], "demo-42-1");
    assert_eq!(out["turns"], 2);
    // The demo's effects of the deleted session stay (they are the host's
    // rows); `abridge verify`, which checks them in G5, still holds.
    let text = run(&["verify", "--db", d]);
    assert!(text.contains("all guarantees hold"), "{text}");
    let dry: serde_json::Value = serde_json::from_str(&run(&[
        "prune",
        "--db",
        d,
        "--idle-for",
        "0s",
        "--dry-run",
        "--json",
    ]))
    .unwrap();
    assert_eq!(dry.as_array().unwrap().len(), 2);
    // Said for a person: how long idle, and since when (UTC), no raw ms.
    let said = run(&["prune", "--db", d, "--idle-for", "0s", "--dry-run"]);
    let listed: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("would delete"))
        .collect();
    assert_eq!(listed.len(), 2, "{said}");
    for line in listed {
        assert!(line.contains(", idle for "), "{line}");
        let since = line.rsplit("since ").next().unwrap();
        assert!(
            since.len() == 20 && since.ends_with('Z') && since.as_bytes()[10] == b'T',
            "{line}"
        );
        assert!(!line.ends_with(" ms"), "{line}");
    }
    let text = run(&["prune", "--db", d, "--idle-for", "0s"]);
    assert!(text.contains("2 sessions deleted"), "{text}");
    let again = Command::new(env!("CARGO_BIN_EXE_abridge"))
        .args(["delete", "--db", d, "--session", "demo-42-1"])
        .output()
        .unwrap();
    assert!(!again.status.success());
    let bad = Command::new(env!("CARGO_BIN_EXE_abridge"))
        .args(["prune", "--db", d, "--idle-for", "soon"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not an age"));
}

/// Deletes its session while the step is at the model, then answers.
struct DeletingModel {
    store: Store,
}

#[abridge::async_trait]
impl abridge::ModelClient for DeletingModel {
    async fn complete(
        &self,
        _req: &abridge::message::ModelRequest,
    ) -> Result<abridge::message::ModelResponse, abridge::ModelError> {
        self.store.delete_session("doomed").await.unwrap();
        Ok(abridge::message::ModelResponse {
            blocks: vec![abridge::message::ResponseBlock::Text {
                text: "Too late.".into(),
            }],
            ..Default::default()
        })
    }
}

/// A runner whose session is deleted under it learns so at its next write:
/// the turn is gone (`TurnDeleted`), not taken over by another holder
/// (`LeaseLost`, which a host would wait out and retry). On PostgreSQL the
/// lease check is queued, and the two are told apart after the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_on_a_deleted_turn_is_turn_deleted_not_a_lost_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(&dir.path().join("doomed.db"));
    let runner = abridge::Runner::builder(
        store.clone(),
        std::sync::Arc::new(DeletingModel {
            store: store.clone(),
        }),
    )
    .config(common::test_config(Threshold::Off, None, "doomed"))
    .build()
    .unwrap();
    let s = runner.create_session("doomed", "m", "sys").await.unwrap();
    let out = runner.run_turn(s.id, "hello").await;
    assert!(
        matches!(out, Err(Error::TurnDeleted { .. })),
        "{:?}",
        out.map(|o| o.output)
    );
}
