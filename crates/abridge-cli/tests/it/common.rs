//! Shared helpers for the integration tests.
#![allow(dead_code)]

use abridge::{CompactionConfig, FaultHook, Runner, RunnerConfig, Store, Threshold};
use abridge_testkit::demo::{
    demo_tools, OutsideService, ScriptedModel, SlowSummariser, DEMO_MODEL, SYSTEM_PROMPT,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `verify`, with the demo's effects checked in G5.
pub fn verify_demo(c: &abridge::store::Connection) -> abridge::Result<abridge::verify::Report> {
    abridge::verify::verify_with(c, &[&abridge_testkit::demo_tables::DemoEffects])
}

/// The repository's root (the workspace: docs/, README.md, crates/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The key of the test stores: [`test_key`] in a build with the
/// `encryption` feature, none otherwise.
pub fn key_option() -> Option<abridge::store::Key> {
    #[cfg(feature = "encryption")]
    return Some(test_key());
    #[cfg(not(feature = "encryption"))]
    None
}

pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test.db");
    (dir, path)
}

/// The key the core tests' stores are encrypted with in a build with the
/// `encryption` feature (CI runs the core tests once so): a raw key, so every
/// page is encrypted as with any key but no open derives one. A passphrase's
/// derivation (PBKDF2-HMAC-SHA512, 256,000 rounds at every connection's open)
/// was 97% of these suites' CPU; `encryption::` opens, reopens, rekeys and
/// refuses stores keyed by passphrases.
#[cfg(feature = "encryption")]
pub fn test_key() -> abridge::store::Key {
    abridge::store::Key::passphrase(TEST_KEY).unwrap()
}

/// [`test_key`] as `ABRIDGE_KEY` holds it: SQLCipher's raw-key form, 32 bytes
/// in hex.
#[cfg(feature = "encryption")]
pub const TEST_KEY: &str = "x'c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00'";

/// Store options: with [`test_key`] in a build with the `encryption` feature.
pub fn store_options() -> abridge::store::StoreOptions {
    #[cfg(feature = "encryption")]
    return abridge::store::StoreOptions::default().with_key(test_key());
    #[cfg(not(feature = "encryption"))]
    abridge::store::StoreOptions::default()
}

/// Where the store of `path` lives: the SQLite file itself or, when
/// `ABRIDGE_TEST_POSTGRES` holds a server URL (`postgres://postgres@127.0.0.1/test`,
/// in a build with the `postgres` feature), a schema of that database named
/// after the path, so every test has a store of its own there too and
/// reopening the same path reopens the same store.
pub fn db_for(path: &Path) -> PathBuf {
    if path.to_str().is_some_and(abridge::store::is_url) {
        return path.to_path_buf(); // already a server's store
    }
    match std::env::var("ABRIDGE_TEST_POSTGRES") {
        Ok(base) if !base.is_empty() && cfg!(feature = "postgres") => {
            let h = abridge::message::sha256_hex(path.to_string_lossy().as_bytes());
            let sep = if base.contains('?') { '&' } else { '?' };
            PathBuf::from(format!("{base}{sep}schema=t_{}", &h[..20]))
        }
        _ => path.to_path_buf(),
    }
}

