//! G8 and what summaries keep: pinned facts, the guard, supersession, the
//! fidelity workload's targets.

use crate::common;

use abridge::compaction::{ExtractiveSummariser, Summariser, SummaryRequest, SummaryResponse};
use abridge::pins::{Fact, FactKind};
use abridge::{
    CompactionConfig, EventKind, FaultPoint, ModelClient, ModelError, ModelRequest, ModelResponse,
    ResponseBlock, Runner, RunnerConfig, Store, Threshold, Tool, ToolCall, ToolError, ToolSpec,
    Tools, Usage,
};
use abridge_testkit::fidelity::{self, Which};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The test that fails without the guard: a summariser that keeps 300
/// characters, one that ignores the previous summary, and the offline one
/// all leave every fact in view at the last step after many compactions,
/// and `verify` (G8 included) passes. Without the guard the same lossy runs
/// lose most facts (asserted, so the workload can tell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_the_guard_keeps_every_fact_whatever_the_summariser() {
    for which in Which::ALL {
        let (_d, path) = common::temp_db();
        let o = fidelity::run(&path, which, true).await.unwrap();
        assert!(
            o.compactions >= 10,
            "{which:?}: {} compactions",
            o.compactions
        );
        assert_eq!(o.visible, o.facts, "{which:?} lost {:?}", o.lost);
        // The ids from tools are mentioned in passing: the newest of them
        // stay live (`pins_window`, folded at this small threshold to keep
        // the pinned block within its share), older ones leave.
        let window = o.last_window.expect("the guard records its window");
        assert!(
            (1..100).contains(&window),
            "{which:?}: window {window}: at 2,500 tokens the ids must fold"
        );
        // The window is shared with the tools' other values, which come
        // up again in every batch (a value mentioned again refreshes its
        // turn): every id live in it is seen.
        assert!(
            o.tool_ids_live >= 1 && o.tool_ids_visible >= o.tool_ids_live,
            "{which:?}: {}/{} ids from tools visible, {} live, window {window}",
            o.tool_ids_visible,
            o.tool_ids,
            o.tool_ids_live
        );
        assert!(o.verified, "{which:?}: verify failed");
    }
    for which in [Which::Lossy, Which::IgnoresPrevious] {
        let (_d, path) = common::temp_db();
        let o = fidelity::run(&path, which, false).await.unwrap();
        assert!(
            o.visible_share() < 0.5,
            "{which:?} without the guard kept {}/{}: the workload no longer tells",
            o.visible,
            o.facts
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_summariser_keeps_nine_facts_in_ten_with_their_sentence_without_the_guard() {
    let (_d, path) = common::temp_db();
    let o = fidelity::run(&path, Which::Offline, false).await.unwrap();
    assert!(o.compactions >= 10, "{} compactions", o.compactions);
    assert!(
        o.sentence_share() >= 0.9,
        "{}/{} with their sentence; lost {:?}",
        o.with_sentence,
        o.facts,
        o.lost
    );
}

/// Answers every turn with one sentence; a turn asking for "logs" calls the
/// `logs` tool first.
struct Plain;

#[abridge::async_trait]
impl ModelClient for Plain {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = serde_json::to_string(&req.messages.last().unwrap().content).unwrap();
        let block = if last.contains("logs please") {
            ResponseBlock::ToolUse {
                id: "l1".into(),
                name: "logs".into(),
                input: json!({}),
                raw_input: None,
            }
        } else {
            ResponseBlock::Text {
                text: "Noted, thank you.".into(),
            }
        };
        Ok(ModelResponse {
            blocks: vec![block],
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

/// 12,000 chars of log whose last lines name failed transactions: far past
/// the 2,000-char cap a summariser's transcript puts on a tool result.
struct Logs;

#[abridge::async_trait]
impl Tool for Logs {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        let mut s = "ok line of no interest\n".repeat(520);
        for i in 0..3 {
            s.push_str(&format!("failed txn=tx_late_{i}9\n"));
        }
        Ok(Value::String(s))
    }
}

/// A summariser that keeps nothing but a fixed sentence.
struct Forgets;

#[abridge::async_trait]
impl Summariser for Forgets {
    async fn summarise(&self, _: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        Ok(SummaryResponse {
            text: "The user talked about an order.".into(),
            usage: Usage::default(),
        })
    }
}

fn runner(store: &Store, summariser: Arc<dyn Summariser>, cfg: CompactionConfig) -> Runner {
    runner_with_logs(store, Logs, summariser, cfg)
}

/// The `Plain` model with `tool` as its `logs` tool.
fn runner_with_logs(
    store: &Store,
    tool: impl Tool + 'static,
    summariser: Arc<dyn Summariser>,
    cfg: CompactionConfig,
) -> Runner {
    let spec = ToolSpec {
        name: "logs".into(),
        description: "logs".into(),
        input_schema: json!({"type": "object"}),
    };
    Runner::builder(store.clone(), Arc::new(Plain))
        .tools(Tools::new().idempotent(spec, tool))
        .summariser_arc(summariser)
        .config(RunnerConfig::default().with_owner("fidelity-test"))
        .compaction(cfg)
        .build()
        .unwrap()
}

/// `input` with background text that states no fact, so that a turn is
/// large enough for its summary (and the pinned facts) to shrink it (G7).
fn padded(input: &str) -> String {
    format!(
        "{input} {}",
        "here is some more background about the weather and the garden, nothing of note. "
            .repeat(8)
    )
}

/// A new session of `r` that has run `inputs`, each padded, as its turns.
async fn padded_session(r: &Runner, inputs: &[&str]) -> abridge::store::SessionRow {
    let s = r.create_session("s", "m", "sys").await.unwrap();
    for input in inputs {
        r.run_turn(s.id, &padded(input)).await.unwrap();
    }
    s
}

fn small_threshold() -> CompactionConfig {
    CompactionConfig::default().with_compact_at(Threshold::Tokens(150))
}

async fn newest_summary(store: &Store, sid: abridge::SessionId) -> abridge::store::CompactionRow {
    store
        .compactions(sid)
        .await
        .unwrap()
        .into_iter()
        .rev()
        .find(|c| c.status == abridge::store::CompactionStatus::Completed)
        .expect("a completed compaction")
}

#[tokio::test]
async fn a_newer_value_supersedes_the_older_one_and_the_block_says_so() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let r = runner(&store, Arc::new(Forgets), small_threshold());
    let s = padded_session(
        &r,
        &[
            "My budget is 1,000 EUR.",
            "Please change my budget to 1,250 EUR.",
            "That is all for now, thanks a lot for your help with this.",
            "One more thing: nothing else, just saying hello again today.",
        ],
    )
    .await;
    let pins = store.pins(s.id).await.unwrap();
    let budget: Vec<_> = pins
        .iter()
        .filter(|p| p.slot.as_deref() == Some("budget"))
        .collect();
    assert_eq!(budget.len(), 2, "{pins:#?}");
    assert_eq!(budget[1].supersedes, Some(budget[0].id));
    let live = store
        .with_conn(move |c| {
            abridge::inspect::live_pins(c, s.id, i64::MAX, abridge::pins::DEFAULT_PINS_WINDOW)
        })
        .unwrap();
    assert!(live.iter().any(|p| p.value == "1,250 EUR"));
    assert!(!live.iter().any(|p| p.value == "1,000 EUR"), "{live:#?}");
    let row = newest_summary(&store, s.id).await;
    let summary = row.summary.unwrap();
    assert!(
        summary.contains("- [turn 1] budget: 1,250 EUR (replaces 1,000 EUR)"),
        "{summary}"
    );
    assert!(summary.starts_with("The user talked about an order."));
    assert!(row.pins_added.unwrap() >= 1);
    common::assert_all_steps_rebuild(&store);
}

/// Corrections that name no slot attach to the slot last mentioned with a
/// value of their shape; a question never replaces a value; another order's
/// id never supersedes the first.
#[tokio::test]
async fn corrections_questions_and_other_orders_keep_the_current_values_right() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let r = runner(&store, Arc::new(Forgets), small_threshold());
    let s = padded_session(
        &r,
        &[
            "My budget is 900 EUR. My postcode is 80273.",
            "No wait, make it 1,000 EUR.",
            "Could you check if you deliver to postal code 37527?",
            "Order ORD-1001 is the sofa. Order ORD-1002 is the lamp.",
            "We moved the deadline to 2027-04-02.",
        ],
    )
    .await;
    let live = store
        .with_conn(move |c| {
            abridge::inspect::live_pins(c, s.id, i64::MAX, abridge::pins::DEFAULT_PINS_WINDOW)
        })
        .unwrap();
    let slot = |name: &str| {
        live.iter()
            .filter(|p| p.slot.as_deref() == Some(name))
            .map(|p| p.value.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(slot("budget"), ["1,000 EUR"], "{live:#?}");
    assert_eq!(slot("postcode"), ["80273"], "{live:#?}");
    assert_eq!(slot("deadline"), ["2027-04-02"], "{live:#?}");
    for id in ["ORD-1001", "ORD-1002", "37527"] {
        assert!(
            live.iter().any(|p| p.value == id && p.slot.is_none()),
            "{id}: {live:#?}"
        );
    }
    assert!(
        !live
            .iter()
            .any(|p| p.slot.as_deref() == Some(abridge::pins::LAST_SLOT)),
        "{live:#?}"
    );
}

#[tokio::test]
async fn a_host_pin_is_carried_by_the_next_compaction() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let r = runner(&store, Arc::new(Forgets), small_threshold());
    let s = r.create_session("s", "m", "sys").await.unwrap();
    r.run_turn(s.id, &padded("hello there")).await.unwrap();
    let at = r
        .pin(s.id, Fact::host(Some("gift wrap"), "wrap it in blue paper"))
        .await
        .unwrap();
    assert_eq!(at, 1, "counts as stated before the next turn");
    assert!(r.pin(s.id, Fact::host(None, "  ")).await.is_err());
    for _ in 0..3 {
        r.run_turn(s.id, &padded("and some more")).await.unwrap();
    }
    let row = newest_summary(&store, s.id).await;
    assert!(row.up_to_turn_index >= 1);
    assert!(row
        .summary
        .unwrap()
        .contains("gift wrap: wrap it in blue paper"),);
    let pins = store.pins(s.id).await.unwrap();
    assert!(pins.iter().any(|p| p.kind == FactKind::Host));
}

/// Pins are written in the transaction that finishes the turn: a crash just
/// before it leaves none, and the resumed turn writes each once.
#[tokio::test]
async fn facts_are_pinned_once_in_the_transaction_that_finishes_the_turn() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let crashing = Runner::builder(store.clone(), Arc::new(Plain))
        .config(RunnerConfig::default().with_owner("crashing"))
        .fault_hook(common::fail_at(FaultPoint::BeforeStepComplete, 1))
        .build()
        .unwrap();
    let s = crashing.create_session("s", "gpt-4o", "sys").await.unwrap();
    let err = crashing
        .run_turn(s.id, "My e-mail is ana@example.org.")
        .await
        .unwrap_err();
    assert!(matches!(err, abridge::Error::Injected(_)), "{err}");
    assert!(store.pins(s.id).await.unwrap().is_empty());
    let turn = store.turns(s.id).await.unwrap().remove(0);
    let fresh = Runner::builder(store.clone(), Arc::new(Plain))
        .config(RunnerConfig::default().with_owner("crashing"))
        .build()
        .unwrap();
    fresh.resume_turn(turn.id).await.unwrap();
    let pins = store.pins(s.id).await.unwrap();
    assert_eq!(
        pins.iter().filter(|p| p.value == "ana@example.org").count(),
        1,
        "{pins:#?}"
    );
}

#[tokio::test]
async fn ids_past_the_tool_result_cap_are_pinned_and_carried() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let r = runner(&store, Arc::new(ExtractiveSummariser), small_threshold());
    let s = r.create_session("s", "m", "sys").await.unwrap();
    r.run_turn(s.id, "logs please").await.unwrap();
    for _ in 0..2 {
        r.run_turn(s.id, &padded("thanks")).await.unwrap();
    }
    let pins = store.pins(s.id).await.unwrap();
    let summary = newest_summary(&store, s.id).await.summary.unwrap();
    for i in 0..3 {
        let id = format!("tx_late_{i}9");
        assert!(pins.iter().any(|p| p.value == id), "{id} not pinned");
        assert!(summary.contains(&id), "{id} not carried: {summary}");
    }
}

#[tokio::test]
async fn pins_over_budget_are_all_kept_and_reported() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let mut cfg = small_threshold();
    cfg.pins_budget_chars = 40;
    let r = runner(&store, Arc::new(Forgets), cfg);
    let mut events = r.subscribe();
    let s = padded_session(
        &r,
        &[
            "My order number is ORD-1 and my postal code is 75001.",
            "Send it to ana@example.org and bill FR-776-AB please.",
            "Nothing else for today, thank you very much for your help.",
            "Bye for now, I will come back tomorrow with more questions.",
        ],
    )
    .await;
    let summary = newest_summary(&store, s.id).await.summary.unwrap();
    for v in ["ORD-1", "75001", "ana@example.org", "FR-776-AB"] {
        assert!(summary.contains(v), "{v} dropped: {summary}");
    }
    let mut over = 0;
    for e in common::drained(&mut events) {
        if let EventKind::PinsOverBudget { chars, budget, .. } = e.kind {
            assert!(chars > budget);
            over += 1;
        }
    }
    assert!(over >= 1, "no PinsOverBudget event");
}

