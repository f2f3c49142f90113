//! The store boundary: the one connection type every statement of abridge
//! goes through, whatever the database behind it.
//!
//! [`Connection`], [`Transaction`], [`Statement`] and [`Row`] have the shape
//! of rusqlite's (`execute`, `query_row`, `prepare_cached`, `query_map`,
//! `row.get(i)`), and values cross them as rusqlite's [`ToSql`] and
//! [`FromSql`]: so the store's statements, the row decoders and a host's
//! transactional tools read the same on every backend. A backend is an arm of
//! `Backend`: SQLite, and PostgreSQL with the `postgres` feature, which
//! binds the same values and decodes its columns into the same
//! [`ValueRef`](rusqlite::types::ValueRef)s (see `pg`).
//!
//! Statements are written once, in the SQL both backends read: `?N`
//! placeholders, `INSERT … ON CONFLICT`, `RETURNING`. What differs in
//! dialect is translated by the backend that needs it, once per statement
//! text.

use crate::error::{Error, Result};
use rusqlite::types::{FromSql, ToSql};
use std::ops::{Deref, DerefMut};

pub use crate::backend_kind::BackendKind;

/// A connection to a store's database. Every statement abridge issues goes
/// through one; a host's [transactional tool](crate::TransactionalTool) gets
/// one inside the step's [`Transaction`].
pub struct Connection {
    pub(crate) backend: Backend,
    /// The store's clock (the system's for a connection opened outside a
    /// store: a read-only snapshot).
    pub(crate) clock: std::sync::Arc<dyn crate::clock::Clock>,
    /// The store's group commit (an SQLite store of several connections):
    /// a turn's write transactions run on its writer (see `store::group`).
    pub(crate) group: Option<std::sync::Arc<crate::store::group::Group>>,
}

/// Whose rows a write transaction of [`Connection::write_tx_of`] writes.
/// Only a server store locks by it: SQLite's one writer holds the whole file.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(
    not(feature = "postgres"),
    expect(dead_code, reason = "read only by a server store's lock")
)]
pub(crate) enum Owner {
    Turn(crate::ids::TurnId),
    Session(crate::ids::SessionId),
}

pub(crate) enum Backend {
    Sqlite(rusqlite::Connection),
    /// Boxed: a server connection (its client, caches and queue) is several
    /// times an SQLite handle's size.
    #[cfg(feature = "postgres")]
    Postgres(Box<crate::store::pg::PgConn>),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("backend", &self.kind())
            .finish()
    }
}

impl Connection {
    /// Runs `f` with this connection's statements taken as the host's own: on
    /// PostgreSQL sent as written, untranslated (what a transactional tool
    /// runs, written for the store's backend); nothing changes on SQLite.
    pub(crate) fn as_host<T>(&self, f: impl FnOnce() -> T) -> T {
        match &self.backend {
            Backend::Sqlite(_) => f(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => c.as_host(f),
        }
    }
}

#[cfg(feature = "postgres")]
impl Connection {
    /// The PostgreSQL client of a connection known to be one (the
    /// PostgreSQL backend's own code).
    pub(crate) fn pg(&self) -> &crate::store::pg::PgConn {
        match &self.backend {
            Backend::Postgres(c) => c,
            Backend::Sqlite(_) => {
                unreachable!("an SQLite connection where a PostgreSQL one was built")
            }
        }
    }
}

#[cfg(feature = "postgres")]
impl From<crate::store::pg::PgConn> for Connection {
    fn from(c: crate::store::pg::PgConn) -> Connection {
        Connection {
            backend: Backend::Postgres(Box::new(c)),
            clock: crate::clock::default_clock(),
            group: None,
        }
    }
}

impl From<rusqlite::Connection> for Connection {
    fn from(c: rusqlite::Connection) -> Connection {
        Connection {
            backend: Backend::Sqlite(c),
            clock: crate::clock::default_clock(),
            group: None,
        }
    }
}

impl Connection {
    /// Milliseconds since the epoch, by the store's clock.
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The database behind this connection.
    pub fn kind(&self) -> BackendKind {
        match &self.backend {
            Backend::Sqlite(_) => BackendKind::Sqlite,
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => BackendKind::Postgres,
        }
    }

