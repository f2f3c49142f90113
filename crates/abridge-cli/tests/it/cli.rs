//! Every verb run as a process against a database made by the demo.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_abridge");

fn abridge(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = abridge(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs and expects a failure with one clear line on stderr, no panic.
fn fails(args: &[&str], needle: &str) -> String {
    let out = abridge(args);
    assert!(!out.status.success(), "{args:?} should fail");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains(needle), "{args:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    err
}

fn demo_db(dir: &Path) -> PathBuf {
    let db = dir.join("demo.db");
    let out = ok(&[
        "demo",
        "--db",
        db.to_str().unwrap(),
        "--sessions",
        "2",
        "--turns",
        "12",
        "--compact-at",
        "1500",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["turns"], 24);
    assert!(
        report["compactions_completed"].as_i64().unwrap() >= 2,
        "{report}"
    );
    db
}

/// Tampering as someone with write access to the file would: the schema's
/// append-only triggers dropped first.
fn tamper(db: &Path, statement: &str) {
    let c = rusqlite::Connection::open(db).unwrap();
    let names: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    for n in names {
        c.execute_batch(&format!("DROP TRIGGER {n}")).unwrap();
    }
    c.execute_batch(statement).unwrap();
}

fn sql(db: &Path, statement: &str) {
    rusqlite::Connection::open(db)
        .unwrap()
        .execute_batch(statement)
        .unwrap();
}

#[test]
fn demo_completes_and_compacts_and_verify_passes() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let out = ok(&["verify", "--db", db.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["checks"].as_array().unwrap().len(), 12);
    let text = ok(&["verify", "--db", db.to_str().unwrap()]);
    assert!(text.contains("all guarantees hold"));
}

#[test]
fn replay_raw_hashes_to_the_recorded_value_for_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let conn = abridge::store::open_read_only(&db).unwrap();
    let steps = abridge::inspect::executed_step_ids(&conn).unwrap();
    assert!(steps.len() > 40);
    for id in steps {
        let recorded: String = conn
            .query_row(
                "SELECT messages_sha256 FROM steps WHERE id = ?1",
                [id],
                |r| r.get(0),
            )
            .unwrap();
        let out = abridge(&[
            "replay",
            "--db",
            db.to_str().unwrap(),
            "--step",
            &id.to_string(),
            "--raw",
        ]);
        assert!(out.status.success());
        assert_eq!(
            abridge::message::sha256_hex(&out.stdout),
            recorded,
            "step {id}"
        );
    }
    let pretty = ok(&["replay", "--db", db.to_str().unwrap(), "--step", "1"]);
    assert!(pretty.trim_end().ends_with("match"));
}

#[test]
fn verify_names_a_changed_summary() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    // A compaction some step read (with background compaction, the newest
    // row of a session may have completed after its last step).
    tamper(&db, "UPDATE compactions SET summary = summary || ' (edited)' WHERE id = (SELECT min(compaction_id) FROM steps)");
    let out = abridge(&["verify", "--db", db.to_str().unwrap()]);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("FAIL G2") && text.contains("summary changed after completion"),
        "{text}"
    );
    assert!(text.contains("FAIL G3"), "{text}");
}

#[test]
fn verify_names_a_duplicated_effect() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    sql(&db, "INSERT INTO demo_effects (idempotency_key, tool, arguments) SELECT idempotency_key, tool, arguments FROM demo_effects LIMIT 1");
    let out = abridge(&["verify", "--db", db.to_str().unwrap(), "--json"]);
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let g5 = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str().unwrap().starts_with("G5"))
        .unwrap();
    assert_eq!(g5["ok"], false);
    assert!(
        g5["violations"][0]
            .as_str()
            .unwrap()
            .contains("applied 2 times"),
        "{g5}"
    );
}

#[test]
fn verify_names_a_step_pointing_at_a_pending_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    tamper(
        &db,
        "INSERT INTO compactions (session_id, up_to_turn_index, up_to_turn_id, status, trigger, created_at) \
         VALUES (1, 900, 1, 'pending', 'auto', 0); \
         UPDATE steps SET compaction_id = last_insert_rowid() WHERE id = (SELECT max(id) FROM steps);",
    );
    let out = abridge(&["verify", "--db", db.to_str().unwrap()]);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("FAIL G4") && text.contains("which is pending"),
        "{text}"
    );
}

