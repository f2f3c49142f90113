//! Group commit: the turns' write transactions of different sessions that
//! are ready at the same moment commit as one SQLite transaction.
//!
//! An SQLite store of more than one connection keeps one more, the writer.
//! A turn's write transaction (its fenced ones: a step's claim, its
//! response and tool records, its completion, a lease renewal; and the start
//! of a session's turn) runs on the writer instead of on the caller's
//! connection, as a member of the writer's open batch:
//!
//! - the first member begins the transaction (`BEGIN IMMEDIATE`, the
//!   statements it always ran); a member that joins a batch already open runs
//!   its part inside a savepoint of its own;
//! - a member that ends its part hands the writer, the batch still open, to
//!   the next member waiting for it (at most [`MAX_BATCH`] parts a batch),
//!   and waits for the batch's end; the member that finds no one waiting
//!   commits the batch, for every part in it;
//! - a part that fails is rolled back to its savepoint (the first member's,
//!   alone in the batch, with the transaction) and its member gets its own
//!   error: its batch-mates' parts stay and commit;
//! - a batch whose `COMMIT` fails fails every member whose part was in it,
//!   with the same (resumable) error: none of them was told its part was
//!   durable, as a single transaction's failed commit tells its caller.
//!
//! So each member's part is all or nothing and its fence is checked inside
//! it, as before; a member returns from its commit only once its part is
//! durable (or has failed); and the statements of one session's step, alone
//! in the store, are the ones it ran without the group. What changes is only
//! that parts of several sessions share one `COMMIT`: fewer commits (and
//! locks, WAL frame headers and page writes) than steps when many sessions
//! run. Waits for the writer and for a batch's end hand a runtime worker's
//! other tasks off first ([`may_block`](crate::store::inline::may_block)).
//!
//! A store whose turns' writes never meet (one session at a time, a host
//! that runs its turns one after another) has nothing to share a commit
//! with, and the writer would only cost it its reads' page cache (another
//! connection's commits invalidate it): a write that arrives when none of
//! the last [`RECENT`] turn writes met another one running runs as a
//! transaction on the caller's own connection, as without the group; the
//! first that meets one sends the next ones back to the batch.

use crate::error::{Error, Result};
use crate::store::db::Connection;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Turn writes whose meeting (or not) with another one running decides
/// where the next one runs (see the module's doc).
pub(crate) const RECENT: u32 = 64;

/// Parts a batch takes at most: a batch holds SQLite's write lock (other
/// processes' writers and the store's other transactions wait on it) while
/// its parts run one after the other.
pub(crate) const MAX_BATCH: usize = 32;

/// The savepoint of a part that joined an open batch (not `abridge_sp`, a
/// transactional tool's own): begun, kept, undone.
const BEGIN_PART: &str = "SAVEPOINT abridge_group_part";
const KEEP_PART: &str = "RELEASE SAVEPOINT abridge_group_part";
const UNDO_PART: &str =
    "ROLLBACK TO SAVEPOINT abridge_group_part; RELEASE SAVEPOINT abridge_group_part";

/// A store's writer and its batches.
pub(crate) struct Group {
    state: Mutex<State>,
    /// Notified when the writer is handed back.
    free: Condvar,
    /// Notified when a batch ends.
    ended: Condvar,
    /// How long a member waits for the writer: the store's busy timeout.
    busy_timeout: Duration,
    /// Batches ended with a `COMMIT`.
    commits: AtomicU64,
    /// Parts committed (in those batches).
    parts_committed: AtomicU64,
    /// Turn write transactions running now, in the batch or alone.
    writing: AtomicUsize,
    /// One bit a turn write, newest lowest: it met another one running.
    recent: AtomicU64,
    /// Turn write transactions run alone, on the caller's connection.
    alone: AtomicU64,
    /// Parts rolled back while the batch held other members' kept parts.
    undone_beside_kept: AtomicU64,
    /// Every turn write joins the batch, met or not (a test's switch).
    every_write: AtomicBool,
    /// Read transactions run on the idle writer.
    lent: AtomicU64,
    /// The pool's count of the writer: dropped after it closes.
    _held: Box<dyn std::any::Any + Send + Sync>,
}