/// Records its requests; answers without the facts the first time and with
/// whatever it is asked to include the second.
struct Reasked {
    calls: AtomicUsize,
    requests: Mutex<Vec<SummaryRequest>>,
}

#[abridge::async_trait]
impl Summariser for Reasked {
    async fn summarise(&self, r: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.requests.lock().unwrap().push(r.clone());
        let text = if r.rules.contains("leaves out facts") {
            format!(
                "{} Also: order number ORD-77, postal code 90210.",
                r.previous.clone().unwrap_or_default()
            )
        } else {
            "The user has an order.".to_string()
        };
        Ok(SummaryResponse {
            text,
            usage: Usage::default(),
        })
    }
}

#[tokio::test]
async fn a_summariser_is_asked_once_more_for_the_facts_it_left_out() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let mut cfg = small_threshold();
    cfg.reask_missing_pins = true;
    let summariser = Arc::new(Reasked {
        calls: AtomicUsize::new(0),
        requests: Mutex::default(),
    });
    let r = runner(&store, summariser.clone(), cfg);
    let s = padded_session(
        &r,
        &[
            "My order number is ORD-77 and my postal code is 90210.",
            "Nothing else for today, thank you very much for your help.",
        ],
    )
    .await;
    let row = newest_summary(&store, s.id).await;
    // What the summariser wrote, then the user's own words (no block: the
    // second answer carries every pin).
    let summary = row.summary.as_deref().unwrap();
    let (written, words) = summary
        .split_once("\n\n## The user's own words")
        .unwrap_or((summary, ""));
    assert!(!words.contains("## Pinned facts"), "{summary}");
    assert_eq!(
        Some(written),
        Some("The user has an order. Also: order number ORD-77, postal code 90210.")
    );
    assert_eq!(row.pins_added, Some(0), "the second answer carried both");
    assert_eq!(row.summary_calls, 2);
    let reqs = summariser.requests.lock().unwrap();
    assert!(reqs[1].rules.contains("ORD-77") && reqs[1].rules.contains("90210"));
}