    /// The SQLite connection underneath, for what only SQLite has (its
    /// pragmas, hooks, backups); None on another backend.
    pub fn as_sqlite(&self) -> Option<&rusqlite::Connection> {
        match &self.backend {
            Backend::Sqlite(c) => Some(c),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => None,
        }
    }

    /// The SQLite connection underneath, mutably; None on another backend.
    pub fn as_sqlite_mut(&mut self) -> Option<&mut rusqlite::Connection> {
        match &mut self.backend {
            Backend::Sqlite(c) => Some(c),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => None,
        }
    }

    /// The SQLite connection, or [`Error::Unsupported`] naming `what` needs it.
    pub(crate) fn sqlite(&self, what: &'static str) -> Result<&rusqlite::Connection> {
        self.as_sqlite().ok_or(Error::Unsupported {
            what,
            backend: self.kind(),
        })
    }

    /// Runs one statement; the number of rows it changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    /// Runs a write whose answer nobody needs now (not even its count). On
    /// PostgreSQL, inside a transaction, it goes with the connection's next
    /// request that waits for an answer, in the same round trip, and its
    /// error is that request's; elsewhere it runs at once.
    pub(crate) fn execute_later<P: Params>(&self, sql: &str, params: P) -> Result<()> {
        self.write_later(sql, params, None::<fn() -> Error>)
    }

    /// As [`execute_later`](Connection::execute_later), for a write that
    /// must change a row: the error `or()` when it changes none, returned
    /// by the request it goes with (on PostgreSQL always checked before
    /// `COMMIT` is sent).
    pub(crate) fn execute_later_or<P: Params>(
        &self,
        sql: &str,
        params: P,
        or: impl Fn() -> Error + Send + 'static,
    ) -> Result<()> {
        self.write_later(sql, params, Some(or))
    }

    fn write_later<P: Params>(
        &self,
        sql: &str,
        params: P,
        or: Option<impl Fn() -> Error + Send + 'static>,
    ) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(c) => {
                let n = c.prepare_cached(sql)?.execute(params)?;
                match or {
                    Some(or) if n == 0 => Err(or()),
                    _ => Ok(()),
                }
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => c.prepare(sql, true)?.execute_later(
                &params.values(),
                or.map(|or| Box::new(or) as crate::store::pg::Refusal),
            ),
        }
    }