/// What a store holds, as bytes to search: an SQLite file with its WAL, or
/// every text of every row of a PostgreSQL store.
pub fn stored_bytes(db: &Path) -> Vec<u8> {
    if on_postgres() {
        let c = read_only_conn(db);
        let columns: Vec<(String, String)> = {
            let mut st = c
                .prepare(
                    "SELECT table_name::text, column_name::text FROM information_schema.columns \
                     WHERE table_schema = current_schema() AND data_type = 'text'",
                )
                .unwrap();
            let v = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
            v.collect::<Result<_, _>>().unwrap()
        };
        let mut out = Vec::new();
        for (t, col) in columns {
            let s: Option<String> = c
                .query_row(
                    &format!("SELECT string_agg({col}, '|') FROM {t}"),
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            out.extend(s.unwrap_or_default().into_bytes());
        }
        return out;
    }
    let mut bytes = std::fs::read(db).unwrap();
    if let Ok(w) = std::fs::read(format!("{}-wal", db.display())) {
        bytes.extend(w);
    }
    bytes
}

/// True when the tests run against PostgreSQL (see [`db_for`]).
pub fn on_postgres() -> bool {
    db_for(Path::new("x")).to_str() != Some("x")
}

/// Opens the store at `path` (see [`db_for`]): encrypted with [`test_key`]
/// in a build with the `encryption` feature.
pub fn store_at(path: &Path) -> Store {
    Store::open_with(db_for(path), store_options()).unwrap()
}

/// A read-only connection to the store at `path` (with [`test_key`] in a
/// build with the `encryption` feature).
pub fn read_only_conn(path: &Path) -> abridge::store::Connection {
    #[cfg(feature = "encryption")]
    let key = Some(test_key());
    #[cfg(not(feature = "encryption"))]
    let key = None;
    abridge::store::open_read_only_keyed(db_for(path), key.as_ref()).unwrap()
}

/// The `abridge` command, with the key of the test stores in `ABRIDGE_KEY`
/// in a build with the `encryption` feature.
pub fn abridge_cmd() -> std::process::Command {
    #[allow(unused_mut)]
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_abridge"));
    #[cfg(feature = "encryption")]
    c.env("ABRIDGE_KEY", TEST_KEY);
    c
}

/// As [`open`], with the store reading `clock` (a test of leases or expiry
/// moves it instead of sleeping).
pub fn open_with_clock(path: &Path, clock: &abridge::ManualClock) -> Store {
    let opts = store_options().with_clock(Arc::new(clock.clone()));
    let store = Store::open_with(db_for(path), opts).unwrap();
    store
        .with_conn(abridge_testkit::demo_tables::create_demo_tables)
        .unwrap();
    store
}

/// Moves `clock` by `step`, `n` times; after each move waits (for a
/// condition, in real time) until a task woken by it has gone back to sleep
/// on the clock: the store's renewal task, whose sleeps are `step` long.
pub async fn advance_clock(clock: &abridge::ManualClock, step: Duration, n: usize) {
    for _ in 0..n {
        let before = clock.sleeps_begun();
        clock.advance(step);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while clock.sleeps_begun() <= before {
            assert!(
                std::time::Instant::now() < deadline,
                "nothing slept on the clock again"
            );
            tokio::task::yield_now().await;
        }
    }
}

pub fn open(path: &Path) -> Store {
    let store = store_at(path);
    store
        .with_conn(abridge_testkit::demo_tables::create_demo_tables)
        .unwrap();
    store
}

/// A runner on the demo workload with fast retries and short leases.
pub fn demo_runner(
    store: &Store,
    seed: u64,
    compact_at: Threshold,
    hook: Option<FaultHook>,
) -> Runner {
    demo_runner_with(
        store,
        seed,
        compact_at,
        hook,
        &["notify_customer", "charge_card"],
        "test-runner",
    )
}

/// As [`demo_runner`], with the extra (non-transactional) tools the model calls
/// and the lease owner named.
pub fn demo_runner_with(
    store: &Store,
    seed: u64,
    compact_at: Threshold,
    hook: Option<FaultHook>,
    extras: &[&str],
    owner: &str,
) -> Runner {
    demo_runner_of(store, seed, extras, test_config(compact_at, hook, owner))
}

/// As [`demo_runner_with`], with the runner's configuration given whole.
pub fn demo_runner_of(store: &Store, seed: u64, extras: &[&str], cfg: RunnerConfig) -> Runner {
    Runner::builder(store.clone(), Arc::new(demo_model(seed, extras)))
        .tools(demo_tools(
            Some(OutsideService {
                db: store.path().to_path_buf(),
                key: key_option(),
            }),
            Duration::ZERO,
        ))
        .summariser(SlowSummariser::default())
        .config(cfg)
        .build()
        .unwrap()
}

pub fn demo_model(seed: u64, extras: &[&str]) -> ScriptedModel {
    let mut model = ScriptedModel::new(seed);
    model.extra_tools = extras.iter().map(|s| s.to_string()).collect();
    model
}

pub fn test_config(compact_at: Threshold, hook: Option<FaultHook>, owner: &str) -> RunnerConfig {
    let mut cfg = RunnerConfig::default().with_owner(owner);
    cfg.lease_ttl = Duration::from_secs(5);
    cfg.model_retry = abridge::RetryPolicy::default()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(8));
    // Inline compaction: a step at the threshold compacts before it reads,
    // so a run's transcript is the same whatever the timing (the background
    // mode's tests set it themselves, in crates/abridge-cli/tests/it/background.rs).
    cfg.compaction = CompactionConfig::default()
        .with_compact_at(compact_at)
        .with_context_window(DEMO_MODEL, 2_000)
        .with_background(None);
    cfg.compaction.retry = abridge::RetryPolicy::default()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(8));
    cfg.testing.fault_hook = hook;
    // A deliberately broken build (`--features broken-…`) breaks the tests'
    // runners too: the tests that check the guarantee it breaks fail.
    cfg.testing = abridge_testkit::sabotage::apply(cfg.testing);
    cfg
}

/// A session of the demo workload (seed `seed`) with `turns` completed turns
/// and no compaction, run by a setup runner (demo model and tools, offline
/// summariser).
pub async fn uncompacted_history(
    store: &Store,
    seed: u64,
    turns: u64,
) -> abridge::store::SessionRow {
    let r = Runner::builder(store.clone(), Arc::new(demo_model(seed, &[])))
        .tools(demo_tools(None, Duration::ZERO))
        .config(test_config(Threshold::Off, None, "setup"))
        .build()
        .unwrap();
    let sid = demo_session(&r, seed, 0).await;
    for t in 0..turns {
        r.run_turn_at(sid, t as i64, &abridge_testkit::demo::user_turn(seed, 0, t))
            .await
            .unwrap();
    }
    store
        .with_conn(move |c| Ok(abridge::inspect::sessions(c)?.remove(0).session))
        .unwrap()
}