/// `verify` catches a completed summary that lacks a live pin (written past
/// the guard, with the schema's protections lifted).
#[tokio::test]
async fn verify_reports_a_summary_that_lost_a_pin() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let r = runner(&store, Arc::new(Forgets), small_threshold());
    let s = padded_session(
        &r,
        &[
            "My loyalty card is LC-4471-XZ.",
            "Nothing else for today, thank you very much for your help.",
        ],
    )
    .await;
    let row = newest_summary(&store, s.id).await;
    let g8 = g8_of(&store).await;
    assert!(g8.ok && g8.checked >= 1, "{g8:?}");
    drop(r);
    overwrite_summary(&store, row.id, "The user talked about an order.");
    let g8 = g8_of(&store).await;
    assert!(!g8.ok);
    assert!(g8.violations[0].contains("LC-4471-XZ"), "{g8:?}");
}

/// `verify`'s G8 check of the store.
async fn g8_of(store: &Store) -> abridge::verify::Check {
    let report = store.verify(Vec::new()).await.unwrap();
    report
        .checks
        .into_iter()
        .find(|c| c.name.starts_with("G8"))
        .unwrap()
}

/// Writes `text` as compaction `id`'s summary past the guard, with the
/// schema's protection of completed rows lifted: a store a bug or a hand
/// changed.
fn overwrite_summary(store: &Store, id: abridge::CompactionId, text: &'static str) {
    store
        .with_conn(move |c| {
            c.execute_batch(if common::on_postgres() {
                "DROP TRIGGER compactions_completed_never_change ON compactions"
            } else {
                "DROP TRIGGER compactions_completed_never_change"
            })?;
            c.execute(
                "UPDATE compactions SET summary = ?1, summary_sha256 = ?2 WHERE id = ?3",
                (text, abridge::message::sha256_hex(text.as_bytes()), id),
            )?;
            Ok(())
        })
        .unwrap();
}

