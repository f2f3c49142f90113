//! The store: every SQL statement abridge issues lives under this module.
//!
//! A [`Store`] owns a pool of SQLite connections to one file (`pool`). Opening it
//! checks the file (not a database, a foreign database, a newer schema: typed
//! errors, nothing written), sets WAL once, and applies `schema.sql` with its
//! version stamp in one IMMEDIATE transaction. Every write transaction is
//! `BEGIN IMMEDIATE`, so writers queue on SQLite's busy handler instead of
//! failing with `SQLITE_BUSY` on lock upgrade.
//!
//! The async entry points run their SQLite work in place on the calling
//! worker of a multi-thread runtime (`block_in_place`, [`Blocking::InPlace`],
//! the default) or on tokio's blocking pool ([`Blocking::Pool`], and on a
//! current-thread runtime). A runner's step calls run on the calling
//! worker with no hand-off at all, handing its other tasks off only at a
//! lock wait or at work that grows with the history (`inline`). Another
//! exception is a short read that cannot wait (`ensure()`'s decision): it runs
//! on the calling thread when a connection is idle, with SQLite's busy handler
//! off, and through the pool otherwise.
//!
//! # Layout
//! One file per thing stored, each with every statement about it:
//! `sessions`, `turns`, `leases` (taking, fencing, renewing a turn's lease),
//! `steps`, `invocations`, `compactions`, `pins`, `history` (the rows a context is
//! built from); `rows` holds the row types; `schema` the file checks, the
//! schema of version 1 and the numbered migrations; `tx` the transaction
//! helpers; `snapshot` read-only access from outside a host; `audit` the
//! counts and checks `inspect` and `verify` read; `erase` deleting a session
//! whole and `redact` redacting a secret (the two exceptions to append-only
//! history); `key` the key of an encrypted store; `pool` the connection
//! pool, whose last handle's drop returns once every connection is closed;
//! `inline` the step calls that run on the calling worker.
//! This file holds the [`Store`] itself: options, opening, the blocking
//! bridge.

mod backend;
mod location;
mod schema;
mod snapshot;
mod tables;

// The rooms' modules, by the paths the engine names them with.
pub(crate) use backend::{db, group, inline, key, pool, tx};
#[cfg(feature = "postgres")]
pub(crate) use backend::{dialect, pg};
pub(crate) use tables::{history, leases, pins, rows, sessions, turns};

// The backend.
pub use db::{
    BackendKind, ColumnIndex, Connection, MappedRows, OptionalExtension, Params, Row, Rows,
    Savepoint, Statement, Transaction,
};
pub(crate) use inline::may_block;
#[cfg(any(test, feature = "testing"))]
pub(crate) use key::connect;
pub(crate) use key::{apply_key, map_keyed_err, set_key};
pub use key::{encryption_available, rekey_copy, Key};
#[cfg(feature = "postgres")]
pub use pg::SCHEMA_PG_SQL;
pub(crate) use tx::{in_read_tx, in_step_read_tx, write_tx};

// Where a store lives, its schema, its read-only snapshots.
pub use location::{is_url, Location};
use schema::{check_file, map_open_err, migrate, retry_busy};
pub use schema::{check_path, Migration, MIGRATIONS, PG_BASELINE, SCHEMA_SQL, SCHEMA_VERSION};
pub use snapshot::{
    open_read_only, open_read_only_keyed, read_only, read_only_keyed, read_only_version,
    read_only_version_keyed,
};

// The tables: each family's rows, statements and functions.
pub use tables::approvals::Decision;
pub(crate) use tables::approvals::{
    abandon_calls, approval_for_call, expire_call, granted, park_call, park_turn, parked_since,
    waiting_calls, NewApproval,
};
pub use tables::approvals::{get_approval, list_approvals, pending_calls};
pub(crate) use tables::audit::{
    all_compactions, duplicate_boundaries, executed_step_ids, integrity_check,
    invocation_anomalies, invocation_count, session_counts, steps_reading_non_completed,
};
#[cfg(any(test, feature = "testing"))]
pub(crate) use tables::audit::{background_totals, run_totals, summary_waits, takeovers};
pub use tables::audit::{finished_turns, SessionCounts};
pub(crate) use tables::compactions::{
    claim_compaction, compaction_at, complete_compaction, enqueue_compaction, fail_compaction,
    get_compaction, held_by_live_other, latest_completed, latest_completed_id, list_compactions,
    newest_pending, note_compaction_error, pending_compactions, prefetch_compaction_at,
    prefetch_latest_completed_id, renew_compaction_lease, retry_compaction, Claim, Thresholds,
};
pub use tables::compactions::{ClaimOutcome, CompactionStats};
pub(crate) use tables::erasures::{checkpoint, deletions_left_behind, next_id, was_deleted};
pub(crate) use tables::history::{load_history, load_range, load_range_from, prefetch_range};
pub use tables::history::{HistoryStep, HistoryTurn};
pub(crate) use tables::invocations::{
    finish_invocation, invocation_exists, list_invocations, run_transactional, start_invocation,
    NewInvocation,
};
pub use tables::leases::Lease;
pub(crate) use tables::leases::{explain_lost, fenced_tx, renew_lease};
pub(crate) use tables::pins::{list_pins, live_pins, pin_host_fact, pin_turn, prefetch_live_pins};
pub(crate) use tables::redactions::{
    input_before_redaction, list_redactions, prefetch_session_redaction, redaction_mark,
    row_redacted, session_redaction,
};
pub use tables::redactions::{RedactedRows, RedactionMark, RedactionRecord, REDACTION_MARKER};
pub use tables::rows::{
    ApprovalKind, ApprovalRow, ApprovalStatus, CompactionRow, CompactionStatus, Effect,
    InvocationRow, InvocationStatus, ParentKind, ParentLink, SessionRow, StepRow, StepStatus,
    TurnRow, TurnStatus,
};
pub(crate) use tables::sessions::{
    children, create_session, delegate_child, find_session, fork_session, forks_reading,
    get_session, list_sessions, running_child_turns,
};
pub(crate) use tables::steps::{
    claim_step, complete_step, get_step, last_step, list_steps, step_read, write_response,
    Responded, ResponseThen,
};
#[cfg(test)]
pub(crate) use tables::turns::session_pace;
pub(crate) use tables::turns::{
    abandon_turn, acquire_lease, background_summary_ms, begin_turn, fail_turn, get_turn,
    latest_context_tokens, list_turns, list_turns_after, prefetch_latest_context_tokens,
    prefetch_recent_window, recent_window_boundary, running_turns, turn_paces, turn_text_chars,
    walk_turn_sizes, Pace, Tail, TurnPace, PACE_TURNS,
};