pub async fn demo_session(runner: &Runner, seed: u64, i: u64) -> abridge::SessionId {
    runner
        .create_session(
            &abridge_testkit::demo::session_external_id(seed, i),
            DEMO_MODEL,
            SYSTEM_PROMPT,
        )
        .await
        .unwrap()
        .id
}

/// Every executed step's rebuilt hash equals its recorded one.
pub fn assert_all_steps_rebuild(store: &Store) -> usize {
    store
        .with_conn(|c| {
            let ids = abridge::inspect::executed_step_ids(c)?;
            for id in &ids {
                let r = abridge::replay::rebuild_step(c, *id)?;
                assert!(
                    r.matches(),
                    "step {id} rebuilt {} but recorded {}",
                    r.sha256,
                    r.recorded
                );
            }
            Ok(ids.len())
        })
        .unwrap()
}

/// A hook that fails at the `nth` (1-based) time `point` is reached, once.
pub fn fail_at(point: abridge::FaultPoint, nth: usize) -> FaultHook {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = Arc::new(AtomicUsize::new(0));
    Arc::new(move |p| {
        if p == point && hits.fetch_add(1, Ordering::SeqCst) + 1 == nth {
            Err(p)
        } else {
            Ok(())
        }
    })
}

/// Runs turns `0..turns` of demo session `i`; returns how many injected faults
/// stopped it. After a fault the turn is resumed by `fresh()` (a new runner, as
/// a restarted process would build).
pub async fn run_script(
    first: &Runner,
    fresh: impl Fn() -> Runner,
    seed: u64,
    i: u64,
    turns: u64,
) -> usize {
    let sid = demo_session(first, seed, i).await;
    let mut runner = first.clone();
    let mut faults = 0;
    for t in 0..turns {
        let input = abridge_testkit::demo::user_turn(seed, i, t);
        loop {
            match runner.run_turn_at(sid, t as i64, &input).await {
                Ok(_) => break,
                Err(abridge::Error::Injected(_)) => {
                    faults += 1;
                    runner = fresh();
                }
                Err(e) => panic!("turn {t}: {e}"),
            }
        }
    }
    faults
}

/// The session's full transcript (JSONL export).
pub fn transcript(store: &Store, seed: u64, i: u64) -> String {
    let ext = abridge_testkit::demo::session_external_id(seed, i);
    store
        .with_conn(|c| abridge::inspect::export(c, &ext, abridge::inspect::ExportFormat::Jsonl))
        .unwrap()
}

/// Every effect applied, for comparing runs.
pub fn effects(store: &Store) -> Vec<(String, String, String)> {
    use abridge_testkit::demo_tables::{all_effects, DemoTable};
    store
        .with_conn(|c| {
            let mut v = all_effects(c, DemoTable::Effects)?;
            v.extend(all_effects(c, DemoTable::External)?);
            Ok(v)
        })
        .unwrap()
}

pub fn assert_verified(store: &Store) {
    let report = store.with_conn(|c| verify_demo(c)).unwrap();
    assert!(report.ok, "{report:#?}");
}

/// Wraps a model and counts its calls.
pub struct Counting<M> {
    pub inner: M,
    pub calls: std::sync::atomic::AtomicUsize,
}

impl<M> Counting<M> {
    pub fn new(inner: M) -> Arc<Counting<M>> {
        Arc::new(Counting {
            inner,
            calls: Default::default(),
        })
    }
    pub fn count(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[abridge::async_trait]
impl<M: abridge::ModelClient> abridge::ModelClient for Counting<M> {
    async fn complete(
        &self,
        request: &abridge::ModelRequest,
    ) -> Result<abridge::ModelResponse, abridge::ModelError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.complete(request).await
    }
}

#[abridge::async_trait]
impl<M: abridge::Summariser> abridge::Summariser for Counting<M> {
    async fn summarise(
        &self,
        request: &abridge::SummaryRequest,
    ) -> Result<abridge::SummaryResponse, abridge::ModelError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.summarise(request).await
    }
    fn model(&self) -> Option<String> {
        self.inner.model()
    }
}

/// Every event `rx` holds now, in order. A receiver that fell behind has
/// lost the oldest, and a test that counts or looks for one could then pass
/// on a part of the stream: it fails instead.
pub fn drained(rx: &mut tokio::sync::broadcast::Receiver<abridge::Event>) -> Vec<abridge::Event> {
    use tokio::sync::broadcast::error::TryRecvError;
    let mut out = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(e) => out.push(e),
            Err(TryRecvError::Empty | TryRecvError::Closed) => return out,
            Err(TryRecvError::Lagged(n)) => {
                panic!("the test's subscriber lost {n} events: it saw only part of the stream")
            }
        }
    }
}