#[test]
fn read_only_verbs_never_modify_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    // Checkpoint so the main file holds everything, then snapshot it.
    sql(&db, "PRAGMA wal_checkpoint(TRUNCATE)");
    let before = std::fs::read(&db).unwrap();
    let d = db.to_str().unwrap();
    ok(&["inspect", "--db", d]);
    ok(&["inspect", "--db", d, "demo-42-0", "--json"]);
    ok(&["replay", "--db", d, "--step", "3"]);
    ok(&[
        "export",
        "--db",
        d,
        "--session",
        "demo-42-1",
        "--format",
        "jsonl",
    ]);
    ok(&["verify", "--db", d]);
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn export_has_the_full_transcript_with_compaction_points() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let d = db.to_str().unwrap();
    let jsonl = ok(&[
        "export",
        "--db",
        d,
        "--session",
        "demo-42-0",
        "--format",
        "jsonl",
    ]);
    let kinds: Vec<String> = jsonl
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "user").count(),
        12,
        "every turn, compacted or not"
    );
    assert!(kinds.iter().any(|k| k == "compaction"));
    assert!(kinds.iter().any(|k| k == "tool_result"));
    let md = ok(&["export", "--db", d, "--session", "demo-42-0"]);
    assert!(md.contains("## Turn 0") && md.contains("**Compaction up to turn"));
}

#[test]
fn manual_compact_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    ok(&[
        "demo",
        "--db",
        db.to_str().unwrap(),
        "--sessions",
        "1",
        "--turns",
        "6",
        "--compact-at",
        "off",
        "--json",
    ]);
    // The preview says what it would fold as a person reads it (no range
    // syntax, no id the user never saw).
    let preview = ok(&[
        "compact",
        "--db",
        db.to_str().unwrap(),
        "--session",
        "demo-42-0",
        "--dry-run",
    ]);
    assert!(
        preview.contains("would fold turns 0 to 5 into one summary"),
        "{preview}"
    );
    assert!(!preview.contains("..="), "{preview}");
    let out = ok(&[
        "compact",
        "--db",
        db.to_str().unwrap(),
        "--session",
        "demo-42-0",
        "--focus",
        "order numbers",
    ]);
    assert!(out.contains("up to turn 5: completed"), "{out}");
    let detail = ok(&[
        "inspect",
        "--db",
        db.to_str().unwrap(),
        "demo-42-0",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(v["compactions"][0]["trigger"], "manual");
    assert_eq!(v["compactions"][0]["focus"], "order numbers");
}

#[test]
fn bad_input_exits_non_zero_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let m = missing.to_str().unwrap();
    for verb in [
        vec!["inspect", "--db", m],
        vec!["verify", "--db", m],
        vec!["replay", "--db", m, "--step", "1"],
        vec!["export", "--db", m, "--session", "x"],
        vec!["compact", "--db", m, "--session", "x"],
    ] {
        fails(&verb, "no database at");
    }
    assert!(!missing.exists(), "a read verb created the file");

    let text = dir.path().join("notes.txt");
    std::fs::write(
        &text,
        "hello, I am not a database at all, just text.".repeat(50),
    )
    .unwrap();
    fails(
        &["inspect", "--db", text.to_str().unwrap()],
        "not an abridge database",
    );

    let db = demo_db(dir.path());
    let d = db.to_str().unwrap();
    fails(
        &["inspect", "--db", d, "no-such-session"],
        "unknown session no-such-session",
    );
    fails(
        &["replay", "--db", d, "--step", "999999"],
        "unknown step 999999",
    );
    fails(
        &[
            "export",
            "--db",
            d,
            "--session",
            "demo-42-0",
            "--format",
            "pdf",
        ],
        "unknown format",
    );
    fails(
        &["demo", "--db", d, "--compact-at", "1.5"],
        "invalid configuration",
    );

    let newer = dir.path().join("newer.db");
    std::fs::copy(&db, &newer).unwrap();
    let too_new = abridge::store::SCHEMA_VERSION + 1;
    sql(&newer, &format!("PRAGMA user_version = {too_new}"));
    fails(
        &["verify", "--db", newer.to_str().unwrap()],
        &format!(
            "schema version {too_new} is newer than this build supports ({})",
            abridge::store::SCHEMA_VERSION
        ),
    );
}