/// G8 that cannot pass falsely: a summary in which a short value appears
/// only inside other words (`L` in `Lisbon`, `7` in `17`) does not carry it,
/// and `verify` says which pin is lost.
#[tokio::test]
async fn verify_fails_when_a_short_value_is_only_inside_other_words() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let r = runner(&store, Arc::new(Forgets), small_threshold());
    let s = padded_session(
        &r,
        &[
            "Please change my size to L.",
            "Nothing else for today, thank you very much for your help.",
        ],
    )
    .await;
    let row = newest_summary(&store, s.id).await;
    let pins = store.pins(s.id).await.unwrap();
    assert!(
        pins.iter()
            .any(|p| p.slot.as_deref() == Some("size") && p.value == "L"),
        "{pins:?}"
    );
    let g8 = g8_of(&store).await;
    assert!(g8.ok, "{g8:?}");
    drop(r);
    // "L" only inside "Lisbon" and "LOW": never as the size.
    overwrite_summary(&store, row.id, "17 parcels to Lisbon, LOW priority.");
    let g8 = g8_of(&store).await;
    assert!(!g8.ok, "{g8:?}");
    assert!(
        g8.violations.iter().any(|v| v.contains("size: \"L\"")),
        "{g8:?}"
    );
}

/// The documented target (docs/fidelity.md, "No thrash"): the first step
/// after a compaction sends at most 60% of the threshold; after one made in
/// the background (read a turn or more later, with the turns that ran while
/// it was made), less than the soft threshold (80%), so that reading it does
/// not start the next one. Every compaction of the demo workload (3 sessions
/// x 40 turns, threshold 4,000, background compaction on) meets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_compaction_of_the_demo_leaves_the_context_under_the_target() {
    let (_d, path) = common::temp_db();
    let opts = abridge_testkit::demo::DemoOptions {
        db: common::db_for(&path),
        ..Default::default()
    };
    let report = abridge_testkit::demo::run_demo(&opts, |_| {})
        .await
        .unwrap();
    assert!(report.compactions_completed >= 10);
    let threshold = 4_000;
    let store = Store::open(common::db_for(&path)).unwrap();
    // (A summary made in the background after the session's last turn has
    // no step that read it.)
    let after: Vec<(i64, bool, Option<i64>)> = store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT c.id, c.background, (SELECT s.context_tokens FROM steps s \
                 WHERE s.compaction_id = c.id ORDER BY s.id LIMIT 1) \
                 FROM compactions c WHERE c.status = 'completed'",
            )?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .unwrap();
    let mut background = 0;
    for (id, in_background, tokens) in after {
        let Some(tokens) = tokens else { continue };
        let share = if in_background { 80 } else { 60 };
        background += usize::from(in_background);
        assert!(
            tokens * 100 < threshold * share || (!in_background && tokens * 100 == threshold * 60),
            "compaction {id}: the next step sent {tokens} tokens, over {share}% of {threshold}"
        );
    }
    assert!(background > 0, "the demo compacts in the background");
    let report = store.verify(Vec::new()).await.unwrap();
    assert!(report.notes.is_empty(), "{:?}", report.notes);
}

/// Writes a summary close to the threshold: every compaction leaves no room.
struct Bloated;

#[abridge::async_trait]
impl Summariser for Bloated {
    async fn summarise(&self, r: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        Ok(SummaryResponse {
            text: "background without any detail. ".repeat(r.max_chars / 32),
            usage: Usage::default(),
        })
    }
}

#[tokio::test]
async fn compacting_in_consecutive_turns_is_reported_by_an_event_and_verify() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let mut cfg = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(400))
        .with_background(None);
    cfg.max_summary_share = Some(1.0);
    let r = runner(&store, Arc::new(Bloated), cfg);
    let mut events = r.subscribe();
    let s = r.create_session("s", "m", "sys").await.unwrap();
    for _ in 0..6 {
        r.run_turn(s.id, &padded("more")).await.unwrap();
    }
    let mut often = 0;
    for e in common::drained(&mut events) {
        if let EventKind::CompactingOften {
            boundary,
            previous_boundary,
        } = e.kind
        {
            assert_eq!(boundary, previous_boundary + 1);
            often += 1;
        }
    }
    assert!(often >= 2, "{often} CompactingOften events");
    let report = store.verify(Vec::new()).await.unwrap();
    assert!(report.ok, "no guarantee is broken");
    assert_eq!(report.notes.len(), 1, "{:?}", report.notes);
    assert!(report.notes[0].contains("one turn after the previous one"));
}

/// `keep_recent_tokens` keeps the newest turns whose stored text fits it,
/// beside `keep_last_turns`, and the same boundary at every step of a turn.
#[tokio::test]
async fn keep_recent_tokens_keeps_the_newest_turns_that_fit() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    // A padded turn stores ~690 chars of input and 17 of answer: ~180 tokens.
    let cfg = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(700))
        .with_keep_recent_tokens(400)
        .with_background(None); // read by the step that claimed it
    let r = runner(&store, Arc::new(ExtractiveSummariser), cfg);
    let s = r.create_session("s", "m", "sys").await.unwrap();
    for _ in 0..8 {
        r.run_turn(s.id, &padded("more")).await.unwrap();
    }
    let rows = store.compactions(s.id).await.unwrap();
    assert!(!rows.is_empty());
    let turns = store.turns(s.id).await.unwrap();
    for c in &rows {
        // The step that claimed it ran in some turn t; turns b+1..t-1 (two of
        // ~180 tokens) stayed verbatim.
        let readers = store
            .with_conn({
                let id = c.id;
                move |conn| {
                    conn.query_row(
                        "SELECT min(t.idx) FROM steps s JOIN turns t ON t.id = s.turn_id \
                         WHERE s.compaction_id = ?1",
                        [id],
                        |r| r.get::<_, i64>(0),
                    )
                }
            })
            .unwrap();
        assert_eq!(
            readers - c.up_to_turn_index,
            3,
            "compaction up to {} first read in turn {readers} ({} turns)",
            c.up_to_turn_index,
            turns.len()
        );
    }
}