struct State {
    /// None while a member holds it.
    writer: Option<Connection>,
    /// Members waiting for the writer.
    waiting: usize,
    /// Parts in the open batch.
    parts: usize,
    /// The open batch, which members whose part is in it wait on.
    batch: Arc<Batch>,
}

#[derive(Default)]
struct Batch {
    /// How it ended: set once, under the group's lock.
    outcome: OnceLock<std::result::Result<(), Failed>>,
}

/// A batch's failed commit, for each member whose part was in it.
#[derive(Clone, Debug)]
struct Failed {
    code: Option<rusqlite::ffi::Error>,
    message: String,
}

impl Failed {
    fn of(e: &Error) -> Failed {
        let code = match e {
            Error::Sqlite(rusqlite::Error::SqliteFailure(code, _)) => Some(*code),
            _ => None,
        };
        Failed {
            code,
            message: format!("the group commit this write was part of failed: {e}"),
        }
    }

    fn error(&self) -> Error {
        let code = self.code.unwrap_or(rusqlite::ffi::Error {
            code: rusqlite::ErrorCode::SystemIoFailure,
            extended_code: rusqlite::ffi::SQLITE_IOERR,
        });
        Error::Sqlite(rusqlite::Error::SqliteFailure(
            code,
            Some(self.message.clone()),
        ))
    }
}

impl Group {
    /// A group around `writer`, a connection of the store's kept for it.
    /// `held` is the pool's count of it, dropped once it has closed.
    pub(crate) fn new(
        writer: Connection,
        held: Box<dyn std::any::Any + Send + Sync>,
        busy_timeout: Duration,
    ) -> Group {
        Group {
            state: Mutex::new(State {
                writer: Some(writer),
                waiting: 0,
                parts: 0,
                batch: Arc::default(),
            }),
            free: Condvar::new(),
            ended: Condvar::new(),
            busy_timeout,
            commits: AtomicU64::new(0),
            parts_committed: AtomicU64::new(0),
            writing: AtomicUsize::new(0),
            // Until the store has seen its writes, they may meet.
            recent: AtomicU64::new(u64::MAX),
            alone: AtomicU64::new(0),
            undone_beside_kept: AtomicU64::new(0),
            every_write: AtomicBool::new(false),
            lent: AtomicU64::new(0),
            _held: held,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Batches committed, and the parts they committed.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.commits.load(Ordering::Relaxed),
            self.parts_committed.load(Ordering::Relaxed),
        )
    }

    /// Turn write transactions run alone on the caller's connection.
    pub(crate) fn alone(&self) -> u64 {
        self.alone.load(Ordering::Relaxed)
    }

    /// Read transactions run on the idle writer
    /// ([`Group::lend_idle_writer`]).
    pub(crate) fn lent(&self) -> u64 {
        self.lent.load(Ordering::Relaxed)
    }

    /// Sends every turn write to the batch (`on`), as if each had met
    /// another, or back to the rule of [`Group::arrive`].
    pub(crate) fn set_every_write(&self, on: bool) {
        self.every_write.store(on, Ordering::Relaxed);
    }

    /// Members waiting for the writer right now.
    pub(crate) fn waiting(&self) -> usize {
        self.state().waiting
    }

    /// Parts kept in the open batch right now (the members waiting for its
    /// end): a part running now is a batch-mate of that many.
    pub(crate) fn open_parts(&self) -> usize {
        self.state().parts
    }

    /// Parts rolled back (failed) in a batch that held other members'
    /// kept parts, which stayed in it.
    pub(crate) fn undone_beside_kept(&self) -> u64 {
        self.undone_beside_kept.load(Ordering::Relaxed)
    }

