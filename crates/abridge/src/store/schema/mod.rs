//! What a file must be to be a store, and how it becomes one: the path and
//! file checks that refuse anything else untouched, the schema of version 1
//! and the numbered migrations after it.

use crate::error::{Error, Result};
use rusqlite::{Connection, OptionalExtension};
use std::path::Path;
use std::time::Duration;

/// The schema of version 1, applied on first open; the numbered
/// [`MIGRATIONS`] follow it.
pub const SCHEMA_SQL: &str = include_str!("../../../schema.sql");

/// One schema change after version 1: its SQLite form, its PostgreSQL form,
/// and what runs after its SQL in the same transaction.
///
/// One list, [`MIGRATIONS`], drives both backends. A store at version `v`
/// gets every migration above `v`, each with its version stamp, in one
/// transaction (IMMEDIATE on SQLite; under the store's advisory lock on
/// PostgreSQL); a new SQLite store gets [`SCHEMA_SQL`] and all of them, a new
/// PostgreSQL store the baseline `schema_pg.sql` (version [`PG_BASELINE`])
/// and those above it. Never edit one that has shipped: add the next
/// (`crates/abridge-cli/tests/it/schema.rs` pins each shipped file's SHA-256).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Migration {
    /// The version it brings a store to.
    pub version: i64,
    /// The SQLite statements.
    pub sqlite: &'static str,
    /// The PostgreSQL statements; None for a version at or below
    /// [`PG_BASELINE`], which the PostgreSQL baseline holds whole.
    pub postgres: Option<&'static str>,
    /// Run after the SQL, inside the same transaction (on both backends).
    pub(crate) hook: Option<Hook>,
}

/// What a migration does beyond its SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hook {
    /// Pins the facts of the turns finished before pins existed (version 3),
    /// with the built-in extractor, so the next compaction carries them.
    BackfillPins,
    /// Spells out the columns' checks of a list of three or more values
    /// (version 14): [`spell_out_checks`].
    SpellOutChecks,
}

/// The version the PostgreSQL schema file (`schema_pg.sql`) is written at: a
/// new PostgreSQL store starts here, and every migration above it has a
/// PostgreSQL form.
pub const PG_BASELINE: i64 = 7;
const _: () = assert!(PG_BASELINE <= SCHEMA_VERSION);

const fn sqlite_only(version: i64, sqlite: &'static str) -> Migration {
    Migration {
        version,
        sqlite,
        postgres: None,
        hook: None,
    }
}

/// Schema changes after version 1, in order.
pub const MIGRATIONS: &[Migration] = &[
    sqlite_only(2, include_str!("migrations/0002_append_only.sql")),
    Migration {
        hook: Some(Hook::BackfillPins),
        ..sqlite_only(3, include_str!("migrations/0003_pins.sql"))
    },
    sqlite_only(4, include_str!("migrations/0004_background.sql")),
    sqlite_only(5, include_str!("migrations/0005_providers.sql")),
    sqlite_only(6, include_str!("migrations/0006_erasure.sql")),
    sqlite_only(7, include_str!("migrations/0007_redaction.sql")),
    Migration {
        version: 8,
        sqlite: include_str!("migrations/0008_thresholds.sql"),
        postgres: Some(include_str!("migrations/postgres/0008_thresholds.sql")),
        hook: None,
    },
    Migration {
        version: 9,
        sqlite: include_str!("migrations/0009_approvals.sql"),
        postgres: Some(include_str!("migrations/postgres/0009_approvals.sql")),
        hook: None,
    },
    Migration {
        version: 10,
        sqlite: include_str!("migrations/0010_restated_pins.sql"),
        postgres: Some(include_str!("migrations/postgres/0010_restated_pins.sql")),
        hook: None,
    },
    Migration {
        version: 11,
        sqlite: include_str!("migrations/0011_forks.sql"),
        postgres: Some(include_str!("migrations/postgres/0011_forks.sql")),
        hook: None,
    },
    Migration {
        version: 12,
        sqlite: include_str!("migrations/0012_verified_points.sql"),
        postgres: Some(include_str!("migrations/postgres/0012_verified_points.sql")),
        hook: None,
    },
    Migration {
        version: 13,
        sqlite: include_str!("migrations/0013_bounded_reads.sql"),
        postgres: Some(include_str!("migrations/postgres/0013_bounded_reads.sql")),
        hook: None,
    },
    Migration {
        version: 14,
        sqlite: include_str!("migrations/0014_spelled_out_checks.sql"),
        postgres: Some(include_str!(
            "migrations/postgres/0014_spelled_out_checks.sql"
        )),
        hook: Some(Hook::SpellOutChecks),
    },
    Migration {
        version: 15,
        sqlite: include_str!("migrations/0015_pins_by_value_dropped.sql"),
        postgres: Some(include_str!(
            "migrations/postgres/0015_pins_by_value_dropped.sql"
        )),
        hook: None,
    },
];

