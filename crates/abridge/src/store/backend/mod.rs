//! The backend: the boundary every statement goes through (`db`:
//! `Connection`, `Transaction`, `Row`, over SQLite or PostgreSQL), write and
//! read transactions (`tx`), the pool (`pool`), the group commit of
//! SQLite's turn transactions (`group`), the step calls that run on
//! the calling worker (`inline`), an encrypted store's key (`key`), and the
//! PostgreSQL connection with its statement translation (`pg`, `dialect`)
//! and, on Unix, its I/O done by the thread that waits for it (`pg_io`).

pub(crate) mod db;
#[cfg(feature = "postgres")]
pub(crate) mod dialect;
pub(crate) mod group;
pub(crate) mod inline;
pub(crate) mod key;
#[cfg(feature = "postgres")]
pub(crate) mod pg;
#[cfg(all(feature = "postgres", unix))]
pub(crate) mod pg_io;
pub(crate) mod pool;
pub(crate) mod tx;
