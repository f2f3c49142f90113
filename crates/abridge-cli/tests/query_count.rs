//! One step issues a fixed, small number of SQL statements and reads a fixed
//! number of rows, independent of the history's length H (counts, not times:
//! stable on any machine), and no statement of a step scans a history table
//! or builds a temporary b-tree (a list's check, a sort for a `LIMIT`);
//! ensure() below the threshold only reads, in at most three statements.
//!
//! Every statement of a step (and of the background compactions it claims)
//! visits a fixed number of rows (SQLite's virtual-machine steps a run),
//! however many turns and compactions the session has had.
//!
//! This file holds a single test so the process-wide counters (fed by SQLite's
//! trace hook on the store's one connection) see only its statements.

use abridge::{
    ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner, RunnerConfig,
    Store, StoreOptions, Threshold, ToolSpec, Tools, Usage,
};
use abridge_testkit::demo::DemoTxTool;
use rusqlite::trace::{TraceEvent, TraceEventCodes};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static STATEMENTS: AtomicU64 = AtomicU64::new(0);
static WRITE_TXS: AtomicU64 = AtomicU64::new(0);
static ROWS: AtomicU64 = AtomicU64::new(0);
/// The text of every statement run while `RECORD` is set.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
static RECORD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn count(event: TraceEvent<'_>) {
    match event {
        TraceEvent::Stmt(_, sql) => {
            // The schema's append-only triggers report as "-- TRIGGER name":
            // checks SQLite runs inside the statement, not statements abridge
            // issues.
            if sql.trim_start().starts_with("--") {
                return;
            }
            STATEMENTS.fetch_add(1, Ordering::SeqCst);
            if sql.trim_start().starts_with("BEGIN IMMEDIATE") {
                WRITE_TXS.fetch_add(1, Ordering::SeqCst);
            }
            if RECORD.load(Ordering::SeqCst) {
                SEEN.lock().unwrap().push(sql.to_string());
            }
        }
        // A row a statement handed back to abridge.
        TraceEvent::Row(_) => {
            ROWS.fetch_add(1, Ordering::SeqCst);
        }
        _ => {}
    }
}

/// What one measured turn cost.
#[derive(Debug, PartialEq, Eq)]
struct Cost {
    statements: u64,
    write_txs: u64,
    rows: u64,
    /// Rows inserted, updated or deleted (SQLite's change count).
    rows_written: u64,
    /// Pages appended to the WAL (its checkpoints off for the measure).
    pages_written: u64,
}

/// Per statement text, while `VM_ON` is set: its runs and SQLite's
/// virtual-machine steps over them (each run's share of the cached
/// statement's cumulative counter, whose last value `VM_LAST` keeps).
/// (runs, VM steps over them, the most of one run)
static VM: Mutex<BTreeMap<String, (u64, u64, u64)>> = Mutex::new(BTreeMap::new());
static VM_LAST: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
static VM_ON: AtomicBool = AtomicBool::new(false);
/// The adaptive soft threshold's reads of a session's pace: its newest
/// background summary's time (`store::background_summary_ms`), and its
/// turns' measures and times (`store::turn_paces`, the turns finished since
/// its last read).
const PACE_SQL: &str = "SELECT done - claimed FROM";
const PACE_TURNS_SQL: &str = "SELECT t.idx, (SELECT max(s.context_tokens)";
/// The sizes of the verbatim tail's turns (`store::recent_window_boundary`).
const RECENT_WINDOW_SQL: &str = "SELECT t.idx, length(t.input)";
/// The pins a summary carries (`store::live_pins`).
const LIVE_PINS_SQL: &str = "SELECT p.id, p.turn_index, p.kind, p.slot, p.value, p.sentence";
/// A compaction's whole row, the summary's text with it.
const COMPACTION_ROW_SQL: &str =
    "SELECT id, session_id, up_to_turn_index, up_to_turn_id, previous_id, status, summary,";
