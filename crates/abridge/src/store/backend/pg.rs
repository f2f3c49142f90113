//! The PostgreSQL backend (the `postgres` feature): a connection that runs
//! the store's statements, as written for SQLite, on a PostgreSQL server.
//!
//! - Values: a rusqlite [`ToSql`] is bound as what the server expects for
//!   that parameter (an integer as `int8`, `int4`, `bool` or `numeric`; a text
//!   as `text`), and every column is decoded into the
//!   [`ValueRef`] SQLite would have given (an integer, a real, a text, a
//!   blob), so the row decoders and `FromSql` impls are the same.
//! - Statements: `?N` placeholders become `$N`, and the few SQLite spellings
//!   abridge uses are translated once per statement text ([`translate`]).
//!   Prepared statements are cached per connection.
//! - Transactions: a write transaction takes the store's advisory lock
//!   (`pg_advisory_xact_lock`) first, so writers queue one at a time as
//!   SQLite's `BEGIN IMMEDIATE` makes them, and each of its statements reads
//!   the latest committed rows (READ COMMITTED). A read transaction is
//!   `REPEATABLE READ, READ ONLY`: one snapshot, as SQLite's read transaction.
//! - A leased turn's own writes (its steps, tool calls, end: the fenced
//!   transactions, most of a step's) take the store's lock shared and the
//!   turn's exclusively ([`PgConn::begin_write_of`]), so the turns of
//!   different sessions commit side by side (and the server flushes their
//!   commits together) while every other writer still excludes them all.
//!   Such a transaction touches only its turn's rows; what is store-wide in
//!   it (a new store-wide id, taken as `max(id) + 1`, and a transactional
//!   tool's own statements on the host's tables) first takes the store's
//!   serial lock, so those parts still run one at a time, as before. A
//!   session's next turn starts the same way under the session's lock (and
//!   takes a turn's before it leases that turn again). The locks are always
//!   taken in that order (store, session, turn, serial), so these
//!   transactions never wait for each other in a cycle.

use crate::error::{Error, Result};
use rusqlite::types::{FromSql, ToSql, ToSqlOutput, Value, ValueRef};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use tokio_postgres::types::{FromSql as PgFromSql, IsNull, ToSql as PgToSql, Type};

type BoxError = Box<dyn std::error::Error + Sync + Send>;

/// The runtime every PostgreSQL connection of the process does its I/O on
/// (one thread, made on first use, never dropped). A store call waits for
/// its answer on the calling thread with a plain executor, so it works the
/// same on tokio's blocking pool, in a runtime's worker (as SQLite's calls
/// do) and on a thread with no runtime at all.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("abridge-postgres")
            .enable_all()
            .build()
            .expect("abridge: cannot start the PostgreSQL I/O thread")
    })
}

/// Waits for `f` on the calling thread.
///
/// Outside tokio's cooperative budget: a store call made on a thread inside
/// a task's poll (a synchronous `Store::open` in an async host) runs under
/// that task's budget, and once the budget was spent every poll of a join
/// handle or channel answered "not yet" and woke itself at once, so the
/// wait spun forever (64 stores opened in one poll of a test did it).
fn wait<F: Future>(f: F) -> F::Output {
    futures_executor::block_on(tokio::task::unconstrained(f))
}

/// One client, its prepared statements, whether a transaction is open, and
/// the requests that wait to go with the next one.
///
/// Pipelining: a request whose answer nothing needs yet (a transaction's
/// `BEGIN` and advisory lock, a `SAVEPOINT` or `RELEASE`, a write sent with
/// [`PgStatement::execute_later`]) is queued, and sent ahead of the next
/// request that waits for an answer, in the same round trip. The first
/// failure, in the order they were written, is what that request returns:
/// a queued one's before its own (a statement after a failed one fails
/// only because the transaction is aborted). A queued write that must have
/// changed a row is checked before `COMMIT` is sent, never in the same
/// round trip, so a transaction whose check fails is rolled back, not
/// committed; `ROLLBACK` drops the queue unsent, and a transaction whose
/// `BEGIN` never left the queue costs no round trip at all.
pub(crate) struct PgConn {
    client: tokio_postgres::Client,
    /// The connection's I/O, done by the thread that waits for an answer
    /// (None: on the I/O thread, [`runtime`]). Declared after `client`, so
    /// dropped after it: the connection then sees its client gone and ends
    /// the session (`Terminate`) as the I/O is dropped.
    #[cfg(unix)]
    io: RefCell<Option<super::pg_io::Io>>,
    /// Prepared statements by their text (as written for SQLite), which is
    /// kept shared for the statements handed out and the prefetched reads.
    cache: RefCell<HashMap<Arc<str>, tokio_postgres::Statement>>,
    /// A host's own statements (a transactional tool's), sent as written and
    /// cached apart from the engine's, by their text.
    host_cache: RefCell<HashMap<Arc<str>, tokio_postgres::Statement>>,
    /// While set, statements are the host's: not translated.
    host_sql: Cell<bool>,
    in_tx: Cell<bool>,
    /// A checked write of the open transaction changed no row: its error.
    refused: RefCell<Option<Refusal>>,
    /// Where the `COMMIT` of [`PgConn::end_later`] stands.
    deferred: Cell<Deferred>,
    /// The open transaction is a read transaction ([`PgConn::begin_read`]).
    read_only: Cell<bool>,
    /// Writes made or queued so far: a prefetched read is served only if
    /// none was since it was queued (it ran before them on the server).
    writes: Cell<u64>,
    /// Written, not sent yet: they go ahead of the next request.
    queued: RefCell<Vec<Queued>>,
    /// Rows of prefetched reads, kept for the query that asks for them.
    prefetched: RefCell<Vec<Prefetched>>,
    /// Requests answered by the server (each a round trip).
    trips: Cell<u64>,
    /// The key of the store's advisory write lock.
    lock_key: i64,
    /// Which of the store's locks the open write transaction holds.
    scope: Cell<Scope>,
}

/// The store's locks a write transaction holds (see the module's notes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scope {
    /// No write transaction, or one holding the store's lock exclusively.
    Store,
    /// A leased turn's (or a session's, when it starts a turn): the
    /// store's lock shared, the turn's (the session's) exclusively;
    /// `serial` once it took the store's serial lock too.
    Turn { serial: bool },
}

/// The classes of the two-part advisory keys (xor the store's): a turn's
/// lock, the store's serial lock, a session's lock.
const TURN: i32 = 0;
const SERIAL: i32 = 1;
const SESSION: i32 = 2;

/// Marks a statement that takes a new store-wide id as `max(id) + 1`
/// (`store::next_id!`): in a turn's transaction it waits for the serial
/// lock first.
pub(crate) const NEXT_ID_MARK: &str = "_id_floor FROM erasures";

/// A request that waits to be sent with the next one.
enum Queued {
    /// Statements with no parameters and no rows (`BEGIN ...`, `SAVEPOINT`,
    /// `RELEASE`), run with the simple query protocol.
    Batch(String),
    /// The `COMMIT` of a transaction ended by [`PgConn::end_later`].
    Commit,
    /// A write of which at most this is wanted: with `or`, that it changed
    /// a row (`or` is the error when it changed none).
    Write {
        stmt: tokio_postgres::Statement,
        values: Vec<Bound>,
        or: Option<Refusal>,
    },
    /// A read the caller will make: its rows are kept for it
    /// ([`PgConn::prefetch`]).
    Read {
        stmt: tokio_postgres::Statement,
        values: Vec<Bound>,
        sql: Arc<str>,
        writes: u64,
    },
}

/// The error of a checked write that changed no row. Kept by the connection
/// once it fired: the transaction is refused from then on (every later
/// request, and `COMMIT`, which becomes `ROLLBACK`), whatever its caller
/// made of the first error.
pub(crate) type Refusal = Box<dyn Fn() -> Error + Send>;

/// A `COMMIT` sent with the next request ([`PgConn::end_later`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Deferred {
    /// None is waiting to be known.
    None,
    /// Queued, not sent yet.
    Queued,
    /// Answered: whether it failed (its error went to the request it was
    /// sent with).
    Answered { failed: bool },
}

/// The rows of a prefetched read, with what identifies the query that may
/// take them.
struct Prefetched {
    sql: Arc<str>,
    values: Vec<Bound>,
    /// [`PgConn::writes`] when it was queued.
    writes: u64,
    rows: Vec<tokio_postgres::Row>,
}

/// What a queued request answered.
enum Answer {
    Done(u64),
    Rows(Vec<tokio_postgres::Row>),
}

impl Queued {
    fn is_checked(&self) -> bool {
        matches!(self, Queued::Write { or: Some(_), .. })
    }
}

pub(crate) struct PgStatement<'c> {
    conn: &'c PgConn,
    stmt: tokio_postgres::Statement,
    /// The text it was prepared from (as written for SQLite).
    sql: Arc<str>,
}

type PgResult<T> = std::result::Result<T, tokio_postgres::Error>;
type Pending<'a> = std::pin::Pin<Box<dyn Future<Output = PgResult<Answer>> + Send + 'a>>;

/// Runs `ahead`, then `last`, as one pipeline: each is polled first in that
/// order, which is when tokio-postgres writes its request, so the server
/// gets them in order in one round trip; then waits for every answer.
fn pipeline<T>(
    conn: &PgConn,
    mut ahead: Vec<Pending<'_>>,
    last: impl Future<Output = T>,
) -> (Vec<PgResult<Answer>>, T) {
    use std::task::Poll;
    let mut done: Vec<Option<PgResult<Answer>>> = ahead.iter().map(|_| None).collect();
    let mut last = std::pin::pin!(last);
    let mut out = None;
    conn.wait(std::future::poll_fn(|cx| {
        for (f, d) in ahead.iter_mut().zip(done.iter_mut()) {
            if d.is_none() {
                if let Poll::Ready(r) = f.as_mut().poll(cx) {
                    *d = Some(r);
                }
            }
        }
        if out.is_none() {
            if let Poll::Ready(r) = last.as_mut().poll(cx) {
                out = Some(r);
            }
        }
        if out.is_some() && done.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }));
    let done = done
        .into_iter()
        .map(|d| d.expect("every answer came"))
        .collect();
    (done, out.expect("the last answer came"))
}