    /// Counts a turn's write transaction in (until the returned [`Writing`]
    /// is dropped) and says whether it joins the batch: unless none of the
    /// last [`RECENT`] turn writes, this one included, met another running.
    pub(crate) fn arrive(self: &Arc<Self>) -> (Writing, bool) {
        let met = self.writing.fetch_add(1, Ordering::AcqRel) > 0;
        let writing = Writing {
            group: self.clone(),
        };
        let shift = |m: u64| (m << 1) | u64::from(met);
        let before = self
            .recent
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| Some(shift(m)))
            .unwrap_or_else(|m| m);
        let join = self.batching(shift(before));
        if !join {
            self.alone.fetch_add(1, Ordering::Relaxed);
        }
        (writing, join)
    }

    /// Whether turn writes go to the batch, given the bits of the recent
    /// ones (see [`Group::arrive`]).
    fn batching(&self, recent: u64) -> bool {
        recent & (u64::MAX >> (64 - RECENT)) != 0 || self.every_write.load(Ordering::Relaxed)
    }

    /// Takes the writer (waiting, at most the busy timeout, while another
    /// member holds it) and opens this member's part: the batch's
    /// transaction, or a savepoint in the open one.
    ///
    /// Errors: [`Error::PoolTimeout`] when the writer was not handed back in
    /// time (resumable); the `BEGIN`'s own (another process's writer held
    /// the file past the busy timeout).
    pub(crate) fn join(self: &Arc<Self>, writing: Writing) -> Result<Member> {
        let mut st = self.state();
        if st.writer.is_none() {
            st.waiting += 1;
            let deadline = Instant::now() + self.busy_timeout;
            let got;
            (got, st) = wait(&self.free, st, Some(deadline), |st| st.writer.is_some());
            st.waiting -= 1;
            if !got {
                return Err(Error::PoolTimeout {
                    waited: self.busy_timeout,
                });
            }
        }
        let writer = st.writer.take().expect("the writer is free");
        let first = st.parts == 0;
        drop(st);
        let member = Member {
            group: self.clone(),
            writer: Some(writer),
            first,
            _writing: writing,
        };
        // It waits for another process's lock as the caller's own
        // connection would.
        let raw = member.conn().as_sqlite().expect("an SQLite store's writer");
        let _ = crate::store::inline::callers_busy_handler(raw, self.busy_timeout);
        let sql = if first { "BEGIN IMMEDIATE" } else { BEGIN_PART };
        let begun = raw
            .prepare_cached(sql)
            .and_then(|mut st| st.execute([]).map(drop));
        if let Err(e) = begun {
            // Nothing of this member's is in the batch: the writer goes on
            // as it was.
            let _ = member.leave(false);
            return Err(e.into());
        }
        Ok(member)
    }
}

impl Group {
    /// Lends the writer for a read transaction when it is idle: the turns'
    /// writes go to the batch (see [`Group::arrive`]) and none is under way
    /// (running, waiting for the writer, or waiting for its batch's end: so
    /// no batch is open either). None otherwise: the caller reads on its own
    /// connection.
    ///
    /// A read on the writer finds its page cache as the writer's last
    /// commit left it. Every other connection of the store drops its whole
    /// cache at its next read once anything was written (SQLite sees the WAL
    /// changed and cannot tell which pages), so while many sessions run, a
    /// step's reads on a connection of the pool fetch every page again from
    /// the WAL or the file.
    pub(crate) fn lend_idle_writer(&self) -> Option<Lent<'_>> {
        let mut st = self.state();
        if !self.batching(self.recent.load(Ordering::Relaxed))
            || self.writing.load(Ordering::Acquire) != 0
        {
            return None;
        }
        if !st.writer.as_ref()?.is_autocommit() {
            // A batch's transaction left open (its end failed): not for a
            // read, which must see committed rows only.
            return None;
        }
        let writer = st.writer.take()?;
        self.lent.fetch_add(1, Ordering::Relaxed);
        Some(Lent {
            group: self,
            writer: Some(writer),
        })
    }
}

/// The writer lent for a read transaction ([`Group::lend_idle_writer`]),
/// handed back when dropped.
pub(crate) struct Lent<'g> {
    group: &'g Group,
    writer: Option<Connection>,
}