    /// Says that a read follows (`sql` with `params`), which nothing read
    /// before it decides: on PostgreSQL, in a read transaction, it is sent
    /// with the next request and its rows wait for the query that asks for
    /// them, so independent reads share a round trip. Elsewhere (SQLite,
    /// or a write transaction) it does nothing.
    pub(crate) fn prefetch<P: Params>(&self, sql: &str, params: P) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(_) => {
                let _ = (sql, params);
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => c.prefetch(sql, &params.values()),
        }
    }

    /// Runs one `INSERT` into a table with an `id` key; the id of the row
    /// it made, or None when it made none (`ON CONFLICT DO NOTHING`). SQLite
    /// reads its last rowid; PostgreSQL appends `RETURNING id`.
    pub fn insert_returning_id<P: Params>(&self, sql: &str, params: P) -> Result<Option<i64>> {
        match &self.backend {
            Backend::Sqlite(c) => {
                let n = c.prepare_cached(sql)?.execute(params)?;
                Ok((n == 1).then(|| c.last_insert_rowid()))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => c.insert_returning_id(sql, &params.values()),
        }
    }

    /// Whether a table `name` exists (in the store's schema on PostgreSQL).
    pub fn has_table(&self, name: &str) -> Result<bool> {
        let sql = match self.kind() {
            BackendKind::Sqlite => "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            BackendKind::Postgres => "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = ?1",
        };
        Ok(self.query_row(sql, [name], |r| r.get::<_, i64>(0))? > 0)
    }

    /// Has the bytes SQLite frees overwritten as they are freed (its
    /// `secure_delete`); nothing on PostgreSQL, whose freed row versions
    /// are the server's (see `VACUUM`).
    pub(crate) fn secure_delete(&self) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(c) => Ok(c.execute_batch("PRAGMA secure_delete = ON")?),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => Ok(()),
        }
    }

    /// Runs statements separated by `;`, without parameters.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(c) => Ok(c.execute_batch(sql)?),
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => c.execute_batch(sql),
        }
    }

    /// Runs a query expected to return a row and maps its first row with `f`;
    /// no row is [`Error::NoRow`] (see [`OptionalExtension`]).
    pub fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    /// Prepares a statement.
    pub fn prepare(&self, sql: &str) -> Result<Statement<'_>> {
        self.prepare_with(sql, false)
    }

    /// Prepares a statement through the connection's statement cache.
    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'_>> {
        self.prepare_with(sql, true)
    }

    fn prepare_with(&self, sql: &str, cached: bool) -> Result<Statement<'_>> {
        Ok(Statement {
            inner: match &self.backend {
                Backend::Sqlite(c) => StmtInner::Sqlite(if cached {
                    SqliteStmt::Cached(c.prepare_cached(sql)?)
                } else {
                    SqliteStmt::Plain(c.prepare(sql)?)
                }),
                #[cfg(feature = "postgres")]
                Backend::Postgres(c) => StmtInner::Postgres(c.prepare(sql, cached)?),
            },
        })
    }

    /// Round trips to the server so far on this connection (PostgreSQL:
    /// each statement, prepare, BEGIN and COMMIT is one); None on SQLite,
    /// which has no server.
    pub fn round_trips(&self) -> Option<u64> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => Some(c.round_trips()),
        }
    }

    /// True outside a transaction.
    pub fn is_autocommit(&self) -> bool {
        match &self.backend {
            Backend::Sqlite(c) => c.is_autocommit(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => !c.in_transaction(),
        }
    }

    /// Begins a write transaction: `BEGIN IMMEDIATE` on SQLite (writers queue
    /// on the busy handler instead of failing on lock upgrade); on
    /// PostgreSQL a READ COMMITTED transaction whose writes take row locks.
    pub(crate) fn write_tx(&mut self) -> Result<Transaction<'_>> {
        match &self.backend {
            Backend::Sqlite(c) => {
                c.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => c.begin_write()?,
        }
        Ok(Transaction {
            conn: self,
            open: true,
            member: None,
            writing: None,
        })
    }

    /// Begins a write transaction of `owner`'s rows only: a leased turn's
    /// (its fenced transactions) or a session's (the start of its next
    /// turn). On SQLite the same `BEGIN IMMEDIATE`; on PostgreSQL one that
    /// excludes the owner's other writers and every store-wide one, not the
    /// turns of other sessions (see `store::pg`). On an SQLite store with a
    /// group commit, a part of the writer's batch (see `store::group`).
    pub(crate) fn write_tx_of(&mut self, owner: Owner) -> Result<Transaction<'_>> {
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(c) = &self.backend {
            c.begin_write_of(owner)?;
            return Ok(Transaction {
                conn: self,
                open: true,
                member: None,
                writing: None,
            });
        }
        let _ = owner;
        if let Some(group) = self.group.clone() {
            let (writing, join) = group.arrive();
            if join {
                let member = group.join(writing)?;
                return Ok(Transaction {
                    conn: self,
                    open: true,
                    member: Some(member),
                    writing: None,
                });
            }
            let mut tx = self.write_tx()?;
            tx.writing = Some(writing);
            return Ok(tx);
        }
        self.write_tx()
    }

    /// In a session's write transaction on PostgreSQL, the lock of one of
    /// its turns, before its row is read again and its lease taken; nothing
    /// elsewhere (SQLite's writer holds every lock).
    pub(crate) fn lock_turn(&self, turn: crate::ids::TurnId) {
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(c) = &self.backend {
            c.lock_turn(turn.0);
        }
        let _ = turn;
    }

    fn begin_plain(&self) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(c) => {
                c.prepare_cached("BEGIN")?.execute([])?;
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => c.begin_read()?,
        }
        Ok(())
    }

    fn end(&self, commit: bool) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(c) => {
                c.prepare_cached(if commit { "COMMIT" } else { "ROLLBACK" })?
                    .execute([])?;
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => c.end(commit)?,
        }
        Ok(())
    }

    /// [`Connection::in_read_tx`] for a step's reads, which are short and
    /// neither write nor wait for anything: on an SQLite store whose turns'
    /// writes run in the group commit's batches, they run on the group's
    /// writer when it is idle, whose page cache its own commits keep (see
    /// `Group::lend_idle_writer`); else on this connection. The writer is
    /// held while `f` runs: a member that joins meanwhile waits for it.
    pub(crate) fn in_step_read_tx<R>(&self, f: impl FnOnce(&Connection) -> Result<R>) -> Result<R> {
        if self.is_autocommit() {
            if let Some(lent) = self.group.as_ref().and_then(|g| g.lend_idle_writer()) {
                return lent.conn().in_read_tx(f);
            }
        }
        self.in_read_tx(f)
    }

    /// Runs `f`'s reads in one read transaction (one snapshot for all of
    /// them; on SQLite the file and WAL-index locks are taken once instead of
    /// once per statement). Inside a transaction already, just runs `f`.
    pub(crate) fn in_read_tx<R>(&self, f: impl FnOnce(&Connection) -> Result<R>) -> Result<R> {
        if !self.is_autocommit() {
            return f(self);
        }
        self.begin_plain()?;
        let out = f(self);
        // A read transaction has nothing to keep: COMMIT and ROLLBACK end it alike.
        let end = self.end(true);
        if end.is_err() && !self.is_autocommit() {
            let _ = self.end(false);
        }
        let v = out?;
        end?;
        Ok(v)
    }
}

