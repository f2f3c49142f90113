//! Opening files: a fresh file, a newer schema, a non-database, a foreign database.

use abridge::{Error, Store};

fn tmp() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x.db");
    (d, p)
}

#[test]
fn fresh_file_gets_the_schema_and_its_version() {
    let (_d, p) = tmp();
    let store = Store::open(&p).unwrap();
    let (v, tables): (i64, i64) = store
        .with_conn(|c| {
            let v = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            let t = c.query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN \
                 ('sessions','turns','steps','tool_invocations','compactions')",
                [],
                |r| r.get(0),
            )?;
            Ok((v, t))
        })
        .unwrap();
    assert_eq!((v, tables), (abridge::store::SCHEMA_VERSION, 5));
    // Opening again is a no-op.
    drop(store);
    Store::open(&p).unwrap();
}

#[test]
fn newer_schema_version_is_refused_naming_both_versions() {
    let (_d, p) = tmp();
    drop(Store::open(&p).unwrap());
    let c = rusqlite::Connection::open(&p).unwrap();
    c.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(c);
    let err = Store::open(&p).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SchemaTooNew {
                found: 99,
                supported: abridge::store::SCHEMA_VERSION
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("99") && msg.contains(&format!("({})", abridge::store::SCHEMA_VERSION)),
        "{msg}"
    );
    assert!(matches!(
        abridge::store::open_read_only(&p),
        Err(Error::SchemaTooNew { .. })
    ));
}

#[test]
fn non_database_file_is_refused_and_left_untouched() {
    let (_d, p) = tmp();
    let content =
        b"this is not a database, just some text that is long enough to look like a header....."
            .repeat(20);
    std::fs::write(&p, &content).unwrap();
    let err = Store::open(&p).unwrap_err();
    assert!(matches!(err, Error::NotADatabase { .. }), "{err}");
    assert_eq!(std::fs::read(&p).unwrap(), content);
    assert!(matches!(
        abridge::store::open_read_only(&p),
        Err(Error::NotADatabase { .. })
    ));
}

