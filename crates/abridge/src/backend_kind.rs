//! Which database a store lives in: a word the bottom floor (errors) and the
//! store's backend both use, so it sits below both.

/// Which database a [`Connection`](crate::store::Connection) talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// An SQLite file (the default backend).
    Sqlite,
    /// A PostgreSQL server (the `postgres` feature).
    Postgres,
}