/// A transaction on a [`Connection`] (which it dereferences to). Dropped
/// without [`commit`](Transaction::commit), it rolls back.
pub struct Transaction<'c> {
    conn: &'c mut Connection,
    open: bool,
    /// A part of the group commit's batch: its statements run on the
    /// group's writer, not on `conn`.
    member: Option<crate::store::group::Member>,
    /// A turn's write run alone on `conn` by a store with a group commit:
    /// counted as running until it ends.
    writing: Option<crate::store::group::Writing>,
}

impl Deref for Transaction<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        match &self.member {
            Some(m) => m.conn(),
            None => self.conn,
        }
    }
}

impl DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        match &mut self.member {
            Some(m) => m.conn_mut(),
            None => self.conn,
        }
    }
}

impl Transaction<'_> {
    /// Commits. On failure the transaction is rolled back. A part of a
    /// group commit returns once its batch has committed.
    pub fn commit(mut self) -> Result<()> {
        if let Some(m) = self.member.take() {
            self.open = false;
            return m.leave(true);
        }
        let r = self.conn.end(true);
        if r.is_ok() {
            self.open = false;
        }
        r
    }

    /// Commits, with the `COMMIT` sent ahead of `next`'s first request on
    /// PostgreSQL (one round trip fewer), and runs `next` on the connection.
    /// Once the commit is known to have succeeded, returns `next`'s result;
    /// when it failed, an error (the one `next` got for it, when it got one).
    /// `next` must do nothing that needs the commit durable first: it runs
    /// reads and transactions of its own, which the server orders after it.
    pub(crate) fn commit_then<R>(
        mut self,
        next: impl FnOnce(&mut Connection) -> Result<R>,
    ) -> Result<Result<R>> {
        if let Some(m) = self.member.take() {
            self.open = false;
            m.leave(true)?;
            return Ok(next(self.conn));
        }
        match &self.conn.backend {
            Backend::Sqlite(_) => {
                self.conn.end(true)?;
                self.open = false;
                self.writing = None;
                Ok(next(self.conn))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(c) => {
                c.end_later()?;
                self.open = false;
                let out = next(self.conn);
                let settled = match &self.conn.backend {
                    Backend::Postgres(c) => c.settle(),
                    #[allow(unreachable_patterns)]
                    _ => Ok(()),
                };
                match (out, settled) {
                    (out, Ok(())) => Ok(out),
                    (Err(e), Err(_)) => Err(e),
                    (Ok(_), Err(e)) => Err(e),
                }
            }
        }
    }

    /// Rolls back.
    pub fn rollback(mut self) -> Result<()> {
        self.open = false;
        if let Some(m) = self.member.take() {
            return m.leave(false);
        }
        self.conn.end(false)
    }

    /// A savepoint inside this transaction: released by
    /// [`Savepoint::commit`], rolled back to when dropped without it.
    pub fn savepoint(&mut self) -> Result<Savepoint<'_>> {
        let conn: &Connection = self;
        conn.execute_batch("SAVEPOINT abridge_sp")?;
        Ok(Savepoint { conn, open: true })
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.member.take() {
            let _ = m.leave(false);
            return;
        }
        if self.open && !self.conn.is_autocommit() {
            let _ = self.conn.end(false);
        }
    }
}

