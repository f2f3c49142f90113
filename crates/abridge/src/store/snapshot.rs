//! Read-only access to a store from outside any host: an ordinary read-only
//! connection, and the trace-free snapshot the command line reads through.

use super::db::Connection;
use super::schema::{check_file, check_path, map_open_err};
use super::{apply_key, map_keyed_err, Key, Location};
use crate::error::{Error, Result};
use rusqlite::OpenFlags;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Opens an existing abridge database read-only: for inspecting a store while a
/// host writes to it. Never creates or modifies the file.
pub fn open_read_only(path: impl Into<Location>) -> Result<Connection> {
    open_read_only_keyed(path, None)
}

/// [`open_read_only`] for a store encrypted with `key` (see [`super::Key`]).
pub fn open_read_only_keyed(path: impl Into<Location>, key: Option<&Key>) -> Result<Connection> {
    let path = match path.into() {
        Location::Postgres(url) => {
            let (conn, version, display) = open_server(&url, key)?;
            current(&display, version)?;
            return Ok(conn);
        }
        Location::File(path) => path,
    };
    let path = path.as_path();
    let (conn, version) = open_checked(path, key)?;
    current(path, version)?;
    Ok(conn)
}

/// The schema version of the store at `path` (`PRAGMA user_version`), read
/// without writing; refuses what is not an abridge store or is newer than
/// this build.
pub fn read_only_version(path: impl Into<Location>) -> Result<i64> {
    read_only_version_keyed(path, None)
}

/// [`read_only_version`] for a store encrypted with `key`.
pub fn read_only_version_keyed(path: impl Into<Location>, key: Option<&Key>) -> Result<i64> {
    match path.into() {
        Location::Postgres(url) => open_server(&url, key).map(|(_, v, _)| v),
        Location::File(path) => Ok(open_checked(&path, key)?.1),
    }
}

/// A connection to the PostgreSQL store at `url`, its schema version
/// (refused when newer than this build's, or missing: an older one is for
/// the caller to refuse or upgrade, as for a file) and its display name.
#[cfg(feature = "postgres")]
fn open_server(url: &str, key: Option<&Key>) -> Result<(Connection, i64, PathBuf)> {
    if key.is_some() {
        return Err(Error::Config(
            "a PostgreSQL store takes no key: encryption at rest is the server's".into(),
        ));
    }
    let target = super::pg::parse(url)?;
    let conn = target.connect()?;
    let version = target.version(&conn)?;
    Ok((
        Connection::from(conn),
        version,
        PathBuf::from(&target.display),
    ))
}

#[cfg(not(feature = "postgres"))]
fn open_server(_: &str, _: Option<&Key>) -> Result<(Connection, i64, PathBuf)> {
    Err(Error::Unsupported {
        what: "a postgres:// store (build with the `postgres` feature)",
        backend: super::BackendKind::Postgres,
    })
}

/// An ordinary read-only connection to an existing abridge store, and its
/// schema version (any this build can migrate).
fn open_checked(path: &Path, key: Option<&Key>) -> Result<(Connection, i64)> {
    check_path(path)?;
    if !path.exists() {
        return Err(Error::NotFound {
            path: path.to_path_buf(),
        });
    }
    let conn = rusqlite::Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| map_open_err(path, e))?;
    apply_key(&conn, key)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    let version = abridge_version(&conn, path).map_err(|e| map_keyed_err(path, key, e))?;
    Ok((Connection::from(conn), version))
}

/// Runs `read` on a read-only view of the store at `path` that leaves no
/// trace: no `-wal` or `-shm` file is created, and it works in a directory the
/// user cannot write.
///
/// When the store has no `-wal` file, or an empty one (every writer closed
/// cleanly, or checkpointed and truncated it), all its rows are in the main
/// file: it is opened `immutable` (no locks, no
/// shared memory) and `read` runs; if the main file's size or modification
/// time changed meanwhile, or the `-wal` file holds frames (another process
/// may have checkpointed into it), the read is not trusted and runs again on an ordinary read-only connection, which may
/// create the `-shm` file (or, in an unwritable directory, fails with
/// [`Error::ChangedWhileReading`]). When the `-wal` file holds frames, a
/// writer is running or did not close: an ordinary read-only connection reads
/// them (creating the `-shm` file if it is missing and the directory allows).
///
/// `read` may run twice; it must only read.
pub fn read_only<T>(
    path: impl Into<Location>,
    read: impl FnMut(&Connection) -> Result<T>,
) -> Result<T> {
    read_only_keyed(path, None, read)
}

