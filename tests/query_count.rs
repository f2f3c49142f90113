//! One step issues a fixed, small number of SQL statements, independent of the
//! history's length H (a count, not a time: stable on any machine); ensure()
//! below the threshold only reads, in at most three statements.
//!
//! This file holds a single test so the process-wide statement counter (fed by
//! SQLite's trace hook) sees only its statements.

use abridge::demo::DemoTxTool;
use abridge::{
    ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner, RunnerConfig,
    Store, StoreOptions, Threshold, ToolSpec, Tools, Usage,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static STATEMENTS: AtomicU64 = AtomicU64::new(0);
static WRITE_TXS: AtomicU64 = AtomicU64::new(0);

fn count(sql: &str) {
    // The schema's append-only triggers report as "-- TRIGGER name": checks
    // SQLite runs inside the statement, not statements abridge issues.
    if sql.trim_start().starts_with("--") {
        return;
    }
    STATEMENTS.fetch_add(1, Ordering::SeqCst);
    if sql.trim_start().starts_with("BEGIN IMMEDIATE") {
        WRITE_TXS.fetch_add(1, Ordering::SeqCst);
    }
}

/// Step 0 calls one tool; step 1 answers.
struct TwoSteps;

#[async_trait::async_trait]
impl ModelClient for TwoSteps {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = req.messages.last().unwrap();
        let blocks = if matches!(last.content[0], abridge::ContentBlock::Text { .. }) {
            vec![ResponseBlock::ToolUse {
                id: "c1".into(),
                name: "lookup_order".into(),
                input: serde_json::json!({"order_id": "ORD-1"}),
            }]
        } else {
            vec![ResponseBlock::Text {
                text: "done".into(),
            }]
        };
        Ok(ModelResponse {
            blocks,
            usage: Usage {
                input_tokens: Some(100),
                output_tokens: Some(5),
            },
        })
    }
}

/// (statements, write transactions) of one two-step turn after `h` turns.
async fn statements_for_turn_at(h: i64, compact_at: Threshold) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(
        dir.path().join("q.db"),
        StoreOptions {
            on_statement: Some(count),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    store
        .with_conn(abridge::store::demo::create_demo_tables)
        .unwrap();
    let mut cfg = RunnerConfig {
        owner: "q".into(),
        heartbeat: false,
        ..RunnerConfig::default()
    };
    cfg.compaction.compact_at = compact_at;
    let spec = ToolSpec {
        name: "lookup_order".into(),
        description: "d".into(),
        input_schema: serde_json::json!({"type": "object"}),
    };
    let runner = Runner::builder(store, Arc::new(TwoSteps))
        .tools(Tools::new().transactional(spec, DemoTxTool("lookup_order")))
        .config(cfg)
        .build()
        .unwrap();
    let s = runner.create_session("s", "gpt-4o", "sys").await.unwrap();
    for t in 0..h {
        runner.run_turn(s.id, &format!("turn {t}")).await.unwrap();
    }
    let (before, before_tx) = (
        STATEMENTS.load(Ordering::SeqCst),
        WRITE_TXS.load(Ordering::SeqCst),
    );
    let out = runner.run_turn(s.id, "the measured turn").await.unwrap();
    assert_eq!(out.steps, 2);
    let counts = (
        STATEMENTS.load(Ordering::SeqCst) - before,
        WRITE_TXS.load(Ordering::SeqCst) - before_tx,
    );

    // ensure() below the threshold (or with compaction off): reads only.
    let (before, before_tx) = (
        STATEMENTS.load(Ordering::SeqCst),
        WRITE_TXS.load(Ordering::SeqCst),
    );
    let read = runner.compactor().ensure(&s, h + 1, 0).await.unwrap();
    assert!(read.is_none());
    let ensure_statements = STATEMENTS.load(Ordering::SeqCst) - before;
    assert_eq!(WRITE_TXS.load(Ordering::SeqCst) - before_tx, 0);
    assert!(
        (1..=3).contains(&ensure_statements),
        "{compact_at:?}: ensure() took {ensure_statements} statements"
    );
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_per_step_are_fixed_and_independent_of_history() {
    for compact_at in [Threshold::Off, Threshold::Tokens(1_000_000)] {
        let small = statements_for_turn_at(10, compact_at).await;
        let large = statements_for_turn_at(120, compact_at).await;
        assert_eq!(small, large, "{compact_at:?}: statements grew with H");
        // Two steps: begin the turn (claims step 0); ensure, build, then the
        // response, the tool, step 0's completion and step 1's claim; ensure,
        // build, then the final answer and the turn's completion.
        let (statements, write_txs) = small;
        let per_step = statements / 2;
        assert!(
            per_step <= 25,
            "{compact_at:?}: {per_step} statements per step"
        );
        // One to begin the turn (claiming step 0), one per step: the tool step's
        // response, tool, completion and step 1's claim; the final answer with
        // the turn's completion.
        assert_eq!(write_txs, 3, "{compact_at:?}: write transactions per turn");
        println!(
            "{compact_at:?}: {statements} statements, {write_txs} write transactions \
             per two-step turn"
        );
    }
}