/// A savepoint of a [`Transaction`] (see [`Transaction::savepoint`]).
pub struct Savepoint<'c> {
    conn: &'c Connection,
    open: bool,
}

impl Deref for Savepoint<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Savepoint<'_> {
    /// Keeps the savepoint's writes in the transaction.
    pub fn commit(mut self) -> Result<()> {
        self.open = false;
        self.conn.execute_batch("RELEASE SAVEPOINT abridge_sp")
    }
}

impl Drop for Savepoint<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self
                .conn
                .execute_batch("ROLLBACK TO SAVEPOINT abridge_sp; RELEASE SAVEPOINT abridge_sp");
        }
    }
}

/// A prepared statement of a [`Connection`].
pub struct Statement<'c> {
    inner: StmtInner<'c>,
}

enum StmtInner<'c> {
    Sqlite(SqliteStmt<'c>),
    #[cfg(feature = "postgres")]
    Postgres(crate::store::pg::PgStatement<'c>),
}

enum SqliteStmt<'c> {
    Cached(rusqlite::CachedStatement<'c>),
    Plain(rusqlite::Statement<'c>),
}

impl<'c> SqliteStmt<'c> {
    fn get(&mut self) -> &mut rusqlite::Statement<'c> {
        match self {
            SqliteStmt::Cached(s) => s,
            SqliteStmt::Plain(s) => s,
        }
    }
}

/// The rows a [`Statement::query_map`] maps, one `rusqlite::Result` each
/// (what the mapping closure returned).
pub enum MappedRows<A, B> {
    #[doc(hidden)]
    Sqlite(A),
    #[doc(hidden)]
    Fetched(B),
}

impl<T, A, B> Iterator for MappedRows<A, B>
where
    A: Iterator<Item = rusqlite::Result<T>>,
    B: Iterator<Item = rusqlite::Result<T>>,
{
    type Item = rusqlite::Result<T>;
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            MappedRows::Sqlite(a) => a.next(),
            MappedRows::Fetched(b) => b.next(),
        }
    }
}