/// The pins live at a boundary are read through an index: a slot changed in
/// every one of 300 turns costs the read no more than one changed 30 times
/// (SQLite virtual-machine steps, counted by a progress handler).
#[tokio::test]
async fn reading_the_live_pins_does_not_walk_every_value_a_slot_had() {
    let (_d, path) = common::temp_db();
    // SQLite's virtual machine steps are what it counts: an SQLite store.
    let store = Store::open(&path).unwrap();
    let r = Runner::builder(store.clone(), Arc::new(Plain))
        .config(RunnerConfig::default().with_owner("slots"))
        .compaction(CompactionConfig::default().with_compact_at(Threshold::Off))
        .build()
        .unwrap();
    let s = r.create_session("s", "m", "sys").await.unwrap();
    let cost = |store: &Store| {
        let sid = s.id;
        store
            .with_conn(move |c| {
                let steps = Arc::new(AtomicUsize::new(0));
                let counter = steps.clone();
                c.as_sqlite().unwrap().progress_handler(
                    10,
                    Some(move || {
                        counter.fetch_add(1, Ordering::SeqCst);
                        false
                    }),
                )?;
                let live = abridge::inspect::live_pins(
                    c,
                    sid,
                    i64::MAX,
                    abridge::pins::DEFAULT_PINS_WINDOW,
                )?;
                c.as_sqlite()
                    .unwrap()
                    .progress_handler(0, None::<fn() -> bool>)?;
                assert_eq!(
                    live.iter()
                        .filter(|p| p.slot.as_deref() == Some("size"))
                        .count(),
                    1
                );
                Ok(steps.load(Ordering::SeqCst))
            })
            .unwrap()
    };
    let mut at_30 = 0;
    for t in 0..300 {
        r.run_turn(s.id, &format!("My size is EU {t}."))
            .await
            .unwrap();
        if t == 29 {
            at_30 = cost(&store);
            assert!(at_30 > 0);
        }
    }
    let at_300 = cost(&store);
    assert!(
        at_300 <= at_30 + 2,
        "reading the live pins took {at_300} progress ticks at 300 values, {at_30} at 30"
    );
}

/// Numbers each call: a new id every time.
struct Counter(AtomicUsize);

#[abridge::async_trait]
impl Tool for Counter {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Value::String(format!("created ticket TK-{n:04}X")))
    }
}

/// Facts found in tool results stay live only while among the newest
/// `pins_window`: a tool-heavy session keeps a bounded summary, the newest
/// ids are carried, older ones leave, and G8 (checked against the window the
/// compaction recorded) holds.
#[tokio::test]
async fn facts_mentioned_in_passing_are_live_within_a_window_so_the_summary_stays_bounded() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let mut cfg = small_threshold();
    cfg.pins_window = 3;
    let r = runner_with_logs(&store, Counter(AtomicUsize::new(0)), Arc::new(Forgets), cfg);
    let s = r.create_session("s", "m", "sys").await.unwrap();
    r.run_turn(s.id, &padded("My loyalty card is LC-4471-XZ."))
        .await
        .unwrap();
    for _ in 0..12 {
        r.run_turn(s.id, &padded("logs please")).await.unwrap();
    }
    let row = newest_summary(&store, s.id).await;
    assert_eq!(row.pins_window, Some(3));
    let summary = row.summary.unwrap();
    assert!(
        summary.contains("LC-4471-XZ"),
        "the user's fact stays: {summary}"
    );
    let newest = row.up_to_turn_index as usize; // one ticket per turn 1..
    for n in (newest - 3)..newest {
        assert!(
            summary.contains(&format!("TK-{n:04}X")),
            "TK-{n:04}X: {summary}"
        );
    }
    assert!(!summary.contains("TK-0000X"), "an old id stayed: {summary}");
    let report = store.verify(Vec::new()).await.unwrap();
    assert!(report.ok, "{report:#?}");
}

/// Answers every call with the same text.
struct Says(&'static str);

#[abridge::async_trait]
impl Tool for Says {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        Ok(Value::String(self.0.into()))
    }
}

/// The live pins of a session at `boundary`, with a window of `window`.
fn live_at(
    store: &Store,
    sid: abridge::SessionId,
    boundary: i64,
    window: usize,
) -> Vec<abridge::pins::Pin> {
    store
        .with_conn(move |c| abridge::inspect::live_pins(c, sid, boundary, window))
        .unwrap()
}

