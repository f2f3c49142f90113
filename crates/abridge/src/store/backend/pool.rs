//! The store's connection pool: r2d2's, with one addition.
//!
//! r2d2 opens (and replaces) connections on threads of its own, and such a
//! thread holds the pool while it works. When a store's last handle is
//! dropped during that moment, the pool, and every connection in it, would
//! be dropped later, on r2d2's thread: after the host has let go of the
//! store, perhaps while the process exits. That is a race with whatever comes
//! next: a host that deletes or moves the file, or the process's exit
//! handlers (SQLCipher frees its memory in one: a connection closing at the
//! same time crashed the process with SIGSEGV).
//!
//! So the pool counts what it holds: its connection maker (alive as long as
//! anything holds the pool) and every connection it opened. Every handle of
//! a store shares one [`Closer`]; the last handle's drop waits until that
//! count is zero, so when it returns the store's connections are closed.

use crate::error::Result;
use crate::store::db::{self, Connection};
use r2d2_sqlite::SqliteConnectionManager;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A store's pool.
pub(crate) type Pool = r2d2::Pool<Manager>;

/// A connection checked out of a [`Pool`].
pub(crate) type Checkout = r2d2::PooledConnection<Manager>;

/// How the pool's connections are made, whichever the backend.
#[derive(Debug)]
pub(crate) enum Connect {
    Sqlite(SqliteConnectionManager),
    #[cfg(feature = "postgres")]
    Postgres(crate::store::pg::Manager),
}

/// Builds the pool (opening its connections, as r2d2's `build` does) and
/// the [`Closer`] its store's handles share.
pub(crate) fn build(
    connect: Connect,
    clock: Arc<dyn crate::clock::Clock>,
    max_size: u32,
    connection_timeout: Duration,
    patience: Duration,
) -> Result<(Pool, Arc<Closer>)> {
    let held = Arc::new(Held::default());
    // Made first: a pool whose build fails is waited for too.
    let closer = Arc::new(Closer {
        held: held.clone(),
        patience,
    });
    // A connection to a local file does not go stale: checking it would cost
    // a statement at every checkout, and reopening it (r2d2 closes one idle
    // for 10 minutes or open for 30 by default) its statement cache and, on
    // an encrypted store, a key derivation. An SQLite store keeps its
    // connections; a server's can drop, and are checked and replaced.
    let local_file = matches!(connect, Connect::Sqlite(_));
    let manager = Manager {
        connect,
        clock,
        _alive: Token::new(&held),
        held,
    };
    let mut builder = r2d2::Pool::builder()
        .max_size(max_size)
        .connection_timeout(connection_timeout)
        .test_on_check_out(!local_file);
    if local_file {
        builder = builder.idle_timeout(None).max_lifetime(None);
    }
    let pool = builder.build(manager)?;
    Ok((pool, closer))
}

/// What a pool holds: its manager and its connections, counted.
#[derive(Default)]
pub(crate) struct Held {
    count: Mutex<usize>,
    none: Condvar,
    #[cfg(test)]
    hooks: tests::Hooks,
}

impl Held {
    fn count(&self) -> std::sync::MutexGuard<'_, usize> {
        self.count.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One thing a pool holds; its drop is counted.
struct Token(Arc<Held>);

impl Token {
    fn new(held: &Arc<Held>) -> Token {
        *held.count() += 1;
        Token(held.clone())
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        let mut n = self.0.count();
        *n -= 1;
        if *n == 0 {
            self.0.none.notify_all();
        }
    }
}

/// Shared by every handle of one store: dropped with the last one, it waits
/// until the pool and all its connections are gone (at most `patience`: a
/// connection still checked out by the dropping thread itself is never
/// returned, and one being opened to an unreachable server takes its
/// connect timeout).
pub(crate) struct Closer {
    held: Arc<Held>,
    patience: Duration,
}

impl Drop for Closer {
    fn drop(&mut self) {
        let until = Instant::now() + self.patience;
        let mut n = self.held.count();
        while *n > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    held = *n,
                    "a dropped store's pool still holds connections; they close when its last user lets go"
                );
                return;
            }
            n = self
                .held
                .none
                .wait_timeout(n, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Makes the pool's connections, each counted.
pub(crate) struct Manager {
    connect: Connect,
    /// The store's, given to every connection.
    clock: Arc<dyn crate::clock::Clock>,
    held: Arc<Held>,
    _alive: Token,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.connect.fmt(f)
    }
}

/// A connection of the pool: derefs to [`Connection`].
pub(crate) struct Pooled {
    conn: Connection,
    _held: Token,
}

impl std::ops::Deref for Pooled {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Pooled;
    type Error = crate::error::Error;