impl Statement<'_> {
    /// Runs the statement; the number of rows it changed.
    pub fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        match &mut self.inner {
            StmtInner::Sqlite(s) => Ok(s.get().execute(params)?),
            #[cfg(feature = "postgres")]
            StmtInner::Postgres(s) => s.execute(&params.values()),
        }
    }

    /// Maps the first row with `f`; no row is [`Error::NoRow`].
    pub fn query_row<T, P, F>(&mut self, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        match &mut self.inner {
            StmtInner::Sqlite(s) => Ok(s.get().query_row(params, |r| f(&Row::sqlite(r)))?),
            #[cfg(feature = "postgres")]
            StmtInner::Postgres(s) => {
                let rows = s.query(&params.values())?;
                match rows.first() {
                    Some(r) => Ok(f(&Row::postgres(r))?),
                    None => Err(Error::NoRow),
                }
            }
        }
    }

    /// Maps every row with `f`.
    #[allow(clippy::type_complexity)]
    pub fn query_map<'s, T, P, F>(
        &'s mut self,
        params: P,
        mut f: F,
    ) -> Result<
        MappedRows<
            impl Iterator<Item = rusqlite::Result<T>> + 's,
            impl Iterator<Item = rusqlite::Result<T>> + 's,
        >,
    >
    where
        P: Params,
        F: FnMut(&Row<'_>) -> rusqlite::Result<T> + 's,
        T: 's,
    {
        match &mut self.inner {
            StmtInner::Sqlite(s) => Ok(MappedRows::Sqlite(
                s.get().query_map(params, move |r| f(&Row::sqlite(r)))?,
            )),
            #[cfg(feature = "postgres")]
            StmtInner::Postgres(s) => {
                let rows = s.query(&params.values())?;
                let out: Vec<rusqlite::Result<T>> =
                    rows.iter().map(|r| f(&Row::postgres(r))).collect();
                Ok(MappedRows::Fetched(out.into_iter()))
            }
            #[cfg(not(feature = "postgres"))]
            #[allow(unreachable_patterns)]
            _ => Ok(MappedRows::Fetched(Vec::new().into_iter())),
        }
    }

    /// Runs the query; its rows one by one with [`Rows::next`].
    pub fn query<P: Params>(&mut self, params: P) -> Result<Rows<'_>> {
        match &mut self.inner {
            StmtInner::Sqlite(s) => Ok(Rows {
                inner: RowsInner::Sqlite(s.get().query(params)?),
            }),
            #[cfg(feature = "postgres")]
            StmtInner::Postgres(s) => Ok(Rows {
                inner: RowsInner::Fetched(s.query(&params.values())?.into_iter(), None),
            }),
        }
    }

    /// True when the query returns a row.
    pub fn exists<P: Params>(&mut self, params: P) -> Result<bool> {
        match &mut self.inner {
            StmtInner::Sqlite(s) => Ok(s.get().exists(params)?),
            #[cfg(feature = "postgres")]
            StmtInner::Postgres(s) => Ok(!s.query(&params.values())?.is_empty()),
        }
    }
}

/// The rows of [`Statement::query`].
pub struct Rows<'s> {
    inner: RowsInner<'s>,
}

enum RowsInner<'s> {
    Sqlite(rusqlite::Rows<'s>),
    #[cfg(feature = "postgres")]
    Fetched(
        std::vec::IntoIter<tokio_postgres::Row>,
        Option<tokio_postgres::Row>,
    ),
}

impl Rows<'_> {
    /// The next row, or None after the last.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Row<'_>>> {
        match &mut self.inner {
            RowsInner::Sqlite(r) => Ok(r.next()?.map(Row::sqlite)),
            #[cfg(feature = "postgres")]
            RowsInner::Fetched(it, cur) => {
                *cur = it.next();
                Ok(cur.as_ref().map(Row::postgres))
            }
        }
    }
}

/// One row of a result (see [`Row::get`]).
pub struct Row<'a> {
    inner: RowInner<'a>,
}