impl PgConn {
    pub(crate) fn new(client: tokio_postgres::Client, lock_key: i64) -> PgConn {
        PgConn {
            client,
            #[cfg(unix)]
            io: RefCell::new(None),
            cache: RefCell::default(),
            host_cache: RefCell::default(),
            host_sql: Cell::new(false),
            in_tx: Cell::new(false),
            read_only: Cell::new(false),
            deferred: Cell::new(Deferred::None),
            refused: RefCell::default(),
            writes: Cell::new(0),
            queued: RefCell::default(),
            prefetched: RefCell::default(),
            trips: Cell::new(0),
            lock_key,
            scope: Cell::new(Scope::Store),
        }
    }

    /// The class of the two-part advisory keys of this store's turn and
    /// serial locks (apart from the one-part key of its store lock).
    fn lock_class(&self) -> i32 {
        (self.lock_key ^ (self.lock_key >> 32)) as i32
    }

    /// In a turn's transaction, a statement that is store-wide (a new
    /// store-wide id, or a host's own statement) first takes the store's
    /// serial lock: queued, so it goes ahead of that statement.
    fn serialise_if_store_wide(&self, sql: &str) {
        if self.scope.get() != (Scope::Turn { serial: false }) {
            return;
        }
        if self.host_sql.get() || sql.contains(NEXT_ID_MARK) {
            self.queue(Queued::Batch(format!(
                "SELECT pg_advisory_xact_lock({}, 0)",
                self.lock_class() ^ SERIAL
            )));
            self.scope.set(Scope::Turn { serial: true });
        }
    }

    /// Round trips to the server so far on this connection.
    pub(crate) fn round_trips(&self) -> u64 {
        self.trips.get()
    }

    pub(crate) fn in_transaction(&self) -> bool {
        self.in_tx.get()
    }

    pub(crate) fn is_closed(&self) -> bool {
        #[cfg(unix)]
        if let Some(io) = self.io.borrow_mut().as_mut() {
            if io.ended() {
                return true;
            }
        }
        self.client.is_closed()
    }

    /// Waits for `f`, an answer of this connection's client: on this
    /// thread, polling the connection's I/O here when it is done here.
    fn wait<F: Future>(&self, f: F) -> F::Output {
        #[cfg(unix)]
        if let Some(io) = self.io.borrow_mut().as_mut() {
            return super::pg_io::block_on(io, f);
        }
        wait(f)
    }