impl Lent<'_> {
    /// The writer, to read on.
    pub(crate) fn conn(&self) -> &Connection {
        self.writer.as_ref().expect("held until handed back")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        let Some(writer) = self.writer.take() else {
            return;
        };
        if let Some(raw) = writer.as_sqlite() {
            if !raw.is_autocommit() {
                // A read that did not end its transaction (a panic in it):
                // the writer goes back with none open.
                let _ = raw.execute_batch("ROLLBACK");
            }
        }
        let mut st = self.group.state();
        st.writer = Some(writer);
        drop(st);
        self.group.free.notify_one();
    }
}

/// How long a member waits on the calling thread itself before it hands a
/// runtime worker's other tasks off (`may_block`): a part takes tens of
/// microseconds, less than the hand-off's two thread wake-ups.
const WAIT_IN_PLACE: Duration = Duration::from_millis(2);

/// Waits on `cv` until `done` or `deadline` (None: until `done`): up to
/// [`WAIT_IN_PLACE`] on the thread as it is, the rest inside `may_block`.
/// Returns whether `done`.
fn wait<'a>(
    cv: &Condvar,
    mut st: MutexGuard<'a, State>,
    deadline: Option<Instant>,
    done: impl Fn(&State) -> bool,
) -> (bool, MutexGuard<'a, State>) {
    let wait_until = |mut st: MutexGuard<'a, State>, until: Option<Instant>| {
        while !done(&st) {
            st = match until {
                None => cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(until) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return (false, st);
                    }
                    cv.wait_timeout(st, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        (true, st)
    };
    let soon = Instant::now() + WAIT_IN_PLACE;
    let in_place = Some(deadline.map_or(soon, |d| d.min(soon)));
    match wait_until(st, in_place) {
        (true, back) => (true, back),
        (false, back) => {
            st = back;
            crate::store::inline::may_block(|| wait_until(st, deadline))
        }
    }
}

/// A turn's write transaction counted as running (see [`Group::arrive`]).
pub(crate) struct Writing {
    group: Arc<Group>,
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.group.writing.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A member's hold of the writer, from [`Group::join`] to its part's end.
pub(crate) struct Member {
    group: Arc<Group>,
    writer: Option<Connection>,
    /// Whether its part began the batch's transaction.
    first: bool,
    /// Counted as running until its part, and its wait for the batch, end.
    _writing: Writing,
}

impl Member {
    /// The writer, which this member's statements run on.
    pub(crate) fn conn(&self) -> &Connection {
        self.writer.as_ref().expect("held until the part ends")
    }

    pub(crate) fn conn_mut(&mut self) -> &mut Connection {
        self.writer.as_mut().expect("held until the part ends")
    }

    /// Ends this member's part: kept (`keep`) or rolled back. A kept part
    /// returns once its batch has committed (Ok) or failed (the commit's
    /// error); a part rolled back returns at once (Ok once it is undone).
    pub(crate) fn leave(mut self, keep: bool) -> Result<()> {
        let writer = self.writer.take().expect("held until the part ends");
        self.group.end_part(writer, self.first, keep)
    }
}

impl Drop for Member {
    /// A member dropped before its part ended (a panic in it) rolls it back.
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            let _ = self.group.end_part(writer, self.first, false);
        }
    }
}

/// The error of a batch whose transaction ended before its COMMIT: every
/// part in it is lost (resumable: each is run again from the store).
fn ended_uncommitted() -> Error {
    Error::Sqlite(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
        Some("the group commit's transaction ended before its COMMIT".into()),
    ))
}

