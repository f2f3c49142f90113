//! Real process kills: SIGKILL a running `abridge demo` mid-step and mid-summary.
//!
//! Scenario: the demo binary runs scripted sessions with simulated model and
//! summariser latency. The test watches the database (read-only) until the run
//! is at the point it wants, kills the process with SIGKILL, and runs the same
//! command again. The rerun takes the dead process's leases over at once (its
//! owner identity names a process that no longer exists), finishes the same
//! compactions it left pending, and ends with the transcript of an uninterrupted
//! run; `verify` holds on the result. With background compaction, a kill
//! while a summary is being made in the background leaves a pending row that
//! the rerun finishes.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_abridge");

fn demo(db: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["demo", "--db"])
        .arg(db)
        .args([
            "--sessions",
            "2",
            "--turns",
            "14",
            "--compact-at",
            "1500",
            "--seed",
            "5",
            "--json",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // Inline compaction unless the test asks for background: the transcript
    // is then the same whatever the timing.
    if !extra.contains(&"--background") {
        c.args(["--background", "off"]);
    }
    c
}

fn run_ok(mut c: Command) {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn query(db: &Path, sql: &str) -> i64 {
    match abridge::store::open_read_only(db) {
        Ok(c) => c.query_row(sql, [], |r| r.get(0)).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Waits until `sql` returns at least `n`, then SIGKILLs the child.
fn kill_when(mut child: Child, db: &Path, sql: &str, n: i64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false; // finished before the point was reached
        }
        if query(db, sql) >= n {
            child.kill().unwrap(); // SIGKILL on Unix
            child.wait().unwrap();
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the run never reached {sql} >= {n}");
}

fn transcripts(db: &Path) -> Vec<String> {
    let c = abridge::store::open_read_only(db).unwrap();
    (0..2)
        .map(|i| {
            abridge::inspect::export(
                &c,
                &format!("demo-5-{i}"),
                abridge::inspect::ExportFormat::Jsonl,
            )
            .unwrap()
        })
        .collect()
}

fn verified(db: &Path) {
    let c = abridge::store::open_read_only(db).unwrap();
    let r =
        abridge::verify::verify_with(&c, &[&abridge_testkit::demo_tables::DemoEffects]).unwrap();
    assert!(r.ok, "{r:#?}");
}

#[test]
fn killed_mid_step_resumes_to_the_uninterrupted_transcript() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control.db");
    run_ok(demo(&control, &[]));
    let db = dir.path().join("killed.db");
    let latency = ["--model-latency", "8", "--summary-latency", "30"];
    let mut kills = 0;
    for steps in [3, 12, 25, 40] {
        let child = demo(&db, &latency).spawn().unwrap();
        if kill_when(child, &db, "SELECT count(*) FROM steps", steps) {
            kills += 1;
        }
    }
    assert!(kills >= 3, "only {kills} kills landed");
    run_ok(demo(&db, &latency));
    assert_eq!(transcripts(&db), transcripts(&control));
    verified(&db);
}

#[test]
fn killed_mid_summary_the_rerun_finishes_the_same_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control.db");
    run_ok(demo(&control, &[]));
    let db = dir.path().join("killed.db");
    let latency = ["--summary-latency", "3000"];
    let child = demo(&db, &latency).spawn().unwrap();
    assert!(kill_when(
        child,
        &db,
        "SELECT count(*) FROM compactions WHERE status = 'pending'",
        1
    ));
    let c = abridge::store::open_read_only(&db).unwrap();
    let (pending_id, attempts): (i64, i64) = c
        .query_row(
            "SELECT id, attempts FROM compactions WHERE status = 'pending'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    drop(c);
    run_ok(demo(&db, &[]));
    let c = abridge::store::open_read_only(&db).unwrap();
    let (status, attempts_after): (String, i64) = c
        .query_row(
            "SELECT status, attempts FROM compactions WHERE id = ?1",
            [pending_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (status.as_str(), attempts_after),
        ("completed", attempts + 1)
    );
    let reads: i64 = c
        .query_row(
            "SELECT count(*) FROM steps WHERE compaction_id = ?1",
            [pending_id],
            |r| r.get(0),
        )
        .unwrap();
    assert!(reads > 0, "no step read the finished compaction");
    drop(c);
    assert_eq!(transcripts(&db), transcripts(&control));
    verified(&db);
}

#[test]
fn two_processes_on_one_database_never_run_a_turn_twice() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control.db");
    run_ok(demo(&control, &[]));
    let db = dir.path().join("shared.db");
    let latency = ["--model-latency", "5", "--summary-latency", "20"];
    let a = demo(&db, &latency).spawn().unwrap();
    let b = demo(&db, &latency).spawn().unwrap();
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(transcripts(&db), transcripts(&control));
    verified(&db);
}

/// The transcript's records other than compactions: with background
/// compaction, which turns a summary covers depends on timing, but the turns,
/// tool calls and answers do not.
fn turns_only(transcripts: Vec<String>) -> Vec<String> {
    transcripts
        .into_iter()
        .map(|t| {
            t.lines()
                .filter(|l| !l.contains("\"kind\":\"compaction\""))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

#[test]
fn killed_while_a_background_summary_is_made_the_rerun_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control.db");
    run_ok(demo(&control, &[]));
    let db = dir.path().join("killed.db");
    let slow = [
        "--background",
        "on",
        "--model-latency",
        "5",
        "--summary-latency",
        "3000",
    ];
    let child = demo(&db, &slow).spawn().unwrap();
    // Killed once steps have gone on while the summary is being made.
    assert!(kill_when(
        child,
        &db,
        "SELECT count(*) FROM compactions c JOIN steps s ON s.responded_at > c.created_at \
         WHERE c.status = 'pending' AND c.background = 1",
        2
    ));
    let c = abridge::store::open_read_only(&db).unwrap();
    let (pending_id, attempts, steps_then): (i64, i64, i64) = c
        .query_row(
            "SELECT id, attempts, (SELECT count(*) FROM steps) FROM compactions \
             WHERE status = 'pending' AND background = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    drop(c);
    run_ok(demo(&db, &["--background", "on"]));
    let c = abridge::store::open_read_only(&db).unwrap();
    let (status, attempts_after, background): (String, i64, bool) = c
        .query_row(
            "SELECT status, attempts, background FROM compactions WHERE id = ?1",
            [pending_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        (status.as_str(), attempts_after, background),
        ("completed", attempts + 1, true),
        "the pending row is finished by the rerun, not re-decided"
    );
    let pending: i64 = c
        .query_row(
            "SELECT count(*) FROM compactions WHERE status = 'pending'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(pending, 0, "the rerun leaves nothing pending");
    assert!(steps_then > 2);
    drop(c);
    assert_eq!(
        turns_only(transcripts(&db)),
        turns_only(transcripts(&control))
    );
    verified(&db);
}