#[test]
fn every_verb_has_help_with_an_example() {
    // Every verb `abridge --help` lists (the worker verbs the harness runs
    // itself are hidden from it).
    let top = ok(&["--help"]);
    let verbs: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|v| *v != "help")
        .collect();
    assert!(verbs.len() >= 15, "{verbs:?}");
    for verb in verbs {
        let out = ok(&[verb, "--help"]);
        assert!(out.contains("Example"), "{verb}: {out}");
    }
}

#[test]
fn chaos_refuses_to_replace_a_file_it_did_not_make() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "my notes").unwrap();
    let demo = demo_db(dir.path());
    let demo_bytes = std::fs::read(&demo).unwrap();
    for path in [&text, &demo] {
        fails(
            &["chaos", "--db", path.to_str().unwrap(), "--kills", "1"],
            "refusing to replace",
        );
    }
    assert_eq!(std::fs::read_to_string(&text).unwrap(), "my notes");
    assert_eq!(std::fs::read(&demo).unwrap(), demo_bytes);
}

#[test]
fn a_closed_pipe_ends_export_quietly() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let mut child = Command::new(BIN)
        .args([
            "export",
            "--db",
            db.to_str().unwrap(),
            "--session",
            "demo-42-0",
        ])
        .args(["--format", "markdown"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is gone (as `| head -1` leaves it).
    let out = child.wait_with_output().unwrap();
    assert!(!first.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.is_empty(), "{err}");
}

/// The read verbs, each as the user runs it on the demo's store.
fn read_verbs(d: &str) -> Vec<Vec<String>> {
    [
        vec!["inspect", "--db", d],
        vec!["inspect", "--db", d, "demo-42-0"],
        vec!["replay", "--db", d, "--step", "3"],
        vec!["export", "--db", d, "--session", "demo-42-1"],
        vec!["verify", "--db", d],
    ]
    .into_iter()
    .map(|v| v.into_iter().map(String::from).collect())
    .collect()
}

/// Regression: the read-only verbs read a store of an older schema with this
/// build's queries and reported every step as a G3 violation ("no such
/// column"). They now refuse it in one line naming `abridge upgrade`, which
/// migrates it (keeping every row); then they read it.
#[test]
fn read_only_verbs_refuse_an_older_store_until_it_is_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("old.db");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden-v2.db");
    std::fs::copy(&fixture, &db).unwrap();
    let d = db.to_str().unwrap();
    let before = std::fs::read(&db).unwrap();
    for verb in [
        vec!["inspect", "--db", d],
        vec!["replay", "--db", d, "--step", "3"],
        vec!["export", "--db", d, "--session", "id:1"],
        vec!["verify", "--db", d],
        vec!["report", "--db", d, "--session", "id:1"],
    ] {
        fails(&verb, "abridge upgrade --db");
    }
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "a read-only verb wrote"
    );
    let out = ok(&["upgrade", "--db", d]);
    let v = abridge::store::SCHEMA_VERSION;
    assert!(out.contains(&format!("schema version 2 -> {v}")), "{out}");
    let out = ok(&["upgrade", "--db", d]);
    assert!(
        out.contains(&format!("already at schema version {v}")),
        "{out}"
    );
    let out = ok(&["verify", "--db", d]);
    assert!(out.contains("all guarantees hold"), "{out}");
}

fn side_files(db: &Path) -> Vec<PathBuf> {
    ["-wal", "-shm", "-journal"]
        .iter()
        .map(|s| PathBuf::from(format!("{}{s}", db.display())))
        .filter(|p| p.exists())
        .collect()
}

#[test]
fn read_only_verbs_create_no_wal_or_shm_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    // The demo's process closed its store: normally no side file is left
    // (the last connection to close removes them).
    let before = side_files(&db);
    for verb in read_verbs(db.to_str().unwrap()) {
        let args: Vec<&str> = verb.iter().map(String::as_str).collect();
        ok(&args);
        assert_eq!(side_files(&db), before, "{args:?}");
    }
    // With a writer open whose -wal was checkpointed and truncated: the
    // readers read the main file and add nothing.
    let w = rusqlite::Connection::open(&db).unwrap();
    w.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    let before = side_files(&db);
    for verb in read_verbs(db.to_str().unwrap()) {
        let args: Vec<&str> = verb.iter().map(String::as_str).collect();
        ok(&args);
        assert_eq!(side_files(&db), before, "{args:?}");
    }
    drop(w);
}