/// Runs one of the part's statements on the writer.
fn exec(raw: &rusqlite::Connection, sql: &str) -> Result<()> {
    raw.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Ends a part's statements: kept in the batch (Ok(true)), or undone
/// (Ok(false); Err when undoing, or keeping, failed: then it is undone as
/// far as it could be). The first part, alone in the batch, is undone with
/// the transaction; a later one to its savepoint.
fn close_part(raw: &rusqlite::Connection, first: bool, keep: bool) -> Result<bool> {
    if raw.is_autocommit() {
        // Its transaction never began, or ended without a COMMIT (SQLite
        // rolls back on some errors; a host's statement may have): a part
        // to keep is refused as a lone transaction's COMMIT would be.
        return if keep {
            Err(ended_uncommitted())
        } else {
            Ok(false)
        };
    }
    match (keep, first) {
        (true, true) => Ok(true),
        (true, false) => match exec(raw, KEEP_PART) {
            Ok(()) => Ok(true),
            Err(e) => {
                let _ = raw.execute_batch(UNDO_PART);
                Err(e)
            }
        },
        (false, true) => exec(raw, "ROLLBACK").map(|()| false),
        (false, false) => raw
            .execute_batch(UNDO_PART)
            .map(|()| false)
            .map_err(Error::from),
    }
}

impl Group {
    fn end_part(&self, writer: Connection, first: bool, keep: bool) -> Result<()> {
        let raw = writer.as_sqlite().expect("an SQLite store's writer");
        let closed = close_part(raw, first, keep);
        let kept = matches!(closed, Ok(true));
        // A part undone: its own outcome, whatever its batch-mates'.
        let undone = closed.map(drop);
        let mut st = self.state();
        if kept {
            st.parts += 1;
        } else if !first && st.parts > 0 && !raw.is_autocommit() {
            // Undone to its savepoint, the batch-mates' parts still in the
            // open transaction (not lost with a transaction that ended).
            self.undone_beside_kept.fetch_add(1, Ordering::Relaxed);
        }
        let batch = st.batch.clone();
        let open = !raw.is_autocommit();
        if open && st.parts > 0 && st.waiting > 0 && st.parts < MAX_BATCH {
            // The next member's part joins the batch; this one waits for
            // its end.
            st.writer = Some(writer);
            self.free.notify_one();
            if !kept {
                return undone;
            }
            // No deadline: the batch ends once the parts that joined it end,
            // as a transaction ends once its statements have run.
            let (_, st) = wait(&self.ended, st, None, |_| batch.outcome.get().is_some());
            drop(st);
            let outcome = batch.outcome.get().expect("the batch ended").clone();
            return outcome.map_err(|f| f.error());
        }
        // This member ends the batch.
        let parts = st.parts;
        drop(st);
        let committed = if !open {
            // Parts kept in a transaction that ended meanwhile are lost.
            if parts == 0 {
                Ok(())
            } else {
                Err(ended_uncommitted())
            }
        } else if parts == 0 {
            exec(raw, "ROLLBACK")
        } else {
            let r = exec(raw, "COMMIT");
            if r.is_err() && !raw.is_autocommit() {
                let _ = exec(raw, "ROLLBACK");
            }
            r
        };
        let mut st = self.state();
        let outcome = committed.as_ref().map(|_| ()).map_err(Failed::of);
        if open && parts > 0 && outcome.is_ok() {
            self.commits.fetch_add(1, Ordering::Relaxed);
            self.parts_committed
                .fetch_add(parts as u64, Ordering::Relaxed);
        }
        let _ = batch.outcome.set(outcome);
        st.parts = 0;
        st.batch = Arc::default();
        st.writer = Some(writer);
        drop(st);
        self.ended.notify_all();
        self.free.notify_one();
        if kept {
            committed
        } else {
            undone
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ids::TurnId;
    use crate::store::db::Owner;
    use crate::{Store, StoreOptions};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    fn store(dir: &tempfile::TempDir) -> Store {
        let store = Store::open(dir.path().join("g.db")).unwrap();
        store
            .with_conn(|c| {
                // A deferred foreign key: a batch holding a row without its
                // parent fails at its COMMIT, not at the row's insert.
                c.execute_batch(
                    "CREATE TABLE parent (id INTEGER PRIMARY KEY);
                     CREATE TABLE t (x INTEGER NOT NULL,
                        parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);",
                )
            })
            .unwrap();
        store
    }

    fn rows(store: &Store) -> Vec<i64> {
        store
            .with_conn(|c| {
                let mut st = c.prepare("SELECT x FROM t ORDER BY x")?;
                let xs = st.query_map([], |r| r.get(0))?;
                Ok(xs.collect::<rusqlite::Result<Vec<i64>>>()?)
            })
            .unwrap()
    }

    fn wait_for(what: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(10);
        while !what() {
            assert!(Instant::now() < until, "timed out");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs one part per `(x, sql_after, keep)`: the first holds the writer
    /// until every other one waits for it, so all of them end up in one
    /// batch. Returns each part's commit result, in order.
    fn batch_of(store: &Store, parts: Vec<(i64, Option<&'static str>, bool)>) -> Vec<bool> {
        let group = store.pool.group().expect("a group commit").clone();
        let n = parts.len();
        let (joined, first_in) = mpsc::channel();
        let mut threads = Vec::new();
        for (i, (x, extra, keep)) in parts.into_iter().enumerate() {
            let store = store.clone();
            let group = group.clone();
            let joined = joined.clone();
            threads.push(std::thread::spawn(move || {
                store
                    .with_conn(|c| {
                        let tx = c.write_tx_of(Owner::Turn(TurnId(x)))?;
                        tx.execute("INSERT INTO t (x) VALUES (?1)", [x])?;
                        if let Some(sql) = extra {
                            tx.execute_batch(sql)?;
                        }
                        if i == 0 {
                            joined.send(()).unwrap();
                            wait_for(|| group.waiting() == n - 1);
                        }
                        if keep {
                            tx.commit()
                        } else {
                            tx.rollback()
                        }
                    })
                    .is_ok()
            }));
            if i == 0 {
                first_in.recv().unwrap();
            }
        }
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn parts_of_different_turns_ready_together_commit_as_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let ok = batch_of(
            &store,
            vec![(1, None, true), (2, None, true), (3, None, true)],
        );
        assert_eq!(ok, vec![true, true, true]);
        assert_eq!(rows(&store), vec![1, 2, 3]);
        assert_eq!(store.group_commits(), (1, 3), "one COMMIT for three parts");
        // Alone, a part is a transaction of its own, as without the group.
        store
            .with_conn(|c| {
                let tx = c.write_tx_of(Owner::Turn(TurnId(4)))?;
                tx.execute("INSERT INTO t (x) VALUES (4)", [])?;
                tx.commit()
            })
            .unwrap();
        assert_eq!(store.group_commits(), (2, 4));
    }

    #[test]
    fn a_failing_part_is_rolled_back_alone_and_its_batch_mates_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let ok = batch_of(
            &store,
            vec![
                (1, None, true),
                (2, None, false),
                (3, Some("INSERT INTO nowhere VALUES (1)"), true),
                (4, None, true),
            ],
        );
        // The second rolled back, the third failed on its own statement.
        assert_eq!(ok, vec![true, true, false, true]);
        assert_eq!(rows(&store), vec![1, 4]);
        assert_eq!(store.group_commits(), (1, 2));
        assert_eq!(store.group_commits_undone_beside_kept(), 2);
    }

    #[test]
    fn a_batch_whose_commit_fails_fails_every_part_in_it_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let ok = batch_of(
            &store,
            vec![
                (1, None, true),
                (2, Some("UPDATE t SET parent = 99 WHERE x = 2"), true),
                (3, None, true),
            ],
        );
        assert_eq!(
            ok,
            vec![false, false, false],
            "no part was told it was durable"
        );
        assert!(rows(&store).is_empty(), "{:?}", rows(&store));
        assert_eq!(store.group_commits(), (0, 0));
        // The writer is out of the failed transaction: the next part commits.
        let ok = batch_of(&store, vec![(5, None, true), (6, None, true)]);
        assert_eq!(ok, vec![true, true]);
        assert_eq!(rows(&store), vec![5, 6]);
    }

    /// A part whose statement ends the whole transaction (a host's
    /// `ROLLBACK`): the part kept before it is not told it is durable.
    #[test]
    fn a_transaction_ended_inside_a_part_fails_every_part_kept_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let ok = batch_of(&store, vec![(1, None, true), (2, Some("ROLLBACK"), true)]);
        assert_eq!(ok, vec![false, false]);
        assert!(rows(&store).is_empty(), "{:?}", rows(&store));
        assert_eq!(store.group_commits(), (0, 0));
        let ok = batch_of(&store, vec![(3, None, true)]);
        assert_eq!(ok, vec![true]);
        assert_eq!(rows(&store), vec![3]);
    }

    #[test]
    fn a_part_that_panics_is_rolled_back_and_frees_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let s = store.clone();
        let panicked = std::thread::spawn(move || {
            s.with_conn(|c| {
                let tx = c.write_tx_of(Owner::Turn(TurnId(1)))?;
                tx.execute("INSERT INTO t (x) VALUES (1)", [])?;
                panic!("a tool's bug");
                #[allow(unreachable_code)]
                tx.commit()
            })
        })
        .join();
        assert!(panicked.is_err());
        let ok = batch_of(&store, vec![(2, None, true)]);
        assert_eq!(ok, vec![true]);
        assert_eq!(rows(&store), vec![2]);
    }

    fn write(store: &Store, x: i64) {
        store
            .with_conn(|c| {
                let tx = c.write_tx_of(Owner::Turn(TurnId(x)))?;
                tx.execute("INSERT INTO t (x) VALUES (?1)", [x])?;
                tx.commit()
            })
            .unwrap();
    }

    /// Turn writes that never meet (one session at a time) run on the
    /// caller's connection once the last `RECENT` met none; the first that
    /// meets another sends the next ones back to the batch.
    #[test]
    fn writes_that_never_meet_run_alone_until_two_meet_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let recent = i64::from(super::RECENT);
        for x in 1..=recent {
            write(&store, x);
        }
        // Until the store has seen `RECENT` writes, they go to the batch.
        assert_eq!(
            store.group_commits(),
            (recent as u64 - 1, recent as u64 - 1)
        );
        assert_eq!(store.group_commits_alone(), 1);
        for x in recent + 1..recent + 11 {
            write(&store, x);
        }
        assert_eq!(store.group_commits_alone(), 11, "alone, one after another");
        assert_eq!(store.group_commits().0, recent as u64 - 1);
        // Two that meet: the one that arrives second joins the batch, and
        // so do the writes after it, alone as they are.
        let (held, hold) = mpsc::channel::<()>();
        let (begun, began) = mpsc::channel();
        let s = store.clone();
        let first = std::thread::spawn(move || {
            s.with_conn(|c| {
                let tx = c.write_tx_of(Owner::Turn(TurnId(1_000)))?;
                tx.execute("INSERT INTO t (x) VALUES (1000)", [])?;
                begun.send(()).unwrap();
                hold.recv().unwrap();
                tx.commit()
            })
            .unwrap()
        });
        began.recv().unwrap();
        assert_eq!(store.group_commits_alone(), 12, "the first met none");
        let s = store.clone();
        let second = std::thread::spawn(move || write(&s, 1_001));
        wait_for(|| {
            store
                .pool
                .group()
                .unwrap()
                .writing
                .load(super::Ordering::Relaxed)
                == 2
        });
        held.send(()).unwrap();
        first.join().unwrap();
        second.join().unwrap();
        write(&store, 1_002);
        assert_eq!(store.group_commits_alone(), 12);
        assert_eq!(store.group_commits().0, recent as u64 + 1);
        let mut want: Vec<i64> = (1..recent + 11).collect();
        want.extend([1_000, 1_001, 1_002]);
        assert_eq!(rows(&store), want);
    }

    #[test]
    fn without_the_group_a_turns_transaction_runs_on_its_own_connection() {
        let dir = tempfile::tempdir().unwrap();
        let one = Store::open_with(
            dir.path().join("one.db"),
            StoreOptions::default().with_max_connections(1),
        )
        .unwrap();
        let off = Store::open_with(
            dir.path().join("off.db"),
            StoreOptions::default().with_group_commit(false),
        )
        .unwrap();
        for s in [&one, &off] {
            assert!(s.pool.group().is_none());
            s.with_conn(|c| {
                let tx = c.write_tx_of(Owner::Turn(TurnId(1)))?;
                tx.execute_batch("CREATE TABLE t (x)")?;
                tx.commit()
            })
            .unwrap();
            assert_eq!(s.group_commits(), (0, 0));
        }
    }

    /// A step's read transaction (`in_step_read_tx`) while the turns' writes
    /// run in the batch: on the idle writer, which it hands back; the rows
    /// it reads are the committed ones.
    #[test]
    fn a_steps_read_runs_on_the_idle_writer_and_hands_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let group = store.pool.group().unwrap().clone();
        group.set_every_write(true);
        write(&store, 1);
        let writer_handle = |c: &crate::store::Connection| {
            // SAFETY: the handle is only compared, never used.
            unsafe { c.as_sqlite().unwrap().handle() as usize }
        };
        let on_writer = group.state().writer.as_ref().map(writer_handle).unwrap();
        let before = group.lent();
        let (read, own) = store
            .with_conn(|c| {
                let own = writer_handle(c);
                c.in_step_read_tx(|r| {
                    assert!(group.state().writer.is_none(), "the writer is lent");
                    assert!(!r.is_autocommit(), "in a read transaction");
                    let xs: i64 = r.query_row("SELECT sum(x) FROM t", [], |r| r.get(0))?;
                    Ok(((xs, writer_handle(r)), own))
                })
            })
            .unwrap();
        assert_eq!(read.0, 1);
        assert_eq!(read.1, on_writer, "read on the writer");
        assert_ne!(own, on_writer);
        assert_eq!(group.lent(), before + 1);
        let st = group.state();
        assert!(st.writer.as_ref().unwrap().is_autocommit());
        drop(st);
        // The writer goes on taking parts.
        write(&store, 2);
        assert_eq!(rows(&store), vec![1, 2]);
    }

    /// While a member holds the writer (an open batch), a step's read runs
    /// on its own connection at once, and does not see the batch's rows.
    #[test]
    fn a_steps_read_does_not_wait_for_the_writer_nor_read_an_open_batch() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let group = store.pool.group().unwrap().clone();
        group.set_every_write(true);
        write(&store, 1);
        let (held, hold) = mpsc::channel::<()>();
        let (begun, began) = mpsc::channel();
        let s = store.clone();
        let member = std::thread::spawn(move || {
            s.with_conn(|c| {
                let tx = c.write_tx_of(Owner::Turn(TurnId(2)))?;
                tx.execute("INSERT INTO t (x) VALUES (2)", [])?;
                begun.send(()).unwrap();
                hold.recv().unwrap();
                tx.commit()
            })
            .unwrap()
        });
        began.recv().unwrap();
        let before = group.lent();
        let xs: i64 = store
            .with_conn(|c| {
                c.in_step_read_tx(|r| r.query_row("SELECT sum(x) FROM t", [], |r| r.get(0)))
            })
            .unwrap();
        assert_eq!(xs, 1, "the open batch's row is not read");
        assert_eq!(group.lent(), before, "read on its own connection");
        held.send(()).unwrap();
        member.join().unwrap();
        assert_eq!(rows(&store), vec![1, 2]);
    }

    /// A read on the lent writer that panics hands it back with no
    /// transaction open.
    #[test]
    fn a_steps_read_that_panics_hands_the_writer_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let group = store.pool.group().unwrap().clone();
        group.set_every_write(true);
        let s = store.clone();
        let g = group.clone();
        let panicked = std::thread::spawn(move || {
            s.with_conn(|c| {
                c.in_step_read_tx(|r| {
                    assert!(g.state().writer.is_none());
                    let _: i64 = r.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
                    panic!("a bug in a step's read");
                    #[allow(unreachable_code)]
                    Ok(())
                })
            })
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(group.lent(), 1);
        assert!(group.state().writer.as_ref().unwrap().is_autocommit());
        let ok = batch_of(&store, vec![(3, None, true), (4, None, true)]);
        assert_eq!(ok, vec![true, true]);
        assert_eq!(rows(&store), vec![3, 4]);
    }

    /// Writes that run alone (one session at a time) keep their own
    /// connection's cache warm: a step's read stays on it.
    #[test]
    fn a_steps_read_stays_on_its_connection_while_writes_run_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let group = store.pool.group().unwrap().clone();
        for x in 1..=i64::from(super::RECENT) + 1 {
            write(&store, x);
        }
        assert!(store.group_commits_alone() > 0);
        store
            .with_conn(|c| {
                c.in_step_read_tx(|r| r.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)))
            })
            .unwrap();
        assert_eq!(group.lent(), 0);
    }
}