    fn connect(&self) -> Result<Pooled> {
        #[cfg(test)]
        self.held.hooks.before_connect();
        let mut conn = match &self.connect {
            Connect::Sqlite(m) => Connection::from(m.connect()?),
            #[cfg(feature = "postgres")]
            Connect::Postgres(m) => Connection::from(m.0.connect()?),
        };
        conn.clock = self.clock.clone();
        #[cfg(test)]
        self.held.hooks.connected();
        Ok(Pooled {
            conn,
            _held: Token::new(&self.held),
        })
    }

    fn is_valid(&self, conn: &mut Pooled) -> Result<()> {
        match (&self.connect, &mut conn.conn.backend) {
            (Connect::Sqlite(m), db::Backend::Sqlite(c)) => Ok(m.is_valid(c)?),
            #[cfg(feature = "postgres")]
            (Connect::Postgres(m), db::Backend::Postgres(c)) => m.is_valid(c),
            #[allow(unreachable_patterns)]
            _ => Ok(()),
        }
    }

    fn has_broken(&self, conn: &mut Pooled) -> bool {
        #[cfg(test)]
        if self.held.hooks.report_broken() {
            return true;
        }
        match (&self.connect, &mut conn.conn.backend) {
            (Connect::Sqlite(m), db::Backend::Sqlite(c)) => m.has_broken(c),
            #[cfg(feature = "postgres")]
            // A `COMMIT` still queued (`Transaction::commit_then` left by a
            // panic) is sent now, not when the connection is next used: its
            // transaction holds the store's write lock until then.
            (Connect::Postgres(_), db::Backend::Postgres(c)) => {
                c.settle().is_err() || c.is_closed()
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::{Store, StoreOptions};
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    /// What a test makes the pool's connection maker do.
    #[derive(Default)]
    pub(crate) struct Hooks {
        /// Report the next connection returned as broken (r2d2 then drops it
        /// and opens a replacement on its own thread).
        broken_once: AtomicBool,
        /// Milliseconds each connect sleeps before it opens.
        connect_delay_ms: AtomicU64,
        connects_started: AtomicUsize,
        connects_finished: AtomicUsize,
    }

    impl Hooks {
        pub(crate) fn before_connect(&self) {
            self.connects_started.fetch_add(1, Ordering::SeqCst);
            let ms = self.connect_delay_ms.load(Ordering::SeqCst);
            if ms > 0 {
                std::thread::sleep(Duration::from_millis(ms));
            }
        }
        pub(crate) fn connected(&self) {
            self.connects_finished.fetch_add(1, Ordering::SeqCst);
        }
        pub(crate) fn report_broken(&self) -> bool {
            self.broken_once.swap(false, Ordering::SeqCst)
        }
    }

    /// The regression: a connection r2d2 was still opening on its own thread
    /// when the store's last handle was dropped used to be opened, and
    /// closed, after that drop had returned (under the `encryption` feature,
    /// while the process exited: SIGSEGV in SQLCipher's exit handler).
    #[test]
    fn dropping_the_last_handle_returns_once_every_connection_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions::default().with_max_connections(1);
        let store = Store::open_with(dir.path().join("t.db"), opts).unwrap();
        let held = store._closer.held.clone();
        assert_eq!(held.hooks.connects_finished.load(Ordering::SeqCst), 1);
        // The connection comes back "broken": r2d2 drops it and opens its
        // replacement on its own thread, which takes 300 ms.
        held.hooks.connect_delay_ms.store(300, Ordering::SeqCst);
        held.hooks.broken_once.store(true, Ordering::SeqCst);
        store.with_conn(|_| Ok(())).unwrap();
        while held.hooks.connects_started.load(Ordering::SeqCst) < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let second = store.clone();
        drop(store);
        // Not the last handle: returns at once, the pool is still in use.
        assert!(*held.count() > 0);
        drop(second);
        assert_eq!(
            held.hooks.connects_finished.load(Ordering::SeqCst),
            2,
            "the drop returned before the replacement connection was made"
        );
        assert_eq!(*held.count(), 0, "a connection outlived its store");
    }

    #[test]
    fn an_sqlite_store_never_closes_and_reopens_its_connections_by_age() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("t.db")).unwrap();
        assert_eq!(store.pool.idle_timeout(), None);
        assert_eq!(store.pool.max_lifetime(), None);
        assert!(!store.pool.test_on_check_out());
    }

    #[test]
    fn a_connection_held_past_the_patience_does_not_block_the_drop_forever() {
        let held = Arc::new(Held::default());
        let token = Token::new(&held);
        let closer = Closer {
            held: held.clone(),
            patience: Duration::from_millis(50),
        };
        let start = Instant::now();
        drop(closer);
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(*held.count(), 1);
        drop(token);
        assert_eq!(*held.count(), 0);
    }
}
