//! The crate's error type.
//!
//! Each variant says what happened and carries the ids involved. The docs of each
//! variant say what it means for a retry: whether calling again (resuming the turn,
//! reopening the store) can succeed.

use crate::ids::{CompactionId, SessionId, StepId, TurnId};
use std::path::PathBuf;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in abridge.
///
/// The messages of the errors that fail a turn are stored in the turn's row, so
/// they name no row id: two stores that ran the same script hold the same text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store's file was deleted or replaced while it was open: writes
    /// would go into an unlinked file and be lost. Final for this `Store`:
    /// nothing more is written; reopen the path (a new store) to go on.
    #[error("the database file {path} was deleted or replaced while open; nothing more is written to it")]
    StoreFileGone {
        /// The path that was opened.
        path: PathBuf,
    },

    /// The path names no file SQLite would open as a plain file: empty,
    /// `:memory:` (each pooled connection would get its own empty database),
    /// or a `file:` URI (its query could change how the file is opened).
    /// Final: pass a file path (`./file:x.db` for a file whose name starts
    /// with `file:`).
    #[error("{path:?} is not a database file path: {reason}")]
    NotAFilePath {
        /// The path as given.
        path: PathBuf,
        /// Why it is refused.
        reason: &'static str,
    },

    /// Another process wrote to the file while a read-only snapshot was being
    /// read, and the store's directory does not allow the shared-memory file
    /// a concurrent read needs. Resumable: read again.
    #[error("{path} changed while it was being read; read again")]
    ChangedWhileReading {
        /// The path that was read.
        path: PathBuf,
    },

    /// The path does not exist and the caller asked not to create it.
    /// Final: fix the path.
    #[error("no database at {path}")]
    NotFound {
        /// The path that was opened.
        path: PathBuf,
    },

    /// The key given does not open the encrypted store (or the file is not
    /// an SQLite database, encrypted or not). Final; nothing was written.
    #[error(
        "{path}: the key does not open it (a wrong key, or not an encrypted abridge database)"
    )]
    WrongKey {
        /// The path that was opened.
        path: PathBuf,
    },

    /// The key opens the store's main file, but not the `-wal` file beside
    /// it, which holds frames: a WAL written under another key or for another
    /// file (typically the old file's, left beside a copy that `abridge
    /// rekey` wrote and that was moved over it). Refused before anything was
    /// written, so the WAL is never applied. Final: if the main file is the
    /// copy, stop every process using the old file and delete the stale
    /// `-wal` and `-shm`; otherwise put the file that the WAL belongs to back.
    #[error(
        "{path}: the key opens it but not its WAL {wal}, which belongs to another file or key; \
         refused, nothing written (after moving a rekeyed copy over a store, delete the old \
         -wal and -shm files)"
    )]
    ForeignWal {
        /// The store.
        path: PathBuf,
        /// The WAL that does not belong to it.
        wal: PathBuf,
    },

    /// A key was given, but this build's SQLite is not SQLCipher (build
    /// with the `encryption` feature). Nothing was opened.
    #[error(
        "this build cannot encrypt: it was built without the `encryption` feature (SQLCipher)"
    )]
    EncryptionUnavailable,

    /// The file exists but is not an SQLite database (or is encrypted and
    /// was opened without its key). Final; nothing was written.
    #[error("{path} is not an abridge database (not an SQLite file, or an encrypted one opened without its key)")]
    NotADatabase {
        /// The path that was opened.
        path: PathBuf,
    },

    /// The file is an SQLite database that abridge did not create (it has tables
    /// but no abridge schema version). Final; nothing was written.
    #[error("{path} is an SQLite database but not an abridge database")]
    ForeignDatabase {
        /// The path that was opened.
        path: PathBuf,
    },

    /// The database was written by a newer abridge. Final for this build:
    /// upgrade abridge. Nothing was written.
    #[error("database schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew {
        /// `PRAGMA user_version` of the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },

    /// A read-only open of a store written by an older abridge: its schema
    /// must be migrated first, which needs a write ([`crate::Store::open`], or
    /// `abridge upgrade --db FILE`). Nothing was written.
    #[error(
        "{path}: schema version {found} is older than this build's ({supported}); \
         migrate it first with `abridge upgrade --db {path}` (or Store::open), which keeps every row"
    )]
    SchemaTooOld {
        /// The file.
        path: PathBuf,
        /// `PRAGMA user_version` of the file.
        found: i64,
        /// The version this build reads.
        supported: i64,
    },

    /// An SQLite error. `SQLITE_BUSY` past the busy timeout lands here and is
    /// worth a retry; constraint violations are bugs or tampering.
    #[error("sqlite: {0}")]
    Sqlite(rusqlite::Error),

    /// A query that must return a row returned none, on either backend (see
    /// [`crate::store::OptionalExtension`] for the query that may).
    #[error("no row: the query returned none")]
    NoRow,

    /// A PostgreSQL error (the `postgres` feature). A lost connection, a
    /// serialization failure or a deadlock is worth a retry; a constraint
    /// violation is a bug or tampering.
    #[cfg(feature = "postgres")]
    #[error("postgres: {}", postgres_message(.0))]
    Postgres(#[from] tokio_postgres::Error),

    /// The PostgreSQL server of a store URL did not answer (refused, timed
    /// out, no such host). Nothing was written. Retry when it is back.
    #[error("{target}: the server is unreachable: {reason}")]
    Unreachable {
        /// The store, without its password.
        target: String,
        /// What the connection attempt said.
        reason: String,
    },

    /// The database a store URL names does not exist on its server
    /// (create it first: abridge creates its schema and tables, not the
    /// database).
    #[error("{target}: no such database on the server (create it first)")]
    NoSuchDatabase {
        /// The store, without its password.
        target: String,
    },

    /// An operation only one backend has (an SQLite pragma, a file-level
    /// backup), asked of another.
    #[error("{what} is not available on a {backend:?} store")]
    Unsupported {
        /// The operation.
        what: &'static str,
        /// The backend it was asked of.
        backend: crate::backend_kind::BackendKind,
    },

    /// Every pooled connection stayed in use for as long as a call waits
    /// for one (the busy timeout and five seconds more): the store is
    /// overloaded, or a host holds connections. Retry.
    #[error("no pooled connection came free within {waited:?}")]
    PoolTimeout {
        /// How long the call waited.
        waited: std::time::Duration,
    },

    /// A stored JSON column did not decode. Means tampering or a bug; final.
    #[error("stored JSON did not decode: {0}")]
    Json(#[from] serde_json::Error),

    /// I/O outside SQLite (creating a directory, reading a file).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),

    /// No session with that id or external id.
    #[error("unknown session {0}")]
    UnknownSession(String),

    /// No turn with that id.
    #[error("unknown turn {0}")]
    UnknownTurn(TurnId),

    /// No step with that id.
    #[error("unknown step {0}")]
    UnknownStep(StepId),

    /// The step has no recorded response (it never executed); nothing to rebuild.
    #[error("step {0} was never executed (no recorded response)")]
    StepNotExecuted(StepId),

    /// The step records a compaction that is not completed: a G4 violation
    /// (only possible by tampering with the store).
    #[error("step {step_id} read compaction {compaction_id}, which is not completed")]
    ReadNonCompleted {
        /// The step.
        step_id: StepId,
        /// The compaction.
        compaction_id: CompactionId,
    },

    /// `create_session` found the external id with a different model or system prompt.
    #[error("session {external_id} exists with a different {field}")]
    SessionConflict {
        /// The session's external id.
        external_id: String,
        /// Which field differs.
        field: &'static str,
    },

    /// A turn is already running in this session; finish or resume it first.
    #[error("a turn of this session is still running (turn {running_idx})")]
    TurnRunning {
        /// The session.
        session_id: SessionId,
        /// The running turn's index.
        running_idx: i64,
    },

    /// The session's running turn is parked: a tool call of it waits for a
    /// decision or a result. Decide the calls (`Store::decide`) and resume
    /// it, or abandon it (`Runner::abandon_turn`), before a new turn.
    #[error("turn {parked_idx} of this session is parked: {calls} tool call(s) wait for a decision or a result (abridge pending)")]
    TurnParked {
        /// The session.
        session_id: SessionId,
        /// The parked turn's index.
        parked_idx: i64,
        /// How many of its calls wait.
        calls: i64,
    },

    /// No parked call has this id (never had, or its session was deleted).
    #[error("no tool call {call} waits for a decision (abridge pending lists those that do)")]
    UnknownCall {
        /// The id given.
        call: crate::ids::CallId,
    },

    /// The call was decided already: the first decision wins, and this
    /// is it. Final.
    #[error("tool call {call} was already decided: {status}{}", by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default())]
    AlreadyDecided {
        /// The call.
        call: crate::ids::CallId,
        /// The first decision's outcome (`approved`, `rejected`, `delivered`, `abandoned`).
        status: String,
        /// Who took it, as they said.
        by: Option<String>,
    },

    /// The decision does not fit the call: a result delivered to a call
    /// that waits for an approval, an approval of a deferred tool's call,
    /// edited arguments that are not a JSON object. Final.
    #[error("tool call {call}: {reason}")]
    WrongDecision {
        /// The call.
        call: crate::ids::CallId,
        /// Why.
        reason: String,
    },

    /// `begin_turn` named an index that exists with a different input, or that is
    /// not the next one. Final: the host's script and the store disagree.
    #[error("turn {idx}: {reason}")]
    TurnConflict {
        /// The session.
        session_id: SessionId,
        /// The index asked for.
        idx: i64,
        /// What differs.
        reason: String,
    },

    /// A fork was asked for at a turn that cannot be a fork point: one that
    /// does not exist in the session, or that has not completed. Final for
    /// that turn; a completed turn can be forked at.
    #[error("session {session_id} cannot be forked at turn {turn}: {reason}")]
    NotAForkPoint {
        /// The session asked to be forked.
        session_id: SessionId,
        /// The turn asked for.
        turn: i64,
        /// Why not.
        reason: String,
    },

    /// Deleting or redacting a session that forks still read: the rows it
    /// would remove or change are theirs too. Final until the forks named
    /// are deleted (or deleted with it: `delete_session` with its forks).
    #[error("session {session_id} has forks that read its history ({}); delete them first, or with it", .forks.join(", "))]
    HasForks {
        /// The session.
        session_id: SessionId,
        /// The forks' external ids.
        forks: Vec<String>,
    },

    /// The turn has already finished; there is nothing to resume.
    #[error("turn {turn_id} is already {status}")]
    TurnFinished {
        /// The turn.
        turn_id: TurnId,
        /// Its final status.
        status: String,
    },

    /// Another live runner holds the turn's lease. Retry after `expires_at`.
    #[error("turn {turn_id} is leased by {owner} until {expires_at}")]
    LeaseHeld {
        /// The turn.
        turn_id: TurnId,
        /// The live holder.
        owner: String,
        /// When its lease runs out (ms since epoch).
        expires_at: i64,
    },

    /// This runner's lease on the turn was taken over; its write was refused
    /// (fenced). The new holder continues the turn; this runner must stop.
    #[error("lease on turn {turn_id} lost (epoch {epoch} was taken over); write refused")]
    LeaseLost {
        /// The turn.
        turn_id: TurnId,
        /// The epoch this runner held.
        epoch: i64,
    },

    /// The turn ran `max_steps` steps without a final answer. The turn is failed.
    #[error("reached max_steps ({max_steps}) without a final answer")]
    MaxSteps {
        /// The turn.
        turn_id: TurnId,
        /// The configured limit.
        max_steps: u32,
    },

    /// The model answered with nothing usable (no blocks, or only empty text).
    /// The turn is failed.
    #[error("model returned an empty response")]
    EmptyResponse {
        /// The step.
        step_id: StepId,
    },

    /// The model response was malformed in a way no tool result can express
    /// (a duplicated or empty tool call id). The turn is failed.
    #[error("invalid model response: {reason}")]
    InvalidResponse {
        /// The step.
        step_id: StepId,
        /// What was wrong.
        reason: String,
    },

    /// The model call failed after every retry. The turn is failed.
    #[error("model call failed: {message}")]
    Model {
        /// The step.
        step_id: StepId,
        /// The last error.
        message: String,
    },

    /// The provider rate-limited the step and asked for a wait longer than the
    /// runner's retry policy allows (`RunnerConfig::model_retry.max_backoff`).
    /// Retry: the turn stays `running` and resumable; resume it once
    /// `retry_after` has passed (the step is called again).
    #[error("rate limited: the provider asks to wait {retry_after:?}, longer than the retry policy allows ({allowed:?}): {message}")]
    RateLimited {
        /// The step.
        step_id: StepId,
        /// The wait the provider asked for (capped at one day).
        retry_after: std::time::Duration,
        /// The longest wait the policy allows.
        allowed: std::time::Duration,
        /// What the provider said.
        message: String,
    },

    /// The model refused the step's context as longer than its window, and
    /// neither compacting every earlier turn nor leaving out the older tool
    /// results of this turn made it fit. The turn is failed.
    #[error("the context does not fit the model's window even compacted and with older tool results left out: {message}")]
    ContextOverflow {
        /// The step.
        step_id: StepId,
        /// What the provider said last.
        message: String,
    },

    /// No context window is known for the model and the threshold is a
    /// fraction of it: compaction could never trigger. Raised when the
    /// runner is built or a session is created; register the window
    /// (`CompactionConfig::with_context_window`) or use a token threshold.
    #[error("no context window is known for model {model:?}, and the compaction threshold is a fraction of it: register its window (with_context_window) or use a token threshold")]
    UnknownWindow {
        /// The model id.
        model: String,
    },

    /// A compaction failed after its last attempt and the failure policy says the
    /// turn fails. The row is marked failed; `retry_compaction` re-arms it.
    #[error("compaction up to turn {boundary} failed: {message}")]
    CompactionFailed {
        /// The row.
        compaction_id: CompactionId,
        /// The session.
        session_id: SessionId,
        /// Its boundary.
        boundary: i64,
        /// The last error.
        message: String,
    },

    /// Waiting for another live holder's compaction took longer than allowed.
    /// Retry: the holder may still finish, or its lease will expire.
    #[error("compaction {compaction_id} is held by {owner}; gave up waiting")]
    CompactionWaitTimeout {
        /// The row.
        compaction_id: CompactionId,
        /// The live holder.
        owner: String,
    },

    /// One summariser attempt failed (an error, a timeout, or a summary refused
    /// by G7). Retried within the attempt budget; the last one fails the row.
    #[error("summary attempt failed: {0}")]
    Summary(String),

    /// Nothing to compact: no completed turn past the newest compaction.
    #[error(
        "nothing to compact: every completed turn is summarised or among the kept recent turns"
    )]
    NothingToCompact {
        /// The session.
        session_id: SessionId,
    },

    /// A manual compaction asked with a focus other than the one the
    /// session's completed compaction at the same boundary was made with: a
    /// completed summary never changes (G2). Final until a new turn runs.
    #[error(
        "session {session} is already compacted up to turn {boundary} ({}); \
         a completed summary never changes: run a turn first, then compact with the new focus",
        .existing.as_deref().map_or("with no focus".to_string(), |f| format!("with focus {f:?}"))
    )]
    AlreadyCompacted {
        /// The session.
        session_id: SessionId,
        /// The session as the host named it (its external id).
        session: String,
        /// The boundary.
        boundary: i64,
        /// The focus that compaction was made with.
        existing: Option<String>,
    },

    /// A session key a user typed is both an external id and another
    /// session's numeric id. Final: write `ext:KEY` or `id:KEY`.
    #[error("{key:?} is the external id of session {external_of} and also a session id: write ext:{key} or id:{key}")]
    AmbiguousSession {
        /// The key as typed.
        key: String,
        /// The numeric id of the session whose external id is `key`.
        external_of: SessionId,
    },

    /// The session was deleted ([`crate::Store::delete_session`]). Final.
    #[error("the session was deleted (it was row {session_id})")]
    SessionDeleted {
        /// The session.
        session_id: SessionId,
    },

    /// The turn is gone: its session was deleted while this runner worked on
    /// it. Nothing more is written for it. Final.
    #[error("turn {turn_id} is gone: its session was deleted")]
    TurnDeleted {
        /// The turn.
        turn_id: TurnId,
    },

    /// A configuration value out of range. Raised when the config is built.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A failure injected by a fault hook at a named point (tests and the chaos
    /// harness). Behaves like a crash: nothing is cleaned up; resume the turn.
    #[error("fault injected at {0}")]
    Injected(crate::fault::FaultPoint),

    /// A blocking task panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(String),
}