    /// Sends the queued requests and then `last` in one round trip, and
    /// waits for every answer: the first failure, in order, is returned.
    fn send<T>(&self, last: impl Future<Output = PgResult<T>>) -> Result<T> {
        if let Some(refused) = &*self.refused.borrow() {
            return Err(refused());
        }
        let queued = std::mem::take(&mut *self.queued.borrow_mut());
        self.trips.set(self.trips.get() + 1);
        if queued.is_empty() {
            return Ok(self.wait(last)?);
        }
        let client = &self.client;
        let ahead: Vec<Pending<'_>> = queued
            .iter()
            .map(|q| -> Pending<'_> {
                match q {
                    Queued::Batch(sql) => Box::pin(async move {
                        client.batch_execute(sql).await?;
                        Ok(Answer::Done(0))
                    }),
                    Queued::Commit => Box::pin(async move {
                        client.batch_execute("COMMIT").await?;
                        Ok(Answer::Done(0))
                    }),
                    Queued::Write { stmt, values, .. } => Box::pin(async move {
                        let refs: Vec<&(dyn PgToSql + Sync)> =
                            values.iter().map(|v| v as &(dyn PgToSql + Sync)).collect();
                        Ok(Answer::Done(client.execute(stmt, &refs).await?))
                    }),
                    Queued::Read { stmt, values, .. } => Box::pin(async move {
                        let refs: Vec<&(dyn PgToSql + Sync)> =
                            values.iter().map(|v| v as &(dyn PgToSql + Sync)).collect();
                        Ok(Answer::Rows(client.query(stmt, &refs).await?))
                    }),
                }
            })
            .collect();
        let (answers, last) = pipeline(self, ahead, last);
        for (q, a) in queued.iter().zip(&answers) {
            if matches!(q, Queued::Commit) {
                self.deferred.set(Deferred::Answered { failed: a.is_err() });
            }
        }
        for (q, a) in queued.into_iter().zip(answers) {
            match (q, a) {
                (_, Err(e)) => return Err(e.into()),
                (Queued::Write { or: Some(or), .. }, Ok(Answer::Done(0))) => {
                    let e = or();
                    *self.refused.borrow_mut() = Some(or);
                    return Err(e);
                }
                (
                    Queued::Read {
                        sql,
                        values,
                        writes,
                        ..
                    },
                    Ok(Answer::Rows(rows)),
                ) => {
                    self.prefetched.borrow_mut().push(Prefetched {
                        sql,
                        values,
                        writes,
                        rows,
                    });
                }
                _ => {}
            }
        }
        Ok(last?)
    }

    /// Sends what is queued (nothing else), when anything is.
    fn flush(&self) -> Result<()> {
        if self.queued.borrow().is_empty() {
            return Ok(());
        }
        self.send(std::future::ready(Ok(())))
    }

    fn queue(&self, q: Queued) {
        self.queued.borrow_mut().push(q);
    }

    /// Runs `f` with this connection's statements taken as the host's own:
    /// sent to the server as written, untranslated (a transactional tool's
    /// SQL, written for PostgreSQL).
    /// However `f` ends: a tool that panics (caught further up, and the
    /// step goes on with an error result) leaves the engine's statements on
    /// this connection translated again.
    pub(crate) fn as_host<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Restore<'c>(&'c std::cell::Cell<bool>, bool);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                self.0.set(self.1);
            }
        }
        let _restore = Restore(&self.host_sql, self.host_sql.replace(true));
        f()
    }

    /// The statement text the server gets: the engine's translated, a
    /// host's as written.
    fn server_text<'s>(&self, sql: &'s str) -> std::borrow::Cow<'s, str> {
        match self.host_sql.get() {
            true => std::borrow::Cow::Borrowed(sql),
            false => std::borrow::Cow::Owned(translate(sql)),
        }
    }

    pub(crate) fn prepare(&self, sql: &str, cached: bool) -> Result<PgStatement<'_>> {
        self.serialise_if_store_wide(sql);
        let cache = match self.host_sql.get() {
            true => &self.host_cache,
            false => &self.cache,
        };
        if cached {
            if let Some((key, stmt)) = cache.borrow().get_key_value(sql) {
                return Ok(PgStatement {
                    conn: self,
                    stmt: stmt.clone(),
                    sql: key.clone(),
                });
            }
        }
        let text = self.server_text(sql);
        let stmt = self.send(self.client.prepare(&text)).inspect_err(|e| {
            tracing::debug!(error = %e, sql = %text, "PostgreSQL refused a statement");
        })?;
        let sql: Arc<str> = sql.into();
        if cached {
            let mut cache = cache.borrow_mut();
            // Bounded: statements built with their values in the text would
            // otherwise grow it (and the server's prepared statements) for
            // ever. The engine's own are far fewer than the bound.
            if cache.len() >= STATEMENT_CACHE_CAP {
                cache.clear();
            }
            cache.insert(sql.clone(), stmt.clone());
        }
        Ok(PgStatement {
            conn: self,
            stmt,
            sql,
        })
    }

    pub(crate) fn execute_batch(&self, sql: &str) -> Result<()> {
        let head = sql.trim_start().to_ascii_uppercase();
        // Inside a transaction, a savepoint's start and release answer
        // nothing anyone waits for: they go with the next request.
        if self.in_tx.get()
            && (head.starts_with("SAVEPOINT") || head.starts_with("RELEASE"))
            && !sql.contains(';')
        {
            self.queue(Queued::Batch(sql.to_string()));
            return Ok(());
        }
        self.serialise_if_store_wide(sql);
        self.wrote();
        let r = self.send(self.client.batch_execute(&self.server_text(sql)));
        if head.starts_with("BEGIN") || head.starts_with("START TRANSACTION") {
            self.in_tx.set(r.is_ok());
        } else if head.starts_with("COMMIT")
            || head.starts_with("END")
            || (head.starts_with("ROLLBACK") && !head.starts_with("ROLLBACK TO"))
        {
            self.in_tx.set(false);
            self.scope.set(Scope::Store);
        }
        r
    }

    /// Begins a write transaction: READ COMMITTED, holding the store's
    /// advisory lock until it ends (writers one at a time, as on SQLite).
    /// Queued: it goes with the transaction's first statement, and a lock
    /// not granted in time is that statement's error.
    pub(crate) fn begin_write(&self) -> Result<()> {
        self.read_only.set(false);
        self.begin(format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock({})",
            self.lock_key
        ))
    }

    /// Begins a write transaction of a leased turn's own rows, or of one
    /// session's (the start of its next turn): READ COMMITTED, holding the
    /// store's lock shared and the turn's (the session's) exclusively until
    /// it ends (see the module's notes). Queued, as [`PgConn::begin_write`]'s.
    /// A turn a session's transaction goes on to lease is locked first
    /// ([`PgConn::lock_turn`]).
    pub(crate) fn begin_write_of(&self, owner: crate::store::db::Owner) -> Result<()> {
        use crate::store::db::Owner;
        let (kind, id) = match owner {
            Owner::Turn(t) => (TURN, t.0),
            Owner::Session(s) => (SESSION, s.0),
        };
        self.read_only.set(false);
        self.begin(format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock_shared({}); \
             SELECT pg_advisory_xact_lock({}, {})",
            self.lock_key,
            self.lock_class() ^ kind,
            id as i32
        ))?;
        self.scope.set(Scope::Turn { serial: false });
        Ok(())
    }

    /// In a session's transaction, takes the lock of one of its turns
    /// (queued: it goes ahead of the next statement), before that turn's
    /// row is read again and its lease taken. Elsewhere nothing: a
    /// transaction holding the store's lock holds every turn's.
    pub(crate) fn lock_turn(&self, turn_id: i64) {
        if self.scope.get() == (Scope::Turn { serial: false }) {
            self.queue(Queued::Batch(format!(
                "SELECT pg_advisory_xact_lock({}, {})",
                self.lock_class() ^ TURN,
                turn_id as i32
            )));
        }
    }

    /// Begins a read transaction: one snapshot for all its reads. Queued,
    /// as a write transaction's.
    pub(crate) fn begin_read(&self) -> Result<()> {
        self.begin("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY".to_string())
    }

    fn begin(&self, sql: String) -> Result<()> {
        // Outside a transaction the queue holds at most the previous one's
        // end (`end_later`): it goes first, in the same round trip.
        self.read_only.set(sql.ends_with("READ ONLY"));
        self.scope.set(Scope::Store);
        self.queue(Queued::Batch(sql));
        self.in_tx.set(true);
        Ok(())
    }

    /// Sends `sql` (no parameters, no rows) without waiting for its
    /// answer: the request is written to the connection now, so it reaches
    /// the server before any later one, and its answer is dropped when it
    /// comes. For what cannot fail in a way anyone must hear of: the end of
    /// a read transaction (if the connection broke, the next request says
    /// so; the server ends a broken connection's transaction itself).
    fn send_unanswered(&self, sql: &str) {
        let mut request = std::pin::pin!(self.client.batch_execute(sql));
        // The first poll writes the request (tokio-postgres sends it to the
        // connection's task then); the answer is not waited for.
        let _ = request
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        // Where this thread does the connection's I/O, the connection takes
        // it from the client and writes it now.
        #[cfg(unix)]
        if let Some(io) = self.io.borrow_mut().as_mut() {
            io.push();
        }
    }

    /// Ends the transaction. `ROLLBACK` drops the queued requests unsent
    /// (and sends nothing when the server never saw the transaction);
    /// `COMMIT` goes with the queued requests unless one must be checked
    /// first.
    pub(crate) fn end(&self, commit: bool) -> Result<()> {
        let mut queued = std::mem::take(&mut *self.queued.borrow_mut());
        // The previous transaction's end, still queued, stays queued: this
        // one's requests are what follows it.
        let ours = queued
            .iter()
            .rposition(|q| matches!(q, Queued::Commit))
            .map_or(0, |i| i + 1);
        let current = queued.split_off(ours);
        *self.queued.borrow_mut() = queued;
        let queued = current;
        // A refused transaction is rolled back, and its COMMIT is the refusal.
        let refused = self.refused.borrow_mut().take();
        let unseen = matches!(queued.first(), Some(Queued::Batch(s)) if s.starts_with("BEGIN"));
        let r = if unseen && (!commit || queued.len() == 1 || self.read_only.get()) {
            // Nothing of it reached the server (or only reads no one asked
            // for): nothing to end there.
            Ok(())
        } else if self.read_only.get() {
            // A read transaction has nothing to keep, and no one waits for
            // its end: queued reads no one asked for are dropped.
            self.send_unanswered(if commit { "COMMIT" } else { "ROLLBACK" });
            Ok(())
        } else if !commit || refused.is_some() {
            let r = self.send(self.client.batch_execute("ROLLBACK"));
            match refused {
                Some(or) if commit => Err(or()),
                _ => r,
            }
        } else {
            let checked = queued.iter().any(Queued::is_checked);
            self.queued.borrow_mut().extend(queued);
            let checked = if checked { self.flush() } else { Ok(()) };
            match checked {
                Ok(()) => self.send(self.client.batch_execute("COMMIT")),
                Err(e) => {
                    self.refused.borrow_mut().take();
                    let _ = self.send(self.client.batch_execute("ROLLBACK"));
                    Err(e)
                }
            }
        };
        // A failed COMMIT ends the transaction too (the server rolled it back).
        self.in_tx.set(false);
        self.read_only.set(false);
        self.scope.set(Scope::Store);
        self.refused.borrow_mut().take();
        self.prefetched.borrow_mut().clear();
        r
    }

    /// Ends a write transaction with a `COMMIT` that goes with the next
    /// request (one round trip fewer when a read follows at once), after
    /// the checked writes are known to have passed. [`PgConn::settle`]
    /// says how it went; the request it went with returns its error.
    /// A refused transaction, or a failed check, is rolled back here.
    pub(crate) fn end_later(&self) -> Result<()> {
        let checked = self.queued.borrow().iter().any(Queued::is_checked);
        let refused = self.refused.borrow().is_some();
        let unseen = matches!(self.queued.borrow().first(), Some(Queued::Batch(s)) if s.starts_with("BEGIN"));
        if refused || self.read_only.get() || (unseen && self.queued.borrow().len() == 1) {
            return self.end(true);
        }
        if checked {
            if let Err(e) = self.flush() {
                self.refused.borrow_mut().take();
                let _ = self.end(false);
                return Err(e);
            }
        }
        self.wrote();
        self.queue(Queued::Commit);
        self.deferred.set(Deferred::Queued);
        self.in_tx.set(false);
        self.scope.set(Scope::Store);
        self.prefetched.borrow_mut().clear();
        Ok(())
    }

    /// Whether the `COMMIT` of [`PgConn::end_later`] succeeded: sent now if
    /// no request took it yet. A failure is an error (the request it went
    /// with returned the server's).
    pub(crate) fn settle(&self) -> Result<()> {
        if self.deferred.get() == Deferred::Queued {
            self.flush()?;
        }
        match self.deferred.replace(Deferred::None) {
            Deferred::Answered { failed: true } => Err(Error::Task(
                "the transaction's COMMIT failed (the request sent with it returned why)".into(),
            )),
            _ => Ok(()),
        }
    }

    /// A read the caller will make later in this transaction, queued now
    /// so that it goes with the next request; its rows wait for the query
    /// that asks for them (same text, same values), so reads that do not
    /// depend on each other share one round trip. They are dropped, and
    /// the query runs as usual, when any write was made or queued after the
    /// read was (it ran before that write on the server), and when the
    /// transaction ends. Outside a transaction it does nothing.
    pub(crate) fn prefetch(&self, sql: &str, params: &[&dyn ToSql]) -> Result<()> {
        if !self.in_tx.get() {
            return Ok(());
        }
        let PgStatement { stmt, sql, .. } = self.prepare(sql, true)?;
        let values = bind(params)?;
        let writes = self.writes.get();
        let same = |s: &Arc<str>, v: &Vec<Bound>, w: u64| *s == sql && *v == values && w == writes;
        let known = self
            .prefetched
            .borrow()
            .iter()
            .any(|p| same(&p.sql, &p.values, p.writes))
            || self.queued.borrow().iter().any(|q| {
                matches!(q, Queued::Read { sql, values, writes, .. } if same(sql, values, *writes))
            });
        if known {
            // Asked for already (a caller that guessed what comes next).
            return Ok(());
        }
        self.queue(Queued::Read {
            stmt,
            values,
            sql,
            writes,
        });
        Ok(())
    }

    /// Counts a write (made or queued).
    fn wrote(&self) {
        self.writes.set(self.writes.get() + 1);
    }

    pub(crate) fn insert_returning_id(
        &self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Option<i64>> {
        let mut st = self.prepare(&format!("{sql} RETURNING id"), true)?;
        match st.query(params)?.first() {
            Some(row) => Ok(Some(get(row, 0)?)),
            None => Ok(None),
        }
    }
}

impl PgStatement<'_> {
    pub(crate) fn execute(&mut self, params: &[&dyn ToSql]) -> Result<usize> {
        self.conn.wrote();
        let values = bind(params)?;
        let refs: Vec<&(dyn PgToSql + Sync)> =
            values.iter().map(|v| v as &(dyn PgToSql + Sync)).collect();
        let n = self
            .conn
            .send(self.conn.client.execute(&self.stmt, &refs))?;
        Ok(n as usize)
    }

    /// Runs the write with the connection's next request (see [`PgConn`]);
    /// outside a transaction, at once. With `or`, that is the error when it
    /// changed no row.
    pub(crate) fn execute_later(
        &mut self,
        params: &[&dyn ToSql],
        or: Option<Refusal>,
    ) -> Result<()> {
        if !self.conn.in_tx.get() {
            let n = self.execute(params)?;
            return match or {
                Some(or) if n == 0 => Err(or()),
                _ => Ok(()),
            };
        }
        self.conn.wrote();
        let values = bind(params)?;
        self.conn.queue(Queued::Write {
            stmt: self.stmt.clone(),
            values,
            or,
        });
        Ok(())
    }

    pub(crate) fn query(&mut self, params: &[&dyn ToSql]) -> Result<Vec<tokio_postgres::Row>> {
        let values = bind(params)?;
        let writes = self.conn.writes.get();
        {
            let mut kept = self.conn.prefetched.borrow_mut();
            kept.retain(|p| p.writes == writes);
            if let Some(i) = kept
                .iter()
                .position(|p| p.sql == self.sql && p.values == values)
            {
                return Ok(kept.swap_remove(i).rows);
            }
        }
        if !is_read(&self.sql) {
            self.conn.wrote();
        }
        let refs: Vec<&(dyn PgToSql + Sync)> =
            values.iter().map(|v| v as &(dyn PgToSql + Sync)).collect();
        self.conn.send(self.conn.client.query(&self.stmt, &refs))
    }
}

/// Whether a statement only reads (a `SELECT`): any other may write.
fn is_read(sql: &str) -> bool {
    sql.trim_start()
        .get(..6)
        .is_some_and(|h| h.eq_ignore_ascii_case("SELECT"))
}