#[test]
fn read_only_verbs_work_in_a_directory_the_user_cannot_write() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // Under /tmp (world-traversable), whatever TMPDIR says: the unprivileged
    // user must reach the directory to be refused writing in it.
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let db = demo_db(dir.path());
    // A copy of the binary the unprivileged user can run, wherever the
    // checkout lives (a build under a private home is not theirs to execute).
    let bin = dir.path().join("abridge");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    for verb in read_verbs(db.to_str().unwrap()) {
        let mut cmd = Command::new(&bin);
        cmd.args(&verb);
        if root {
            // Root writes anywhere: run as an unprivileged user instead.
            cmd.uid(65534).gid(65534);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{verb:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stdout.is_empty(), "{verb:?}");
    }
    assert_eq!(side_files(&db), Vec::<PathBuf>::new());
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn numbers_out_of_range_get_one_clear_line_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh.db");
    let f = fresh.to_str().unwrap();
    for (args, needle) in [
        (vec!["demo", "--db", f, "--turns", "0"], "at least 1"),
        (vec!["demo", "--db", f, "--turns", "-1"], "at least 1"),
        (vec!["demo", "--db", f, "--sessions", "0"], "at least 1"),
        (vec!["demo", "--db", f, "--seed", "-5"], "0 or more"),
        (
            vec!["demo", "--db", f, "--model-latency", "-5"],
            "0 or more",
        ),
        (vec!["replay", "--db", f, "--step", "-1"], "row id"),
        (vec!["replay", "--db", f, "--step", "0"], "row id"),
        (
            vec![
                "compact",
                "--db",
                f,
                "--session",
                "x",
                "--keep-last-turns",
                "-2",
            ],
            "0 or more",
        ),
        (vec!["chaos", "--db", f, "--workers", "0"], "at least 1"),
        (
            vec!["chaos", "--db", f, "--point-kill-p", "2"],
            "from 0 to 1",
        ),
        (vec!["chaos", "--db", f, "--turns", "-3"], "at least 1"),
        (
            vec!["chaos", "--db", f, "--model-faults", "1.5"],
            "from 0 to 1",
        ),
    ] {
        let err = fails(&args, needle);
        assert!(err.starts_with("abridge: error: "), "{err}");
    }
    assert!(!fresh.exists());
}

#[test]
fn memory_and_uri_paths_are_refused_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let before = std::fs::read(&db).unwrap();
    // A URI naming the demo's store: opening it as a URI would write into it.
    let uri = format!("file:{}?mode=rwc", db.display());
    for path in [
        ":memory:",
        "file:x.db",
        "file:x.db?mode=memory",
        uri.as_str(),
    ] {
        for verb in [
            vec!["demo", "--db", path, "--turns", "1"],
            vec!["inspect", "--db", path],
            vec!["verify", "--db", path],
            vec!["compact", "--db", path, "--session", "demo-42-0"],
            vec!["export", "--db", path, "--session", "demo-42-0"],
        ] {
            fails(&verb, "is not a database file path");
        }
    }
    assert_eq!(std::fs::read(&db).unwrap(), before);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["demo.db".to_string()]);
}

#[test]
fn a_numeric_key_is_never_shadowed_by_an_external_id() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let d = db.to_str().unwrap();
    // Session 1's external id becomes "2", which is also session 2's id.
    let second: String = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT external_id FROM sessions WHERE id = 2", [], |r| {
            r.get(0)
        })
        .unwrap();
    tamper(&db, "UPDATE sessions SET external_id = '2' WHERE id = 1");
    fails(&["inspect", "--db", d, "2"], "write ext:2 or id:2");
    fails(
        &["export", "--db", d, "--session", "2"],
        "write ext:2 or id:2",
    );
    let by_id: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", "--db", d, "id:2", "--json"])).unwrap();
    assert_eq!(by_id["summary"]["session"]["external_id"], second.as_str());
    let by_ext: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", "--db", d, "ext:2", "--json"])).unwrap();
    assert_eq!(by_ext["summary"]["session"]["id"], 1);
    // A key that is one session's external id and its own id is no conflict.
    tamper(&db, "UPDATE sessions SET external_id = '1' WHERE id = 1");
    let same: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", "--db", d, "1", "--json"])).unwrap();
    assert_eq!(same["summary"]["session"]["id"], 1);
}