/// The newest completed compaction's id (`store::latest_completed_id`).
const LATEST_ID_SQL: &str = "SELECT CASE WHEN ids.b IS NULL THEN ids.o";

fn vm_hook(event: TraceEvent<'_>) {
    if let TraceEvent::Profile(stmt, _) = event {
        let sql = stmt.sql().to_string();
        // Cumulative over the cached statement's runs; a statement prepared
        // afresh starts again from zero.
        let now = stmt.get_status(rusqlite::StatementStatus::VmStep) as u64;
        let last = VM_LAST
            .lock()
            .unwrap()
            .insert(sql.clone(), now)
            .unwrap_or(0);
        let run = if now >= last { now - last } else { now };
        if VM_ON.load(Ordering::SeqCst) {
            let mut m = VM.lock().unwrap();
            let e = m.entry(sql).or_default();
            e.0 += 1;
            e.1 += run;
            e.2 = e.2.max(run);
        }
    }
}

fn counters() -> [u64; 3] {
    [&STATEMENTS, &WRITE_TXS, &ROWS].map(|c| c.load(Ordering::SeqCst))
}

/// Step 0 calls one tool; step 1 answers.
struct TwoSteps;

#[abridge::async_trait]
impl ModelClient for TwoSteps {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = req.messages.last().unwrap();
        let blocks = if matches!(last.content[0], abridge::ContentBlock::Text { .. }) {
            vec![ResponseBlock::ToolUse {
                id: "c1".into(),
                name: "lookup_order".into(),
                input: serde_json::json!({"order_id": "ORD-1"}),
                raw_input: None,
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
                ..Default::default()
            },
            ..Default::default()
        })
    }
}