/// The schema version this build writes (`PRAGMA user_version`; the
/// `abridge_schema` stamp on PostgreSQL): the last migration's.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].version;

pub(crate) fn map_open_err(path: &Path, e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => Error::NotADatabase {
            path: path.to_path_buf(),
        },
        _ => Error::Sqlite(e),
    }
}

/// Refuses, before SQLite touches it ([`Error::NotADatabase`],
/// [`Error::NotAFilePath`]), a path that is not a regular file (a
/// directory gives "disk I/O error", a FIFO blocks the open for ever).
/// Also refuses what SQLite would not treat as a file path: an empty path,
/// `:memory:`, and `file:` URIs.
pub fn check_path(path: &Path) -> Result<()> {
    let refuse = |reason| {
        Err(Error::NotAFilePath {
            path: path.to_path_buf(),
            reason,
        })
    };
    let text = path.to_string_lossy();
    if text.is_empty() {
        return refuse("it is empty");
    }
    if text == ":memory:" {
        return refuse(
            "an in-memory database is not durable and not shared by the pool's connections",
        );
    }
    if text.starts_with("file:") {
        return refuse(
            "URIs are not accepted; write ./file:... for a file whose name starts with file:",
        );
    }
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(Error::NotADatabase {
            path: path.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

/// Reads `user_version` and refuses files abridge cannot use. Returns the version.
///
/// The version and the table count are read in one statement, so one snapshot:
/// another process migrating the same new file in between cannot make it look
/// like a foreign database.
pub(crate) fn check_file(conn: &Connection, path: &Path) -> Result<i64> {
    let (version, tables, ours): (i64, i64, i64) = conn
        .query_row(
            "SELECT (SELECT user_version FROM pragma_user_version), \
                    (SELECT count(*) FROM sqlite_master WHERE type = 'table'), \
                    (SELECT count(*) FROM sqlite_master WHERE type = 'table' \
                     AND name IN ('sessions', 'turns', 'steps', 'tool_invocations', 'compactions'))",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(|e| map_open_err(path, e))?;
    if version > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    // Tables without a stamp, or a stamp without abridge's tables: not ours.
    if (version == 0 && tables > 0) || (version > 0 && ours < 5) {
        return Err(Error::ForeignDatabase {
            path: path.to_path_buf(),
        });
    }
    Ok(version)
}

/// Retries `f` while SQLite says busy or locked, until `timeout` has passed.
pub(crate) fn retry_busy<T>(
    timeout: Duration,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match f() {
            Err(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

pub(crate) fn migrate(conn: &mut crate::store::db::Connection, path: &Path) -> Result<()> {
    let tx = conn.write_tx()?;
    // Re-check inside the write lock: another process may have migrated first.
    let version = check_file(tx.sqlite("the schema check")?, path)?;
    if version == 0 {
        tx.execute_batch(SCHEMA_SQL)?;
        tx.execute_batch("PRAGMA user_version = 1")?;
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > version.max(1)) {
        tx.execute_batch(m.sqlite)?;
        run_hook(&tx, m.hook)?;
        tx.execute_batch(&format!("PRAGMA user_version = {}", m.version))?;
    }
    tx.commit()?;
    Ok(())
}

/// Runs a migration's hook inside its transaction.
pub(crate) fn run_hook(conn: &crate::store::db::Connection, hook: Option<Hook>) -> Result<()> {
    match hook {
        None => Ok(()),
        Some(Hook::BackfillPins) => crate::store::pins::backfill(conn).map(|_| ()),
        Some(Hook::SpellOutChecks) => match conn.kind() {
            crate::store::BackendKind::Sqlite => spell_out_checks(conn.sqlite("the checks")?),
            crate::store::BackendKind::Postgres => Ok(()),
        },
    }
}

/// The columns' checks of a list of three or more values, on the tables a
/// turn writes: (table, column, the values as the schema spells them).
/// SQLite runs `CHECK (x IN (...))` of such a list by building a temporary
/// b-tree of it at every row written; `redacted_rows.tbl`, written only by a
/// redaction, keeps its list.
const LISTED_CHECKS: &[(&str, &str, &[&str])] = &[
    ("turns", "status", &["'running'", "'completed'", "'failed'"]),
    (
        "compactions",
        "status",
        &["'pending'", "'completed'", "'failed'"],
    ),
    (
        "steps",
        "status",
        &["'running'", "'responded'", "'completed'", "'failed'"],
    ),
    (
        "tool_invocations",
        "effect",
        &[
            "'transactional'",
            "'idempotent'",
            "'at_most_once'",
            "'none'",
        ],
    ),
    (
        "tool_invocations",
        "status",
        &["'started'", "'completed'", "'failed'"],
    ),
    (
        "pins",
        "source",
        &["'user'", "'assistant'", "'tool'", "'host'"],
    ),
    ("pins", "windowed", &["0", "1", "2"]),
    (
        "approvals",
        "effect",
        &[
            "'transactional'",
            "'idempotent'",
            "'at_most_once'",
            "'deferred'",
        ],
    ),
    (
        "approvals",
        "status",
        &[
            "'pending'",
            "'approved'",
            "'rejected'",
            "'delivered'",
            "'abandoned'",
        ],
    ),
];

/// A listed check as the schema wrote it, and spelled out: the same rule
/// (a NULL passes both; the column's affinity and collation apply to each
/// comparison as to the list's).
fn listed_and_spelled(column: &str, values: &[&str]) -> (String, String) {
    let listed = format!("CHECK ({column} IN ({}))", values.join(", "));
    let spelled = values
        .iter()
        .map(|v| format!("{column} = {v}"))
        .collect::<Vec<_>>()
        .join(" OR ");
    (listed, format!("CHECK ({spelled})"))
}

/// Version 14's hook, inside the migration's transaction: rewrites each of
/// [`LISTED_CHECKS`] in its table's `CREATE TABLE` text, the way SQLite's
/// documentation gives for a change of constraints that leaves every row as
/// it is (`writable_schema`, the schema's version moved on so that every
/// connection re-reads it), then re-reads the schema on this connection: a
/// text SQLite would not parse fails the migration, which rolls back. A
/// table whose text does not hold the check as written (a store made by
/// other means) keeps its own.
pub(crate) fn spell_out_checks(c: &Connection) -> Result<()> {
    let changes: Vec<(&str, String, String)> = LISTED_CHECKS
        .iter()
        .map(|(table, column, values)| {
            let (listed, spelled) = listed_and_spelled(column, values);
            (*table, listed, spelled)
        })
        .collect();
    rewrite_checks(c, &changes)
}

/// Rewrites, in each `(table, from, to)`, the table's check `from` (when its
/// `CREATE TABLE` text holds it once) as `to`, and re-reads the schema: see
/// [`spell_out_checks`]. Called inside a transaction, which an error rolls
/// back.
fn rewrite_checks(c: &Connection, changes: &[(&str, String, String)]) -> Result<()> {
    // Each table's text as read, and as rewritten so far.
    let mut texts: Vec<(&str, String, String)> = Vec::new();
    for (table, from, to) in changes {
        let i = match texts.iter().position(|(t, _, _)| t == table) {
            Some(i) => i,
            None => {
                let read: Option<String> = c
                    .query_row(
                        "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                        [table],
                        |r| r.get(0),
                    )
                    .optional()?;
                let Some(read) = read else { continue };
                texts.push((table, read.clone(), read));
                texts.len() - 1
            }
        };
        let text = &mut texts[i].2;
        if text.matches(from.as_str()).count() == 1 {
            *text = text.replace(from.as_str(), to);
        }
    }
    let rewritten: Vec<(&str, String)> = texts
        .into_iter()
        .filter(|(_, read, text)| read != text)
        .map(|(table, _, text)| (table, text))
        .collect();
    if rewritten.is_empty() {
        return Ok(());
    }
    let version: i64 = c.query_row("PRAGMA schema_version", [], |r| r.get(0))?;
    c.execute_batch("PRAGMA writable_schema = ON")?;
    let written = (|| -> Result<()> {
        for (table, sql) in &rewritten {
            c.execute(
                "UPDATE sqlite_schema SET sql = ?1 WHERE type = 'table' AND name = ?2",
                rusqlite::params![sql, table],
            )?;
        }
        c.execute_batch(&format!("PRAGMA schema_version = {}", version + 1))?;
        Ok(())
    })();
    // RESET also drops this connection's copy of the schema.
    c.execute_batch("PRAGMA writable_schema = RESET")?;
    written?;
    for (table, _) in &rewritten {
        c.prepare(&format!("SELECT 1 FROM \"{table}\" LIMIT 0"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 14's safety net: a rewritten check that SQLite would not
    /// parse fails the re-read inside the transaction, whose rollback leaves
    /// the schema as it was (the check still refusing, the file whole for a
    /// new connection).
    #[test]
    fn a_rewritten_check_sqlite_would_not_parse_rolls_the_migration_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut c = Connection::open(&path).unwrap();
        c.execute_batch(SCHEMA_SQL).unwrap();
        c.execute_batch(
            "INSERT INTO sessions (id, external_id, model, system_prompt, created_at) \
             VALUES (1, 's', 'm', '', 0)",
        )
        .unwrap();
        let (table, column, values) = LISTED_CHECKS[0];
        assert_eq!((table, column), ("turns", "status"));
        let (listed, _) = listed_and_spelled(column, values);
        let broken = "CHECK (status = 'running' OR".to_string();
        let tx = c.transaction().unwrap();
        let err = rewrite_checks(&tx, &[("turns", listed.clone(), broken)]).unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");
        drop(tx);
        let insert = |c: &Connection, status: &str, idx: i64| {
            c.execute(
                "INSERT INTO turns (session_id, idx, input, status, created_at) \
                 VALUES (1, ?1, 'x', ?2, 0)",
                rusqlite::params![idx, status],
            )
        };
        let again = Connection::open(&path).unwrap();
        for c in [&c, &again] {
            let sql: String = c
                .query_row(
                    "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'turns'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(sql.contains(&listed), "{sql}");
            let ok: String = c.query_row("PRAGMA quick_check", [], |r| r.get(0)).unwrap();
            assert_eq!(ok, "ok");
            let err = insert(c, "bogus", 0).unwrap_err().to_string();
            assert!(err.contains("CHECK constraint failed"), "{err}");
        }
        insert(&again, "running", 0).unwrap();
    }

    #[test]
    fn the_list_is_in_order_and_every_version_above_the_postgres_baseline_has_its_postgres_form() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        let want: Vec<i64> = (2..=SCHEMA_VERSION).collect();
        assert_eq!(versions, want);
        for m in MIGRATIONS {
            assert_eq!(
                m.postgres.is_some(),
                m.version > PG_BASELINE,
                "version {}: a PostgreSQL form exactly above the baseline",
                m.version
            );
        }
    }
}