#[test]
fn inspect_shows_step_ids_that_replay_takes() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let d = db.to_str().unwrap();
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", "--db", d, "demo-42-1", "--json"])).unwrap();
    let turns = detail["turns"].as_array().unwrap();
    let text = ok(&["inspect", "--db", d, "demo-42-1"]);
    for t in turns {
        let ids: Vec<i64> = t["step_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(ids.len() as i64, t["steps"].as_i64().unwrap());
        for id in &ids {
            ok(&["replay", "--db", d, "--step", &id.to_string()]);
        }
        // The text view names them too (as a range or a list).
        let first = ids[0].to_string();
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&t["turn"]["idx"].to_string()))
            .unwrap();
        assert!(line.contains(&first), "{line}");
    }
}

#[test]
fn inspect_aligns_columns_by_display_width() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let d = db.to_str().unwrap();
    // Wide (CJK, emoji) and combining characters in an external id.
    tamper(
        &db,
        "UPDATE sessions SET external_id = '顧客-東京🚚' WHERE id = 1",
    );
    tamper(
        &db,
        "UPDATE sessions SET external_id = 'cafe\u{301}-e\u{301}te\u{301}' WHERE id = 2",
    );
    let text = ok(&["inspect", "--db", d]);
    let cols: Vec<usize> = text
        .lines()
        .map(|l| {
            let at = l
                .find("scripted-support-1")
                .or_else(|| l.find("model"))
                .unwrap();
            unicode_width::UnicodeWidthStr::width(&l[..at])
        })
        .collect();
    assert_eq!(cols.len(), 3, "{text}");
    assert!(cols.iter().all(|c| *c == cols[0]), "{cols:?}\n{text}");
}

#[test]
fn errors_name_the_session_as_the_user_typed_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let d = db.to_str().unwrap();
    // A turn left running (a host that died mid-turn). The demo creates its
    // sessions concurrently: look the row id up by the external id.
    tamper(
        &db,
        "UPDATE turns SET status = 'running', finished_at = NULL \
         WHERE id = (SELECT max(t.id) FROM turns t JOIN sessions s ON s.id = t.session_id \
                     WHERE s.external_id = 'demo-42-0')",
    );
    let id: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT id FROM sessions WHERE external_id = 'demo-42-0'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let err = fails(
        &["compact", "--db", d, "--session", "demo-42-0"],
        "still running",
    );
    assert!(err.contains("session demo-42-0:"), "{err}");
    assert!(!err.contains(&format!("session {id}")), "{err}");
}

