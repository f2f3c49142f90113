//! The store's connection pool: a fixed set of connections, opened when the
//! store is opened, checked out and returned by the calling thread.
//!
//! # Why not a pool crate
//! A store needs little of a general pool: its connections are opened on
//! the caller's thread, never in the background, an SQLite store keeps its
//! connections for its lifetime (a connection to a local file does not go
//! stale; reopening one costs its statement cache and, encrypted, a key
//! derivation), and a server's connection is checked at checkout and
//! replaced when found broken. A pool crate opens and replaces connections
//! on threads of its own, with a scheduler of its own per pool; such a
//! thread can hold the last reference to the pool while the host drops its
//! store, and close a connection after the host has let go (a race with a
//! host that deletes the file, or with the process's exit handlers:
//! SQLCipher frees its memory in one, and a connection closing at the same
//! time crashed the process). Here nothing runs anywhere but on a thread
//! that called the store, and an app embedding the engine compiles no
//! thread-pool or platform crate for it.
//!
//! The pool still counts what it holds: its connection maker and every
//! connection it opened. Every handle of a store shares one [`Closer`]; the
//! last handle's drop waits until that count is zero (a connection checked
//! out on another thread is returned, and closed, first), so when it returns
//! the store's connections are closed.

use crate::error::{Error, Result};
use crate::store::db::{self, Connection};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What an SQLite connection runs once, right after it is opened (the key,
/// the busy timeout, the pragmas).
pub(crate) type Init = Box<dyn Fn(&mut rusqlite::Connection) -> rusqlite::Result<()> + Send + Sync>;

/// How the pool's connections are made, whichever the backend.
pub(crate) enum Connect {
    /// A file, opened with SQLite's default flags, then `Init`.
    Sqlite { path: PathBuf, init: Init },
    #[cfg(feature = "postgres")]
    Postgres(Box<crate::store::pg::Manager>),
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connect::Sqlite { path, .. } => write!(f, "Sqlite({})", path.display()),
            #[cfg(feature = "postgres")]
            Connect::Postgres(m) => write!(f, "Postgres({m:?})"),
        }
    }
}

/// A store's pool. Cheap to clone: every clone is the same pool.
#[derive(Clone)]
pub(crate) struct Pool(Arc<Shared>);

struct Shared {
    maker: Maker,
    /// Connections open, idle or checked out (or being opened).
    max_size: u32,
    /// How long [`Pool::get`] waits for a connection to come back.
    timeout: Duration,
    /// A server's connections are checked at checkout (a file's are not:
    /// the check would cost a statement at every checkout).
    check_on_checkout: bool,
    state: Mutex<State>,
    /// Notified when a connection comes back, or a slot frees.
    returned: Condvar,
}