/// A value as SQLite would hold it, bound as the type the server expects.
#[derive(Debug, PartialEq)]
enum Bound {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

fn bind(params: &[&dyn ToSql]) -> Result<Vec<Bound>> {
    params
        .iter()
        .map(|p| {
            let v = match p.to_sql()? {
                ToSqlOutput::Borrowed(r) => from_ref(r),
                ToSqlOutput::Owned(v) => from_value(v),
                other => {
                    return Err(Error::Sqlite(rusqlite::Error::ToSqlConversionFailure(
                        format!("cannot bind {other:?} on PostgreSQL").into(),
                    )))
                }
            };
            Ok(v)
        })
        .collect()
}

fn from_ref(r: ValueRef<'_>) -> Bound {
    match r {
        ValueRef::Null => Bound::Null,
        ValueRef::Integer(i) => Bound::Int(i),
        ValueRef::Real(f) => Bound::Real(f),
        ValueRef::Text(t) => Bound::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Bound::Blob(b.to_vec()),
    }
}

fn from_value(v: Value) -> Bound {
    match v {
        Value::Null => Bound::Null,
        Value::Integer(i) => Bound::Int(i),
        Value::Real(f) => Bound::Real(f),
        Value::Text(t) => Bound::Text(t),
        Value::Blob(b) => Bound::Blob(b),
    }
}

impl PgToSql for Bound {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<IsNull, BoxError> {
        match (self, ty) {
            (Bound::Null, _) => Ok(IsNull::Yes),
            (Bound::Int(i), &Type::INT8) => put(i, ty, out),
            (Bound::Int(i), &Type::INT4) => put(i32::try_from(*i)?, ty, out),
            (Bound::Int(i), &Type::INT2) => put(i16::try_from(*i)?, ty, out),
            (Bound::Int(i), &Type::BOOL) => put(*i != 0, ty, out),
            (Bound::Int(i), &Type::FLOAT8) => put(*i as f64, ty, out),
            (Bound::Int(i), &Type::NUMERIC) => {
                numeric_from_i64(*i, out);
                Ok(IsNull::No)
            }
            (Bound::Int(i), t) if is_text(t) => put(i.to_string(), &Type::TEXT, out),
            (Bound::Real(f), &Type::FLOAT8) => put(f, ty, out),
            (Bound::Real(f), &Type::FLOAT4) => put(*f as f32, ty, out),
            (Bound::Real(f), t) if is_text(t) => put(f.to_string(), &Type::TEXT, out),
            (Bound::Text(s), t) if is_text(t) => put(s.as_str(), &Type::TEXT, out),
            (Bound::Text(s), &Type::BYTEA) => put(s.as_bytes(), ty, out),
            (Bound::Blob(b), &Type::BYTEA) => put(b.as_slice(), ty, out),
            (v, t) => Err(format!("cannot bind {v:?} as a {t} parameter").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// `v` in the server's binary form of `ty`.
fn put<T: PgToSql>(
    v: T,
    ty: &Type,
    out: &mut bytes::BytesMut,
) -> std::result::Result<IsNull, BoxError> {
    v.to_sql(ty, out)
}

fn is_text(t: &Type) -> bool {
    matches!(
        *t,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN
    )
}

/// A column as SQLite would have returned it.
enum Column {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl<'a> PgFromSql<'a> for Column {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> std::result::Result<Column, BoxError> {
        Ok(match *ty {
            Type::INT8 => Column::Int(i64::from_sql(ty, raw)?),
            Type::INT4 => Column::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Column::Int(i16::from_sql(ty, raw)?.into()),
            Type::OID => Column::Int(u32::from_sql(ty, raw)?.into()),
            Type::BOOL => Column::Int(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Column::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Column::Real(f32::from_sql(ty, raw)?.into()),
            Type::NUMERIC => numeric(raw)?,
            Type::BYTEA => Column::Blob(raw.to_vec()),
            _ => Column::Text(String::from_utf8(raw.to_vec())?),
        })
    }

    fn from_sql_null(_: &Type) -> std::result::Result<Column, BoxError> {
        Ok(Column::Null)
    }

    fn accepts(ty: &Type) -> bool {
        // Text-like types arrive in the binary format as their UTF-8 bytes.
        !matches!(
            *ty,
            Type::JSONB | Type::TIMESTAMP | Type::TIMESTAMPTZ | Type::DATE | Type::UUID
        )
    }
}

/// A NUMERIC column (what `sum()` of integers gives): an integer when it has
/// no fractional digits, else a real.
fn numeric(raw: &[u8]) -> std::result::Result<Column, BoxError> {
    let word = |i: usize| -> std::result::Result<i16, BoxError> {
        raw.get(i * 2..i * 2 + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "short NUMERIC".into())
    };
    let (ndigits, weight, sign, dscale) = (word(0)?, word(1)?, word(2)? as u16, word(3)?);
    if sign == 0xC000 {
        return Ok(Column::Real(f64::NAN));
    }
    let negative = sign == 0x4000;
    let mut int: i128 = 0;
    let mut real = 0f64;
    for k in 0..ndigits as usize {
        let d = word(4 + k)? as i128;
        let power = weight as i32 - k as i32;
        real += d as f64 * 10_000f64.powi(power);
        if power >= 0 {
            int = int
                .checked_mul(1)
                .and_then(|v| v.checked_add(d * 10_000i128.pow(power as u32)))
                .ok_or("NUMERIC out of range")?;
        }
    }
    if dscale == 0 {
        let v = if negative { -int } else { int };
        return Ok(Column::Int(i64::try_from(v)?));
    }
    Ok(Column::Real(if negative { -real } else { real }))
}

/// An integer in PostgreSQL's binary NUMERIC form.
fn numeric_from_i64(v: i64, out: &mut bytes::BytesMut) {
    use bytes::BufMut;
    let negative = v < 0;
    let mut n = v.unsigned_abs();
    let mut digits = Vec::new();
    while n > 0 {
        digits.push((n % 10_000) as i16);
        n /= 10_000;
    }
    digits.reverse();
    let weight = digits.len() as i16 - 1;
    // Trailing zero groups are implied by the weight.
    while digits.last() == Some(&0) {
        digits.pop();
    }
    out.put_i16(digits.len() as i16);
    out.put_i16(weight.max(0));
    out.put_u16(if negative { 0x4000 } else { 0 });
    out.put_u16(0);
    for d in digits {
        out.put_i16(d);
    }
}

/// Column `i` of `row`, decoded as SQLite's value of it would be.
pub(crate) fn get<T: FromSql>(row: &tokio_postgres::Row, i: usize) -> rusqlite::Result<T> {
    let col: Column = row.try_get(i).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Null, Box::new(e))
    })?;
    let (r, ty) = match &col {
        Column::Null => (ValueRef::Null, rusqlite::types::Type::Null),
        Column::Int(v) => (ValueRef::Integer(*v), rusqlite::types::Type::Integer),
        Column::Real(v) => (ValueRef::Real(*v), rusqlite::types::Type::Real),
        Column::Text(s) => (ValueRef::Text(s.as_bytes()), rusqlite::types::Type::Text),
        Column::Blob(b) => (ValueRef::Blob(b), rusqlite::types::Type::Blob),
    };
    T::column_result(r).map_err(|e| match e {
        rusqlite::types::FromSqlError::InvalidType => {
            rusqlite::Error::InvalidColumnType(i, row.columns()[i].name().to_string(), ty)
        }
        rusqlite::types::FromSqlError::Other(err) => {
            rusqlite::Error::FromSqlConversionFailure(i, ty, err)
        }
        other => rusqlite::Error::FromSqlConversionFailure(i, ty, Box::new(other)),
    })
}

pub(crate) use crate::store::dialect::translate;

/// Most prepared statements a connection keeps per cache (the engine's, a
/// host's); a full cache is emptied, and its statements prepared again as
/// they are next used.
pub(crate) const STATEMENT_CACHE_CAP: usize = 256;

/// The PostgreSQL schema at [`crate::store::SCHEMA_VERSION`], applied at once.
pub const SCHEMA_PG_SQL: &str = include_str!("../../../schema_pg.sql");

/// A store on a server: how to connect, the schema its tables live in, the
/// key of its advisory write lock, and how to name it (without a password).
#[derive(Clone)]
pub(crate) struct Target {
    config: tokio_postgres::Config,
    pub(crate) schema: String,
    pub(crate) display: String,
    pub(crate) lock_key: i64,
}

/// How long a connection may take to start when the URL does not say.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Parses a store URL: a libpq connection URL, plus abridge's own
/// `schema=NAME` parameter (default `public`): the schema its tables live
/// in, created on first open. Without a `connect_timeout`, 10 s.
pub(crate) fn parse(url: &str) -> Result<Target> {
    let bad = |reason: String| Error::Config(format!("store URL: {reason}"));
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut schema = "public".to_string();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("schema", v)) => schema = v.to_string(),
            _ => kept.push(pair),
        }
    }
    let valid = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !schema.starts_with(|c: char| c.is_ascii_digit());
    if !valid {
        return Err(bad(format!(
            "schema {schema:?}: letters, digits and _ only, not starting with a digit, at most 63"
        )));
    }
    // The schema name is written unquoted in every statement (search_path,
    // CREATE SCHEMA) and compared as given in the catalogue: a plain lower-case
    // identifier is the one form all of them read alike. A capital would be
    // folded by the first and kept by the second.
    if schema.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(bad(format!(
            "schema {schema:?}: PostgreSQL folds unquoted names to lower case; write it in \
             lower case (schema={})",
            schema.to_ascii_lowercase()
        )));
    }
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e| bad(format!("{e}")))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    let options = config.get_options().unwrap_or("").to_string();
    config.options(format!("{options} -c search_path={schema}").trim());
    if config.get_application_name().is_none() {
        config.application_name("abridge");
    }
    let host = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect::<Vec<_>>()
        .join(",");
    let port = config
        .get_ports()
        .first()
        .map_or(String::new(), |p| format!(":{p}"));
    let display = format!(
        "postgres://{}@{host}{port}/{}?schema={schema}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    );
    let digest = crate::message::sha256_hex(format!("abridge store {schema}").as_bytes());
    let lock_key = i64::from_str_radix(&digest[..15], 16).unwrap_or(0x0ab1d6e);
    Ok(Target {
        config,
        schema,
        display,
        lock_key,
    })
}

