//! Shared helpers for the integration tests.
#![allow(dead_code)]

use abridge::demo::{demo_tools, ScriptedModel, SlowSummariser, DEMO_MODEL, SYSTEM_PROMPT};
use abridge::{CompactionConfig, FaultHook, Runner, RunnerConfig, Store, Threshold};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test.db");
    (dir, path)
}

pub fn open(path: &Path) -> Store {
    let store = Store::open(path).unwrap();
    store
        .with_conn(|c| abridge::store::demo::create_demo_tables(c))
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
    let db = store.path().to_path_buf();
    let mut cfg = RunnerConfig {
        owner: "test-runner".into(),
        lease_ttl: Duration::from_secs(5),
        model_backoff: Duration::from_millis(1),
        ..RunnerConfig::default()
    };
    cfg.compaction = CompactionConfig::default()
        .with_compact_at(compact_at)
        .with_context_window(DEMO_MODEL, 2_000);
    cfg.compaction.retry_backoff = Duration::from_millis(1);
    cfg.fault_hook = hook;
    let mut model = ScriptedModel::new(seed);
    model.extra_tools = vec!["notify_customer".into(), "charge_card".into()];
    Runner::builder(store.clone(), Arc::new(model))
        .tools(demo_tools(Some(db), Duration::ZERO))
        .summariser(SlowSummariser::default())
        .config(cfg)
        .build()
        .unwrap()
}

pub async fn demo_session(runner: &Runner, seed: u64, i: u64) -> i64 {
    runner
        .create_session(
            &abridge::demo::session_external_id(seed, i),
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
