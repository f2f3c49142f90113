//! What a file must be to be a store, and how it becomes one: the path and
//! file checks that refuse anything else untouched, the schema of version 1
//! and the numbered migrations after it.

use crate::error::{Error, Result};
use rusqlite::Connection;
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