/// An SQLite error, with "no row" as the engine's own kind ([`Error::NoRow`]),
/// as on PostgreSQL.
impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Error {
        match e {
            rusqlite::Error::QueryReturnedNoRows => Error::NoRow,
            e => Error::Sqlite(e),
        }
    }
}
impl Error {
    /// The text this error carries from outside abridge (a provider's or a
    /// summariser's message), which can quote a conversation's content;
    /// events and logs show it only when the host opts in
    /// (`RunnerConfig::log_content`).
    pub fn quoted_text(&self) -> Option<&str> {
        match self {
            Error::Model { message, .. }
            | Error::RateLimited { message, .. }
            | Error::ContextOverflow { message, .. }
            | Error::CompactionFailed { message, .. } => Some(message),
            Error::Summary(m) => Some(m),
            Error::InvalidResponse { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// True for errors after which the turn stays `running` and can be resumed
    /// (by this process or another): store contention, lost leases, injected
    /// faults. False for errors that finished the turn as failed, or bad input.
    ///
    /// An SQLite error is resumable when it is about the moment (busy, locked,
    /// I/O, a full disk), not about the data: a constraint the schema refuses,
    /// a value too big, or a row that does not decode will fail again on every
    /// retry, so the turn fails with it instead of staying `running` for ever.
    pub fn is_resumable(&self) -> bool {
        if let Error::Sqlite(e) = self {
            return match e {
                rusqlite::Error::SqliteFailure(f, _) => !matches!(
                    f.code,
                    rusqlite::ErrorCode::ConstraintViolation
                        | rusqlite::ErrorCode::TooBig
                        | rusqlite::ErrorCode::TypeMismatch
                        | rusqlite::ErrorCode::DatabaseCorrupt
                        | rusqlite::ErrorCode::NotADatabase
                ),
                // Decoding a stored value failed: the row will not change.
                _ => false,
            };
        }
        #[cfg(feature = "postgres")]
        if let Error::Postgres(e) = self {
            // About the moment: the connection (closed, killed, timed out:
            // no SQLSTATE), or a class the server uses for it (08 connection,
            // 40 rollback on serialization or deadlock, 53 resources, 57
            // operator intervention, 55P03 lock timeout). Not about the data:
            // a constraint (23), a syntax or a type (42).
            return match e.code().map(|c| c.code()) {
                None => true,
                Some(c) => {
                    ["08", "40", "53", "57"].iter().any(|p| c.starts_with(p)) || c == "55P03"
                }
            };
        }
        matches!(
            self,
            Error::PoolTimeout { .. }
                | Error::Unreachable { .. }
                | Error::LeaseHeld { .. }
                | Error::LeaseLost { .. }
                | Error::RateLimited { .. }
                | Error::Injected(_)
                | Error::Task(_)
                | Error::CompactionWaitTimeout { .. }
        )
    }
}

/// A PostgreSQL error as its server's message (with the SQLSTATE), or the
/// client's when the server did not answer.
#[cfg(feature = "postgres")]
fn postgres_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Calls the fault hook at `point`, turning its refusal into
/// [`Error::Injected`] (a crash at that point, for tests).
pub(crate) fn check_fault(
    hook: &Option<crate::fault::FaultHook>,
    point: crate::fault::FaultPoint,
) -> Result<()> {
    match hook {
        Some(h) => h(point).map_err(Error::Injected),
        None => Ok(()),
    }
}