#[test]
fn foreign_sqlite_database_is_refused() {
    let (_d, p) = tmp();
    let c = rusqlite::Connection::open(&p).unwrap();
    c.execute_batch("CREATE TABLE notes (x TEXT); INSERT INTO notes VALUES ('keep me');")
        .unwrap();
    drop(c);
    assert!(matches!(
        Store::open(&p),
        Err(Error::ForeignDatabase { .. })
    ));
    let c = rusqlite::Connection::open(&p).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn read_only_open_of_a_missing_file_does_not_create_it() {
    let (_d, p) = tmp();
    assert!(matches!(
        abridge::store::open_read_only(&p),
        Err(Error::NotFound { .. })
    ));
    assert!(!p.exists());
}

/// Regression: several processes opening one new file at once saw "database is
/// locked" (the switch to WAL fails without the busy handler) or a half-read
/// header taken for a foreign database (version and tables read in two snapshots).
#[test]
fn concurrent_first_opens_of_a_new_file_all_succeed() {
    for round in 0..30 {
        let (_d, p) = tmp();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
        let handles: Vec<_> = (0..6)
            .map(|_| {
                let (p, b) = (p.clone(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    let store = Store::open(&p)?;
                    store.with_conn(abridge_testkit::demo_tables::create_demo_tables)
                })
            })
            .collect();
        for h in handles {
            let r = h.join().unwrap();
            assert!(r.is_ok(), "round {round}: {:?}", r.err());
        }
    }
}

#[test]
fn a_version_stamp_without_abridge_tables_is_refused_and_left_untouched() {
    let (_d, p) = tmp();
    let c = rusqlite::Connection::open(&p).unwrap();
    c.execute_batch("PRAGMA user_version = 1").unwrap();
    drop(c);
    let before = std::fs::read(&p).unwrap();
    let err = Store::open(&p).unwrap_err();
    assert!(matches!(err, Error::ForeignDatabase { .. }), "{err}");
    assert_eq!(std::fs::read(&p).unwrap(), before);
}

/// Copies the version-1 golden store (written by the build of schema 1).
fn version_one_store() -> (tempfile::TempDir, std::path::PathBuf) {
    let (d, p) = tmp();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden-v1.db");
    std::fs::copy(fixture, &p).unwrap();
    (d, p)
}

fn counts(c: &abridge::store::Connection) -> Vec<i64> {
    [
        "sessions",
        "turns",
        "steps",
        "tool_invocations",
        "compactions",
    ]
    .iter()
    .map(|t| {
        c.query_row(&format!("SELECT count(*) FROM {t}"), [], |r| r.get(0))
            .unwrap()
    })
    .collect()
}

#[test]
fn a_version_one_store_is_migrated_to_the_current_version_keeping_every_row() {
    let (_d, p) = version_one_store();
    let before = counts(&rusqlite::Connection::open(&p).unwrap().into());
    let store = Store::open(&p).unwrap();
    let (v, after, formats) = store
        .with_conn(|c| {
            let v: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            let f: Vec<i64> = c
                .prepare("SELECT DISTINCT render_format FROM steps")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            Ok((v, counts(c), f))
        })
        .unwrap();
    assert_eq!(v, abridge::store::SCHEMA_VERSION);
    assert_eq!(after, before);
    // Steps executed before version 2 keep the renderer they were hashed with.
    assert_eq!(formats, vec![1]);
}

/// G6 by the schema: history rows are never deleted, and rows in a final
/// status never change, except the one documented transition (a failed
/// compaction re-armed).
#[test]
fn g6_the_schema_refuses_deleting_history_and_changing_finished_rows() {
    let (_d, p) = version_one_store();
    drop(Store::open(&p).unwrap());
    let c = rusqlite::Connection::open(&p).unwrap();
    let refused = |sql: &str| {
        let err = c.execute_batch(sql).expect_err(sql).to_string();
        assert!(err.contains("abridge:"), "{sql}: {err}");
    };
    for t in [
        "sessions",
        "turns",
        "steps",
        "tool_invocations",
        "compactions",
    ] {
        refused(&format!(
            "DELETE FROM {t} WHERE id = (SELECT min(id) FROM {t})"
        ));
    }
    refused("UPDATE turns SET output = 'changed' WHERE status = 'completed'");
    refused("UPDATE turns SET status = 'running' WHERE status = 'failed'");
    refused("UPDATE steps SET response = '{}' WHERE status = 'completed'");
    refused("UPDATE tool_invocations SET result = 'x' WHERE status = 'completed'");
    refused("UPDATE compactions SET summary = 'x' WHERE status = 'completed'");
    refused("UPDATE sessions SET system_prompt = 'x'");
    refused("UPDATE turns SET input = 'x' WHERE id = (SELECT min(id) FROM turns)");
    // The documented transition: a failed compaction is re-armed.
    c.execute_batch(
        "INSERT INTO compactions (session_id, up_to_turn_index, up_to_turn_id, status, trigger, \
         created_at) SELECT session_id, 7, id, 'failed', 'manual', 0 FROM turns \
         WHERE idx = 7 AND session_id = 1; \
         UPDATE compactions SET status = 'pending', lease_owner = NULL, lease_expires_at = 0 \
         WHERE up_to_turn_index = 7 AND session_id = 1",
    )
    .unwrap();
    assert_eq!(
        counts(&rusqlite::Connection::open(&p).unwrap().into())[4],
        9
    );
    // Pins: never deleted, never changed, marked superseded once.
    c.execute_batch(
        "INSERT INTO pins (session_id, turn_index, kind, slot, value, sentence, source, created_at) \
         VALUES (1, 0, 'stated', 'size', 'M', 'my size is M', 'user', 0), \
                (1, 1, 'stated', 'size', 'L', 'my size is L', 'user', 0)",
    )
    .unwrap();
    let (m, l): (i64, i64) = c
        .query_row(
            "SELECT min(id), max(id) FROM pins WHERE slot = 'size'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    refused(&format!("DELETE FROM pins WHERE id = {m}"));
    refused(&format!("UPDATE pins SET value = 'S' WHERE id = {m}"));
    refused(&format!(
        "UPDATE pins SET superseded_by = {l} WHERE id = {m}"
    ));
    c.execute_batch(&format!(
        "UPDATE pins SET superseded_by = {l}, superseded_at = 1 WHERE id = {m}"
    ))
    .unwrap();
    refused(&format!(
        "UPDATE pins SET superseded_by = {m}, superseded_at = 0 WHERE id = {m}"
    ));
}

#[test]
fn a_directory_or_a_fifo_is_refused_at_once_and_left_untouched() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    let err = Store::open(&dir).unwrap_err();
    assert!(matches!(err, Error::NotADatabase { .. }), "{err}");
    assert!(matches!(
        abridge::store::open_read_only(&dir),
        Err(Error::NotADatabase { .. })
    ));
    #[cfg(unix)]
    {
        let fifo = d.path().join("a-fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            // Would block for ever if SQLite opened it.
            let err = Store::open(&fifo).unwrap_err();
            assert!(matches!(err, Error::NotADatabase { .. }), "{err}");
        }
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

#[tokio::test]
async fn a_blank_session_id_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path().join("x.db")).unwrap();
    let runner = abridge::Runner::builder(store, std::sync::Arc::new(NoModel))
        .build()
        .unwrap();
    for blank in ["", "   ", "\t\n"] {
        let err = runner
            .create_session(blank, "gpt-4o", "s")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{blank:?}: {err}");
    }
}

struct NoModel;

#[abridge::async_trait]
impl abridge::ModelClient for NoModel {
    async fn complete(
        &self,
        _: &abridge::ModelRequest,
    ) -> Result<abridge::ModelResponse, abridge::ModelError> {
        Err(abridge::ModelError::Permanent("no model".into()))
    }
}

/// A store made and closed. The pool's last connection closes on its worker
/// thread a moment after the `Store` is dropped (and the last one to close
/// removes the -wal file): wait for that, up to 10 s.
fn closed_store() -> (tempfile::TempDir, std::path::PathBuf) {
    let (d, p) = tmp();
    drop(Store::open(&p).unwrap());
    let wal = std::path::PathBuf::from(format!("{}-wal", p.display()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while wal.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!wal.exists(), "the store's connections did not close");
    (d, p)
}

fn session_count(c: &abridge::store::Connection) -> abridge::Result<i64> {
    c.query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))
}