/// [`read_only`] for a store encrypted with `key` (see [`super::Key`]).
pub fn read_only_keyed<T>(
    path: impl Into<Location>,
    key: Option<&Key>,
    mut read: impl FnMut(&Connection) -> Result<T>,
) -> Result<T> {
    let path = match path.into() {
        Location::Postgres(url) => {
            // One snapshot for every read, as a file read gives; an older
            // schema is refused as a file's is.
            let (conn, version, display) = open_server(&url, key)?;
            current(&display, version)?;
            return conn.in_read_tx(|c| read(c));
        }
        Location::File(path) => path,
    };
    let path = path.as_path();
    if key.is_some() && !super::encryption_available() {
        return Err(Error::EncryptionUnavailable);
    }
    check_path(path)?;
    if !path.exists() {
        return Err(Error::NotFound {
            path: path.to_path_buf(),
        });
    }
    let wal = sidecar(path, "-wal");
    // No -wal, or an empty one (checkpointed and truncated): no frames, so
    // every committed row is in the main file.
    let wal_empty = || std::fs::metadata(&wal).map_or(true, |m| m.len() == 0);
    if wal_empty() {
        let before = file_stamp(path);
        let conn = open_immutable(path, key)?;
        let out = read(&conn)?;
        drop(conn);
        // A checkpoint into the main file needs a writer with the -wal open,
        // and a writer that closed meanwhile changed the file's stamp.
        if before.is_some() && wal_empty() && file_stamp(path) == before {
            return Ok(out);
        }
        return match open_read_only_keyed(path, key) {
            Ok(conn) => read(&conn),
            Err(Error::Sqlite(_)) => Err(Error::ChangedWhileReading {
                path: path.to_path_buf(),
            }),
            Err(e) => Err(e),
        };
    }
    let conn = open_read_only_keyed(path, key)?;
    read(&conn)
}

/// `path` with `suffix` appended to its file name (`x.db` -> `x.db-wal`).
pub(crate) fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Size and modification time: what a write into the file changes.
fn file_stamp(path: &Path) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// True when the key opens the main file read alone (`immutable`: SQLite
/// ignores the `-wal` file) while the file read with its `-wal` refused it,
/// and that `-wal` holds frames: the WAL was written under another key, or
/// for another file (an old file's WAL beside the copy `rekey` wrote). Only
/// reads; a main file with no page yet (everything still in the WAL) cannot
/// tell, and says false.
pub(crate) fn wal_is_foreign(path: &Path, key: &Key) -> bool {
    let has_frames = std::fs::metadata(sidecar(path, "-wal")).is_ok_and(|m| m.len() > 32);
    let main_has_pages = std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
    has_frames
        && main_has_pages
        && immutable_conn(path, Some(key))
            .and_then(|conn| abridge_version(&conn, path))
            .is_ok()
}

/// Opens `path` read-only with `immutable=1`: SQLite takes no lock and makes
/// no `-shm`. Only sound while nothing writes the main file (checked by the
/// caller).
fn open_immutable(path: &Path, key: Option<&Key>) -> Result<Connection> {
    let conn = immutable_conn(path, key)?;
    current(
        path,
        abridge_version(&conn, path).map_err(|e| map_keyed_err(path, key, e))?,
    )?;
    Ok(Connection::from(conn))
}

/// The keyed `immutable=1` connection of [`open_immutable`], unchecked.
fn immutable_conn(path: &Path, key: Option<&Key>) -> Result<rusqlite::Connection> {
    let abs = std::path::absolute(path)?;
    let mut uri = String::from("file:");
    for &b in abs.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || b"/._-~".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    let conn = rusqlite::Connection::open_with_flags(
        &uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|e| map_open_err(path, e))?;
    apply_key(&conn, key)?;
    Ok(conn)
}

/// The store's schema version; a file with no abridge version is foreign.
fn abridge_version(conn: &rusqlite::Connection, path: &Path) -> Result<i64> {
    match check_file(conn, path)? {
        0 => Err(Error::ForeignDatabase {
            path: path.to_path_buf(),
        }),
        v => Ok(v),
    }
}

/// Refuses a store of an older schema: this build's queries would misread it.
fn current(path: &Path, version: i64) -> Result<()> {
    if version < super::SCHEMA_VERSION {
        return Err(Error::SchemaTooOld {
            path: path.to_path_buf(),
            found: version,
            supported: super::SCHEMA_VERSION,
        });
    }
    Ok(())
}