impl Target {
    /// How long a statement waits for a lock (the store's write lock
    /// above all) before failing with `lock_not_available` (resumable).
    pub(crate) fn lock_timeout(&mut self, d: std::time::Duration) {
        let options = self.config.get_options().unwrap_or("").to_string();
        self.config
            .options(format!("{options} -c lock_timeout={}", d.as_millis()).trim());
    }

    /// One client, with the connection errors a host can act on typed.
    pub(crate) fn connect(&self) -> Result<PgConn> {
        #[cfg(unix)]
        if let Some(conn) = self.connect_here()? {
            return Ok(conn);
        }
        let config = self.config.clone();
        let made =
            wait(runtime().spawn(async move { config.connect(tokio_postgres::NoTls).await }))
                .map_err(|e| Error::Task(e.to_string()))?;
        let (client, connection) = made.map_err(|e| self.connect_error(e))?;
        // The connection's I/O; it ends when the client is dropped.
        runtime().spawn(async move {
            let _ = connection.await;
        });
        Ok(PgConn::new(client, self.lock_key))
    }

    /// A failed connection's error, typed where a host can act on it.
    fn connect_error(&self, e: tokio_postgres::Error) -> Error {
        if e.code() == Some(&tokio_postgres::error::SqlState::INVALID_CATALOG_NAME) {
            Error::NoSuchDatabase {
                target: self.display.clone(),
            }
        } else if e.as_db_error().is_none() {
            self.unreachable(e)
        } else {
            Error::Postgres(e)
        }
    }

    fn unreachable(&self, reason: impl std::fmt::Display) -> Error {
        Error::Unreachable {
            target: self.display.clone(),
            reason: reason.to_string(),
        }
    }

    /// A client whose connection's I/O the waiting thread does
    /// ([`super::pg_io`]): for a target of one host and port (TCP or a Unix
    /// socket's directory), with the socket options tokio-postgres would
    /// set, and `connect_timeout` over the whole start-up. None for any
    /// other target (several hosts, host addresses, a session attribute to
    /// check): tokio-postgres connects it, and its I/O runs on [`runtime`].
    #[cfg(unix)]
    fn connect_here(&self) -> Result<Option<PgConn>> {
        use super::pg_io::{block_on_until, Io};
        use tokio_postgres::config::TargetSessionAttrs;
        let c = &self.config;
        let [host] = c.get_hosts() else {
            return Ok(None);
        };
        if c.get_ports().len() > 1
            || !c.get_hostaddrs().is_empty()
            || c.get_target_session_attrs() != TargetSessionAttrs::Any
        {
            return Ok(None);
        }
        let port = c.get_ports().first().copied().unwrap_or(5432);
        let timeout = c.get_connect_timeout().copied().unwrap_or(CONNECT_TIMEOUT);
        let deadline = std::time::Instant::now() + timeout;
        let socket = super::pg_io::connect(c, host, port, timeout)
            .map_err(|e| self.unreachable(format!("error connecting to server: {e}")))?;
        let mut io = Io::new(socket.handle());
        let made = block_on_until(
            &mut io,
            deadline,
            c.connect_raw(socket, tokio_postgres::NoTls),
        )
        .map_err(|()| self.unreachable("error connecting to server: connection timed out"))?;
        let (client, connection) = made.map_err(|e| self.connect_error(e))?;
        io.drive_from_now(Box::pin(async move {
            let _ = connection.await;
        }));
        let conn = PgConn::new(client, self.lock_key);
        *conn.io.borrow_mut() = Some(io);
        Ok(Some(conn))
    }

    /// Creates the schema and its tables on first open, in one transaction
    /// holding the store's advisory lock (concurrent first opens wait for
    /// the one that creates them); refuses a newer schema, and tables not
    /// abridge's.
    ///
    /// A store older than the build gets every migration above its version
    /// from [`crate::store::MIGRATIONS`] (their PostgreSQL forms and hooks) in the
    /// same transaction, as a file does.
    pub(crate) fn migrate(&self, conn: PgConn) -> Result<i64> {
        let conn = crate::store::db::Connection::from(conn);
        let pg = conn.pg();
        pg.begin_write()?;
        let r = self.migrate_in_tx(&conn);
        let end = pg.end(r.is_ok());
        let v = r?;
        end?;
        Ok(v)
    }

    fn migrate_in_tx(&self, c: &crate::store::db::Connection) -> Result<i64> {
        let conn = c.pg();
        // The queued BEGIN and lock go first: what follows uses the client.
        conn.flush()?;
        // Created only when missing: a host given a schema of its own, and no
        // right to create one in the database, opens it all the same.
        let exists: bool = conn
            .wait(conn.client.query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1::text)",
                &[&self.schema],
            ))?
            .get(0);
        if !exists {
            conn.wait(
                conn.client
                    .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", self.schema)),
            )?;
        }
        let found = match read_version(conn, self)? {
            Some(v) if v > crate::store::SCHEMA_VERSION => {
                return Err(Error::SchemaTooNew {
                    found: v,
                    supported: crate::store::SCHEMA_VERSION,
                })
            }
            Some(v) if v < crate::store::PG_BASELINE => {
                return Err(Error::Config(format!(
                    "{}: schema version {v} is older than any PostgreSQL store ({})",
                    self.display,
                    crate::store::PG_BASELINE
                )))
            }
            Some(v) => v,
            None => {
                conn.wait(conn.client.batch_execute(SCHEMA_PG_SQL))?;
                conn.wait(conn.client.execute(
                    "INSERT INTO abridge_schema (version) VALUES ($1)",
                    &[&crate::store::PG_BASELINE],
                ))?;
                crate::store::PG_BASELINE
            }
        };
        // The same list as a file's: every version above the store's, its
        // PostgreSQL form and its stamp, in this one transaction.
        for m in crate::store::MIGRATIONS
            .iter()
            .filter(|m| m.version > found)
        {
            let sql = m.postgres.ok_or_else(|| {
                Error::Config(format!(
                    "migration {} has no PostgreSQL form (a build error)",
                    m.version
                ))
            })?;
            conn.wait(conn.client.batch_execute(sql))?;
            crate::store::schema::run_hook(c, m.hook)?;
            conn.wait(conn.client.execute(
                "INSERT INTO abridge_schema (version) VALUES ($1)",
                &[&m.version],
            ))?;
        }
        Ok(crate::store::SCHEMA_VERSION)
    }

    /// The schema version of an existing store, read without writing.
    pub(crate) fn version(&self, conn: &PgConn) -> Result<i64> {
        let v = read_version(conn, self)?.ok_or_else(|| Error::NotFound {
            path: self.display.clone().into(),
        })?;
        if v > crate::store::SCHEMA_VERSION {
            return Err(Error::SchemaTooNew {
                found: v,
                supported: crate::store::SCHEMA_VERSION,
            });
        }
        Ok(v)
    }
}

/// The version stamp in the target's schema; None when it holds no tables;
/// [`Error::ForeignDatabase`] when it holds tables but no stamp.
fn read_version(conn: &PgConn, target: &Target) -> Result<Option<i64>> {
    conn.flush()?;
    let row = conn.wait(conn.client.query_one(
        "SELECT to_regclass(format('%I.abridge_schema', $1::text)) IS NOT NULL, \
                (SELECT count(*) FROM information_schema.tables WHERE table_schema = $1::text)",
        &[&target.schema],
    ))?;
    let (stamped, tables): (bool, i64) = (row.get(0), row.get(1));
    if !stamped {
        if tables > 0 {
            return Err(Error::ForeignDatabase {
                path: target.display.clone().into(),
            });
        }
        return Ok(None);
    }
    let v: Option<i64> = conn
        .wait(
            conn.client
                .query_one("SELECT max(version) FROM abridge_schema", &[]),
        )?
        .get(0);
    Ok(Some(v.unwrap_or(0)))
}