fn add_session(c: &rusqlite::Connection, external_id: &str) {
    c.execute(
        "INSERT INTO sessions (external_id, model, system_prompt, created_at) \
         VALUES (?1, 'm', 's', 0)",
        [external_id],
    )
    .unwrap();
}

#[test]
fn a_read_only_snapshot_of_a_closed_store_leaves_no_side_file() {
    let (_d, p) = closed_store();
    let w = rusqlite::Connection::open(&p).unwrap();
    add_session(&w, "a");
    drop(w);
    let wal = format!("{}-wal", p.display());
    let shm = format!("{}-shm", p.display());
    assert!(!std::path::Path::new(&wal).exists());
    let n = abridge::store::read_only(&p, session_count).unwrap();
    assert_eq!(n, 1);
    assert!(!std::path::Path::new(&wal).exists());
    assert!(!std::path::Path::new(&shm).exists());
}

/// Runs a snapshot read during which another connection commits and
/// checkpoints into the main file. `keep_writer`: that writer stays open (its
/// -wal keeps the frames: the -wal rule must catch it whatever the clock);
/// otherwise it truncates the -wal and closes (the file's stamp must catch
/// it: the modification time is set far back first, so the change shows
/// whatever the clock's granularity).
fn snapshot_with_a_writer_meanwhile(keep_writer: bool) {
    let (_d, p) = closed_store();
    if !keep_writer {
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1))
            .unwrap();
    }
    let mut calls = 0;
    let mut writer = None;
    let n = abridge::store::read_only(&p, |c| {
        calls += 1;
        let n = session_count(c)?;
        if calls == 1 {
            // The snapshot holds no lock: the writer is not blocked.
            let w = rusqlite::Connection::open(&p).unwrap();
            add_session(&w, "late");
            if keep_writer {
                w.execute_batch("PRAGMA wal_checkpoint(PASSIVE)").unwrap();
                writer = Some(w);
            } else {
                w.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
            }
        }
        Ok(n)
    })
    .unwrap();
    assert_eq!(calls, 2, "the changed file was not read again");
    assert_eq!(n, 1, "the second read sees the committed row");
    drop(writer);
}