/// Issue 32: a value mentioned in passing and mentioned again in a later
/// turn gets a pin at that turn, superseding its earlier one (the block does
/// not say it replaces itself), so it stays among the newest of its window;
/// at a boundary before the repeat the earlier pin is the live one, so
/// `verify` reads every compaction's pins as they were.
#[tokio::test]
async fn a_value_mentioned_again_refreshes_its_turn_and_stays_in_the_window() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let mut cfg = small_threshold();
    cfg.pins_window = 3;
    let r = runner_with_logs(&store, Says("nothing"), Arc::new(Forgets), cfg);
    let s = padded_session(
        &r,
        &[
            "Please look at ORD-1001.",
            "And ORD-2001.",
            "And ORD-2002.",
            "And ORD-2003.",
            "Back to ORD-1001, is it shipped?",
            "And ORD-2005.",
        ],
    )
    .await;
    let rows: Vec<_> = store
        .pins(s.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p.value == "ORD-1001")
        .collect();
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!((rows[0].turn_index, rows[1].turn_index), (0, 4));
    assert_eq!(rows[1].supersedes, Some(rows[0].id));
    assert!(rows[1].in_passing());
    assert!(
        !rows[1].line(false).contains("replaces"),
        "{}",
        rows[1].line(false)
    );
    let values = |pins: &[abridge::pins::Pin]| -> Vec<(String, i64)> {
        let mut v: Vec<_> = pins
            .iter()
            .filter(|p| p.value.starts_with("ORD-"))
            .map(|p| (p.value.clone(), p.turn_index))
            .collect();
        v.sort();
        v
    };
    let pair = |v: &str, t: i64| (v.to_string(), t);
    // Now: the repeat is among the three newest; ORD-2002 has left.
    assert_eq!(
        values(&live_at(&store, s.id, i64::MAX, 3)),
        vec![
            pair("ORD-1001", 4),
            pair("ORD-2003", 3),
            pair("ORD-2005", 5)
        ]
    );
    // Before the repeat: the pin of turn 0 was live (it was superseded at 4).
    assert_eq!(
        values(&live_at(&store, s.id, 2, 3)),
        vec![
            pair("ORD-1001", 0),
            pair("ORD-2001", 1),
            pair("ORD-2002", 2)
        ]
    );
    assert_eq!(
        values(&live_at(&store, s.id, 3, 3)),
        vec![
            pair("ORD-2001", 1),
            pair("ORD-2002", 2),
            pair("ORD-2003", 3)
        ]
    );
    assert!(!store.compactions(s.id).await.unwrap().is_empty());
    let report = store.verify(Vec::new()).await.unwrap();
    assert!(report.ok, "{report:#?}");
}

/// Issue 32: a user repeating a value a tool returned makes it the user's
/// fact (its source, its sentence, the user's window); a tool returning the
/// user's value again refreshes its turn once newer values came after it
/// (not while it is still the newest of its window) and keeps it the user's.
#[tokio::test]
async fn a_user_repeating_a_tools_value_makes_it_the_users_fact() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let r = runner_with_logs(
        &store,
        Says("order ORD-7731 ships on Friday"),
        Arc::new(ExtractiveSummariser),
        CompactionConfig::default().with_compact_at(Threshold::Off),
    );
    let s = r.create_session("s", "m", "sys").await.unwrap();
    r.run_turn(s.id, "logs please").await.unwrap();
    r.run_turn(s.id, "Thanks, ORD-7731 is the one I meant.")
        .await
        .unwrap();
    // Still the newest of the user's window: the tool repeating it changes
    // nothing.
    r.run_turn(s.id, "logs please").await.unwrap();
    r.run_turn(s.id, "And ORD-8800 arrived.").await.unwrap();
    // Overtaken by ORD-8800: the tool repeating it refreshes it.
    r.run_turn(s.id, "logs please").await.unwrap();
    use abridge::pins::FactSource;
    let rows: Vec<_> = store
        .pins(s.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p.value == "ORD-7731")
        .collect();
    let got: Vec<_> = rows
        .iter()
        .map(|p| (p.turn_index, p.source, p.window, p.sentence.as_str()))
        .collect();
    let said = "Thanks, ORD-7731 is the one I meant.";
    assert_eq!(
        got,
        vec![
            (0, FactSource::Tool, 1, "order ORD-7731 ships on Friday"),
            (1, FactSource::User, 2, said),
            (4, FactSource::User, 2, said),
        ],
        "{rows:#?}"
    );
    assert_eq!(rows[1].supersedes, Some(rows[0].id));
    assert_eq!(rows[2].supersedes, Some(rows[1].id));
    let live = live_at(&store, s.id, i64::MAX, 8);
    let live: Vec<_> = live.iter().filter(|p| p.value == "ORD-7731").collect();
    assert_eq!(live.len(), 1, "one live pin of a value: {live:#?}");
    assert_eq!(live[0].id, rows[2].id);
    let report = store.verify(Vec::new()).await.unwrap();
    assert!(report.ok, "{report:#?}");
}

/// Issue 32: the user's own words. With a summariser that keeps nothing,
/// the newest of the user's messages a compaction folds are in its summary
/// verbatim, newest first, within their share (400 chars at this
/// threshold), rolling: carried from summary to summary until newer ones
/// fill the section. What no pattern pins reaches the model as said.
#[tokio::test]
async fn the_users_own_words_carry_what_no_pattern_pins_within_their_share() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let cfg = CompactionConfig::default().with_compact_at(Threshold::Tokens(300));
    let r = runner(&store, Arc::new(Forgets), cfg);
    let s = r.create_session("s", "m", "sys").await.unwrap();
    let said = "Wrap it like a present, it is for my grandmother.";
    r.run_turn(s.id, said).await.unwrap();
    for t in 1..40 {
        r.run_turn(
            s.id,
            &format!("Filler question number {t} about the weather."),
        )
        .await
        .unwrap();
    }
    let rows: Vec<_> = store
        .compactions(s.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.status == abridge::store::CompactionStatus::Completed)
        .collect();
    assert!(rows.len() >= 4, "{} compactions", rows.len());
    let quoted = serde_json::to_string(said).unwrap();
    let section = |summary: &str| -> String {
        let at = summary
            .find(abridge::compaction::USER_WORDS_HEADING)
            .unwrap_or_else(|| panic!("no section: {summary}"));
        let rest = &summary[at..];
        let end = rest[1..].find("\n## ").map_or(rest.len(), |e| e + 1);
        rest[..end].trim_end().to_string()
    };
    // The first summary carries the message the summariser dropped.
    let first = rows[0].summary.as_deref().unwrap();
    assert!(section(first).contains(&quoted), "{first}");
    let mut carried = 0;
    for row in &rows {
        let summary = row.summary.as_deref().unwrap();
        let sec = section(summary);
        assert!(sec.chars().count() <= 400, "{sec}");
        // Newest first: the turns listed go down.
        let turns: Vec<i64> = sec
            .lines()
            .filter_map(|l| l.strip_prefix("- [turn "))
            .filter_map(|l| l.split(']').next()?.parse().ok())
            .collect();
        assert!(turns.windows(2).all(|w| w[0] > w[1]), "{sec}");
        assert_eq!(turns.first().copied(), Some(row.up_to_turn_index), "{sec}");
        if sec.contains(&quoted) {
            carried += 1;
        }
        // G7 still holds with the section in.
        assert!(row.tokens_after < row.tokens_before, "{row:?}");
    }
    // Rolling: a section carries lines of the previous one (turns its
    // own span does not hold), and the oldest leave.
    assert!(carried >= 1, "carried by {carried} summaries");
    let rolled = rows.windows(2).any(|w| {
        section(w[1].summary.as_deref().unwrap())
            .lines()
            .filter_map(|l| l.strip_prefix("- [turn "))
            .filter_map(|l| l.split(']').next()?.parse::<i64>().ok())
            .any(|t| t <= w[0].up_to_turn_index)
    });
    assert!(rolled, "no section carried a line of the one before");
    assert!(
        !section(rows.last().unwrap().summary.as_deref().unwrap()).contains(&quoted),
        "the section never rolls"
    );
    let report = store.verify(Vec::new()).await.unwrap();
    assert!(report.ok, "{report:#?}");
}