use crate::error::{Error, Result};
use crate::ids::SessionId;
use rusqlite::config::DbConfig;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How hard each commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `synchronous=NORMAL` in WAL mode: a commit survives a process crash
    /// (kill -9) but the last commits may be lost on power failure. The default;
    /// roughly ten times the commit rate of `Full`.
    #[default]
    Normal,
    /// `synchronous=FULL`: every commit is fsynced; survives power loss too.
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// Options for [`Store::open_with`]: [`StoreOptions::default`] and the
/// `with_*` methods (the struct is `#[non_exhaustive]`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    /// Commit durability; see [`Synchronous`].
    pub synchronous: Synchronous,
    /// How long a connection waits on a locked database before `SQLITE_BUSY`.
    pub busy_timeout: Duration,
    /// Pool size.
    pub max_connections: u32,
    /// Where the async API runs its SQLite work; see [`Blocking`].
    pub blocking: Blocking,
    /// The key of an encrypted store (SQLCipher, the `encryption`
    /// feature); None: not encrypted. See [`Key`].
    pub key: Option<Key>,
    /// Who checkpoints the WAL into the file; see [`Checkpoints`].
    pub checkpoints: Checkpoints,
    /// The clock the store reads and waits on: leases, timestamps, idle
    /// sessions. Default: [`crate::SystemClock`]; a test of expiry gives a
    /// [`crate::ManualClock`] and moves it.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Group commit on an SQLite store of more than one connection (the
    /// default: on): the write transactions of different sessions' turns
    /// that are ready at the same moment commit as one, each all or
    /// nothing (see `docs/design.md`, "Group commit"). Off, each commits
    /// alone on its caller's connection. No effect on PostgreSQL, whose
    /// server commits different sessions' turns side by side.
    pub group_commit: bool,
}

/// The WAL size past which a [`Checkpoints::OffTheStep`] checkpoint
/// empties the WAL itself, when no step has restarted it: 16 MiB.
pub const WAL_RESTART_BYTES: u64 = 4 * WAL_CHECKPOINT_BYTES;

/// The WAL file's length past which a [`Checkpoints::OffTheStep`] store
/// cuts it back when it restarts (`journal_size_limit`): 32 MiB, twice
/// [`WAL_RESTART_BYTES`], so the file keeps the blocks a WAL emptied by a
/// `RESTART` writes over again.
pub const WAL_KEPT_BYTES: u64 = 2 * WAL_RESTART_BYTES;

/// Who copies an SQLite store's WAL back into its file.
///
/// A checkpoint writes and syncs pages: milliseconds, where a step's commit
/// takes microseconds. SQLite's default runs it inside whichever commit finds
/// the WAL past 1,000 pages, so about every 4 MB of WAL one step (on a
/// runtime worker, for a step's inline call) blocks on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Checkpoints {
    /// Off the step's path (the default): no commit checkpoints
    /// (`wal_autocheckpoint = 0`); the call whose commit finds more than
    /// [`WAL_CHECKPOINT_BYTES`] in the WAL not yet checkpointed starts a
    /// `PASSIVE` checkpoint (which waits for no reader or writer) on
    /// tokio's blocking pool and returns. The WAL restarts from its start
    /// at the next write after a complete checkpoint; its file keeps its
    /// length up to [`WAL_KEPT_BYTES`] (`journal_size_limit`).
    #[default]
    OffTheStep,
    /// SQLite's own: the commit that finds 1,000 pages in the WAL
    /// checkpoints, whatever call it is.
    OnCommit,
}

/// The WAL size past which [`Checkpoints::OffTheStep`] checkpoints: 4 MiB
/// (SQLite's own 1,000 pages of 4 KiB).
pub const WAL_CHECKPOINT_BYTES: u64 = 4 * 1024 * 1024;

