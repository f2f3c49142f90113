//! What only a PostgreSQL store has: its errors, concurrent first opens, the
//! move from an SQLite file, round trips per step, racing claims from
//! several processes, and a chaos run with connections cut by the server.
//!
//! Run against the server named by `ABRIDGE_TEST_POSTGRES` (a database URL,
//! e.g. `postgres://postgres@127.0.0.1/abridge_ci`; `.ci/run` sets it), each
//! test in schemas of its own. Without it, each test says so and returns:
//! the rest of the suite runs on PostgreSQL too when it is set (see
//! `common::db_for`).
#![cfg(feature = "postgres")]

use crate::common;

use abridge::admin::migrate_store;
use abridge::store::{BackendKind, Store, StoreOptions};
use abridge::{Error, Runner, RunnerConfig, Threshold};
use common::*;
use std::path::PathBuf;
use std::sync::Arc;

/// The server's base URL, or None (the test is skipped, with a line).
fn server() -> Option<String> {
    match std::env::var("ABRIDGE_TEST_POSTGRES") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            eprintln!("ABRIDGE_TEST_POSTGRES is not set: skipped");
            None
        }
    }
}

/// A URL of `base` with a schema of this test's own (dropped first).
fn fresh(base: &str, name: &str) -> String {
    let schema = format!("pgtest_{name}_{}", std::process::id());
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}schema={schema}");
    let admin = Store::open_url(
        &format!("{base}{sep}schema=pgtest_admin"),
        StoreOptions::default(),
    )
    .unwrap();
    admin
        .with_conn(|c| c.execute_batch(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")))
        .unwrap();
    url
}

#[test]
fn an_unreachable_server_a_missing_database_and_a_newer_schema_are_typed_errors() {
    let Some(base) = server() else { return };
    // Nothing listens on port 1.
    let err = Store::open("postgres://postgres@127.0.0.1:1/test?connect_timeout=2").unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert!(err.is_resumable());
    let (host, _) = base.rsplit_once('/').unwrap();
    let err = Store::open(format!("{host}/abridge_no_such_database")).unwrap_err();
    assert!(matches!(err, Error::NoSuchDatabase { .. }), "{err}");
    // A store stamped by a newer abridge is refused, nothing written.
    let url = fresh(&base, "newer");
    let store = Store::open(&url).unwrap();
    assert_eq!(store.backend(), BackendKind::Postgres);
    store
        .with_conn(|c| c.execute("UPDATE abridge_schema SET version = version + 1", []))
        .unwrap();
    drop(store);
    let err = Store::open(&url).unwrap_err();
    assert!(matches!(err, Error::SchemaTooNew { .. }), "{err}");
    let err = abridge::store::read_only_version(&url).unwrap_err();
    assert!(matches!(err, Error::SchemaTooNew { .. }), "{err}");
    // A schema holding tables that are not a store's is not taken over.
    let foreign = fresh(&base, "foreign");
    Store::open(&foreign)
        .unwrap()
        .with_conn(|c| c.execute_batch("DROP TABLE abridge_schema; CREATE TABLE mine (x BIGINT)"))
        .unwrap();
    let err = Store::open(&foreign).unwrap_err();
    assert!(matches!(err, Error::ForeignDatabase { .. }), "{err}");
    // A key is the server's business.
    let err = Store::open_with(
        &url,
        StoreOptions::default().with_key(abridge::store::Key::passphrase("k").unwrap()),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

#[test]
fn concurrent_first_opens_of_one_schema_make_one_store() {
    let Some(base) = server() else { return };
    let url = fresh(&base, "first_opens");
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || Store::open(&url).map(|_| ()))
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    let store = Store::open(&url).unwrap();
    // One stamp per version, from the baseline up: made once, by one opener.
    let (stamps, versions): (i64, i64) = store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(*), count(DISTINCT version) FROM abridge_schema",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap();
    let want = abridge::store::SCHEMA_VERSION - abridge::store::PG_BASELINE + 1;
    assert_eq!((stamps, versions), (want, want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_store_migrated_to_postgres_replays_every_step_byte_for_byte() {
    let Some(base) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("from.db");
    let opts = abridge_testkit::demo::DemoOptions {
        db: file.clone(),
        sessions: 2,
        turns: 24,
        compact_at: Threshold::Tokens(2_000),
        ..Default::default()
    };
    abridge_testkit::demo::run_demo(&opts, |_| {})
        .await
        .unwrap();
    let url = fresh(&base, "migrated");
    let (f, u) = (file.clone(), url.clone());
    let moved = tokio::task::spawn_blocking(move || migrate_store(&f, None, &u))
        .await
        .unwrap()
        .unwrap();
    let count = |name: &str| moved.rows.iter().find(|(t, _)| t == name).unwrap().1;
    assert!(count("steps") > 0 && count("compactions") > 0 && count("pins") > 0);
    assert_eq!(moved.steps_rebuilt, count("steps"));

    // Every step's recorded hash and rebuilt bytes, read on both backends.
    let hashes = |db: PathBuf| {
        abridge::store::read_only(&db, |c| {
            let mut st =
                c.prepare("SELECT id FROM steps WHERE messages_sha256 IS NOT NULL ORDER BY id")?;
            let ids = st
                .query_map([], |r| Ok(abridge::StepId(r.get(0)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            ids.into_iter()
                .map(|id| {
                    let r = abridge::replay::rebuild_step(c, id)?;
                    assert!(r.matches(), "step {id:?} on {}", db.display());
                    Ok((id, r.recorded, r.bytes))
                })
                .collect::<abridge::Result<Vec<_>>>()
        })
        .unwrap()
    };
    assert_eq!(hashes(file.clone()), hashes(PathBuf::from(&url)));
    let store = Store::open(&url).unwrap();
    let report = store.with_conn(|c| verify_demo(c)).unwrap();
    assert!(report.ok, "{report:#?}");
    // The sessions go on on the server: new rows take new ids.
    let runner = demo_runner_with(
        &store,
        42,
        Threshold::Tokens(2_000),
        None,
        &[],
        "after-move",
    );
    let sid = store.session("demo-42-0").await.unwrap().id;
    runner.run_turn(sid, "One more question.").await.unwrap();
    assert_verified(&store);
    // A store that already holds sessions takes no second copy.
    let (f, u) = (file.clone(), url.clone());
    let err = tokio::task::spawn_blocking(move || migrate_store(&f, None, &u))
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

/// Round trips per step, counted on the store's one connection: fixed, the
/// same at H = 10 and H = 60 (a rebuild of the history per step would grow
/// with it), and at most 12 per step (turn included).
/// A store of one connection (its round trips counted) on a fresh schema,
/// with the demo's tables, and a runner of the demo model and tools over it:
/// inline compaction, no heartbeat, `tune` applied to the configuration.
fn counted_runner(base: &str, name: &str, tune: impl FnOnce(&mut RunnerConfig)) -> (Store, Runner) {
    let url = fresh(base, name);
    let store = Store::open_with(&url, StoreOptions::default().with_max_connections(1)).unwrap();
    store
        .with_conn(abridge_testkit::demo_tables::create_demo_tables)
        .unwrap();
    let mut cfg = test_config(Threshold::Off, None, "trips");
    cfg.testing.heartbeat = false;
    cfg.compaction.background = None;
    tune(&mut cfg);
    let runner = Runner::builder(store.clone(), Arc::new(demo_model(7, &[])))
        .tools(abridge_testkit::demo::demo_tools(
            None,
            std::time::Duration::ZERO,
        ))
        .config(cfg)
        .build()
        .unwrap();
    (store, runner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_step_are_fixed_and_independent_of_history() {
    let Some(base) = server() else { return };
    let mut per_turn = Vec::new();
    for h in [10u64, 60] {
        let (store, runner) = counted_runner(&base, &format!("trips_{h}"), |cfg| {
            cfg.compaction.compact_at = Threshold::Tokens(1_000_000);
        });
        let s = runner.create_session("s", "m", "sys").await.unwrap();
        for t in 0..h {
            runner
                .run_turn(s.id, &format!("Where is ORD-{t}?"))
                .await
                .unwrap();
        }
        let trips = || store.with_conn(|c| Ok(c.round_trips().unwrap())).unwrap();
        let before = trips();
        // An order both histories asked about (its tool's values are
        // mentioned again: the same statements at either length).
        let out = runner
            .run_turn(s.id, "Where is order ORD-7?")
            .await
            .unwrap();
        let used = trips() - before - 1; // less the read of the counter itself
        per_turn.push((used, out.steps));
    }
    assert_eq!(
        per_turn[0], per_turn[1],
        "round trips grew with H: {per_turn:?}"
    );
    let (trips, steps) = per_turn[0];
    println!("{trips} round trips for a turn of {steps} steps");
    // Pipelined (see `store::pg`), a two-step turn with a transactional
    // tool takes 7 round trips once its statements are prepared: the turn's
    // begin (its reads; the turn's insert, which returns its id); step 0's
    // reads, with the begin's COMMIT and what decides its compaction; its
    // tool's own statement, with the lease check and the response; step 1's
    // reads, with step 0's COMMIT; the pins' lookups, with the final
    // answer's rows; COMMIT. A statement prepared for the first time on the
    // connection costs one more: here one no turn before this one needed
    // (the lookup of a pin's slot). Unpipelined, the same turn took 51.
    assert_eq!(steps, 2);
    assert!(
        trips <= 8,
        "{trips} round trips for a turn of {steps} steps"
    );
}

/// A compacting session's steps read what decides their compaction with the
/// step's first request: the recent window's boundary is found once a turn
/// (sent ahead at the turn's first step), the row at that boundary and the
/// newest measure go with it. A turn that compacts nothing costs what a turn
/// of a session far below its threshold costs (7 round trips for two steps,
/// 8 when a guess missed; see the test above); before, it took 12 (the
/// window's read and the row at its boundary at each step, and the measure
/// at the second step, asked for at a step the context had already passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacting_sessions_turn_reads_its_decision_with_its_steps() {
    let Some(base) = server() else { return };
    let (store, runner) = counted_runner(&base, "trips_compacting", |cfg| {
        cfg.compaction.compact_at = Threshold::Tokens(4_000);
        cfg.compaction.keep_recent_share = Some(0.15);
    });
    let s = runner.create_session("s", "m", "sys").await.unwrap();
    let trips = || store.with_conn(|c| Ok(c.round_trips().unwrap())).unwrap();
    let compactions = || {
        store
            .with_conn(|c| {
                c.query_row("SELECT count(*) FROM compactions", [], |r| {
                    r.get::<_, i64>(0)
                })
            })
            .unwrap()
    };
    let mut quiet = Vec::new();
    for t in 0..60u64 {
        let (before, rows) = (trips(), compactions());
        let out = runner
            .run_turn(s.id, &format!("Where is ORD-{}?", t % 10))
            .await
            .unwrap();
        let used = trips() - before - 1;
        // Past the first turns (statements prepared, a window to remember),
        // the turns of two steps that compacted nothing.
        if t >= 20 && out.steps == 2 && compactions() == rows {
            quiet.push(used);
        }
    }
    assert!(
        compactions() >= 3,
        "the session compacted: {}",
        compactions()
    );
    assert!(quiet.len() >= 10, "turns that compacted nothing: {quiet:?}");
    println!("round trips of the turns that compacted nothing: {quiet:?}");
    assert!(
        quiet.iter().all(|&n| n <= 8),
        "a turn that compacted nothing took more than 8 round trips: {quiet:?}"
    );
}

#[test]
fn racing_processes_on_one_boundary_make_one_row_and_one_summary() {
    let Some(base) = server() else { return };
    let url = fresh(&base, "racing");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = Store::open(&url).unwrap();
    store
        .with_conn(abridge_testkit::demo_tables::create_demo_tables)
        .unwrap();
    let r = demo_runner(&store, 3, Threshold::Off, None);
    rt.block_on(async {
        let s = r.create_session("race", "m", "sys").await.unwrap();
        for t in 0..6 {
            r.run_turn(s.id, &format!("turn {t}: where is ORD-{t}?"))
                .await
                .unwrap();
        }
    });
    drop(r);
    drop(store);
    let children: Vec<_> = (0..4)
        .map(|_| {
            abridge_cmd()
                .args(["compact", "--db", &url, "--session", "race"])
                .output()
                .unwrap()
        })
        .collect();
    for c in &children {
        assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    }
    let store = Store::open(&url).unwrap();
    let (rows, calls): (i64, i64) = store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(*), coalesce(sum(summary_calls), 0) FROM compactions",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(calls, 1);
}

/// Four worker processes on one PostgreSQL store, killed at random and at
/// named points, frozen past their leases, with faults injected and their
/// connections ended by the server mid-transaction: verify and the control
/// comparison hold.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_postgres_with_connections_cut_holds_every_guarantee() {
    let Some(base) = server() else { return };
    let url = fresh(&base, "chaos");
    let o = abridge_testkit::chaos::ChaosOptions {
        db: PathBuf::from(&url),
        workers: 4,
        kills: 60,
        seed: 11,
        exe: Some(PathBuf::from(env!("CARGO_BIN_EXE_abridge"))),
        max_duration: std::time::Duration::from_secs(600),
        ..Default::default()
    };
    let report = abridge_testkit::chaos::run_chaos(&o).await.unwrap();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert!(report.kills >= 60, "{report:?}");
    assert!(report.turns > 0 && report.compactions > 0, "{report:?}");
    println!(
        "{} kills, {} connections ended by the server, {} freezes",
        report.kills, report.connections_terminated, report.freezes
    );
}

#[test]
fn a_lease_held_by_the_same_owner_name_on_another_machine_is_freed_only_by_expiry() {
    // The rule a shared store uses (holder_is_gone_shared) is tested in
    // owner.rs; here, that a PostgreSQL store's runner uses it: a running
    // turn held by the same owner name from another instance is not taken
    // over before its lease expires.
    let Some(base) = server() else { return };
    let url = fresh(&base, "lease");
    let store = Store::open(&url).unwrap();
    store
        .with_conn(abridge_testkit::demo_tables::create_demo_tables)
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cfg = RunnerConfig::default().with_owner("host");
    let r = Runner::builder(store.clone(), Arc::new(demo_model(1, &[])))
        .config(cfg)
        .compaction(abridge::CompactionConfig::default().with_compact_at(Threshold::Off))
        .build()
        .unwrap();
    let sid = rt.block_on(r.create_session("s", "m", "sys")).unwrap().id;
    // A turn left running, its lease held (for a minute) by "host" on
    // another machine: another boot id in its instance.
    store
        .with_conn(move |c| {
            c.execute(
                "INSERT INTO turns (id, session_id, idx, input, status, lease_owner, lease_epoch, \
                 lease_expires_at, created_at) VALUES (1000, ?1, 0, 'hi', 'running', \
                 'host|ffff.1.1.1.1|7', 1, ?2, 0)",
                (sid, abridge::store::now_ms() + 60_000),
            )
        })
        .unwrap();
    let err = rt.block_on(r.run_turn_at(sid, 0, "hi")).unwrap_err();
    assert!(matches!(err, Error::LeaseHeld { .. }), "{err}");
}

#[test]
fn a_host_with_a_schema_of_its_own_and_no_right_to_create_one_opens_it() {
    let Some(base) = server() else { return };
    let url = fresh(&base, "granted");
    let schema = url.rsplit_once("schema=").unwrap().1.to_string();
    let role = format!("abridge_limited_{}", std::process::id());
    // As the server's administrator: a role that may not create schemas,
    // and a schema made for it.
    let admin = Store::open(&url).unwrap();
    admin
        .with_conn(|c| {
            c.execute_batch(&format!(
                "DROP SCHEMA {schema} CASCADE; DROP ROLE IF EXISTS {role}; \
                 CREATE ROLE {role} LOGIN; CREATE SCHEMA {schema} AUTHORIZATION {role}"
            ))
        })
        .unwrap();
    drop(admin);
    let limited = url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    let store = Store::open(&limited).unwrap();
    let n: i64 = store
        .with_conn(|c| c.query_row("SELECT count(*) FROM sessions", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(n, 0);
    drop(store);
    Store::open(&url)
        .unwrap()
        .with_conn(|c| c.execute_batch(&format!("DROP SCHEMA {schema} CASCADE; DROP ROLE {role}")))
        .unwrap();
}

#[test]
fn verify_names_a_rule_missing_from_the_server() {
    let Some(base) = server() else { return };
    let url = fresh(&base, "rules");
    let store = Store::open(&url).unwrap();
    let g6 = |store: &Store| {
        let report = store.with_conn(|c| abridge::verify::verify(c)).unwrap();
        let check = report
            .checks
            .into_iter()
            .find(|c| c.name == "G6 integrity_check")
            .unwrap();
        check.violations
    };
    assert!(g6(&store).is_empty());
    store
        .with_conn(|c| {
            c.execute_batch(
                "DROP TRIGGER compactions_completed_never_change ON compactions; \
                 ALTER TABLE steps DISABLE TRIGGER steps_finished_never_change; \
                 DROP INDEX compactions_one_per_boundary",
            )
        })
        .unwrap();
    let found = g6(&store);
    for rule in [
        "trigger compactions_completed_never_change is missing",
        "trigger steps_finished_never_change is disabled",
        "unique index compactions_one_per_boundary is missing",
    ] {
        assert!(found.iter().any(|v| v == rule), "{rule}: {found:?}");
    }
}

/// The PostgreSQL golden store: a dump (`pg_dump --inserts`) of a store
/// written at schema version 7 (the PostgreSQL baseline) by the golden
/// workload (`golden::write_golden_store`, run with `ABRIDGE_GOLDEN_OUT` set
/// to a server URL). Restored into a schema of its own with `psql`, it is
/// opened (and so upgraded through `MIGRATIONS`' PostgreSQL forms, as a file
/// is), stamped with this build's version, every executed step rebuilds to
/// its recorded hash, and `verify` holds. `abridge upgrade` reports it.
#[test]
fn a_version_7_postgres_store_is_restored_upgraded_and_rebuilds_to_its_hashes() {
    let Some(base) = server() else { return };
    let url = fresh(&base, "golden7");
    let schema = url.rsplit_once("schema=").unwrap().1.to_string();
    let dump = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden-pg-v7.sql"),
    )
    .unwrap();
    let dump = dump.replace("golden_v7", &schema);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dump.sql");
    std::fs::write(&file, dump).unwrap();
    let (server_url, _) = base.split_once('?').unwrap_or((&base, ""));
    let out = std::process::Command::new("psql")
        .args([server_url, "-v", "ON_ERROR_STOP=1", "-q", "-f"])
        .arg(&file)
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Its version is read as a file's is (not refused for being older:
    // `upgrade` reads it first).
    assert_eq!(abridge::store::read_only_version(&url).unwrap(), 7);
    // The read-only verbs refuse it until it is upgraded, as a file.
    let refused = abridge_cmd()
        .args(["inspect", "--db", &url])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("abridge upgrade"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let upgrade = abridge_cmd()
        .args(["upgrade", "--db", &url])
        .output()
        .unwrap();
    assert!(
        upgrade.status.success(),
        "{}",
        String::from_utf8_lossy(&upgrade.stderr)
    );
    let store = Store::open(&url).unwrap();
    assert_eq!(
        abridge::store::read_only_version(&url).unwrap(),
        abridge::store::SCHEMA_VERSION
    );
    let steps = store
        .with_conn(|c| {
            let ids = abridge::inspect::executed_step_ids(c)?;
            for id in &ids {
                let r = abridge::replay::rebuild_step(c, *id)?;
                assert!(
                    r.holds(),
                    "step {id} rebuilt {} but recorded {}",
                    r.sha256,
                    r.recorded
                );
            }
            Ok(ids.len())
        })
        .unwrap();
    assert!(steps >= 40, "{steps} steps");
    let report = store.with_conn(|c| abridge::verify::verify(c)).unwrap();
    assert!(report.ok, "{report:#?}");
}

/// One column as both backends are compared: name, type family, NOT NULL,
/// default (normalised: casts and parentheses dropped).
type ColumnShape = (String, String, bool, Option<String>);

fn family(t: &str) -> String {
    let t = t.to_ascii_lowercase();
    match t.as_str() {
        "integer" | "bigint" | "int8" => "integer",
        "text" | "character varying" => "text",
        "real" | "double precision" | "float8" => "real",
        "blob" | "bytea" => "blob",
        other => other,
    }
    .to_string()
}

fn default_of(d: Option<String>) -> Option<String> {
    let d = d?;
    let d = d.split("::").next().unwrap_or(&d).trim();
    Some(d.trim_matches(|c| c == '(' || c == ')').to_string())
}

/// Tables, their columns and their unique indexes (as column lists, with a
/// partial index's condition noted), of a store, backend-neutral.
fn shape(store: &Store) -> std::collections::BTreeMap<String, (Vec<ColumnShape>, Vec<String>)> {
    let pg = store.backend() == BackendKind::Postgres;
    store
        .with_conn(|c| {
            let tables: Vec<String> = if pg {
                let mut q = c.prepare(
                    "SELECT table_name::text FROM information_schema.tables \
                     WHERE table_schema = current_schema() AND table_name <> 'abridge_schema' \
                     ORDER BY 1",
                )?;
                let v = q.query_map([], |r| r.get(0))?.collect::<Result<Vec<_>, _>>()?;
                v
            } else {
                let mut q = c.prepare(
                    "SELECT name FROM sqlite_master WHERE type = 'table' \
                     AND name NOT LIKE 'sqlite_%' ORDER BY 1",
                )?;
                let v = q.query_map([], |r| r.get(0))?.collect::<Result<Vec<_>, _>>()?;
                v
            };
            let mut out = std::collections::BTreeMap::new();
            for t in tables {
                let columns: Vec<ColumnShape> = if pg {
                    let mut q = c.prepare(
                        "SELECT column_name::text, data_type::text, is_nullable = 'NO', \
                                column_default::text FROM information_schema.columns \
                         WHERE table_schema = current_schema() AND table_name = ?1 \
                         ORDER BY column_name",
                    )?;
                    let v = q
                        .query_map([&t], |r| {
                            let d: Option<String> = r.get(3)?;
                            // An identity column's default is the sequence.
                            let d = d.filter(|d| !d.starts_with("nextval("));
                            Ok((r.get(0)?, family(&r.get::<_, String>(1)?), r.get(2)?, default_of(d)))
                        })?
                        .collect::<Result<Vec<_>, _>>()?;
                    v
                } else {
                    let mut q = c.prepare(
                        "SELECT name, type, \"notnull\" OR pk, dflt_value FROM pragma_table_info(?1) \
                         ORDER BY name",
                    )?;
                    let v = q
                        .query_map([&t], |r| {
                            Ok((
                                r.get(0)?,
                                family(&r.get::<_, String>(1)?),
                                r.get(2)?,
                                default_of(r.get(3)?),
                            ))
                        })?
                        .collect::<Result<Vec<_>, _>>()?;
                    v
                };
                let mut uniques: Vec<String> = if pg {
                    let mut q = c.prepare(
                        "SELECT (SELECT string_agg(a.attname::text, ',' ORDER BY k.n) \
                                   FROM unnest(i.indkey) WITH ORDINALITY AS k(att, n) \
                                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.att) \
                                || CASE WHEN i.indpred IS NULL THEN '' ELSE ' (partial)' END \
                         FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid \
                         WHERE c.relname = ?1 AND c.relnamespace = current_schema()::regnamespace \
                           AND i.indisunique AND NOT i.indisprimary",
                    )?;
                    let v = q.query_map([&t], |r| r.get(0))?.collect::<Result<Vec<_>, _>>()?;
                    v
                } else {
                    let mut q = c.prepare(
                        "SELECT (SELECT group_concat(ii.name, ',') FROM \
                                  (SELECT name FROM pragma_index_info(il.name) ORDER BY seqno) ii) \
                                || CASE WHEN il.partial THEN ' (partial)' ELSE '' END \
                         FROM pragma_index_list(?1) il WHERE il.\"unique\" AND il.origin <> 'pk'",
                    )?;
                    let v = q.query_map([&t], |r| r.get(0))?.collect::<Result<Vec<_>, _>>()?;
                    v
                };
                uniques.sort();
                out.insert(t, (columns, uniques));
            }
            Ok(out)
        })
        .unwrap()
}

/// The two schemas agree: the same tables, each with the same columns (name,
/// type family, NOT NULL, default) and the same unique indexes (the ones the
/// guarantees stand on: G1's boundary, one running turn per session, a
/// step's and a call's numbering), and every append-only rule refuses the
/// same change on both, with the same kind of message.
#[test]
fn both_backends_have_the_same_schema_and_refuse_the_same_changes() {
    let Some(base) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = Store::open(dir.path().join("parity.db")).unwrap();
    let server_url = fresh(&base, "parity");
    let server_store = Store::open(&server_url).unwrap();
    let (a, b) = (shape(&file), shape(&server_store));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "tables differ"
    );
    // What the comparison stands on is there to compare.
    assert!(a.len() >= 8, "{:?}", a.keys());
    let turns = &a["turns"];
    assert!(turns.0.len() >= 8, "{turns:?}");
    assert!(turns.1.contains(&"session_id,idx".to_string()), "{turns:?}");
    assert!(
        a["compactions"]
            .1
            .contains(&"session_id,up_to_turn_index".to_string()),
        "{:?}",
        a["compactions"]
    );
    for (t, sqlite) in &a {
        assert_eq!(
            sqlite, &b[t],
            "table {t}: SQLite (left) and PostgreSQL (right) differ"
        );
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    for (store, db) in [
        (&file, dir.path().join("parity.db")),
        (&server_store, PathBuf::from(&server_url)),
    ] {
        let opts = abridge_testkit::demo::DemoOptions {
            db,
            sessions: 1,
            turns: 12,
            compact_at: Threshold::Tokens(800),
            seed: 42,
            model_latency: std::time::Duration::ZERO,
            summary_latency: std::time::Duration::ZERO,
            owner: None,
            background: false,
            key: None,
            require_approval: Vec::new(),
            keep_recent_share: None,
            telemetry: None,
        };
        rt.block_on(abridge_testkit::demo::run_demo(&opts, |_| {}))
            .unwrap();
        let (compactions, pins): (i64, i64) = store
            .with_conn(|c| {
                c.query_row(
                    "SELECT (SELECT count(*) FROM compactions WHERE status = 'completed'), \
                            (SELECT count(*) FROM pins) * 1000 \
                            + (SELECT count(*) FROM tool_invocations WHERE status = 'completed')",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
            })
            .unwrap();
        assert!(
            compactions > 0 && pins > 1000 && pins % 1000 > 0,
            "{compactions} compactions, {} pins, {} completed calls",
            pins / 1000,
            pins % 1000
        );
        let refused = |sql: &str| {
            let err = store
                .with_conn(|c| c.execute_batch(sql))
                .expect_err(sql)
                .to_string();
            assert!(
                err.contains("abridge:"),
                "{:?}: {sql}: {err}",
                store.backend()
            );
        };
        for t in [
            "sessions",
            "turns",
            "steps",
            "tool_invocations",
            "compactions",
            "pins",
        ] {
            refused(&format!(
                "DELETE FROM {t} WHERE id = (SELECT min(id) FROM {t})"
            ));
        }
        refused("UPDATE turns SET output = 'changed' WHERE status = 'completed'");
        refused("UPDATE steps SET response = '{}' WHERE status = 'completed'");
        refused("UPDATE tool_invocations SET result = 'x' WHERE status = 'completed'");
        refused("UPDATE compactions SET summary = 'x' WHERE status = 'completed'");
        refused("UPDATE sessions SET system_prompt = 'x'");
        refused("UPDATE turns SET input = 'x' WHERE id = (SELECT min(id) FROM turns)");
        refused("UPDATE pins SET value = 'changed' WHERE id = (SELECT min(id) FROM pins)");
    }
}

/// A transactional tool on PostgreSQL writes PostgreSQL, and its statements
/// reach the server as written: `$1` placeholders and the jsonb `?`
/// operator, which the engine's own SQLite-to-PostgreSQL translation would
/// have turned into a placeholder, work inside the step's transaction.
#[test]
fn a_transactional_tools_sql_reaches_postgres_unchanged() {
    let Some(base) = server() else { return };
    let url = fresh(&base, "hostsql");
    let store = Store::open(&url).unwrap();
    store
        .with_conn(|c| c.execute_batch("CREATE TABLE host_notes (key TEXT, has_a BOOLEAN)"))
        .unwrap();

    struct Note;
    impl abridge::TransactionalTool for Note {
        fn call(
            &self,
            tx: &abridge::store::Transaction<'_>,
            call: &abridge::ToolCall,
        ) -> Result<serde_json::Value, abridge::ToolError> {
            let n = tx
                .execute(
                    "INSERT INTO host_notes (key, has_a) \
                     SELECT $1, ('{\"a\": 1}'::jsonb ? 'a') -- not ?2",
                    [&call.idempotency_key],
                )
                .map_err(|e| abridge::ToolError::new(e.to_string()))?;
            Ok(serde_json::json!({"rows": n}))
        }
    }
    struct CallsNote;
    #[abridge::async_trait]
    impl abridge::ModelClient for CallsNote {
        async fn complete(
            &self,
            req: &abridge::ModelRequest,
        ) -> Result<abridge::ModelResponse, abridge::ModelError> {
            let done = serde_json::to_string(&*req.messages)
                .unwrap()
                .contains("tool_result");
            let v = if done {
                serde_json::json!({"blocks": [{"type": "text", "text": "noted"}]})
            } else {
                serde_json::json!({"blocks": [{"type": "tool_use", "id": "n1", "name": "note", "input": {}}]})
            };
            Ok(serde_json::from_value(v).unwrap())
        }
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let r = Runner::builder(store.clone(), Arc::new(CallsNote))
            .tools(abridge::Tools::new().transactional(
                abridge::ToolSpec {
                    name: "note".into(),
                    description: "notes".into(),
                    input_schema: serde_json::json!({"type": "object"}),
                },
                Note,
            ))
            .config(RunnerConfig::default().with_owner("host-sql"))
            .compaction(abridge::CompactionConfig::default().with_compact_at(Threshold::Off))
            .build()
            .unwrap();
        let s = r.create_session("s", "m", "sys").await.unwrap();
        let out = r.run_turn_at(s.id, 0, "note it").await.unwrap();
        assert_eq!(out.output, "noted");
    });
    let (rows, has_a, result): (i64, bool, String) = store
        .with_conn(|c| {
            c.query_row(
                "SELECT (SELECT count(*) FROM host_notes), (SELECT bool_and(has_a) FROM host_notes), \
                        (SELECT result FROM tool_invocations)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
        })
        .unwrap();
    assert_eq!((rows, has_a), (1, true), "tool result: {result}");
}