#[derive(Default)]
struct State {
    idle: Vec<Pooled>,
    /// Connections counted against `max_size`: idle, out, or being opened.
    open: u32,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Builds the pool, opening its `max_size` connections on the calling thread
/// (the first error, such as a wrong key or an unreachable server, is
/// returned and the pool is not made), and the [`Closer`] its store's
/// handles share.
pub(crate) fn build(
    connect: Connect,
    clock: Arc<dyn crate::clock::Clock>,
    max_size: u32,
    connection_timeout: Duration,
    patience: Duration,
    group_commit: Option<Duration>,
) -> Result<(Pool, Arc<Closer>)> {
    if max_size == 0 {
        return Err(Error::Config(
            "a store needs at least one connection".into(),
        ));
    }
    let held = Arc::new(Held::default());
    // Made first: a pool whose build fails is waited for too.
    let closer = Arc::new(Closer {
        held: held.clone(),
        patience,
    });
    let check_on_checkout = !matches!(connect, Connect::Sqlite { .. });
    let mut maker = Maker {
        connect,
        clock,
        _alive: Token::new(&held),
        held,
        group: None,
    };
    // An SQLite store's group commit keeps a connection of its own, the
    // writer (made first, so that it is no member of its own group).
    if let (Some(busy_timeout), Connect::Sqlite { .. }) = (group_commit, &maker.connect) {
        let writer = maker.connect()?;
        maker.group = Some(Arc::new(crate::store::group::Group::new(
            writer.conn,
            Box::new(writer._held),
            busy_timeout,
        )));
    }
    let mut idle = Vec::with_capacity(max_size as usize);
    for _ in 0..max_size {
        idle.push(maker.connect()?);
    }
    let pool = Pool(Arc::new(Shared {
        maker,
        max_size,
        timeout: connection_timeout,
        check_on_checkout,
        state: Mutex::new(State {
            idle,
            open: max_size,
        }),
        returned: Condvar::new(),
    }));
    Ok((pool, closer))
}

impl Pool {
    /// A connection: an idle one, or a new one while fewer than `max_size`
    /// are open (one found broken was closed), or the first returned within
    /// the pool's timeout.
    ///
    /// Errors: [`Error::PoolTimeout`] when none came back in time (resumable);
    /// the backend's own error when a new connection could not be opened.
    pub(crate) fn get(&self) -> Result<Checkout> {
        let deadline = Instant::now() + self.0.timeout;
        let mut state = self.0.state();
        loop {
            if let Some(conn) = state.idle.pop() {
                drop(state);
                match self.checked(conn) {
                    Some(out) => return Ok(out),
                    None => {
                        state = self.0.state();
                        continue;
                    }
                }
            }
            if state.open < self.0.max_size {
                state.open += 1;
                drop(state);
                return match self.0.maker.connect() {
                    Ok(conn) => Ok(self.checkout(conn)),
                    Err(e) => {
                        self.release_slot();
                        Err(e)
                    }
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::PoolTimeout {
                    waited: self.0.timeout,
                });
            }
            state = self
                .0
                .returned
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// An idle connection, if one is idle right now; never waits and never
    /// opens one.
    pub(crate) fn try_get(&self) -> Option<Checkout> {
        loop {
            let conn = self.0.state().idle.pop()?;
            if let Some(out) = self.checked(conn) {
                return Some(out);
            }
        }
    }

    /// The group commit of its connections, if it has one.
    pub(crate) fn group(&self) -> Option<&Arc<crate::store::group::Group>> {
        self.0.maker.group.as_ref()
    }

    /// Whether the pool checks a connection at each checkout.
    #[cfg(test)]
    pub(crate) fn checks_on_checkout(&self) -> bool {
        self.0.check_on_checkout
    }

    /// `conn` checked out, or None (and its slot freed) when the check at
    /// checkout finds it dead.
    fn checked(&self, mut conn: Pooled) -> Option<Checkout> {
        let recent = conn
            .returned
            .is_some_and(|t| t.elapsed() < CHECKED_RECENTLY);
        if self.0.check_on_checkout && self.0.maker.is_valid(&mut conn, recent).is_err() {
            drop(conn);
            self.release_slot();
            return None;
        }
        Some(self.checkout(conn))
    }

    fn checkout(&self, conn: Pooled) -> Checkout {
        Checkout {
            conn: Some(conn),
            pool: self.clone(),
        }
    }

    fn release_slot(&self) {
        self.0.state().open -= 1;
        self.0.returned.notify_one();
    }
}

/// A connection checked out of a [`Pool`]: derefs to [`Connection`], and goes
/// back to the pool when dropped (closed instead when it is broken).
pub(crate) struct Checkout {
    conn: Option<Pooled>,
    pool: Pool,
}

impl std::ops::Deref for Checkout {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn.as_ref().expect("checked out").conn
    }
}

impl std::ops::DerefMut for Checkout {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn.as_mut().expect("checked out").conn
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let shared = &self.pool.0;
        if shared.maker.has_broken(&mut conn) {
            drop(conn);
            self.pool.release_slot();
            return;
        }
        conn.returned = Some(Instant::now());
        shared.state().idle.push(conn);
        shared.returned.notify_one();
    }
}

/// What a pool holds: its maker and its connections, counted.
#[derive(Default)]
pub(crate) struct Held {
    count: Mutex<usize>,
    none: Condvar,
    #[cfg(test)]
    hooks: tests::Hooks,
}

impl Held {
    fn count(&self) -> MutexGuard<'_, usize> {
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
/// returned).
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
struct Maker {
    connect: Connect,
    /// The store's, given to every connection.
    clock: Arc<dyn crate::clock::Clock>,
    held: Arc<Held>,
    _alive: Token,
    /// The group commit every connection it makes belongs to, if any.
    group: Option<Arc<crate::store::group::Group>>,
}

/// A connection of the pool, counted while it is open.
struct Pooled {
    conn: Connection,
    _held: Token,
    /// When it last came back to the pool (None: never checked out).
    returned: Option<Instant>,
}

/// A server's connection that came back this recently, and whose client
/// saw no end of it, is handed out without a round trip to check it (a
/// connection pool's usual bypass window): one used a moment ago answered
/// then, and one that breaks in between fails its first request as one
/// broken mid-transaction does, resumable.
pub(crate) const CHECKED_RECENTLY: Duration = Duration::from_millis(500);

impl Maker {
    fn connect(&self) -> Result<Pooled> {
        #[cfg(test)]
        self.held.hooks.before_connect();
        let mut conn = match &self.connect {
            Connect::Sqlite { path, init } => {
                let mut c = rusqlite::Connection::open(path)?;
                init(&mut c)?;
                Connection::from(c)
            }
            #[cfg(feature = "postgres")]
            Connect::Postgres(m) => Connection::from(m.0.connect()?),
        };
        conn.clock = self.clock.clone();
        conn.group = self.group.clone();
        Ok(Pooled {
            conn,
            _held: Token::new(&self.held),
            returned: None,
        })
    }