/// A store of one connection, so that the trace `hook` set on it sees every
/// statement.
fn traced_store(path: &std::path::Path, mask: TraceEventCodes, hook: fn(TraceEvent<'_>)) -> Store {
    let store = Store::open_with(path, StoreOptions::default().with_max_connections(1)).unwrap();
    store
        .with_conn(|c| {
            c.as_sqlite().unwrap().trace_v2(mask, Some(hook));
            Ok(())
        })
        .unwrap();
    store
}

/// The cost of one two-step turn after `h` turns.
async fn cost_of_turn_at(h: i64, compact_at: Threshold) -> Cost {
    let dir = tempfile::tempdir().unwrap();
    let store = traced_store(
        &dir.path().join("q.db"),
        TraceEventCodes::SQLITE_TRACE_STMT | TraceEventCodes::SQLITE_TRACE_ROW,
        count,
    );
    store
        .with_conn(abridge_testkit::demo_tables::create_demo_tables)
        .unwrap();
    let mut cfg = RunnerConfig::default().with_owner("q");
    cfg.testing.heartbeat = false;
    cfg.compaction.compact_at = compact_at;
    // The verbatim tail (0.15 of the threshold by default) reads the sizes
    // of the turns in it: rows that grow with the tail until it is full,
    // then no more. A tail of 400 tokens (a few of these turns) is full at
    // both lengths measured, so the cost it adds shows and stays the same.
    cfg.compaction.keep_recent_share = None;
    cfg.compaction.keep_recent_tokens = 400;
    let spec = ToolSpec {
        name: "lookup_order".into(),
        description: "d".into(),
        input_schema: serde_json::json!({"type": "object"}),
    };
    let runner_as = |owner: &str| {
        Runner::builder(store.clone(), Arc::new(TwoSteps))
            .tools(Tools::new().transactional(spec.clone(), DemoTxTool("lookup_order")))
            .config(cfg.clone().with_owner(owner))
            .build()
            .unwrap()
    };
    let runner = runner_as("q");
    let s = runner.create_session("s", "gpt-4o", "sys").await.unwrap();
    for t in 0..h {
        runner.run_turn(s.id, &format!("turn {t}")).await.unwrap();
    }
    let wal = dir.path().join("q.db-wal");
    let (changes_before, page_size) = store
        .with_conn(|c| {
            // No checkpoint restarts the WAL mid-measure: every page the turn
            // writes is appended (a frame: the page and a 24-byte header).
            // Emptied first (a WAL restarted after a checkpoint is written
            // over from its start, without growing).
            c.execute_batch("PRAGMA wal_autocheckpoint = 0")?;
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            Ok((
                c.as_sqlite().unwrap().total_changes(),
                c.query_row("PRAGMA page_size", [], |r| r.get::<_, i64>(0))? as u64,
            ))
        })
        .unwrap();
    let wal_before = std::fs::metadata(&wal).map_or(0, |m| m.len());
    let before = counters();
    RECORD.store(true, Ordering::SeqCst);
    let out = runner.run_turn(s.id, "the measured turn").await.unwrap();
    RECORD.store(false, Ordering::SeqCst);
    assert_eq!(out.steps, 2);
    let after = counters();
    let changes_after = store
        .with_conn(|c| Ok(c.as_sqlite().unwrap().total_changes()))
        .unwrap();
    let wal_after = std::fs::metadata(&wal).unwrap().len();
    let cost = Cost {
        statements: after[0] - before[0],
        write_txs: after[1] - before[1],
        rows: after[2] - before[2],
        rows_written: changes_after - changes_before,
        pages_written: (wal_after - wal_before) / (page_size + 24),
    };
    // The verbatim tail's boundary is the same for every step of a turn (the
    // turns it measures are finished): it is found once a turn, at the
    // turn's first step, not at every step. And the turns' sizes it walks
    // are not read at all: the runner that finished them kept each one's,
    // counted from the strings it wrote (the turn before the measured one's
    // included), so the window's statement does not run (it ran once a turn
    // before).
    let window_reads = SEEN
        .lock()
        .unwrap()
        .iter()
        .filter(|sql| sql.trim_start().starts_with(RECENT_WINDOW_SQL))
        .count();
    assert_eq!(
        window_reads, 0,
        "{compact_at:?}: the recent window read {window_reads} times in a turn"
    );
    // The turn's first step read no history either: the runner's context
    // holds the whole turn before, its last step from the rows the runner
    // wrote, and takes this turn's input from its row.
    assert_eq!(
        assert_no_history_scan(&store),
        0,
        "{compact_at:?}: the measured turn read the history's ranges"
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
    // The newest compaction, the measure, the row at the boundary, and with
    // a verbatim tail the sizes of its turns.
    assert!(
        (1..=4).contains(&ensure_statements),
        "{compact_at:?}: ensure() took {ensure_statements} statements"
    );

    // Another host's turn in between: the runner's context holds the turn
    // before it, so its next turn's first step reads the rows since (the
    // other host's turn and its own input), through an index and without
    // the half over a fork's ancestors.
    runner_as("q-other")
        .run_turn(s.id, "another host's turn")
        .await
        .unwrap();
    SEEN.lock().unwrap().clear();
    RECORD.store(true, Ordering::SeqCst);
    runner
        .run_turn(s.id, "after another host's turn")
        .await
        .unwrap();
    RECORD.store(false, Ordering::SeqCst);
    assert!(
        assert_no_history_scan(&store) > 0,
        "{compact_at:?}: no range read ran after another host's turn"
    );
    cost
}

/// Every statement the measured turn ran finds its rows through an index: no
/// full scan of a table that grows with the history; and none builds a
/// temporary b-tree at every run. Returns how many of them read a range of
/// the history (turns, steps, results) to extend a context.
fn assert_no_history_scan(store: &Store) -> usize {
    let seen: std::collections::BTreeSet<String> = SEEN.lock().unwrap().drain(..).collect();
    assert!(seen.len() > 5, "{seen:?}");
    // The session is no fork: the turns, steps and results it reads to
    // extend its context are read without the half over a fork's ancestors
    // (a lookup that finds nothing, which a server may plan as a read of
    // every step of a new store).
    let ranges: Vec<&String> = seen
        .iter()
        .filter(|sql| {
            [
                "SELECT s.id, s.turn_id, s.idx, s.response",
                "SELECT i.step_id, i.tool_call_id",
                "SELECT t.id, t.idx, t.input",
            ]
            .iter()
            .any(|r| sql.trim_start().starts_with(r))
        })
        .collect();
    let range_reads = ranges.len();
    for sql in ranges {
        assert!(!sql.contains("session_lineage"), "{sql}");
    }
    let history = [
        "sessions",
        "turns",
        "steps",
        "tool_invocations",
        "compactions",
        "pins",
    ];
    store
        .with_conn(move |c| {
            let mut temp_btrees = Vec::new();
            for sql in &seen {
                let head = sql.trim_start().to_ascii_uppercase();
                if !["SELECT", "INSERT", "UPDATE", "DELETE", "WITH"]
                    .iter()
                    .any(|k| head.starts_with(k))
                {
                    continue; // BEGIN, COMMIT, SAVEPOINT, pragmas
                }
                let mut st = c
                    .as_sqlite()
                    .unwrap()
                    .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                // Parameters left unbound (NULL): the plan does not depend on them.
                let mut rows = st.raw_query();
                let mut plan = Vec::new();
                while let Some(r) = rows.next()? {
                    plan.push(r.get::<_, String>(3)?);
                }
                for line in &plan {
                    let scans_history = line.starts_with("SCAN")
                        && history
                            .iter()
                            .any(|t| line.split_whitespace().nth(1) == Some(t));
                    assert!(!scans_history, "{sql}\n  plan: {plan:?}");
                }
                // Its program builds no temporary b-tree: a column's CHECK
                // of a list of three or more values, a compound's ORDER BY
                // or a subquery made into a table opens one (a page cache
                // made, filled and freed) at every run.
                let mut st = c.as_sqlite().unwrap().prepare(&format!("EXPLAIN {sql}"))?;
                let mut rows = st.raw_query();
                while let Some(r) = rows.next()? {
                    if r.get::<_, String>(1)? == "OpenEphemeral" {
                        temp_btrees.push(sql.clone());
                        break;
                    }
                }
            }
            assert!(
                temp_btrees.is_empty(),
                "statements that build a temporary b-tree at every run:\n{}",
                temp_btrees.join("\n")
            );
            Ok(())
        })
        .unwrap();
    range_reads
}

/// Answers every step at once, with no usage: the context's measure is the
/// estimate of the bytes sent, so it grows turn by turn and background
/// compactions follow.
struct Growing;

#[abridge::async_trait]
impl ModelClient for Growing {
    async fn complete(&self, _req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse {
            blocks: vec![ResponseBlock::Text {
                text: "Your order ORD-1 left the warehouse on Monday and arrives on Friday.".into(),
            }],
            ..Default::default()
        })
    }
}

/// Runs `h` turns with background compaction (adaptive, the default) on a
/// small threshold, then `measured` more: per statement the measured turns
/// ran, its runs and its virtual-machine steps a run; the compactions
/// completed before them; the pins live then.
async fn vm_steps_at(h: i64, measured: i64) -> (BTreeMap<String, (u64, u64, u64)>, i64, i64) {
    let dir = tempfile::tempdir().unwrap();
    let store = traced_store(
        &dir.path().join("p.db"),
        TraceEventCodes::SQLITE_TRACE_PROFILE,
        vm_hook,
    );
    let mut cfg = RunnerConfig::default().with_owner("p");
    cfg.testing.heartbeat = false;
    cfg.compaction.compact_at = Threshold::Tokens(1_000);
    let runner = Runner::builder(store.clone(), Arc::new(Growing))
        .config(cfg)
        .build()
        .unwrap();
    let s = runner.create_session("s", "gpt-4o", "sys").await.unwrap();
    // Each turn states a new fact (its number) and restates one (the order):
    // what a read visits may grow with the facts the session holds, not with
    // its turns, compactions or restatements.
    let turn = |t: i64| format!("Turn {t}: where is my order ORD-1, and when does it arrive?");
    for t in 0..h {
        runner.run_turn(s.id, &turn(t)).await.unwrap();
        runner.finish_background().await;
    }
    let (compactions, live): (i64, i64) = store
        .with_conn(|c| {
            c.query_row(
                "SELECT (SELECT count(*) FROM compactions WHERE status = 'completed'), \
                 (SELECT count(*) FROM pins WHERE superseded_at IS NULL)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap();
    VM.lock().unwrap().clear();
    VM_ON.store(true, Ordering::SeqCst);
    for t in h..h + measured {
        runner.run_turn(s.id, &turn(t)).await.unwrap();
        runner.finish_background().await;
    }
    VM_ON.store(false, Ordering::SeqCst);
    let runs = std::mem::take(&mut *VM.lock().unwrap());
    let completed_after: i64 = store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(*) FROM compactions WHERE status = 'completed'",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    // The summary's text is read once a compaction, not at every step: a
    // step reads the newest completed compaction's id, and its row only
    // when the id is new to it (then the compaction's own read of the
    // previous summary, and its completion's answer).
    let id_reads: u64 = runs
        .iter()
        .filter(|(sql, _)| sql.starts_with(LATEST_ID_SQL))
        .map(|(_, (n, _, _))| *n)
        .sum();
    let row_reads: u64 = runs
        .iter()
        .filter(|(sql, _)| {
            sql.starts_with(COMPACTION_ROW_SQL)
                && (sql.ends_with("FROM compactions WHERE id = ?1")
                    || sql.contains("WHERE id = (SELECT CASE WHEN ids.b"))
        })
        .map(|(_, (n, _, _))| *n)
        .sum();
    let new = (completed_after - compactions).max(0) as u64;
    println!("{id_reads} id reads, {row_reads} whole-row reads by id, {new} compactions completed");
    assert!(
        id_reads >= measured as u64,
        "{id_reads} reads of the newest completed id"
    );
    assert!(
        row_reads <= 2 * new + 2,
        "{row_reads} whole compaction rows read by id for {new} compactions in {measured} turns"
    );
    let per_run = runs
        .into_iter()
        .map(|(sql, (runs, vm, most))| (sql, (runs, vm / runs.max(1), most)))
        .collect();
    (per_run, compactions, live)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_and_rows_read_per_step_are_fixed_and_independent_of_history() {
    // Every statement of a step, and of the background compactions it
    // claims, visits a fixed number of rows (SQLite's virtual-machine steps
    // a run), however many turns and compactions the session has had: the
    // adaptive soft threshold's pace read once looked through every
    // compaction of the session for the newest background one.
    // (Once also the lookup of who holds a restated value, which visited
    // the value's pin of every turn that restated it.)
    let (small, done_small, live_small) = vm_steps_at(30, 20).await;
    let (large, done_large, live_large) = vm_steps_at(240, 20).await;
    println!("{done_small} / {done_large} compactions, {live_small} / {live_large} live pins");
    assert!(
        done_large >= 4 * done_small.max(1),
        "{done_small} / {done_large}"
    );
    for read in [PACE_SQL, PACE_TURNS_SQL] {
        assert!(
            large.keys().any(|sql| sql.starts_with(read)),
            "the pace read never ran: {read}"
        );
    }
    let mut grew = Vec::new();
    for (sql, (runs, vm_large, most_large)) in &large {
        let Some((_, vm_small, most_small)) = small.get(sql) else {
            continue;
        };
        println!(
            "{vm_small:>6} {vm_large:>6} VM steps a run ({runs} runs, at most {most_small} / \
             {most_large}): {sql:.90}"
        );
        // A summary's live pins: a row for each fact the session holds for
        // good, all of which it carries (G8); it grows with the facts.
        if sql.starts_with(LIVE_PINS_SQL) {
            continue;
        }
        // The pace's turns: a run reads those finished since the session's
        // last pace read, at most the last `PACE_TURNS` (a whole window, as
        // the first read of a runner does), so its mean follows how often
        // the pace is asked; the largest run, a whole window, is what must
        // not grow.
        let (vm_small, vm_large) = if sql.starts_with(PACE_TURNS_SQL) {
            (most_small, most_large)
        } else {
            (vm_small, vm_large)
        };
        if *vm_large > vm_small + vm_small / 10 + 10 {
            grew.push(format!(
                "{vm_small} -> {vm_large} VM steps a run after {done_small} -> {done_large} \
                 compactions: {sql}"
            ));
        }
    }
    assert!(
        grew.is_empty(),
        "grew with the history:\n{}",
        grew.join("\n")
    );

    for compact_at in [Threshold::Off, Threshold::Tokens(1_000_000)] {
        let small = cost_of_turn_at(10, compact_at).await;
        let large = cost_of_turn_at(120, compact_at).await;
        // Statements, and rows read back: an O(H) rebuild of the history per
        // turn would read more rows at H = 120.
        assert_eq!(small, large, "{compact_at:?}: the cost grew with H");
        // Two steps: begin the turn (claims step 0); ensure, build, then the
        // response, the tool, step 0's completion and step 1's claim; ensure,
        // build, then the final answer and the turn's completion.
        let Cost {
            statements,
            write_txs,
            rows,
            rows_written,
            pages_written,
        } = small;
        // The second step's context and the turn's pins come from the rows
        // the runner has just written, not read back (37 and 39 statements
        // then, 43 and 45 when they were read). 39 and 41 now: the lookup of
        // a value held (the tool result repeats two values pinned in earlier
        // turns) reads whether it is still the newest of its window, which
        // spares their refresh. 38 and 40 since the verbatim tail's boundary
        // is read once a turn (it was read at both steps). 37 and 39 since a
        // final answer's step is written completed with its response, one
        // UPDATE of the row instead of two in the same transaction. 36 and
        // 38 since a finished turn's size is kept by the runner that wrote
        // it, not read by the next turn's tail. 33 and 35 since the context
        // kept for the next turn holds the whole turn (its final answer from
        // the rows written) and takes the next turn's input from its row:
        // the first step reads no range of the history (three statements).
        let per_step = statements / 2;
        assert!(
            per_step <= 20,
            "{compact_at:?}: {per_step} statements per step"
        );
        let most = if compact_at == Threshold::Off { 33 } else { 35 };
        assert!(
            statements <= most,
            "{compact_at:?}: {statements} statements per two-step turn (at most {most})"
        );
        // One to begin the turn (claiming step 0), one per step: the tool step's
        // response, tool, completion and step 1's claim; the final answer with
        // the turn's completion.
        assert_eq!(write_txs, 3, "{compact_at:?}: write transactions per turn");
        // 7 and 9 since the first step reads no range (10 and 12 before).
        assert!(rows > 0 && rows <= 9, "{compact_at:?}: {rows} rows read");
        // Written, per two-step turn: the turn, its two steps (claimed, then
        // given their response and completed), the invocation (written once,
        // with its result), the tool's effect, the pins of the finished turn
        // (the values every turn's tool result repeats are still the newest
        // of their window: not pinned again). The final answer's step is
        // changed once (its response and completion in one UPDATE): 9 rows,
        // 10 when it was changed twice.
        // Ceilings of what is measured now (docs/benchmarks.md), so that a
        // change that writes more shows.
        assert!(
            rows_written <= 9,
            "{compact_at:?}: {rows_written} rows written"
        );
        assert!(
            pages_written <= 16,
            "{compact_at:?}: {pages_written} WAL pages written"
        );
        println!(
            "{compact_at:?}: {statements} statements, {write_txs} write transactions, \
             {rows} rows read, {rows_written} rows and {pages_written} WAL pages written \
             per two-step turn"
        );
    }
}