/// Where [`Store::call`] runs blocking SQLite work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Blocking {
    /// On tokio's blocking pool (`spawn_blocking`): no runtime worker thread ever
    /// blocks on SQLite, at the price of a thread hand-off per store call.
    Pool,
    /// On the calling worker thread, which first hands its other tasks to the
    /// rest of the runtime (`block_in_place`), so the runtime goes on while
    /// the call runs. Saves the thread hand-off of each store call (a step
    /// makes one; about a third of a compaction-on step in the peers
    /// benchmark). A runner's step calls go further on an SQLite store: they
    /// run on the worker as they are, handing its other tasks off only while
    /// they wait for another writer's lock or do work that grows with the
    /// history (a context built from many turns). The default. Falls back to
    /// `Pool` on a current-thread runtime, where `block_in_place` is not
    /// allowed.
    #[default]
    InPlace,
}

impl StoreOptions {
    /// Sets the store's clock. Default: the system's.
    pub fn with_clock(mut self, clock: Arc<dyn crate::clock::Clock>) -> Self {
        self.clock = clock;
        self
    }
    /// Sets who checkpoints the WAL. Default: [`Checkpoints::OffTheStep`].
    pub fn with_checkpoints(mut self, c: Checkpoints) -> Self {
        self.checkpoints = c;
        self
    }
    /// Sets the commit durability.
    pub fn with_synchronous(mut self, s: Synchronous) -> Self {
        self.synchronous = s;
        self
    }
    /// Sets the busy timeout.
    pub fn with_busy_timeout(mut self, t: Duration) -> Self {
        self.busy_timeout = t;
        self
    }
    /// Turns group commit on or off (default on; see
    /// [`StoreOptions::group_commit`]).
    pub fn with_group_commit(mut self, on: bool) -> Self {
        self.group_commit = on;
        self
    }
    /// Sets the pool size.
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }
    /// Sets where blocking SQLite work runs.
    pub fn with_blocking(mut self, b: Blocking) -> Self {
        self.blocking = b;
        self
    }
    /// Encrypts the store with `key` (a new file), or opens an encrypted
    /// one. A wrong key is [`Error::WrongKey`]; a build without the
    /// `encryption` feature refuses a key with
    /// [`Error::EncryptionUnavailable`]. An existing unencrypted store is
    /// not encrypted by opening it with a key (it is refused as
    /// [`Error::WrongKey`]).
    pub fn with_key(mut self, key: Key) -> Self {
        self.key = Some(key);
        self
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(10),
            max_connections: 8,
            blocking: Blocking::default(),
            key: None,
            checkpoints: Checkpoints::default(),
            clock: crate::clock::default_clock(),
            group_commit: true,
        }
    }
}

/// A handle on one abridge database. Cheap to clone.
///
/// Dropping the last handle closes the store's connections before it
/// returns (waiting, at most its busy timeout, for a connection the pool is
/// still opening or one still in use elsewhere): a host may delete or move
/// the file, or exit, right after.
#[derive(Clone)]
pub struct Store {
    pool: pool::Pool,
    backend: BackendKind,
    path: PathBuf,
    blocking: Blocking,
    busy_timeout: Duration,
    settled: Arc<Settled>,
    file: Arc<FileIdentity>,
    /// Times a call handed its work off the calling worker (see `inline`).
    handoffs: Arc<std::sync::atomic::AtomicU64>,
    /// Microseconds the inline calls' busy handler slept waiting for
    /// another writer's lock.
    busy_slept: Arc<std::sync::atomic::AtomicU64>,
    /// The clock the store reads (see [`StoreOptions::clock`]).
    clock: Arc<dyn crate::clock::Clock>,
    /// Leases the renewal tasks of this store's runners keep renewing.
    leases_kept: Arc<std::sync::atomic::AtomicI64>,
    /// Calls on tokio's blocking pool not yet ended.
    in_flight: Arc<std::sync::atomic::AtomicI64>,
    /// The WAL's size, watched for [`Checkpoints::OffTheStep`] (None: SQLite
    /// checkpoints on commit, or the store is on a server).
    wal: Option<Arc<WalWatch>>,
    /// An SQLite store's durability (None on a server).
    synchronous: Option<Synchronous>,
    /// Last: dropped with the last handle, after `pool`, it waits for the
    /// pool's connections to close (see `pool`).
    _closer: Arc<pool::Closer>,
}

/// The WAL of an SQLite store under [`Checkpoints::OffTheStep`]: a call
/// that committed looks at the WAL's frames (SQLite's WAL hook, no system
/// call); one that finds more than [`WAL_CHECKPOINT_BYTES`] not yet
/// checkpointed starts a checkpoint on a thread of its own and goes on. One
/// checkpoint at a time.
///
/// The WAL file is cut back only past [`WAL_KEPT_BYTES`]
/// (`journal_size_limit`): a WAL that restarts from its start writes over
/// blocks the file already has, where one cut back at every restart and
/// grown again has the file system free and allocate its blocks at every
/// cycle (1,000 sessions on one file ran 1.08x the steps a second once the
/// file was kept: docs/benchmarks.md). So the watch counts frames, not the
/// file's length, which no longer falls when the WAL restarts.
#[derive(Debug)]
struct WalWatch {
    /// A frame's bytes in the WAL: the page and its 24-byte header.
    frame_bytes: u64,
    /// The store's, put back on the checkpoint's connection.
    busy_timeout: Duration,
    /// A checkpoint is running.
    running: std::sync::atomic::AtomicBool,
    /// The WAL's bytes when the last checkpoint ended; 0 once the WAL has
    /// restarted since.
    last: std::sync::atomic::AtomicU64,
    /// Checkpoints run.
    checkpoints: std::sync::atomic::AtomicU64,
}