/// The triggers and the unique indexes a PostgreSQL store at the current
/// version has: those [`SCHEMA_PG_SQL`] creates, then each migration above
/// the baseline's (creating some, dropping others), by name.
fn pg_rules() -> (Vec<String>, Vec<String>) {
    let texts = std::iter::once(SCHEMA_PG_SQL).chain(
        crate::store::MIGRATIONS
            .iter()
            .filter(|m| m.version > crate::store::PG_BASELINE)
            .filter_map(|m| m.postgres),
    );
    let (mut triggers, mut indexes) = (Vec::new(), Vec::new());
    let name = |rest: &str| {
        let rest = rest.strip_prefix("IF EXISTS ").unwrap_or(rest);
        rest.split(|c: char| c.is_whitespace() || c == ';')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    for line in texts.flat_map(str::lines) {
        if let Some(rest) = line.strip_prefix("CREATE TRIGGER ") {
            triggers.push(name(rest));
        } else if let Some(rest) = line.strip_prefix("CREATE UNIQUE INDEX ") {
            indexes.push(name(rest));
        } else if let Some(rest) = line.strip_prefix("DROP TRIGGER ") {
            let gone = name(rest);
            triggers.retain(|t| *t != gone);
        } else if let Some(rest) = line.strip_prefix("DROP INDEX ") {
            let gone = name(rest);
            indexes.retain(|i| *i != gone);
        }
    }
    (triggers, indexes)
}

/// PostgreSQL's side of `PRAGMA integrity_check`: the server keeps its pages
/// whole, so what is checked is that the rules abridge's guarantees stand on
/// are in place in the store's schema: every trigger of the current schema
/// ([`SCHEMA_PG_SQL`] and the migrations above it) present and enabled,
/// every unique index present and valid. `["ok"]`, or one line per rule
/// missing.
pub(crate) fn rules_in_place(conn: &crate::store::Connection) -> Result<Vec<String>> {
    use crate::store::OptionalExtension;
    let mut problems = Vec::new();
    let (triggers, indexes) = pg_rules();
    for trigger in triggers {
        let enabled: Option<String> = conn
            .query_row(
                "SELECT t.tgenabled::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
                 WHERE c.relnamespace = current_schema()::regnamespace AND t.tgname = ?1",
                [&trigger],
                |r| r.get(0),
            )
            .optional()?;
        match enabled.as_deref() {
            None => problems.push(format!("trigger {trigger} is missing")),
            Some("D") => problems.push(format!("trigger {trigger} is disabled")),
            Some(_) => {}
        }
    }
    for index in indexes {
        let valid: Option<bool> = conn
            .query_row(
                "SELECT i.indisvalid AND i.indisunique FROM pg_index i \
                 JOIN pg_class c ON c.oid = i.indexrelid \
                 WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ?1",
                [&index],
                |r| r.get(0),
            )
            .optional()?;
        match valid {
            None => problems.push(format!("unique index {index} is missing")),
            Some(false) => problems.push(format!("unique index {index} is not valid")),
            Some(true) => {}
        }
    }
    if problems.is_empty() {
        problems.push("ok".into());
    }
    Ok(problems)
}

/// Makes the pool's clients.
#[derive(Clone)]
pub(crate) struct Manager(pub(crate) Target);

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.display)
    }
}

impl Manager {
    /// Whether a pooled connection is fit to hand out: its client saw no
    /// end of it, and (unless it was `recent`ly in use) the server answers
    /// an empty query (a round trip, counted).
    pub(crate) fn is_valid(&self, c: &PgConn, recent: bool) -> Result<()> {
        if c.is_closed() {
            return Err(Error::Task("the server ended the connection".into()));
        }
        if !recent {
            c.trips.set(c.trips.get() + 1);
            c.wait(c.client.simple_query(""))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A turn's transaction knows a store-wide id's statement by its mark:
    /// the expression every such statement is written with carries it.
    #[test]
    fn the_store_wide_id_expression_carries_its_mark() {
        assert!(crate::store::next_id!("turns").contains(NEXT_ID_MARK));
        assert!(crate::store::next_id!("sessions").contains(NEXT_ID_MARK));
    }

    #[test]
    fn a_schema_with_capitals_is_refused_naming_its_lower_case_form() {
        let Err(err) = parse("postgres://u@h/db?schema=Support_Team") else {
            panic!("a schema with capitals was accepted");
        };
        let msg = err.to_string();
        assert!(msg.contains("schema=support_team"), "{msg}");
        let ok = parse("postgres://u@h/db?schema=support_team").unwrap();
        assert_eq!(ok.schema, "support_team");
    }

    /// The rules `verify` looks for on PostgreSQL are those of the current
    /// version: a migration's triggers are looked for, an index it dropped
    /// is not.
    #[test]
    fn the_rules_checked_are_the_current_versions() {
        let (triggers, indexes) = pg_rules();
        assert!(triggers.contains(&"approvals_never_deleted".to_string()));
        assert!(triggers.contains(&"pins_never_change".to_string()));
        assert!(indexes.contains(&"pins_unslotted_once_a_turn".to_string()));
        assert!(!indexes.contains(&"pins_unslotted_once".to_string()));
        assert!(indexes.contains(&"compactions_one_per_boundary".to_string()));
    }

    #[test]
    fn numeric_integers_round_trip() {
        for v in [
            0i64,
            1,
            -1,
            9_999,
            10_000,
            123_456_789,
            -98_765_432_100,
            i64::MAX,
            i64::MIN + 1,
        ] {
            let mut b = bytes::BytesMut::new();
            numeric_from_i64(v, &mut b);
            match numeric(&b).unwrap() {
                Column::Int(got) => assert_eq!(got, v),
                _ => panic!("{v} did not decode as an integer"),
            }
        }
    }
}

/// The pipeline's promises, on the server `ABRIDGE_TEST_POSTGRES` names
/// (skipped without it).
#[cfg(test)]
pub(crate) mod pipeline_tests {
    use crate::error::Error;
    use crate::store::{Connection, Store, StoreOptions};

    fn store(name: &str) -> Option<Store> {
        store_at(name).map(|(s, _)| s)
    }

    /// A store of one connection on a schema of this test's own (dropped
    /// first) of the server `ABRIDGE_TEST_POSTGRES` names, and its URL; None
    /// (the test skipped) without the variable.
    pub(crate) fn fresh_store(name: &str) -> Option<(Store, String)> {
        let Ok(base) = std::env::var("ABRIDGE_TEST_POSTGRES") else {
            eprintln!("ABRIDGE_TEST_POSTGRES is not set: skipped");
            return None;
        };
        let sep = if base.contains('?') { '&' } else { '?' };
        let schema = format!("pgunit_{name}_{}", std::process::id());
        let admin = Store::open_url(
            &format!("{base}{sep}schema=pgunit_admin"),
            StoreOptions::default(),
        )
        .unwrap();
        admin
            .with_conn(|c| c.execute_batch(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")))
            .unwrap();
        let url = format!("{base}{sep}schema={schema}");
        let store =
            Store::open_with(&url, StoreOptions::default().with_max_connections(1)).unwrap();
        Some((store, url))
    }

    fn store_at(name: &str) -> Option<(Store, String)> {
        let (store, url) = fresh_store(name)?;
        store
            .with_conn(|c| {
                c.execute_batch("CREATE TABLE pipe (id BIGINT PRIMARY KEY, v TEXT NOT NULL)")?;
                c.execute("INSERT INTO pipe (id, v) VALUES (1, 'one')", [])?;
                Ok(())
            })
            .unwrap();
        Some((store, url))
    }

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT count(*) FROM pipe", [], |r| r.get(0))
            .unwrap()
    }

    fn trips(c: &Connection) -> u64 {
        c.round_trips().unwrap()
    }

    /// Whether `done` came true within 5 s (asked every 5 ms): for what
    /// the server does on its own time.
    fn eventually(mut done: impl FnMut() -> bool) -> bool {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !done() {
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        true
    }

    /// The server's process serving the store's next connection.
    fn backend_pid(store: &Store) -> i64 {
        store
            .with_conn(|c| c.query_row("SELECT pg_backend_pid()::bigint", [], |r| r.get(0)))
            .unwrap()
    }

    /// Ends the server's process `pid` from another store of `url`, and
    /// returns once it is gone (its notice and the end of its stream sent).
    fn terminate(url: &str, pid: i64) {
        let admin = Store::open_with(url, StoreOptions::default().with_max_connections(1)).unwrap();
        let ended = admin
            .with_conn(|c| {
                c.query_row("SELECT pg_terminate_backend(?1::int, 5000)", [pid], |r| {
                    r.get::<_, bool>(0)
                })
            })
            .unwrap();
        assert!(ended, "backend {pid} ended");
    }

    /// A queued write that had to change a row and changed none fails the
    /// commit, and nothing of its transaction is committed, though every
    /// other write of it reached the server.
    #[test]
    fn a_failed_check_rolls_back_the_whole_transaction() {
        let Some(store) = store("check") else { return };
        store
            .with_conn(|c| {
                let mut tx = c.write_tx()?;
                let written = (|tx: &mut crate::store::Transaction<'_>| {
                    tx.execute_later("INSERT INTO pipe (id, v) VALUES (2, 'two')", [])?;
                    tx.execute_later_or("UPDATE pipe SET v = 'x' WHERE id = 99", [], || {
                        Error::Config("no row".into())
                    })?;
                    tx.execute_later("INSERT INTO pipe (id, v) VALUES (3, 'three')", [])
                })(&mut tx);
                // The check fails where the write reaches the server: with
                // a later request (here the next statement's preparation)
                // or at the latest before COMMIT.
                let err = match written {
                    Err(e) => {
                        drop(tx);
                        e
                    }
                    Ok(()) => tx.commit().unwrap_err(),
                };
                assert!(matches!(&err, Error::Config(m) if m == "no row"), "{err}");
                assert!(c.is_autocommit());
                assert_eq!(count(c), 1, "nothing of the transaction is committed");
                // And with every statement prepared already, at COMMIT.
                for sql in [
                    "INSERT INTO pipe (id, v) VALUES (2, 'two')",
                    "UPDATE pipe SET v = 'x' WHERE id = 99",
                    "INSERT INTO pipe (id, v) VALUES (3, 'three')",
                ] {
                    c.prepare_cached(sql)?;
                }
                let tx = c.write_tx()?;
                tx.execute_later("INSERT INTO pipe (id, v) VALUES (2, 'two')", [])?;
                tx.execute_later_or("UPDATE pipe SET v = 'x' WHERE id = 99", [], || {
                    Error::Config("no row".into())
                })?;
                tx.execute_later("INSERT INTO pipe (id, v) VALUES (3, 'three')", [])?;
                let err = tx.commit().unwrap_err();
                assert!(matches!(&err, Error::Config(m) if m == "no row"), "{err}");
                assert_eq!(count(c), 1, "nothing of the transaction is committed");
                Ok(())
            })
            .unwrap();
    }

    /// A queued write the server refuses is the error of the request it
    /// went with (not that request's "transaction is aborted").
    #[test]
    fn a_refused_queued_write_is_the_error_returned() {
        let Some(store) = store("refused") else {
            return;
        };
        store
            .with_conn(|c| {
                let tx = c.write_tx()?;
                tx.execute_later("INSERT INTO pipe (id, v) VALUES (1, 'again')", [])?;
                let err = tx
                    .query_row("SELECT count(*) FROM pipe", [], |r| r.get::<_, i64>(0))
                    .unwrap_err();
                let Error::Postgres(e) = &err else {
                    panic!("{err}")
                };
                assert_eq!(
                    e.code(),
                    Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION),
                    "{err}"
                );
                drop(tx);
                assert_eq!(count(c), 1);
                Ok(())
            })
            .unwrap();
    }

    /// Round trips: BEGIN goes with the first statement, unchecked writes
    /// with COMMIT, and a transaction with no statement costs none.
    #[test]
    fn queued_requests_share_the_next_round_trip() {
        let Some(store) = store("trips") else { return };
        store
            .with_conn(|c| {
                let before = trips(c);
                c.write_tx()?.commit()?;
                c.write_tx()?; // dropped: rolled back
                assert_eq!(trips(c), before, "an empty transaction costs nothing");

                let unchecked = |c: &mut Connection| -> crate::Result<()> {
                    let tx = c.write_tx()?;
                    let n: i64 = tx.query_row("SELECT max(id) FROM pipe", [], |r| r.get(0))?;
                    tx.execute_later("INSERT INTO pipe (id, v) VALUES (?1, 'n')", [n + 1])?;
                    tx.execute_later("SAVEPOINT sp", [])?;
                    tx.execute_later("INSERT INTO pipe (id, v) VALUES (?1, 'm')", [n + 2])?;
                    tx.execute_later("RELEASE sp", [])?;
                    tx.commit()
                };
                let checked = |c: &mut Connection| -> crate::Result<()> {
                    let tx = c.write_tx()?;
                    tx.execute_later_or("UPDATE pipe SET v = 'y' WHERE id = 1", [], || {
                        Error::Config("no row".into())
                    })?;
                    tx.commit()
                };
                // Once to prepare the statements (a round trip each).
                unchecked(c)?;
                checked(c)?;
                let before = trips(c);
                unchecked(c)?;
                // BEGIN + SELECT; four writes + COMMIT.
                assert_eq!(trips(c) - before, 2);
                assert_eq!(count(c), 5);
                let before = trips(c);
                checked(c)?;
                // BEGIN + the checked write; COMMIT after the check.
                assert_eq!(trips(c) - before, 2);
                Ok(())
            })
            .unwrap();
    }

    /// A lock not granted in time is the error of the transaction's first
    /// statement, and the connection is usable after it.
    #[test]
    fn a_write_lock_not_granted_fails_the_first_statement() {
        let Some((store, url)) = store_at("lock") else {
            return;
        };
        let other =
            Store::open_with(&url, StoreOptions::default().with_max_connections(1)).unwrap();
        store
            .with_conn(|c| {
                c.execute_batch("SET lock_timeout = '100ms'")?;
                let held = std::sync::mpsc::channel::<()>();
                let (hold_tx, hold_rx) = (held.0, held.1);
                let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
                let holder = std::thread::spawn(move || {
                    other
                        .with_conn(|o| {
                            let tx = o.write_tx()?;
                            tx.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))?;
                            ready_tx.send(()).unwrap();
                            hold_rx.recv().unwrap();
                            tx.commit()
                        })
                        .unwrap();
                });
                ready_rx.recv().unwrap();
                let tx = c.write_tx()?;
                let err = tx
                    .query_row("SELECT 1", [], |r| r.get::<_, i64>(0))
                    .unwrap_err();
                assert!(err.is_resumable(), "{err}");
                drop(tx);
                hold_tx.send(()).unwrap();
                holder.join().unwrap();
                assert!(c.is_autocommit());
                assert_eq!(count(c), 1);
                Ok(())
            })
            .unwrap();
    }

