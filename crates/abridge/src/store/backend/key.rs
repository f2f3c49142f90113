//! Encryption at rest: the key of a store encrypted with SQLCipher (the
//! `encryption` feature builds SQLite as SQLCipher, with OpenSSL built in).
//!
//! Every connection to an encrypted store, pooled or read-only, sets the key
//! before anything reads the file (`PRAGMA key`); every page, the WAL's
//! included, is then encrypted (AES-256, SQLCipher 4's defaults). A wrong key
//! is [`Error::WrongKey`]; a key given to a build without SQLCipher is
//! [`Error::EncryptionUnavailable`], before anything touches the file.

use crate::error::{Error, Result};
use rusqlite::Connection;
use std::path::Path;
use std::sync::Arc;

/// The key of an encrypted store, as the host supplies it: a passphrase
/// (SQLCipher derives the key from it, PBKDF2-HMAC-SHA512) or 32 raw key
/// bytes. Its `Debug` shows no part of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Arc<str>);

impl Key {
    /// A passphrase; refused when empty (SQLCipher would leave the file
    /// unencrypted).
    ///
    /// A passphrase of the form `x'…'` is SQLCipher's syntax for a raw key,
    /// and is read so: it must hold 64 hex digits (the key) or 96 (the key
    /// and the salt); any other `x'…'` is refused as a malformed raw key
    /// ([`Error::Config`]), never tried as a passphrase that would then
    /// look like a wrong key.
    pub fn passphrase(passphrase: impl Into<String>) -> Result<Key> {
        let p = passphrase.into();
        if p.is_empty() {
            return Err(Error::Config(
                "an encryption passphrase must not be empty".into(),
            ));
        }
        let raw = p
            .strip_prefix("x'")
            .or_else(|| p.strip_prefix("X'"))
            .and_then(|r| r.strip_suffix('\''));
        if let Some(hex) = raw {
            let digits = hex.chars().all(|c| c.is_ascii_hexdigit());
            if !digits || !(hex.len() == 64 || hex.len() == 96) {
                return Err(Error::Config(format!(
                    "malformed raw key: x'…' must hold 64 hex digits (or 96 with the salt); \
                     this one holds {} characters{}",
                    hex.chars().count(),
                    if digits { "" } else { ", not all hex digits" }
                )));
            }
        }
        Ok(Key(p.into()))
    }

    /// 32 raw key bytes (no key derivation: for a key the host keeps in a
    /// keychain or a key service).
    pub fn raw(bytes: [u8; 32]) -> Key {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Key(format!("x'{hex}'").into())
    }

    /// The `PRAGMA key` value.
    fn pragma_value(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key([redacted])")
    }
}

/// True when this build's SQLite is SQLCipher.
pub fn encryption_available() -> bool {
    cfg!(feature = "encryption")
}

/// Sets `key` on a connection that has not read the file yet.
pub(crate) fn apply_key(conn: &Connection, key: Option<&Key>) -> Result<()> {
    let Some(key) = key else {
        return Ok(());
    };
    // SQLCipher's set-up first: it also sets the default log level, which
    // the pragma below must come after.
    sqlcipher_ready()?;
    // Checked on the connection too: SQLCipher answers `cipher_version`
    // without reading the file, plain SQLite ignores the pragma.
    let cipher = conn
        .query_row("PRAGMA cipher_version", [], |r| r.get::<_, String>(0))
        .is_ok();
    if !cipher {
        return Err(Error::EncryptionUnavailable);
    }
    // SQLCipher logs a wrong key's failed page check to stderr itself;
    // the error is ours to report (a host can set its own level after).
    conn.execute_batch("PRAGMA cipher_log_level = NONE")?;
    set_key(conn, key)?;
    Ok(())
}

/// Waits for SQLCipher's own set-up, or does it, before a connection is
/// keyed.
///
/// SQLite counts itself initialized before it runs SQLCipher's set-up
/// (`SQLITE_EXTRA_INIT`, which SQLCipher requires to be
/// `sqlcipher_extra_init`: its private heap, its crypto provider). A thread
/// that opens a connection while another is still inside that set-up finds
/// SQLite ready and SQLCipher not, and its `PRAGMA key` fails ("An error
/// occurred with PRAGMA key or rekey"): only a process's first opens, made
/// at once, can meet it. `sqlcipher_extra_init` works under SQLite's main
/// mutex and returns at once when the set-up is done, so calling it waits
/// for a set-up in progress.
#[cfg(feature = "encryption")]
fn sqlcipher_ready() -> Result<()> {
    use std::ffi::{c_char, c_int};
    use std::sync::atomic::{AtomicBool, Ordering};
    extern "C" {
        fn sqlcipher_extra_init(arg: *const c_char) -> c_int;
    }
    static READY: AtomicBool = AtomicBool::new(false);
    if READY.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: SQLite is initialized (the caller holds an open connection);
    // the function takes no pointer it keeps and is idempotent under SQLite's
    // main mutex.
    let rc = unsafe { sqlcipher_extra_init(std::ptr::null()) };
    if rc != rusqlite::ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rc), None).into());
    }
    READY.store(true, Ordering::Release);
    Ok(())
}

#[cfg(not(feature = "encryption"))]
fn sqlcipher_ready() -> Result<()> {
    Ok(())
}

/// `PRAGMA key` (on SQLCipher; see [`apply_key`]).
pub(crate) fn set_key(conn: &Connection, key: &Key) -> rusqlite::Result<()> {
    conn.pragma_update(None, "key", key.pragma_value())
}