enum RowInner<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    #[cfg(feature = "postgres")]
    Postgres(&'a tokio_postgres::Row),
}

impl<'a> Row<'a> {
    fn sqlite(r: &'a rusqlite::Row<'a>) -> Row<'a> {
        Row {
            inner: RowInner::Sqlite(r),
        }
    }

    #[cfg(feature = "postgres")]
    fn postgres(r: &'a tokio_postgres::Row) -> Row<'a> {
        Row {
            inner: RowInner::Postgres(r),
        }
    }

    /// The value of column `idx` (its position, or its name) as a `T`.
    pub fn get<I: ColumnIndex, T: FromSql>(&self, idx: I) -> rusqlite::Result<T> {
        match &self.inner {
            RowInner::Sqlite(r) => r.get(idx),
            #[cfg(feature = "postgres")]
            RowInner::Postgres(r) => crate::store::pg::get(r, idx.position(r)?),
        }
    }
}

/// A column's position or name, for [`Row::get`].
pub trait ColumnIndex: rusqlite::RowIndex {
    #[doc(hidden)]
    #[cfg(feature = "postgres")]
    fn position(&self, row: &tokio_postgres::Row) -> rusqlite::Result<usize>;
}

impl ColumnIndex for usize {
    #[cfg(feature = "postgres")]
    fn position(&self, row: &tokio_postgres::Row) -> rusqlite::Result<usize> {
        if *self < row.len() {
            Ok(*self)
        } else {
            Err(rusqlite::Error::InvalidColumnIndex(*self))
        }
    }
}

impl ColumnIndex for &str {
    #[cfg(feature = "postgres")]
    fn position(&self, row: &tokio_postgres::Row) -> rusqlite::Result<usize> {
        row.columns()
            .iter()
            .position(|c| c.name().eq_ignore_ascii_case(self))
            .ok_or_else(|| rusqlite::Error::InvalidColumnName(self.to_string()))
    }
}

/// A statement's parameters: what rusqlite takes (`params![…]`, `[a, b]`,
/// `()`, tuples), each value a rusqlite [`ToSql`], on every backend.
pub trait Params: rusqlite::Params {
    /// The values, in order, for a backend that binds them itself.
    #[doc(hidden)]
    fn values(&self) -> Vec<&dyn ToSql>;
}

impl Params for [&(dyn ToSql + Send + Sync); 0] {
    fn values(&self) -> Vec<&dyn ToSql> {
        Vec::new()
    }
}

impl Params for &[&dyn ToSql] {
    fn values(&self) -> Vec<&dyn ToSql> {
        self.to_vec()
    }
}

impl Params for () {
    fn values(&self) -> Vec<&dyn ToSql> {
        Vec::new()
    }
}

macro_rules! tuple_params {
    ($(($($t:ident $i:tt),+))+) => {$(
        impl<$($t: ToSql),+> Params for ($($t,)+) {
            fn values(&self) -> Vec<&dyn ToSql> {
                vec![$(&self.$i as &dyn ToSql),+]
            }
        }
    )+};
}

tuple_params!(
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
    (A 0, B 1, C 2, D 3, E 4)
    (A 0, B 1, C 2, D 3, E 4, F 5)
);

macro_rules! array_params {
    ($($n:literal)+) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn values(&self) -> Vec<&dyn ToSql> {
                self.iter().map(|v| v as &dyn ToSql).collect()
            }
        }
        impl<T: ToSql + ?Sized> Params for &[&T; $n] {
            fn values(&self) -> Vec<&dyn ToSql> {
                self.iter().map(|v| v as &dyn ToSql).collect()
            }
        }
    )+};
}

array_params!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);

/// `.optional()` on a query's result: no row is `Ok(None)`.
pub trait OptionalExtension<T> {
    /// [`Error::NoRow`] as `Ok(None)`, a row as `Ok(Some(row))`.
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Error::NoRow) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