    /// A connection back in the pool a moment ago is handed out without a
    /// round trip to check it; one idle for longer is checked (a counted
    /// round trip), and one the server ended while idle is replaced.
    #[test]
    fn a_recently_used_connection_is_not_checked_again_an_idle_one_is() {
        let Some((store, url)) = store_at("bypass") else {
            return;
        };
        let trips_now = || store.with_conn(|c| Ok(trips(c))).unwrap();
        let first = trips_now();
        assert_eq!(
            trips_now(),
            first,
            "a checkout right after a return costs no round trip"
        );
        std::thread::sleep(
            super::super::pool::CHECKED_RECENTLY + std::time::Duration::from_millis(100),
        );
        assert_eq!(
            trips_now(),
            first + 1,
            "an idle connection is checked: one round trip"
        );
        // Ended by the server while idle: the check finds it, a new one is made.
        let pid = backend_pid(&store);
        terminate(&url, pid);
        std::thread::sleep(
            super::super::pool::CHECKED_RECENTLY + std::time::Duration::from_millis(100),
        );
        assert_ne!(
            backend_pid(&store),
            pid,
            "the ended connection was replaced"
        );
    }

    /// A connection the server ended a moment ago (within the time a
    /// pooled connection is handed out unchecked) is not handed out: on
    /// Unix the waiting thread does its I/O, and the checkout reads what
    /// the server sent since (its notice, the end of the stream): the
    /// connection says it is closed without a request made on it, and the
    /// next store call runs on a new connection.
    #[test]
    fn a_connection_the_server_ended_a_moment_ago_is_replaced_not_handed_out() {
        let Some((store, url)) = store_at("ended") else {
            return;
        };
        // One connection, no pool: closed once the server ended it, seen
        // without a request.
        let conn = super::parse(&url).unwrap().connect().unwrap();
        #[cfg(unix)]
        assert!(
            conn.io.borrow().is_some(),
            "one TCP host: the waiting thread does the connection's I/O"
        );
        assert!(!conn.is_closed());
        let pid: i64 = conn
            .wait(
                conn.client
                    .query_one("SELECT pg_backend_pid()::bigint", &[]),
            )
            .unwrap()
            .get(0);
        terminate(&url, pid);
        let trips = conn.round_trips();
        assert!(
            eventually(|| conn.is_closed()),
            "the end the server sent is read"
        );
        assert_eq!(conn.round_trips(), trips, "without a request");

        // The pool's: replaced at the next checkout.
        let pid = backend_pid(&store);
        terminate(&url, pid);
        assert_ne!(
            backend_pid(&store),
            pid,
            "the ended connection was replaced"
        );
    }