#[test]
fn the_readme_sample_output_is_what_the_demo_prints() {
    let readme = std::fs::read_to_string(crate::common::repo_root().join("README.md")).unwrap();
    let start = readme
        .find("```\ndemo-42-")
        .expect("the README shows the demo's output");
    let block = &readme[start + 4..];
    let block = &block[..block.find("```").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    // The README's command, in a fresh directory (default --db).
    let out = Command::new(BIN)
        .args(["demo", "--progress"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    // With background compaction (the default), which turns a summary covers
    // depends on timing: the lines about contexts, compactions and the facts
    // the newest summaries carry are checked for their form (numbers aside);
    // the workload's own figures exactly.
    // A number of any width is one `#` ("(13 added" and "(9 added" have
    // one form).
    let shape = |l: &str| -> String {
        let mut hashed = String::with_capacity(l.len());
        for c in l.chars() {
            let c = if c.is_ascii_digit() { '#' } else { c };
            if !(c == '#' && hashed.ends_with('#')) {
                hashed.push(c);
            }
        }
        hashed
            .split_whitespace()
            .map(|w| {
                if w.chars().all(|c| c == '#' || c == '.') {
                    "#"
                } else {
                    w
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let exact: std::collections::HashSet<&str> = printed.lines().collect();
    let shapes: std::collections::HashSet<String> = printed.lines().map(shape).collect();
    let (mut checked, mut exactly) = (0, 0);
    for line in block.lines() {
        // "..." stands for the rows left out; the per-turn lines of
        // concurrent sessions interleave in any order (each is checked).
        if line.trim().is_empty() || line.trim() == "..." {
            continue;
        }
        let timed = [
            "context",
            "compactions",
            "waited",
            "pinned facts",
            "wall time",
        ]
        .iter()
        .any(|w| line.contains(w))
            || line.starts_with("  demo-42-");
        if timed {
            assert!(
                shapes.contains(&shape(line)),
                "the demo no longer prints a line like {line:?}"
            );
        } else {
            assert!(exact.contains(line), "the demo no longer prints {line:?}");
            exactly += 1;
        }
        checked += 1;
    }
    assert!(checked >= 12 && exactly >= 6, "{checked} {exactly}");
}

#[test]
fn verbose_logs_carry_no_colour_codes_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let out = abridge(&[
        "-v",
        "demo",
        "--db",
        db.to_str().unwrap(),
        "--sessions",
        "1",
        "--turns",
        "6",
        "--compact-at",
        "800",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    // -v logs the compactions (info), to stderr, which is a pipe here.
    assert!(err.contains("compaction completed"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "colour codes in a piped log: {err:?}"
    );
}

#[test]
fn compact_dry_run_writes_nothing_and_names_the_pins_it_would_carry() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let d = db.to_str().unwrap();
    let before = std::fs::read(&db).unwrap();
    let sides = side_files(&db);
    let text = ok(&["compact", "--db", d, "--session", "demo-42-0", "--dry-run"]);
    assert!(text.contains("(nothing written)"), "{text}");
    assert!(text.contains("pinned facts carried:"), "{text}");
    let json = ok(&[
        "compact",
        "--db",
        d,
        "--session",
        "demo-42-0",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(std::fs::read(&db).unwrap(), before, "the dry run wrote");
    assert_eq!(side_files(&db), sides);
    let p: serde_json::Value = serde_json::from_str(&json).unwrap();
    let pins = p["pins"].as_array().unwrap();
    assert!(!pins.is_empty(), "{p}");
    assert!(p["expected_tokens_after"].as_u64().unwrap() < p["tokens_before"].as_u64().unwrap());
    // The compaction it previews is the one made, carrying those pins.
    let out = ok(&["compact", "--db", d, "--session", "demo-42-0"]);
    assert!(
        out.contains(&format!("up to turn {}:", p["boundary"])),
        "{out} vs {p}"
    );
    assert!(
        out.contains(&format!("{} pinned facts carried", pins.len())),
        "{out}"
    );
    let again = ok(&["compact", "--db", d, "--session", "demo-42-0", "--dry-run"]);
    assert!(again.contains("nothing would change"), "{again}");
}

/// Regression: a second manual compaction with another focus returned the
/// first one's row silently.
#[test]
fn a_second_compact_with_another_focus_is_refused_and_the_same_one_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let d = db.to_str().unwrap();
    ok(&[
        "compact",
        "--db",
        d,
        "--session",
        "demo-42-1",
        "--focus",
        "postal code",
    ]);
    let same = ok(&[
        "compact",
        "--db",
        d,
        "--session",
        "demo-42-1",
        "--focus",
        "postal code",
    ]);
    assert!(
        same.contains("already compacted up to here earlier"),
        "{same}"
    );
    // Named as the user named it, once, never by its row id.
    let said = fails(
        &[
            "compact",
            "--db",
            d,
            "--session",
            "demo-42-1",
            "--focus",
            "the budget",
        ],
        "session demo-42-1 is already compacted up to turn 11 (with focus \"postal code\")",
    );
    assert_eq!(said.matches("demo-42-1").count(), 1, "{said}");
    assert!(!said.contains("session 2"), "{said}");
}

#[test]
fn inspect_lists_the_live_pins_and_the_pins_each_compaction_carries() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo_db(dir.path());
    let d = db.to_str().unwrap();
    let text = ok(&["inspect", "--db", d, "demo-42-0"]);
    assert!(text.contains("pinned facts (live):"), "{text}");
    // Each compaction's line says what its summary added, not the head every
    // summary shares.
    let said: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("up to turn"))
        .filter_map(|l| l.split_once("new: ").map(|(_, n)| n))
        .collect();
    assert!(said.len() >= 3, "{text}");
    let distinct: std::collections::BTreeSet<&&str> = said.iter().collect();
    assert_eq!(distinct.len(), said.len(), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", "--db", d, "demo-42-0", "--json"])).unwrap();
    let pins = json["live_pins"].as_array().unwrap();
    assert!(!pins.is_empty());
    for p in pins {
        assert!(
            text.contains(p["value"].as_str().unwrap()),
            "{p} not listed"
        );
    }
    let carried = json["compactions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["pins_live"].as_i64())
        .next()
        .expect("a compaction with its pins counted");
    assert!(text.contains(&format!(" pins {carried} ")), "{text}");
}

/// `inspect` shows the share of input tokens the provider served from its
/// prompt cache, over the steps that reported it, equal to the store's sums;
/// `-` for a session none reported it for.
#[test]
fn inspect_shows_the_cached_input_share_from_the_stored_usage() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("golden.db");
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
            "tests/fixtures/golden-v{}.db",
            abridge::store::SCHEMA_VERSION
        )),
        &db,
    )
    .unwrap();
    let d = db.to_str().unwrap();
    // Session 1 keeps its usage; session 2 reported no cache figures.
    tamper(
        &db,
        "UPDATE steps SET cache_read_tokens = NULL, cache_write_tokens = NULL \
         WHERE turn_id IN (SELECT id FROM turns WHERE session_id = 2)",
    );
    let (read, input): (i64, i64) = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT sum(s.cache_read_tokens), sum(s.input_tokens) FROM steps s \
             JOIN turns t ON t.id = s.turn_id \
             WHERE t.session_id = 1 AND s.cache_read_tokens IS NOT NULL",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(read > 0 && input > read);
    let all: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", "--db", d, "--json"])).unwrap();
    let counts = |i: usize| all[i]["counts"].clone();
    assert_eq!(counts(0)["cache_read_tokens"], read);
    assert_eq!(counts(0)["cache_input_tokens"], input);
    assert!(counts(1)["cache_read_tokens"].is_null());
    let share = format!("{:.1}%", read as f64 * 100.0 / input as f64);
    let text = ok(&["inspect", "--db", d]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].ends_with("cached"), "{text}");
    assert!(lines[1].ends_with(&share), "{text}");
    assert!(lines[2].ends_with(" -"), "{text}");
    let detail = ok(&["inspect", "--db", d, "id:1"]);
    assert!(
        detail.contains(&format!(
            "prompt cache: {share} of {input} input tokens read from the cache ({read})"
        )),
        "{detail}"
    );
}

/// An argument left out is named in the one line the command prints, and a
/// usage error exits 2, as docs/cli.md says.
#[test]
fn a_missing_argument_is_named_and_a_usage_error_exits_2() {
    let err = fails(&["replay", "--db", "x.db"], "--step");
    assert!(err.contains("not provided"), "{err}");
    for args in [
        &["replay", "--db", "x.db"][..],
        &["replay", "--db", "x.db", "--step", "0"],
        &["no-such-verb"],
    ] {
        assert_eq!(abridge(args).status.code(), Some(2), "{args:?}");
    }
}

/// A verb's own usage errors (values that do not go together or are out of
/// range, checked after clap's) exit 2 as clap's do, in one line that points
/// at `--help`; an error of the store or the engine exits 1.
#[test]
fn a_verbs_usage_error_exits_2_and_an_engine_error_1() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("u.db");
    let d = db.to_str().unwrap();
    for (args, says) in [
        (
            vec![
                "report",
                "--db",
                d,
                "--soft-share",
                "1.5",
                "--compact-at",
                "4000",
            ],
            "--soft-share must be in (0, 1)",
        ),
        (
            vec!["report", "--db", d, "--soft-share", "0.8"],
            "needs --compact-at",
        ),
    ] {
        let err = fails(&args, says);
        assert!(err.contains("(see --help)"), "{err}");
        assert_eq!(abridge(&args).status.code(), Some(2), "{args:?}");
    }
    ok(&["demo", "--db", d, "--sessions", "1", "--turns", "1"]);
    let args = ["prune", "--db", d, "--idle-for", "3 fortnights"];
    fails(&args, "is not an age");
    assert_eq!(abridge(&args).status.code(), Some(2));
    let args = [
        "export",
        "--db",
        d,
        "--session",
        "demo-42-0",
        "--format",
        "pdf",
    ];
    fails(&args, "unknown format");
    assert_eq!(abridge(&args).status.code(), Some(2));
    // The engine's: no such session.
    let args = ["export", "--db", d, "--session", "nobody"];
    assert_eq!(abridge(&args).status.code(), Some(1));
}
