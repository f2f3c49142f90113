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
    assert_eq!(v["checks"].as_array().unwrap().len(), 9);
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
    tamper(&db, "UPDATE compactions SET summary = summary || ' (edited)' WHERE id = (SELECT min(id) FROM compactions)");
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
    sql(&newer, "PRAGMA user_version = 7");
    fails(
        &["verify", "--db", newer.to_str().unwrap()],
        &format!(
            "schema version 7 is newer than this build supports ({})",
            abridge::store::SCHEMA_VERSION
        ),
    );
}

#[test]
fn every_verb_has_help_with_an_example() {
    for verb in ["demo", "inspect", "replay", "compact", "export", "verify"] {
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