    /// A connection dropped ends its session the way libpq's and
    /// tokio-postgres's own do: the server gets `Terminate` before the
    /// socket closes, not a stream that stops mid-session. A proxy between
    /// the connection and the server keeps what the client sent.
    #[test]
    fn a_dropped_connection_sends_terminate_before_its_socket_closes() {
        use std::io::{Read, Write};
        use tokio_postgres::config::Host;
        let Ok(base) = std::env::var("ABRIDGE_TEST_POSTGRES") else {
            eprintln!("ABRIDGE_TEST_POSTGRES is not set: skipped");
            return;
        };
        let config: tokio_postgres::Config = base.split('?').next().unwrap().parse().unwrap();
        let (Some(Host::Tcp(host)), Some(user)) = (config.get_hosts().first(), config.get_user())
        else {
            eprintln!("the test server is not reached over TCP: skipped");
            return;
        };
        let server = (
            host.clone(),
            config.get_ports().first().copied().unwrap_or(5432),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (sent_tx, sent) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut client, _) = listener.accept().unwrap();
            let mut upstream = std::net::TcpStream::connect(server).unwrap();
            let (mut back_from, mut back_to) =
                (upstream.try_clone().unwrap(), client.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut back_from, &mut back_to);
            });
            let mut kept = Vec::new();
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = client.read(&mut buf) {
                kept.extend_from_slice(&buf[..n]);
                if upstream.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = upstream.shutdown(std::net::Shutdown::Both);
            let _ = sent_tx.send(kept);
        });
        let password = config
            .get_password()
            .map(|p| format!(":{}", String::from_utf8_lossy(p)))
            .unwrap_or_default();
        let db = config.get_dbname().unwrap_or(user);
        let url = format!("postgres://{user}{password}@127.0.0.1:{port}/{db}");
        let conn = super::parse(&url).unwrap().connect().unwrap();
        #[cfg(unix)]
        assert!(conn.io.borrow().is_some(), "the waiting thread's I/O");
        let one: i32 = conn
            .wait(conn.client.query_one("SELECT 1", &[]))
            .unwrap()
            .get(0);
        assert_eq!(one, 1);
        drop(conn);
        let sent = sent
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the dropped connection closed its socket");
        // Terminate: 'X' and its length, 4, and nothing after it.
        assert!(
            sent.ends_with(&[b'X', 0, 0, 0, 4]),
            "the last bytes sent: {:?}",
            &sent[sent.len().saturating_sub(16)..]
        );
    }

    /// The write locks' scopes: a leased turn's transaction excludes that
    /// turn's other writers, the store-wide writers, and (once it takes a
    /// store-wide id) the other turns' store-wide parts; the turns of other
    /// sessions write beside it. Each "waits" is a lock not granted within
    /// the connection's lock timeout.
    #[test]
    fn a_turns_writes_exclude_its_turn_and_the_store_not_other_turns() {
        use crate::ids::{SessionId, TurnId};
        use crate::store::db::Owner;
        let Some((store, url)) = store_at("scopes") else {
            return;
        };
        let other =
            Store::open_with(&url, StoreOptions::default().with_max_connections(1)).unwrap();
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            other
                .with_conn(|o| {
                    let tx = o.write_tx_of(Owner::Turn(TurnId(7)))?;
                    tx.execute("INSERT INTO pipe (id, v) VALUES (70, 'seven')", [])?;
                    ready_tx.send(()).unwrap();
                    // Then a store-wide id (the serial lock), on request.
                    hold_rx.recv().unwrap();
                    tx.query_row(
                        concat!("SELECT ", crate::store::next_id!("turns")),
                        [],
                        |r| r.get::<_, i64>(0),
                    )?;
                    ready_tx.send(()).unwrap();
                    hold_rx.recv().unwrap();
                    tx.commit()
                })
                .unwrap();
        });
        let waits = |r: crate::error::Result<()>| match r {
            Err(e) => {
                assert!(e.is_resumable(), "{e}");
                true
            }
            Ok(()) => false,
        };
        store
            .with_conn(|c| {
                c.execute_batch("SET lock_timeout = '200ms'")?;
                ready_rx.recv().unwrap();
                let write = |c: &mut Connection,
                             tx: fn(
                    &mut Connection,
                )
                    -> crate::error::Result<crate::store::Transaction<'_>>,
                             id: i64| {
                    let tx = tx(c)?;
                    tx.execute("INSERT INTO pipe (id, v) VALUES (?1, 'x')", [id])?;
                    tx.commit()
                };
                // Another session's turn and another session's start: beside it.
                assert!(!waits(write(
                    c,
                    |c| c.write_tx_of(Owner::Turn(TurnId(8))),
                    80
                )));
                assert!(!waits(write(
                    c,
                    |c| c.write_tx_of(Owner::Session(SessionId(3))),
                    81
                )));
                // The same turn, and a store-wide writer: they wait.
                assert!(waits(write(
                    c,
                    |c| c.write_tx_of(Owner::Turn(TurnId(7))),
                    82
                )));
                assert!(waits(write(c, |c| c.write_tx(), 83)));
                // A session's start that leases the held turn waits for it.
                let leasing = (|| {
                    let tx = c.write_tx_of(Owner::Session(SessionId(3)))?;
                    tx.lock_turn(TurnId(7));
                    tx.execute("INSERT INTO pipe (id, v) VALUES (84, 'x')", [])?;
                    tx.commit()
                })();
                assert!(waits(leasing));
                // Once the holder took a store-wide id, another turn's
                // store-wide id waits for it; its own rows still do not.
                hold_tx.send(()).unwrap();
                ready_rx.recv().unwrap();
                let id = (|| {
                    let tx = c.write_tx_of(Owner::Turn(TurnId(8)))?;
                    tx.query_row(
                        concat!("SELECT ", crate::store::next_id!("turns")),
                        [],
                        |r| r.get::<_, i64>(0),
                    )?;
                    tx.commit()
                })();
                assert!(waits(id));
                assert!(!waits(write(
                    c,
                    |c| c.write_tx_of(Owner::Turn(TurnId(8))),
                    85
                )));
                hold_tx.send(()).unwrap();
                holder.join().unwrap();
                // Once it ended, every one of them writes.
                assert!(!waits(write(
                    c,
                    |c| c.write_tx_of(Owner::Turn(TurnId(7))),
                    86
                )));
                assert!(!waits(write(c, |c| c.write_tx(), 87)));
                assert_eq!(count(c), 7);
                Ok(())
            })
            .unwrap();
    }

    /// A refused transaction stays refused: a caller that ignores the first
    /// error gets it again from every later request, and its COMMIT rolls
    /// back and returns it.
    #[test]
    fn a_refused_transaction_refuses_every_later_request_and_its_commit() {
        let Some(store) = store("sticky") else { return };
        store
            .with_conn(|c| {
                c.prepare_cached("UPDATE pipe SET v = 'x' WHERE id = 99")?;
                let tx = c.write_tx()?;
                tx.execute_later_or("UPDATE pipe SET v = 'x' WHERE id = 99", [], || {
                    Error::Config("no row".into())
                })?;
                let first = tx.query_row("SELECT count(*) FROM pipe", [], |r| r.get::<_, i64>(0));
                assert!(matches!(first, Err(Error::Config(_))), "{first:?}");
                // Ignored: the next write is refused as well, and so is COMMIT.
                let again = tx.execute("INSERT INTO pipe (id, v) VALUES (5, 'five')", []);
                assert!(matches!(again, Err(Error::Config(_))), "{again:?}");
                let commit = tx.commit();
                assert!(matches!(commit, Err(Error::Config(_))), "{commit:?}");
                assert!(c.is_autocommit());
                assert_eq!(count(c), 1, "nothing of the transaction is committed");
                Ok(())
            })
            .unwrap();
    }

    /// `commit_then`: the COMMIT goes with the next request (one round trip
    /// for both), and is sent on its own when `next` makes none.
    #[test]
    fn a_deferred_commit_goes_with_the_next_request() {
        let Some((store, url)) = store_at("deferred") else {
            return;
        };
        let other = Store::open(&url).unwrap();
        let seen = || other.with_conn(|c| Ok(count(c))).unwrap();
        store
            .with_conn(|c| {
                c.prepare_cached("INSERT INTO pipe (id, v) VALUES (?1, 'n')")?;
                c.prepare_cached("SELECT count(*) FROM pipe")?;
                let before = trips(c);
                let tx = c.write_tx()?;
                tx.execute_later("INSERT INTO pipe (id, v) VALUES (?1, 'n')", [2])?;
                let n = tx.commit_then(|c| {
                    c.in_read_tx(|c| {
                        c.query_row("SELECT count(*) FROM pipe", [], |r| r.get::<_, i64>(0))
                    })
                })??;
                assert_eq!(n, 2, "the read sees the commit it went after");
                assert_eq!(
                    trips(c) - before,
                    1,
                    "write, COMMIT and read in one round trip"
                );
                assert_eq!(seen(), 2, "committed");

                let before = trips(c);
                let tx = c.write_tx()?;
                tx.execute_later("INSERT INTO pipe (id, v) VALUES (?1, 'n')", [3])?;
                tx.commit_then(|_| Ok(()))??;
                assert_eq!(trips(c) - before, 1, "sent on its own");
                assert!(c.is_autocommit());
                assert_eq!(seen(), 3, "committed");
                Ok(())
            })
            .unwrap();
    }

    /// A deferred COMMIT the server refuses (here a deferred constraint) is
    /// the error of the request it went with and of `commit_then`: nothing
    /// of the transaction is committed.
    #[test]
    fn a_deferred_commit_that_fails_is_the_error_returned() {
        let Some(store) = store("deferred_fail") else {
            return;
        };
        store
            .with_conn(|c| {
                c.execute_batch(
                    "CREATE TABLE child (id BIGINT PRIMARY KEY, parent BIGINT \
                     REFERENCES pipe (id) DEFERRABLE INITIALLY DEFERRED)",
                )?;
                let tx = c.write_tx()?;
                tx.execute_later("INSERT INTO child (id, parent) VALUES (1, 99)", [])?;
                let mut got = None;
                let out = tx.commit_then(|c| {
                    let r = c.in_read_tx(|c| {
                        c.query_row("SELECT count(*) FROM pipe", [], |r| r.get::<_, i64>(0))
                    });
                    got = Some(r.is_err());
                    r
                });
                assert_eq!(got, Some(true), "the read it went with returned the error");
                let Err(Error::Postgres(e)) = out else {
                    panic!("{out:?}")
                };
                assert_eq!(
                    e.code(),
                    Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION),
                    "{e}"
                );
                assert!(c.is_autocommit());
                let children: i64 = c.query_row("SELECT count(*) FROM child", [], |r| r.get(0))?;
                assert_eq!(children, 0, "nothing committed");

                // Swallowed by `next`: `commit_then` still fails.
                let tx = c.write_tx()?;
                tx.execute_later("INSERT INTO child (id, parent) VALUES (1, 99)", [])?;
                let out = tx.commit_then(|c| {
                    let _ = c.in_read_tx(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)));
                    Ok(())
                });
                assert!(out.is_err(), "{out:?}");
                let children: i64 = c.query_row("SELECT count(*) FROM child", [], |r| r.get(0))?;
                assert_eq!(children, 0, "nothing committed");
                Ok(())
            })
            .unwrap();
    }

    /// A read transaction's end is not waited for: a read transaction of one
    /// query is one round trip, and the next one sees no open transaction.
    #[test]
    fn a_read_transaction_costs_one_round_trip() {
        let Some((store, url)) = store_at("read_tx") else {
            return;
        };
        let other = Store::open(&url).unwrap();
        store
            .with_conn(|c| {
                let pid: i32 = c.query_row("SELECT pg_backend_pid()", [], |r| r.get(0))?;
                c.prepare_cached("SELECT count(*) FROM pipe")?;
                let before = trips(c);
                for _ in 0..3 {
                    let n = c.in_read_tx(|c| {
                        c.query_row("SELECT count(*) FROM pipe", [], |r| r.get::<_, i64>(0))
                    })?;
                    assert_eq!(n, 1);
                }
                assert_eq!(trips(c) - before, 3);
                // The server ends it without this connection waiting: seen
                // from another one, it is left idle, not idle in a transaction.
                let state = || -> String {
                    other
                        .with_conn(|o| {
                            o.query_row(
                                "SELECT state FROM pg_stat_activity WHERE pid = ?1",
                                [pid],
                                |r| r.get(0),
                            )
                        })
                        .unwrap()
                };
                assert!(eventually(|| state() == "idle"), "no transaction left open");
                Ok(())
            })
            .unwrap();
    }

    /// A `COMMIT` left queued by a `next` that panicked is sent when the
    /// connection goes back to the pool: the transaction is committed and
    /// the write lock it held is free for another store.
    #[test]
    fn a_deferred_commit_left_by_a_panic_is_sent_when_the_connection_returns() {
        let Some((store, url)) = store_at("deferred_panic") else {
            return;
        };
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.with_conn(|c| {
                let tx = c.write_tx()?;
                tx.execute_later("INSERT INTO pipe (id, v) VALUES (7, 'seven')", [])?;
                tx.commit_then(|_| -> crate::Result<()> { panic!("next panicked") })?
            })
        }));
        assert!(panicked.is_err());
        let other = Store::open(&url).unwrap();
        other
            .with_conn(|c| {
                let tx = c.write_tx()?;
                tx.execute("INSERT INTO pipe (id, v) VALUES (8, 'eight')", [])?;
                tx.commit()?;
                assert_eq!(count(c), 3, "the panicked transaction's row is committed");
                Ok(())
            })
            .unwrap();
    }
}