/// The file's page size: an integer from SQLite, text from SQLCipher with a
/// key (its `cipher_page_size`). It only paces the checkpoints: one that
/// reads as neither is taken as SQLite's default, 4,096 bytes.
fn page_size(conn: &rusqlite::Connection) -> rusqlite::Result<u64> {
    use rusqlite::types::Value;
    let v: Value = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let n = match v {
        Value::Integer(n) => u64::try_from(n).ok(),
        Value::Text(t) => t.trim().parse().ok(),
        _ => None,
    };
    Ok(n.filter(|n| (512..=65_536).contains(n)).unwrap_or(4096))
}

std::thread_local! {
    /// The frames in the WAL after this thread's newest commit on a store
    /// under [`Checkpoints::OffTheStep`] (set by SQLite's WAL hook inside
    /// the commit), taken by the store call's [`WalWatch::after_call`].
    static WAL_FRAMES: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// SQLite's WAL hook on a store's connections (every commit, on the
/// committing thread): keeps the WAL's frames for the call to look at.
fn note_wal_frames(_: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.set(u64::try_from(frames).ok());
    Ok(())
}

impl WalWatch {
    /// After a call: starts a checkpoint when the call committed and the
    /// WAL holds more than [`WAL_CHECKPOINT_BYTES`] not checkpointed, on
    /// tokio's blocking pool inside a runtime (the call returns at once),
    /// on the calling thread outside one (a synchronous host's own call,
    /// already off any step). A call that committed nothing looks at
    /// nothing.
    fn after_call(self: &Arc<Self>, pool: &pool::Pool) {
        use std::sync::atomic::Ordering;
        let Some(frames) = WAL_FRAMES.take() else {
            return;
        };
        let used = frames * self.frame_bytes;
        // Fewer bytes than at the last checkpoint's end: the WAL restarted
        // from its start since, and all of it is new.
        let last = match self
            .last
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                (used < l).then_some(0)
            }) {
            Ok(_) => 0,
            Err(l) => l,
        };
        if used < last + WAL_CHECKPOINT_BYTES || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let (this, pool) = (self.clone(), pool.clone());
        let run = move || {
            this.checkpoint(&pool, used);
            this.running.store(false, Ordering::Release);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(run)),
            Err(_) => run(),
        }
    }

    /// Copies the WAL into the file, waiting for no step. `PASSIVE` does the
    /// copying while steps go on committing (again, each time with less to
    /// copy, until it has caught up with the WAL's end); the next write
    /// transaction that begins with the WAL all copied starts it again from
    /// its beginning.
    ///
    /// Steps that commit back to back (a zero-latency model, many sessions
    /// at once) may never begin with the WAL all copied, and the WAL would
    /// only grow: past [`WAL_RESTART_BYTES`] the checkpoint ends with a
    /// `RESTART` tried without waiting (no busy handler). It takes the
    /// write lock only when no step holds it, finds next to nothing left to
    /// copy and leaves the WAL to be started again by the next write; when a
    /// step holds the lock or a reader is in the WAL it gives up at once and
    /// tries again a millisecond later. A step that begins in its moment
    /// (a few milliseconds) waits for it: once per 16 MiB of WAL, against
    /// SQLite's own checkpoint in a step's commit every 4 MiB.
    /// `used`: the WAL's bytes the call that started it saw.
    fn checkpoint(&self, pool: &pool::Pool, used: u64) {
        let Ok(conn) = pool.get() else { return };
        let Some(c) = conn.as_sqlite() else { return };
        // (busy, frames in the WAL, frames copied)
        let run = |mode: &str| {
            c.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                Ok((
                    r.get::<_, i64>(0)? != 0,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
        };
        // The WAL's frames when the copying caught up (or gave up).
        let passive = || {
            let mut frames = 0;
            for _ in 0..8 {
                let (_, log, copied) = run("PASSIVE")?;
                frames = log;
                if copied >= log {
                    break;
                }
            }
            Ok(frames)
        };
        let restart = || {
            for _ in 0..50 {
                c.busy_timeout(Duration::ZERO)?;
                let t = run("RESTART");
                c.busy_timeout(self.busy_timeout)?;
                match t {
                    Ok((false, log, _)) => return Ok(log),
                    Ok((true, _, _)) => {}
                    Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {}
                    Err(e) => return Err(e),
                }
                std::thread::sleep(Duration::from_millis(1));
                passive()?;
            }
            passive()
        };
        let bytes = |frames: i64| u64::try_from(frames).unwrap_or(0) * self.frame_bytes;
        let done = passive().and_then(|frames| {
            if bytes(frames) > WAL_RESTART_BYTES {
                restart()
            } else {
                Ok(frames)
            }
        });
        let _ = c.busy_timeout(self.busy_timeout);
        // Where it failed, or another process's checkpoint held the WAL
        // (SQLite gives -1 frames), the bytes the call saw: the next try
        // waits for 4 MiB more, not for the next commit.
        let at_end = match done {
            Ok(frames) if frames >= 0 => bytes(frames),
            _ => used,
        };
        self.last
            .store(at_end, std::sync::atomic::Ordering::Relaxed);
        match done {
            Ok(frames) => {
                self.checkpoints
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(wal_frames = frames, "WAL checkpointed off the step's path");
            }
            Err(e) => tracing::debug!(error = %e, "WAL checkpoint skipped"),
        }
    }
}

/// The database file as opened: a store whose file is deleted or replaced
/// while open would go on writing into an unlinked inode, its work lost when
/// the process exits. Checked at every turn's start and every lease renewal;
/// once it fails, every store call fails with [`Error::StoreFileGone`].
#[derive(Debug)]
struct FileIdentity {
    opened: Option<(u64, u64)>,
    gone: std::sync::atomic::AtomicBool,
}

/// Wakes the tasks of this process that wait on a compaction another task of
/// it is writing, when that row is completed or failed. Other processes'
/// waiters poll; this only spares waiters in the same process their polling
/// delay.
#[derive(Default)]
struct Settled(std::sync::Mutex<HashMap<(SessionId, i64), Arc<tokio::sync::Notify>>>);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// Creates a missing store file readable and writable by its owner only
/// (0600 on Unix; SQLite gives the `-wal` and `-shm` files the same mode). An
/// existing file keeps the mode its host gave it.
fn create_private(path: &Path) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    crate::platform::private_file(&mut options);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl Store {
    /// Opens (creating if missing) the database at `path` with default options.
    pub fn open(location: impl Into<Location>) -> Result<Store> {
        Store::open_with(location, StoreOptions::default())
    }

    /// Opens (creating if missing) the database at `path`. A new file is
    /// created readable by its owner only (0600 on Unix, and so its `-wal`
    /// and `-shm`); an existing file's mode is left as the host set it.
    ///
    /// Errors: [`Error::NotADatabase`], [`Error::ForeignDatabase`],
    /// [`Error::SchemaTooNew`]; in each case the file is left untouched.
    pub fn open_with(location: impl Into<Location>, opts: StoreOptions) -> Result<Store> {
        let path = match location.into() {
            Location::Postgres(url) => return Store::open_url(&url, opts),
            Location::File(path) => path,
        };
        check_path(&path)?;
        if opts.key.is_some() && !encryption_available() {
            return Err(Error::EncryptionUnavailable);
        }
        create_private(&path)?;
        let key = opts.key.clone();
        let frame_bytes;
        {
            let conn = rusqlite::Connection::open(&path).map_err(|e| map_open_err(&path, e))?;
            // Until the file (and its WAL) has been read with the key, closing
            // this connection must not checkpoint: a wrong key's connection,
            // or one that found a WAL written under another key or for
            // another file, would copy that WAL's frames into the file.
            conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
            apply_key(&conn, key.as_ref())?;
            conn.busy_timeout(opts.busy_timeout)?;
            // Check before anything writes (journal_mode=WAL writes the header).
            check_file(&conn, &path).map_err(|e| {
                let e = map_keyed_err(&path, key.as_ref(), e);
                // A WAL of another key reads as a wrong key, or as a malformed
                // image when its frames decrypt to nonsense.
                let unreadable = match &e {
                    Error::WrongKey { .. } => true,
                    Error::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => matches!(
                        f.code,
                        rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
                    ),
                    _ => false,
                };
                match (&e, &key) {
                    (_, Some(k)) if unreadable && snapshot::wal_is_foreign(&path, k) => {
                        Error::ForeignWal {
                            path: path.clone(),
                            wal: snapshot::sidecar(&path, "-wal"),
                        }
                    }
                    _ => e,
                }
            })?;
            conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)?;
            // WAL once, before the pool exists: setting it from every pooled
            // connection's init races into "database is locked" at start-up.
            // Switching to WAL takes an exclusive lock and can fail with
            // SQLITE_BUSY without the busy handler while another process opens
            // the same new file: retry until the busy timeout.
            let mode: String = retry_busy(opts.busy_timeout, || {
                conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            })
            .map_err(|e| map_open_err(&path, e))?;
            if !mode.eq_ignore_ascii_case("wal") {
                tracing::warn!(%mode, "journal_mode WAL not available");
            }
            frame_bytes = page_size(&conn)? + 24;
            migrate(&mut Connection::from(conn), &path)?;
        }
        let busy = opts.busy_timeout;
        let sync = opts.synchronous;
        let checkpoints = opts.checkpoints;
        let init: pool::Init = Box::new(move |c| {
            if let Some(k) = &key {
                // SQLCipher's presence and the key were checked on the
                // first connection above.
                set_key(c, k)?;
            }
            c.busy_timeout(busy)?;
            // secure_delete: every byte SQLite frees is overwritten as it is
            // freed, so no stale copy of a row (an older version of an
            // updated row, a page freed by a split) is left in the file for
            // a deleted session's text to survive in.
            c.execute_batch(&format!(
                "PRAGMA foreign_keys = ON; PRAGMA synchronous = {}; PRAGMA secure_delete = ON;",
                sync.pragma()
            ))?;
            c.set_prepared_statement_cache_capacity(64);
            // Plans that never depend on the values bound: without it SQLite
            // re-prepares a cached statement at every run whose plan could
            // (the live pins' read, with its `LIMIT`s in nested `UNION ALL`s,
            // was prepared afresh at every run).
            c.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
            if checkpoints == Checkpoints::OffTheStep {
                c.execute_batch(&format!(
                    "PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = {WAL_KEPT_BYTES};"
                ))?;
                // After the pragma, which sets SQLite's own hook.
                c.wal_hook(Some(note_wal_frames));
            }
            Ok(())
        });
        let (pool, closer) = pool::build(
            pool::Connect::Sqlite {
                path: path.clone(),
                init,
            },
            opts.clock.clone(),
            opts.max_connections,
            // Longer than busy_timeout, so a connection wait never fires first.
            busy + Duration::from_secs(5),
            busy,
            (opts.group_commit && opts.max_connections > 1).then_some(busy),
        )?;
        let file = Arc::new(FileIdentity {
            opened: crate::platform::file_identity(&path),
            gone: Default::default(),
        });
        let wal = (checkpoints == Checkpoints::OffTheStep).then(|| {
            Arc::new(WalWatch {
                frame_bytes,
                busy_timeout: busy,
                running: Default::default(),
                last: Default::default(),
                checkpoints: Default::default(),
            })
        });
        Ok(Store {
            clock: opts.clock.clone(),
            leases_kept: Default::default(),
            in_flight: Default::default(),
            wal,
            synchronous: Some(opts.synchronous),
            pool,
            backend: BackendKind::Sqlite,
            path,
            blocking: opts.blocking,
            busy_timeout: busy,
            settled: Arc::default(),
            file,
            handoffs: Arc::default(),
            busy_slept: Arc::default(),
            _closer: closer,
        })
    }

    /// Opens a store on a PostgreSQL server (the `postgres` feature): a
    /// libpq URL, `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`, with
    /// abridge's own `?schema=NAME` (default `public`) naming the schema its
    /// tables live in. The first open creates the schema and its tables in
    /// one transaction under the store's advisory lock, so concurrent first
    /// opens are safe. [`Store::open`] takes such a URL as its path.
    ///
    /// Its store calls always run on tokio's blocking pool
    /// ([`Blocking::Pool`]: a round trip to a server is not for a worker
    /// thread), `max_connections` is the pool's size and `busy_timeout` how
    /// long a call waits for a pooled connection. A key is refused
    /// ([`Error::Config`]): encryption at rest is the server's.
    ///
    /// Errors: [`Error::Unreachable`], [`Error::NoSuchDatabase`],
    /// [`Error::SchemaTooNew`], [`Error::ForeignDatabase`] (the schema holds
    /// other tables); nothing is written in each case. Without the
    /// `postgres` feature, [`Error::Unsupported`].
    pub fn open_url(url: &str, opts: StoreOptions) -> Result<Store> {
        #[cfg(feature = "postgres")]
        {
            if opts.key.is_some() {
                return Err(Error::Config(
                    "a PostgreSQL store takes no key: encryption at rest is the server's".into(),
                ));
            }
            let mut target = pg::parse(url)?;
            // A writer waits for the store's lock as long as an SQLite writer
            // waits on its busy handler, then fails (resumable).
            target.lock_timeout(opts.busy_timeout);
            target.migrate(target.connect()?)?;
            let (pool, closer) = pool::build(
                pool::Connect::Postgres(Box::new(pg::Manager(target.clone()))),
                opts.clock.clone(),
                opts.max_connections,
                opts.busy_timeout + Duration::from_secs(5),
                opts.busy_timeout,
                None,
            )?;
            Ok(Store {
                clock: opts.clock.clone(),
                leases_kept: Default::default(),
                in_flight: Default::default(),
                wal: None,
                synchronous: None,
                pool,
                backend: BackendKind::Postgres,
                path: PathBuf::from(&target.display),
                blocking: Blocking::Pool,
                busy_timeout: opts.busy_timeout,
                settled: Arc::default(),
                file: Arc::new(FileIdentity {
                    opened: None,
                    gone: Default::default(),
                }),
                handoffs: Arc::default(),
                busy_slept: Arc::default(),
                _closer: closer,
            })
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = (url, opts);
            Err(Error::Unsupported {
                what: "a postgres:// store (build with the `postgres` feature)",
                backend: BackendKind::Postgres,
            })
        }
    }

    /// Which database this store is on.
    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    /// An SQLite store's durability ([`StoreOptions::synchronous`]); None
    /// on PostgreSQL.
    pub fn synchronous(&self) -> Option<Synchronous> {
        self.synchronous
    }

    /// The database file (for a PostgreSQL store, its URL without the
    /// password).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks that the file this store opened is still at its path (not
    /// deleted, not replaced). Once it is not, this and every later store call
    /// fail with [`Error::StoreFileGone`].
    pub fn check_file(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        let gone = self.file.gone.load(Ordering::Relaxed)
            || (self.file.opened.is_some()
                && crate::platform::file_identity(&self.path) != self.file.opened);
        if gone {
            self.file.gone.store(true, Ordering::Relaxed);
            return Err(Error::StoreFileGone {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    fn fail_if_gone(&self) -> Result<()> {
        if self.file.gone.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::StoreFileGone {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    /// Runs `f` on a pooled connection on the current thread (blocking).
    ///
    /// An escape hatch: the connection bypasses leases and fencing, so a
    /// write through it is not protected by any of abridge's guarantees (the
    /// schema still refuses changes to finished history). No documented task
    /// needs it: reads have the read API ([`crate::inspect`]), writes go
    /// through a [`crate::Runner`] or a transactional tool.
    pub fn with_conn<R>(&self, f: impl FnOnce(&mut Connection) -> Result<R>) -> Result<R> {
        self.fail_if_gone()?;
        let mut conn = self.pool.get()?;
        let out = f(&mut conn);
        drop(conn);
        if let Some(w) = &self.wal {
            w.after_call(&self.pool);
        }
        out
    }

    /// Milliseconds since the epoch, by the store's clock.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The store's clock.
    pub fn clock(&self) -> &Arc<dyn crate::clock::Clock> {
        &self.clock
    }

    /// A lease kept (+1) or let go (-1) by a renewal task of this store.
    pub(crate) fn lease_kept(&self, by: i64) {
        self.leases_kept
            .fetch_add(by, std::sync::atomic::Ordering::SeqCst);
    }

    /// Leases the runners of this store (their turns and their compactors'
    /// claims, in this process) keep renewing now: 0 once every turn and
    /// claim has ended, however it ended (a dropped future included).
    #[cfg(any(test, feature = "testing"))]
    pub fn leases_kept(&self) -> i64 {
        self.leases_kept.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// WAL checkpoints this store ran under [`Checkpoints::OffTheStep`],
    /// counting those that found another connection's checkpoint holding
    /// the WAL (tried, copied nothing).
    #[doc(hidden)]
    pub fn wal_checkpoints(&self) -> u64 {
        self.wal.as_ref().map_or(0, |w| {
            w.checkpoints.load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// The group commit's counts since the store was opened: the batches
    /// it committed, and the turns' write transactions (parts) they held.
    /// Both 0 without a group commit ([`StoreOptions::group_commit`] off, one
    /// connection, or PostgreSQL).
    #[doc(hidden)]
    pub fn group_commits(&self) -> (u64, u64) {
        self.pool.group().map_or((0, 0), |g| g.counts())
    }

    /// The turns' write transactions a store with a group commit ran alone,
    /// on the caller's connection, because none of the turn writes before
    /// them met another (one session at a time). 0 without a group commit.
    #[doc(hidden)]
    pub fn group_commits_alone(&self) -> u64 {
        self.pool.group().map_or(0, |g| g.alone())
    }

    /// The steps' read transactions a store with a group commit ran on its
    /// idle writer, whose page cache its commits keep, while the turns'
    /// writes ran in its batches. 0 without a group commit.
    #[doc(hidden)]
    pub fn group_commit_reads_lent(&self) -> u64 {
        self.pool.group().map_or(0, |g| g.lent())
    }

    /// Sends every turn's write transaction to the group commit's batch
    /// (`on`), as if each had met another one running, or back to the
    /// default rule (a write joins the batch unless none of the last 64 met
    /// one): a test that runs its faults on the batched path whatever the
    /// timing. No effect without a group commit.
    #[doc(hidden)]
    pub fn group_commit_every_write(&self, on: bool) {
        if let Some(g) = self.pool.group() {
            g.set_every_write(on);
        }
    }

    /// The turns' write transactions waiting for the group commit's writer
    /// right now (another one holds it). 0 without a group commit.
    #[doc(hidden)]
    pub fn group_commit_waiting(&self) -> usize {
        self.pool.group().map_or(0, |g| g.waiting())
    }

    /// The turns' write transactions kept in the group commit's open batch
    /// right now, waiting for its `COMMIT`: a turn's write transaction
    /// running now (a fault hook inside one) shares its batch with that
    /// many. 0 without a group commit.
    #[doc(hidden)]
    pub fn group_commit_open_parts(&self) -> usize {
        self.pool.group().map_or(0, |g| g.open_parts())
    }

    /// The turns' write transactions that failed (were rolled back) in a
    /// group commit's batch holding other turns' kept parts, which stayed
    /// in the batch. 0 without a group commit.
    #[doc(hidden)]
    pub fn group_commits_undone_beside_kept(&self) -> u64 {
        self.pool.group().map_or(0, |g| g.undone_beside_kept())
    }

    /// Runs `f` on a pooled connection off the async runtime's worker threads:
    /// on tokio's blocking pool, or in place per [`StoreOptions::blocking`].
    pub async fn call<R, F>(&self, f: F) -> Result<R>
    where
        F: FnOnce(&mut Connection) -> Result<R> + Send + 'static,
        R: Send + 'static,
    {
        let store = self.clone();
        self.handoffs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.blocking == Blocking::InPlace && inline::on_multi_thread_runtime() {
            return tokio::task::block_in_place(move || store.with_conn(f));
        }
        // Counted until the work ends: it goes on when the awaiting future
        // is dropped.
        store
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::task::spawn_blocking(move || {
            let out = store.with_conn(f);
            store
                .in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            out
        })
        .await
        .map_err(|e| Error::Task(e.to_string()))?
    }

    /// Store calls handed to tokio's blocking pool and not yet ended (one
    /// whose caller's future was dropped included).
    #[cfg(any(test, feature = "testing"))]
    pub fn calls_in_flight(&self) -> i64 {
        self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// As [`Store::call`], for a call that is short unless it waits: a
    /// step's. With [`Blocking::InPlace`] on a multi-thread runtime, an
    /// SQLite store runs `f` on the calling worker itself when a pooled
    /// connection is idle, with no thread hand-off; only a wait for another
    /// writer's lock, or a part `f` marks with `inline::may_block` (work
    /// that grows with the history), hands the worker's other tasks to the
    /// runtime first. Otherwise `f` goes through [`Store::call`].
    pub(crate) async fn call_inline<R, F>(&self, f: F) -> Result<R>
    where
        F: FnOnce(&mut Connection) -> Result<R> + Send + 'static,
        R: Send + 'static,
    {
        if self.blocking == Blocking::InPlace
            && self.backend == BackendKind::Sqlite
            && inline::on_multi_thread_runtime()
        {
            self.fail_if_gone()?;
            if let Some(conn) = self.pool.try_get() {
                let inline = inline::Inline::enter(
                    conn,
                    self.busy_timeout,
                    self.handoffs.clone(),
                    self.busy_slept.clone(),
                )?;
                if let Some(mut conn) = inline {
                    let out = f(&mut conn);
                    drop(conn);
                    if let Some(w) = &self.wal {
                        w.after_call(&self.pool);
                    }
                    return out;
                }
            }
        }
        self.call(f).await
    }

    /// How many times this store's calls handed their work off the calling
    /// worker thread (a `block_in_place` or a blocking-pool task) since it
    /// was opened: what `Blocking::InPlace`'s inline calls save.
    #[cfg(any(test, feature = "testing"))]
    pub fn thread_handoffs(&self) -> u64 {
        self.handoffs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How long this store's steps slept in SQLite's busy handler, waiting
    /// for another writer's lock (another process's, on one file).
    #[cfg(any(test, feature = "testing"))]
    pub fn busy_sleep(&self) -> Duration {
        Duration::from_micros(self.busy_slept.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Store {
    /// What a waiter on the compaction of (session, boundary) awaits: notified
    /// when a task of this process completes or fails that row. Take it before
    /// looking at the row, so a settlement in between is not missed.
    pub(crate) fn compaction_settled(
        &self,
        session_id: SessionId,
        boundary: i64,
    ) -> Arc<tokio::sync::Notify> {
        let mut map = self.settled.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((session_id, boundary)).or_default().clone()
    }

    /// Wakes this process's waiters on the compaction of (session, boundary).
    pub(crate) fn compaction_has_settled(&self, session_id: SessionId, boundary: i64) {
        let waiting = {
            let mut map = self.settled.0.lock().unwrap_or_else(|e| e.into_inner());
            map.remove(&(session_id, boundary))
        };
        if let Some(n) = waiting {
            n.notify_waiters();
        }
    }

    /// Drops the entry of (session, boundary) when no task of this process
    /// waits on it any more (a waiter calls it when it stops waiting).
    pub(crate) fn forget_settled(&self, session_id: SessionId, boundary: i64) {
        let mut map = self.settled.0.lock().unwrap_or_else(|e| e.into_inner());
        if map
            .get(&(session_id, boundary))
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            map.remove(&(session_id, boundary));
        }
    }

    /// Runs a short read `f` (a few indexed lookups) on the calling thread when
    /// nothing in it can wait: a pooled connection is idle right now, and SQLite
    /// answers without its busy handler (in WAL mode a reader does not wait for
    /// writers; the rare exceptions, such as a WAL being recovered, answer
    /// `SQLITE_BUSY` at once here instead of waiting). Otherwise, or on that
    /// `SQLITE_BUSY`, `f` runs again through [`Store::call`]. Saves the thread
    /// hand-off that would cost more than the reads themselves.
    pub(crate) async fn read<R, F>(&self, f: F) -> Result<R>
    where
        F: Fn(&Connection) -> Result<R> + Send + Sync + 'static,
        R: Send + 'static,
    {
        self.fail_if_gone()?;
        if let Some(conn) = self.pool.try_get() {
            /// Puts the busy handler back however `f` ends (a panic included),
            /// before the connection returns to the pool.
            struct Restore<'c>(&'c rusqlite::Connection, Duration);
            impl Drop for Restore<'_> {
                fn drop(&mut self) {
                    let _ = self.0.busy_timeout(self.1);
                }
            }
            let Some(raw) = conn.as_sqlite() else {
                drop(conn);
                return self.call(move |c| f(c)).await;
            };
            raw.busy_timeout(Duration::ZERO)?;
            let restore = Restore(raw, self.busy_timeout);
            let r = f(&conn);
            drop(restore);
            match r {
                Err(Error::Sqlite(e))
                    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {}
                other => return other,
            }
        }
        self.call(move |c| f(c)).await
    }
}

/// The one rule for turn and compaction leases: a lease is held by a live
/// other when it has a holder and an expiry, the expiry has not passed, the
/// holder is not this very claim (`me`, a holder string), and `holder_is_gone`
/// (see [`crate::owner::holder_is_gone`]) cannot prove the holder gone.
pub(crate) fn lease_held_by_live_other(
    holder: Option<&str>,
    expires_at: Option<i64>,
    me: &str,
    now: i64,
    holder_is_gone: &dyn Fn(&str) -> bool,
) -> bool {
    match (holder, expires_at) {
        (Some(holder), Some(exp)) => exp >= now && holder != me && !holder_is_gone(holder),
        _ => false,
    }
}

/// Milliseconds since the Unix epoch, by the system's clock. A store's own
/// time is its clock's ([`Store::now_ms`]): what its rows and leases read.
pub fn now_ms() -> i64 {
    crate::clock::system_now_ms()
}