/// 2 MB of tool result listing 150,000 ids.
struct Flood;

#[abridge::async_trait]
impl Tool for Flood {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        let ids: Vec<String> = (0..150_000).map(|i| format!("id{i:06}x")).collect();
        Ok(Value::String(ids.join(" ")))
    }
}

/// A tool result listing 150,000 ids pins at most `MAX_PINS_PER_TURN` of
/// them, the user's facts first; the turn completes and verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_ids_in_one_result_pins_a_bounded_number() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let r = runner_with_logs(
        &store,
        Flood,
        Arc::new(ExtractiveSummariser),
        CompactionConfig::default().with_compact_at(Threshold::Off),
    );
    let s = r.create_session("s", "m", "sys").await.unwrap();
    r.run_turn(s.id, "My e-mail is ana@example.org, logs please")
        .await
        .unwrap();
    let pins = store.pins(s.id).await.unwrap();
    assert_eq!(
        pins.len(),
        1_000,
        "MAX_PINS_PER_TURN: {:?}",
        pins.iter()
            .filter(|p| p.source != abridge::pins::FactSource::Tool)
            .collect::<Vec<_>>()
    );
    assert_eq!(pins[0].value, "ana@example.org");
    assert!(store.verify(Vec::new()).await.unwrap().ok);
}

/// Issue 32's long-session target: one new fact a turn for 1,500 turns at
/// an 8,000-token threshold (docs/fidelity.md, "A budget that holds"):
/// every first step after a compaction sends at most 60% of the threshold,
/// no two compactions come in consecutive turns after the first 50, the
/// pinned block stays within its share, and every live rule and slot is in
/// what the model sees at the last step; `verify` passes. With the offline
/// summariser and with the lossy one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fact_every_turn_for_1500_turns_stays_under_the_targets() {
    use abridge_testkit::long_session;
    for lossy in [false, true] {
        let (_d, path) = common::temp_db();
        let summariser: Arc<dyn Summariser> = if lossy {
            Arc::new(fidelity::Lossy)
        } else {
            Arc::new(ExtractiveSummariser)
        };
        let o = long_session::run(&path, 1_500, summariser, |c| c)
            .await
            .unwrap();
        assert!(o.compactions >= 30, "lossy {lossy}: {o:?}");
        assert!(o.max_first_step_share <= 0.60, "lossy {lossy}: {o:?}");
        assert_eq!(o.consecutive_after_50, 0, "lossy {lossy}: {o:?}");
        // The block's share is 10% of 8,000 tokens (3,200 chars) without
        // sentences, and its sentences fit `pins_budget_chars` (4,000).
        assert!(o.max_block_chars <= 4_200, "lossy {lossy}: {o:?}");
        assert!(o.rules_and_slots >= 30, "lossy {lossy}: {o:?}");
        assert_eq!(
            o.rules_and_slots_visible, o.rules_and_slots,
            "lossy {lossy}: lost {:?}",
            o.lost
        );
        assert!(o.verified, "lossy {lossy}: verify failed");
    }
}

/// Before: with no share (and a user's names, addresses and paths live for
/// good), the pinned block grew with the session (17k chars at 1,500 turns
/// of this workload) and the first step after a compaction reached 91% of
/// the threshold. With `pins_max_share = None` the block still outgrows the
/// bound the target test asserts, so that test can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_share_the_pinned_block_grows_with_the_session() {
    let (_d, path) = common::temp_db();
    let o = abridge_testkit::long_session::run(
        &path,
        1_000,
        Arc::new(ExtractiveSummariser),
        |mut c| {
            c.pins_max_share = None;
            c
        },
    )
    .await
    .unwrap();
    assert!(o.max_block_chars > 5_000, "{o:?}");
    assert!(o.verified);
}

/// Pins live for good that alone fill their share: every one is kept (a
/// rule or a stated slot never folds), the host hears `PinsOverShare`, and
/// `verify` passes G8 and notes it.
#[tokio::test]
async fn rules_that_fill_the_share_are_all_kept_and_reported() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let mut cfg = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(1_000))
        .with_background(None);
    cfg.keep_recent_share = None;
    let r = runner(&store, Arc::new(Forgets), cfg);
    let mut events = r.subscribe();
    let rules: Vec<String> = (0..12)
        .map(|i| format!("Never ship parcel group {i} through the northern hub on a weekend."))
        .collect();
    let s = padded_session(&r, &rules.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let summary = newest_summary(&store, s.id).await.summary.unwrap();
    let newest = newest_summary(&store, s.id).await;
    for rule in rules.iter().take(newest.up_to_turn_index as usize + 1) {
        assert!(summary.contains(rule.as_str()), "{rule} dropped: {summary}");
    }
    let mut over = 0;
    for e in common::drained(&mut events) {
        if let EventKind::PinsOverShare { chars, share, .. } = e.kind {
            assert!(chars > share);
            over += 1;
        }
    }
    assert!(over >= 1, "no PinsOverShare event");
    let report = store.call(|c| abridge::verify::verify(c)).await.unwrap();
    assert!(report.ok, "{report:?}");
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("carried no fact mentioned in passing")),
        "{:?}",
        report.notes
    );
    // `abridge inspect` says it under the compaction.
    let out = common::abridge_cmd()
        .arg("inspect")
        .arg("--db")
        .arg(common::db_for(&path))
        .arg("s")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.contains("the pins live for good filled their share"),
        "{out}"
    );
}