/// A refused first read of a keyed connection: the key does not open it.
pub(crate) fn map_keyed_err(path: &Path, key: Option<&Key>, e: Error) -> Error {
    match (key, e) {
        (Some(_), Error::NotADatabase { .. }) => Error::WrongKey {
            path: path.to_path_buf(),
        },
        (_, e) => e,
    }
}

/// An ordinary connection to the store at `location`, opened with `key` (an
/// encrypted store's): what a test kit's outside service, or a harness's
/// lock holder, uses beside a store's pool.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn connect(
    location: crate::store::Location,
    key: Option<&Key>,
) -> Result<crate::store::Connection> {
    match location {
        #[cfg(feature = "postgres")]
        crate::store::Location::Postgres(url) => {
            Ok(crate::store::pg::parse(&url)?.connect()?.into())
        }
        #[cfg(not(feature = "postgres"))]
        crate::store::Location::Postgres(_) => Err(Error::Unsupported {
            what: "a postgres:// store (build with the `postgres` feature)",
            backend: crate::store::BackendKind::Postgres,
        }),
        crate::store::Location::File(path) => {
            let conn = rusqlite::Connection::open(path)?;
            apply_key(&conn, key)?;
            conn.busy_timeout(std::time::Duration::from_secs(30))?;
            Ok(conn.into())
        }
    }
}

/// Writes a copy of the store at `from` (opened with `from_key`, None when
/// it is not encrypted) to the new file `to`, encrypted with `to_key` (None:
/// not encrypted): how a plain store is encrypted, an encrypted one given a
/// new key, or decrypted. SQLCipher's `sqlcipher_export` copies every table,
/// index, trigger and row in one transaction of a read snapshot; the schema
/// version is stamped after. The source is only read (a host may go on
/// using it; what it writes after the snapshot is not in the copy), `to`
/// must not exist (it is never overwritten) and is created readable by its
/// owner only. The copy is opened with `to_key` and its version checked
/// before this returns. Needs the `encryption` feature
/// ([`Error::EncryptionUnavailable`] otherwise); the source must be at this
/// build's schema version ([`Error::SchemaTooOld`] names `abridge upgrade`).
///
/// The copy is written as `{to}.rekey-partial` and renamed to `to` once it
/// reads back with `to_key`: a rekey killed midway leaves only that file,
/// which the next run replaces. A `-wal` or `-shm` file already beside `to`
/// is refused (it belongs to another file).
///
/// To use the copy in place of the store: stop every process that has the
/// store open, move the copy over it, and delete the store's old `-wal` and
/// `-shm` files (they belong to the old file and its key). A store that
/// finds a `-wal` written under another key refuses to open
/// ([`Error::ForeignWal`]) and writes nothing.
pub fn rekey_copy(
    from: impl AsRef<Path>,
    from_key: Option<&Key>,
    to: impl AsRef<Path>,
    to_key: Option<&Key>,
) -> Result<()> {
    let (from, to) = (from.as_ref(), to.as_ref());
    if !encryption_available() {
        return Err(Error::EncryptionUnavailable);
    }
    crate::store::check_path(to)?;
    if to.exists() {
        return Err(Error::Config(format!(
            "{} exists: the copy goes to a new file, never over one",
            to.display()
        )));
    }
    // A WAL beside the target belongs to some other file: the copy would
    // be read with it.
    for side in ["-wal", "-shm"] {
        let s = crate::store::snapshot::sidecar(to, side);
        if s.exists() {
            return Err(Error::Config(format!(
                "{} exists beside {}: it belongs to another file; remove it first",
                s.display(),
                to.display()
            )));
        }
    }
    // Written under a name of its own, then renamed into place: a rekey
    // killed midway leaves only that file, which the next run replaces.
    let partial = crate::store::snapshot::sidecar(to, ".rekey-partial");
    for side in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(crate::store::snapshot::sidecar(&partial, side));
    }
    // Checks the source (a store, this version, the key) without writing.
    crate::store::read_only_keyed(from, from_key, |_| Ok(()))?;
    let conn = Connection::open(from).map_err(|e| crate::store::schema::map_open_err(from, e))?;
    apply_key(&conn, from_key)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    crate::store::create_private(&partial)?;
    let copied = (|| -> Result<()> {
        let target = partial
            .to_str()
            .ok_or_else(|| Error::Config(format!("{} is not a UTF-8 path", to.display())))?;
        conn.execute(
            "ATTACH DATABASE ?1 AS rekeyed KEY ?2",
            rusqlite::params![target, to_key.map_or("", |k| k.pragma_value())],
        )?;
        let tx = conn.unchecked_transaction()?;
        tx.query_row("SELECT sqlcipher_export('rekeyed')", [], |_| Ok(()))?;
        tx.execute_batch(&format!(
            "PRAGMA rekeyed.user_version = {}",
            crate::store::SCHEMA_VERSION
        ))?;
        tx.commit()?;
        conn.execute_batch("DETACH DATABASE rekeyed")?;
        Ok(())
    })();
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    drop(conn);
    crate::store::read_only_keyed(&partial, to_key, |_| Ok(()))?;
    // No replacing rename: `to` may have appeared meanwhile.
    if to.exists() {
        let _ = std::fs::remove_file(&partial);
        return Err(Error::Config(format!(
            "{} appeared while the copy was written; the copy was not put there",
            to.display()
        )));
    }
    std::fs::rename(&partial, to)?;
    crate::store::read_only_keyed(to, to_key, |_| Ok(()))
}
