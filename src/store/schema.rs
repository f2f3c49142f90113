//! What a file must be to be a store, and how it becomes one: the path and
//! file checks that refuse anything else untouched, the schema of version 1
//! and the numbered migrations after it.

use crate::error::{Error, Result};
use rusqlite::Connection;
use std::path::Path;
use std::time::Duration;

/// The schema of version 1, applied on first open; the numbered
/// [`MIGRATIONS`] follow it.
pub const SCHEMA_SQL: &str = include_str!("../../schema.sql");

/// Schema changes after version 1, in order: `(version, sql)`. A store at
/// version `v` gets every migration above `v`, each with its version stamp,
/// in one IMMEDIATE transaction; a new store gets `SCHEMA_SQL` and all of
/// them. Never edit one that has shipped: add the next.
pub const MIGRATIONS: &[(i64, &str)] = &[
    (2, include_str!("migrations/0002_append_only.sql")),
    (3, include_str!("migrations/0003_pins.sql")),
    (4, include_str!("migrations/0004_background.sql")),
    (5, include_str!("migrations/0005_providers.sql")),
    (6, include_str!("migrations/0006_erasure.sql")),
    (7, include_str!("migrations/0007_redaction.sql")),
];

/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 7;

pub(super) fn map_open_err(path: &Path, e: rusqlite::Error) -> Error {
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
pub(super) fn check_file(conn: &Connection, path: &Path) -> Result<i64> {
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
pub(super) fn retry_busy<T>(
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

pub(super) fn migrate(conn: &mut super::db::Connection, path: &Path) -> Result<()> {
    let tx = conn.write_tx()?;
    // Re-check inside the write lock: another process may have migrated first.
    let version = check_file(tx.sqlite("the schema check")?, path)?;
    if version == 0 {
        tx.execute_batch(SCHEMA_SQL)?;
        tx.execute_batch("PRAGMA user_version = 1")?;
    }
    for (v, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > version.max(1)) {
        tx.execute_batch(sql)?;
        if *v == 3 {
            // Turns finished before pins existed are pinned now, with the
            // built-in extractor, so the next compaction carries their facts.
            super::pins::backfill(&tx)?;
        }
        tx.execute_batch(&format!("PRAGMA user_version = {v}"))?;
    }
    tx.commit()?;
    Ok(())
}