/// Facts mentioned in passing fold, oldest first, to keep the block within
/// its share; the compaction records the smaller window, the block says how
/// many were folded, and `verify`'s G8 checks with that window (passes).
#[tokio::test]
async fn facts_in_passing_fold_to_the_share_and_verify_checks_the_recorded_window() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let mut cfg = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(1_500))
        .with_background(None);
    cfg.keep_recent_share = None;
    let r = runner(&store, Arc::new(Forgets), cfg);
    let inputs: Vec<String> = (0..20)
        .map(|i| format!("Order ORD-{i:04}7 and invoice INV-{i:04}3 came in today."))
        .collect();
    let s = padded_session(&r, &inputs.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let newest = newest_summary(&store, s.id).await;
    let window = newest.pins_window.expect("recorded");
    assert!(window < 100, "nothing folded: window {window}");
    let summary = newest.summary.unwrap();
    assert!(summary.contains("- [folded] "), "{summary}");
    // The newest stay, the oldest went.
    let b = newest.up_to_turn_index;
    assert!(summary.contains(&format!("ORD-{b:04}7")), "{summary}");
    assert!(!summary.contains("ORD-00007"), "{summary}");
    let report = store.call(|c| abridge::verify::verify(c)).await.unwrap();
    assert!(report.ok, "{report:?}");
}

/// Issue 32's probe targets (docs/fidelity.md, "The probe evaluation"):
/// after 20 compactions the offline summariser and any summariser with the
/// guard score at least 90% of the maximum, the lossy one with the guard at
/// least 85%, and `verify` passes; without the guard the lossy and the
/// previous-blind ones score under half, so the workload can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_evaluation_meets_its_targets_after_20_compactions() {
    use abridge_testkit::probes;
    for which in Which::ALL {
        for guard in [true, false] {
            let (_d, path) = common::temp_db();
            let o = probes::run(&path, which, guard).await.unwrap();
            assert_eq!(
                o.points.len(),
                probes::CHECKPOINTS.len(),
                "{which:?}: not every checkpoint was reached: {o:?}"
            );
            assert!(o.verified, "{which:?} guard {guard}: verify failed");
            let share = o.share(20);
            match (which, guard) {
                (Which::Lossy, true) => assert!(share >= 0.85, "{o:?}"),
                (_, true) | (Which::Offline, false) => assert!(share >= 0.90, "{o:?}"),
                (_, false) => assert!(share < 0.5, "the workload no longer tells: {o:?}"),
            }
        }
    }
}

/// A grading model that reads: it answers a probe's gold value when the
/// messages it was shown hold it, and "unknown" otherwise (asserting the
/// request carries the instructions and the question).
struct ReadingGrader;

#[abridge::async_trait]
impl ModelClient for ReadingGrader {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        use abridge_testkit::probes;
        assert_eq!(req.model, "grader-model");
        let text = |m: &abridge::message::Message| match &m.content[..] {
            [abridge::message::ContentBlock::Text { text }] => text.clone(),
            other => panic!("not one text block: {other:?}"),
        };
        assert_eq!(text(&req.messages[0]), probes::GRADER_INSTRUCTIONS);
        let asked = text(&req.messages[1]);
        let (shown, question) = asked.rsplit_once("\n\nQuestion: ").unwrap();
        let p = probes::PROBES
            .iter()
            .find(|p| p.question == question)
            .expect("a probe's question");
        let escaped = serde_json::to_string(p.gold).unwrap();
        let answer = if shown.contains(&escaped[1..escaped.len() - 1]) {
            format!("It is {}.", p.gold)
        } else {
            "unknown".to_string()
        };
        Ok(ModelResponse {
            blocks: vec![ResponseBlock::Text { text: answer }],
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

/// Issue 32's optional model-graded mode: each checkpoint's messages and
/// each question go to the grading model, and its answers are scored (gold
/// and no stale value 2, both 1, none 0): with a grader that reads, the
/// offline summariser with the guard grades at least 90%, the lossy one
/// without it under half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_graded_mode_asks_each_question_about_what_the_model_saw() {
    use abridge_testkit::probes::{self, Grader};
    let p = &probes::PROBES[0];
    assert_eq!(probes::score_answer(p, &format!("In {}", p.gold)), 2);
    assert_eq!(probes::score_answer(p, "unknown"), 0);
    if let Some(stale) = p.stale.first() {
        assert_eq!(
            probes::score_answer(p, &format!("{} or {stale}", p.gold)),
            1
        );
    }
    let grader = Grader {
        client: Arc::new(ReadingGrader),
        model: "grader-model".into(),
    };
    for (which, guard) in [(Which::Offline, true), (Which::Lossy, false)] {
        let (_d, path) = common::temp_db();
        let o = probes::run_graded(&path, which, guard, &grader)
            .await
            .unwrap();
        assert_eq!(o.graded.len(), probes::CHECKPOINTS.len(), "{o:?}");
        let share = o.graded_share(20).unwrap();
        if guard {
            assert!(share >= 0.9, "{share}: {:?}", o.graded_missed);
        } else {
            assert!(share < 0.5, "{share}");
        }
    }
}