#[test]
fn a_read_only_snapshot_reads_again_when_a_writer_checkpoints_and_closes() {
    snapshot_with_a_writer_meanwhile(false);
}

#[test]
fn a_read_only_snapshot_reads_again_when_a_writer_is_still_open() {
    snapshot_with_a_writer_meanwhile(true);
}

#[test]
fn a_read_only_snapshot_reads_a_live_writers_wal() {
    let (_d, p) = tmp();
    drop(Store::open(&p).unwrap());
    let w = rusqlite::Connection::open(&p).unwrap();
    w.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
    add_session(&w, "in-the-wal");
    assert!(std::path::Path::new(&format!("{}-wal", p.display())).exists());
    let n = abridge::store::read_only(&p, session_count).unwrap();
    assert_eq!(n, 1);
    drop(w);
}

/// Regression: the benchmarks keep the history fixed by dropping each
/// measured turn; the append-only triggers of schema 2 refused it, and
/// `cargo bench --bench step` panicked. The bench truncation lifts the
/// delete guards for its own transaction only.
#[test]
fn the_bench_truncation_removes_turns_and_leaves_the_guards_in_place() {
    use abridge_testkit::seed::{seed_history, truncate_from, SeedShape};
    let (_d, p) = tmp();
    let store = Store::open(&p).unwrap();
    let count_turns = |store: &Store| -> i64 {
        store
            .with_conn(|c| c.query_row("SELECT count(*) FROM turns", [], |r| r.get(0)))
            .unwrap()
    };
    let triggers = |store: &Store| -> Vec<String> {
        store
            .with_conn(|c| {
                let mut st = c.prepare(
                    "SELECT sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name",
                )?;
                let v = st.query_map([], |r| r.get(0))?;
                Ok(v.collect::<rusqlite::Result<Vec<String>>>()?)
            })
            .unwrap()
    };
    let before = triggers(&store);
    let sid = store
        .with_conn(|c| {
            Ok(abridge::SessionId(c.query_row(
                "INSERT INTO sessions (external_id, model, system_prompt, created_at) \
                 VALUES ('b', 'm', 's', 0) RETURNING id",
                [],
                |r| r.get(0),
            )?))
        })
        .unwrap();
    let shape = SeedShape {
        turns: 10,
        tool_result_bytes: vec![100],
        compact_every: Some(4),
        tool_steps: 1,
    };
    store.with_conn(|c| seed_history(c, sid, &shape)).unwrap();
    assert_eq!(count_turns(&store), 10);
    store.with_conn(|c| truncate_from(c, sid, 6)).unwrap();
    assert_eq!(count_turns(&store), 6);
    assert_eq!(triggers(&store), before, "the guards are back as they were");
    // And they still guard.
    let refused = store.with_conn(|c| c.execute("DELETE FROM turns", []));
    assert!(refused.is_err());
    store
        .with_conn(abridge_testkit::seed::clear_compactions)
        .unwrap();
    let left: i64 = store
        .with_conn(|c| c.query_row("SELECT count(*) FROM compactions", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(left, 0);
    assert_eq!(triggers(&store), before);
}

/// Every shipped schema file, pinned by its SHA-256: a migration that has
/// shipped is never edited (stores at its version already ran it), and a new
/// one is added here with its hash when it ships. The list also names every
/// migration of `MIGRATIONS`, so one cannot be added without its pin.
#[test]
#[cfg(feature = "postgres")]
fn shipped_migrations_are_never_edited() {
    use abridge::store::{MIGRATIONS, SCHEMA_PG_SQL, SCHEMA_SQL};
    let pinned: &[(&str, &str)] = &[
        (
            "schema.sql (v1)",
            "9bbc4990355ed6b8780220a7dae2b4068340721a2677717c8e83c16949338231",
        ),
        (
            "v2",
            "a7076bd8a6d842b81b59e41f15b872f2919f033640530367cc4a5d02c1bc5d7d",
        ),
        (
            "v3",
            "0a2bf715c900297b15d9abaa4bd6e5945c1bdb732fb648c12192bdd76e7061fc",
        ),
        (
            "v4",
            "37a63e32f41e566f3c37428db80684198136d506fe9af3ec20e61bc4b66942a7",
        ),
        (
            "v5",
            "0294447d8ee16204eaf3d99d43c2c7257f8515a3252f8b04df626107d9d9906f",
        ),
        (
            "v6",
            "59edab57ba3098e12db24bbc224b4eaa09a1ed18a64d4bd39ec489d5fff14eb3",
        ),
        (
            "v7",
            "4cec86ec8899cd3dd4c88d2ae4ddf4c264cb13bb27df902053da2fc36df80a54",
        ),
        (
            "v8",
            "bc86c660ee4edca1898251c6df43e590563d7481cbb9c572f5869bf2b4f7f94d",
        ),
        (
            "v8 (PostgreSQL)",
            "b5c0d43b13a07282d6d8729f77ada3e0c8832ebe629e269aca1cfb68065a6b00",
        ),
        (
            "v9",
            "87e7962581726841923b0070b8f25aedcc05764cdf1aaa7d9b64a7e4f57db123",
        ),
        (
            "v9 (PostgreSQL)",
            "f81087b06de4be009d714e7e27126c3193cbc4edca0b1343101ec1ba075ad4bd",
        ),
        (
            "v10",
            "d72167924127b6bf66f0d512cad38bd3c3acde4ab29fd3b74536703cabac47d2",
        ),
        (
            "v10 (PostgreSQL)",
            "7a99ee163e59028208ebc2b0d1a9eea32791d40ca067f644c4b9d00db7902461",
        ),
        (
            "v11",
            "1c66189144f4f43ad9b0ed63978da6d520f08aaba1b4efc48e0f4861a36f9a2c",
        ),
        (
            "v11 (PostgreSQL)",
            "c7f4cb4476f43b798a688755ab8f352bc2cd5051b0e51ae45b521b0783f4de55",
        ),
        (
            "v12",
            "77b12db861ca0ba05023c630f078873378aaefc4a6ad1397a49f85fd57fa4f45",
        ),
        (
            "v12 (PostgreSQL)",
            "a0619154e731e4d0c7acc3004f6c5854b51be16236732de5d260ad6e663a7e17",
        ),
        (
            "v13",
            "b59b3ad1ed56ebe5890b0dc2eeef090892c1c3fef3d821c5d442d6739fd6b1bf",
        ),
        (
            "v13 (PostgreSQL)",
            "e24c01f540af0f895fbde275d427c7903f99e95a2e365ba4621c04f2072608f7",
        ),
        (
            "v14",
            "bcf28e7281f88255136281bdd82ed8a2aaee87df9b3b4d7ab221d493a2a4c7a2",
        ),
        (
            "v14 (PostgreSQL)",
            "cd36dba8dd441d6e193ea47d051e31bfedfb1bc019a17ecd9de960e563a3bb51",
        ),
        (
            "v15",
            "6ffaf1116fdaa0736a1e3896ecda06e10a2a736c3e76269ffbb049f6c9a5fa42",
        ),
        (
            "v15 (PostgreSQL)",
            "1a2704bb48a7a32b1d734aec64a4c779d973280245c37a57586912ba7a38cb23",
        ),
        (
            "schema_pg.sql (PostgreSQL baseline)",
            "519649a80dc5008c7aaf8accd7cbd44adef54017a733e0f51b46d9e4e4fdfcaa",
        ),
    ];
    let sha = |s: &str| abridge::message::sha256_hex(s.as_bytes());
    let mut got = vec![("schema.sql (v1)".to_string(), sha(SCHEMA_SQL))];
    for m in MIGRATIONS {
        got.push((format!("v{}", m.version), sha(m.sqlite)));
        if let Some(pg) = m.postgres {
            got.push((format!("v{} (PostgreSQL)", m.version), sha(pg)));
        }
    }
    got.push((
        "schema_pg.sql (PostgreSQL baseline)".into(),
        sha(SCHEMA_PG_SQL),
    ));
    let want: Vec<(String, String)> = pinned
        .iter()
        .map(|(n, h)| (n.to_string(), h.to_string()))
        .collect();
    assert_eq!(
        got, want,
        "a shipped schema file changed, or a new one has no pin"
    );
}

/// Version 14 spells out the columns' checks of a list of three or more
/// values (SQLite built a temporary b-tree of the list at every row written)
/// on a new store and on one migrated from version 13, and each still
/// refuses a value outside its list and takes one inside it.
#[test]
fn version_14_spells_out_the_listed_checks_and_they_still_refuse() {
    let listed = [
        ("turns", "status"),
        ("steps", "status"),
        ("compactions", "status"),
        ("tool_invocations", "status"),
        ("tool_invocations", "effect"),
        ("pins", "source"),
        ("pins", "windowed"),
        ("approvals", "status"),
        ("approvals", "effect"),
    ];
    let fresh = tmp();
    let old = tmp();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden-v13.db");
    std::fs::copy(fixture, &old.1).unwrap();
    for path in [&fresh.1, &old.1] {
        drop(Store::open(path).unwrap());
        let c = rusqlite::Connection::open(path).unwrap();
        let v: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, abridge::store::SCHEMA_VERSION);
        for (table, column) in listed {
            let sql: String = c
                .query_row(
                    "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                    [table],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(
                !sql.contains(&format!("{column} IN (")) && sql.contains(&format!("{column} = ")),
                "{}: {table}.{column} kept its list: {sql}",
                path.display()
            );
        }
        // The schema as a whole still reads back whole.
        let ok: String = c.query_row("PRAGMA quick_check", [], |r| r.get(0)).unwrap();
        assert_eq!(ok, "ok");
        if path == &fresh.1 {
            c.execute_batch(
                "INSERT INTO sessions (id, external_id, model, system_prompt, created_at) \
                 VALUES (1, 's', 'm', '', 0)",
            )
            .unwrap();
        }
        let turn = |status: &str, idx: i64| {
            c.execute(
                "INSERT INTO turns (session_id, idx, input, status, created_at) \
                 VALUES ((SELECT min(id) FROM sessions), ?1, 'x', ?2, 0)",
                rusqlite::params![idx, status],
            )
        };
        let err = turn("bogus", 100_000).unwrap_err().to_string();
        assert!(err.contains("CHECK constraint failed"), "{err}");
        turn("failed", 100_001).unwrap();
        let step = |status: &str, idx: i64| {
            c.execute(
                "INSERT INTO steps (turn_id, idx, status, created_at) \
                 VALUES ((SELECT max(id) FROM turns), ?1, ?2, 0)",
                rusqlite::params![idx, status],
            )
        };
        let err = step("bogus", 0).unwrap_err().to_string();
        assert!(err.contains("CHECK constraint failed"), "{err}");
        step("responded", 0).unwrap();
    }
}