    fn is_valid(&self, conn: &mut Pooled, recent: bool) -> Result<()> {
        let _ = recent;
        match (&self.connect, &mut conn.conn.backend) {
            #[cfg(feature = "postgres")]
            (Connect::Postgres(m), db::Backend::Postgres(c)) => m.is_valid(c, recent),
            #[allow(unreachable_patterns)]
            _ => Ok(()),
        }
    }

    fn has_broken(&self, conn: &mut Pooled) -> bool {
        #[cfg(test)]
        if self.held.hooks.report_broken() {
            return true;
        }
        match &mut conn.conn.backend {
            db::Backend::Sqlite(_) => false,
            #[cfg(feature = "postgres")]
            // A `COMMIT` still queued (`Transaction::commit_then` left by a
            // panic) is sent now, not when the connection is next used: its
            // transaction holds the store's write lock until then.
            db::Backend::Postgres(c) => c.settle().is_err() || c.is_closed(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::{Store, StoreOptions};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// What a test makes the pool's connection maker do.
    #[derive(Default)]
    pub(crate) struct Hooks {
        /// Report the next connection returned as broken (the pool closes it).
        broken_once: AtomicBool,
        connects: AtomicUsize,
    }

    impl Hooks {
        pub(crate) fn before_connect(&self) {
            self.connects.fetch_add(1, Ordering::SeqCst);
        }
        pub(crate) fn report_broken(&self) -> bool {
            self.broken_once.swap(false, Ordering::SeqCst)
        }
    }

    /// The regression: connections used to be opened, replaced and closed on
    /// a pool crate's threads, so one could close after the store's last
    /// handle was dropped (under the `encryption` feature, while the process
    /// exited: SIGSEGV in SQLCipher's exit handler). A broken connection is
    /// closed as it is returned, its replacement opened by the next caller,
    /// and the last handle's drop returns with every connection closed.
    #[test]
    fn dropping_the_last_handle_returns_once_every_connection_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions::default().with_max_connections(2);
        let store = Store::open_with(dir.path().join("t.db"), opts).unwrap();
        let held = store._closer.held.clone();
        // The maker, the group commit's writer and the pool's two
        // connections.
        assert_eq!(held.hooks.connects.load(Ordering::SeqCst), 3);
        assert_eq!(*held.count(), 4);
        held.hooks.broken_once.store(true, Ordering::SeqCst);
        store.with_conn(|_| Ok(())).unwrap();
        assert_eq!(*held.count(), 3, "a broken connection was kept");
        // Both slots in use at once: the closed one is opened again.
        store.with_conn(|_| store.with_conn(|_| Ok(()))).unwrap();
        assert_eq!(held.hooks.connects.load(Ordering::SeqCst), 4);
        assert_eq!(*held.count(), 4);
        let second = store.clone();
        drop(store);
        // Not the last handle: returns at once, the pool is still in use.
        assert!(*held.count() > 0);
        drop(second);
        assert_eq!(*held.count(), 0, "a connection outlived its store");
    }

    /// A connection checked out on another thread when the last handle is
    /// dropped is waited for: the drop returns once it is back and closed.
    #[test]
    fn the_last_handles_drop_waits_for_a_connection_out_on_another_thread() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("t.db")).unwrap();
        let held = store._closer.held.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let other = store.clone();
        let worker = std::thread::spawn(move || {
            other
                .with_conn(|_| {
                    tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(200));
                    Ok(())
                })
                .unwrap();
        });
        rx.recv().unwrap();
        drop(store);
        worker.join().unwrap();
        assert_eq!(*held.count(), 0, "a connection outlived its store");
    }

    #[test]
    fn an_sqlite_store_never_checks_or_reopens_its_connections() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("t.db")).unwrap();
        assert!(!store.pool.checks_on_checkout());
        let held = store._closer.held.clone();
        for _ in 0..100 {
            store.with_conn(|_| Ok(())).unwrap();
        }
        // The pool's eight and the group commit's writer, once.
        assert_eq!(held.hooks.connects.load(Ordering::SeqCst), 9);
    }

    /// Every connection out: a caller waits for the pool's timeout, then gets
    /// the pool's own resumable error; one returned in time is handed over.
    #[test]
    fn a_full_pool_hands_over_a_returned_connection_or_times_out_resumably() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        rusqlite::Connection::open(&path).unwrap();
        let clock: Arc<dyn crate::clock::Clock> = Arc::new(crate::clock::SystemClock);
        let (pool, _closer) = build(
            Connect::Sqlite {
                path,
                init: Box::new(|_| Ok(())),
            },
            clock,
            1,
            Duration::from_millis(100),
            Duration::from_secs(1),
            None,
        )
        .unwrap();
        let out = pool.get().unwrap();
        assert!(pool.try_get().is_none());
        let err = pool
            .get()
            .err()
            .expect("a second connection from a pool of one");
        assert!(matches!(err, Error::PoolTimeout { .. }), "{err}");
        assert!(err.is_resumable());
        let returning = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(out);
        });
        pool.get().expect("the returned connection");
        returning.join().unwrap();
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
