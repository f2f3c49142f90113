//! The fidelity workload: what a session still knows after many compactions.
//!
//! A scripted session states [`FACTS`] early (a name, rules, a key name, a
//! path, an e-mail address, preferences, amounts, dates, ids; two of them
//! changed later), then runs long filler turns whose tool results are large
//! (the failed-transaction ids of a log batch), so that it compacts again
//! and again. At the last step, each fact counts as *visible* when its
//! current value is in the messages sent to the model, and *with its
//! sentence* when the sentence that stated it is there too.
//!
//! [`run`] measures one summariser, with the pins guard on or off; the
//! `fidelity` example prints the table of docs/fidelity.md, and
//! `crates/abridge-cli/tests/it/fidelity.rs` asserts its targets.

use crate::scripted;
use abridge::async_trait;
use abridge::compaction::{
    CompactionConfig, ExtractiveSummariser, Summariser, SummaryRequest, SummaryResponse, Threshold,
};
use abridge::error::Result;
use abridge::message::{ModelRequest, ModelResponse, ToolSpec, Usage};
use abridge::model::{ModelClient, ModelError};
use abridge::runner::{Runner, RunnerConfig};
use abridge::store::Store;
use abridge::tools::{Tool, ToolCall, ToolError, Tools};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// A fact the session states.
#[derive(Debug, Clone, Copy)]
pub struct StatedFact {
    /// Its kind, as the table groups them.
    pub kind: &'static str,
    /// What the user says.
    pub sentence: &'static str,
    /// The value that must stay visible.
    pub value: &'static str,
    /// A later turn's sentence that changes the value, and the new value
    /// (measured instead of `value`).
    pub changed_to: Option<(&'static str, &'static str)>,
}

const fn fact(kind: &'static str, sentence: &'static str, value: &'static str) -> StatedFact {
    StatedFact {
        kind,
        sentence,
        value,
        changed_to: None,
    }
}

/// The facts, stated one per turn at the start of the session.
pub const FACTS: &[StatedFact] = &[
    fact("name", "My name is Ana Lima.", "Ana Lima"),
    fact(
        "rule",
        "Never ship anything on a Sunday.",
        "Never ship anything on a Sunday.",
    ),
    fact(
        "key name",
        "The API token is in ACME_API_TOKEN.",
        "ACME_API_TOKEN",
    ),
    fact(
        "path",
        "Our config file is /srv/shop/config/orders.toml and nothing else.",
        "/srv/shop/config/orders.toml",
    ),
    fact(
        "e-mail",
        "Send every receipt to ana.lima@example.org please.",
        "ana.lima@example.org",
    ),
    fact(
        "preference",
        "My preferred carrier is DHL Express.",
        "DHL Express",
    ),
    fact(
        "preference",
        "My preferred language is Portuguese.",
        "Portuguese",
    ),
    StatedFact {
        kind: "amount",
        sentence: "My budget is 1,250 EUR.",
        value: "1,250 EUR",
        changed_to: Some(("Please change my budget to 1,400 EUR.", "1,400 EUR")),
    },
    fact("postcode", "My postal code is 75001.", "75001"),
    fact("id", "My order number is ORD-88213.", "ORD-88213"),
    fact("date", "The deadline is 2026-12-18.", "2026-12-18"),
    fact(
        "url",
        "You can follow it on https://track.example.org/p/88213 today.",
        "https://track.example.org/p/88213",
    ),
    fact(
        "rule",
        "Do not call me before 9am.",
        "Do not call me before 9am.",
    ),
    fact(
        "rule",
        "Only use recycled packaging.",
        "Only use recycled packaging.",
    ),
    fact("amount", "I already paid €310.50 as a deposit.", "€310.50"),
    StatedFact {
        kind: "preference",
        sentence: "My shoe size is EU 42.",
        value: "EU 42",
        changed_to: Some(("Please change my shoe size to EU 44.", "EU 44")),
    },
    fact("id", "My loyalty card is LC-4471-XZ.", "LC-4471-XZ"),
    fact(
        "address",
        "My shipping address is 12 Rue de Rivoli, 75001 Paris.",
        "12 Rue de Rivoli, 75001 Paris",
    ),
    fact(
        "name",
        "Your contact at the warehouse is Bruno Carvalho.",
        "Bruno Carvalho",
    ),
    fact(
        "rule",
        "Always confirm the total before charging my card.",
        "Always confirm the total before charging my card.",
    ),
    fact(
        "key name",
        "The region variable is SHOP_REGION.",
        "SHOP_REGION",
    ),
];

/// The summariser measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Which {
    /// The built-in offline summariser.
    Offline,
    /// Keeps the first 300 characters of what it is given.
    Lossy,
    /// The offline summariser, blind to the previous summary.
    IgnoresPrevious,
}

impl Which {
    /// All three.
    pub const ALL: [Which; 3] = [Which::Offline, Which::Lossy, Which::IgnoresPrevious];

    /// The name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Which::Offline => "offline (built-in)",
            Which::Lossy => "lossy (first 300 chars)",
            Which::IgnoresPrevious => "ignores the previous summary",
        }
    }

    pub(crate) fn summariser(self) -> Arc<dyn Summariser> {
        match self {
            Which::Offline => Arc::new(ExtractiveSummariser),
            Which::Lossy => Arc::new(Lossy),
            Which::IgnoresPrevious => Arc::new(IgnoresPrevious),
        }
    }
}

/// A deliberately lossy summariser: the first 300 characters of the previous
/// summary and the transcript.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lossy;

#[async_trait]
impl Summariser for Lossy {
    async fn summarise(
        &self,
        r: &SummaryRequest,
    ) -> std::result::Result<SummaryResponse, ModelError> {
        let all = format!("{}\n{}", r.previous.as_deref().unwrap_or(""), r.transcript);
        Ok(SummaryResponse {
            text: abridge::text::truncate_chars(all.trim(), 300),
            usage: Usage::default(),
        })
    }
    fn model(&self) -> Option<String> {
        Some("lossy-300".into())
    }
}

/// The offline summariser, given no previous summary.
#[derive(Debug, Clone, Copy, Default)]
pub struct IgnoresPrevious;

#[async_trait]
impl Summariser for IgnoresPrevious {
    async fn summarise(
        &self,
        r: &SummaryRequest,
    ) -> std::result::Result<SummaryResponse, ModelError> {
        let mut r = r.clone();
        r.previous = None;
        ExtractiveSummariser.summarise(&r).await
    }
    fn model(&self) -> Option<String> {
        Some("ignores-previous".into())
    }
}

/// The scripted model: a fact turn is acknowledged; a filler turn calls
/// `fetch_logs` once, then answers.
struct FidelityModel;

#[async_trait]
impl ModelClient for FidelityModel {
    async fn complete(&self, req: &ModelRequest) -> std::result::Result<ModelResponse, ModelError> {
        let last = scripted::last_content(req);
        if last.contains("tool_result") {
            return Ok(scripted::text(
                "I checked that batch: three transactions failed and are listed above.",
            ));
        }
        Ok(match scripted::number_after(&last, "batch ") {
            Some(n) => scripted::tool_use(format!("logs_{n}"), "fetch_logs", json!({"batch": n})),
            None => scripted::text("Noted, thank you."),
        })
    }
}

/// Returns a large log batch: 60 lines of transactions, the failed ones
/// with their ids.
struct FetchLogs;

#[async_trait]
impl Tool for FetchLogs {
    async fn call(&self, call: &ToolCall) -> std::result::Result<Value, ToolError> {
        let batch = call
            .input
            .get("batch")
            .and_then(Value::as_str)
            .unwrap_or("0");
        let lines: Vec<String> = (0..60)
            .map(|i| {
                if i % 20 == 7 {
                    format!(
                        "{batch}-{i:02} status=failed txn=tx_{batch}f{i:02} reason=card declined"
                    )
                } else {
                    format!(
                        "{batch}-{i:02} status=ok amount={}.{:02} hub=north-{}",
                        10 + i,
                        i * 7 % 100,
                        i % 9
                    )
                }
            })
            .collect();
        Ok(Value::String(lines.join("\n")))
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The summariser.
    pub summariser: Which,
    /// Whether the pins guard was on.
    pub guard: bool,
    /// Completed compactions.
    pub compactions: i64,
    /// Facts measured.
    pub facts: usize,
    /// Facts whose current value the model sees at the last step.
    pub visible: usize,
    /// Of those, the ones whose stating sentence it sees too.
    pub with_sentence: usize,
    /// By kind: (visible, total).
    pub by_kind: BTreeMap<String, (usize, usize)>,
    /// Values not visible at the last step.
    pub lost: Vec<String>,
    /// Failed-transaction ids the tool results named (three per batch).
    pub tool_ids: usize,
    /// Of those, the ones the model sees at the last step.
    pub tool_ids_visible: usize,
    /// Of those, the ones live at the last completed compaction (within
    /// its window, which the tools' other values mentioned again share).
    pub tool_ids_live: usize,
    /// Whether `verify` passed (G8 included).
    pub verified: bool,
    /// The window of facts mentioned in passing the last compaction
    /// carried (smaller than `pins_window` when they were folded to keep the
    /// pinned block within its share of the threshold).
    pub last_window: Option<i64>,
}

impl Outcome {
    /// Visible share, 0..=1.
    pub fn visible_share(&self) -> f64 {
        self.visible as f64 / self.facts.max(1) as f64
    }
    /// With-sentence share, 0..=1.
    pub fn sentence_share(&self) -> f64 {
        self.with_sentence as f64 / self.facts.max(1) as f64
    }
}

/// Filler turns after the facts (each with a ~2,500-char tool result).
pub const FILLER_TURNS: u64 = 40;

/// The compaction settings of the workload: 2,500 tokens, the recent turn
/// kept, compaction inline (so that every run compacts at the same turns and
/// the tables are the same on every machine).
pub fn config(guard: bool) -> CompactionConfig {
    let mut c = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(2_500))
        .with_keep_last_turns(1)
        .with_background(None);
    c.guard_pins = guard;
    c
}

/// The user's input of turn `t`.
pub fn user_turn(t: u64) -> String {
    let n = FACTS.len() as u64;
    if t < n {
        return FACTS[t as usize].sentence.to_string();
    }
    let changes: Vec<&str> = FACTS
        .iter()
        .filter_map(|f| f.changed_to.map(|c| c.0))
        .collect();
    let k = t - n;
    if k == 5 || k == 11 {
        let i = if k == 5 { 0 } else { 1 };
        if let Some(c) = changes.get(i) {
            return c.to_string();
        }
    }
    format!("Please check the logs of batch {k} for failed payments.")
}

/// Runs the workload on a new store at `path` with `which` summariser.
pub async fn run(path: &Path, which: Which, guard: bool) -> Result<Outcome> {
    let store = Store::open(path)?;
    let spec = ToolSpec {
        name: "fetch_logs".into(),
        description: "Fetches a batch of payment logs.".into(),
        input_schema: json!({"type": "object", "properties": {"batch": {"type": "string"}}}),
    };
    let cfg = RunnerConfig::default()
        .with_owner("fidelity")
        .with_compaction(config(guard));
    let runner = Runner::builder(store.clone(), Arc::new(FidelityModel))
        .tools(Tools::new().idempotent(spec, FetchLogs))
        .summariser_arc(which.summariser())
        .config(cfg)
        .build()?;
    let session = runner
        .create_session(
            "fidelity",
            "fidelity-model",
            "You help Ana with her orders.",
        )
        .await?;
    let turns = FACTS.len() as u64 + FILLER_TURNS;
    for t in 0..turns {
        runner.run_turn(session.id, &user_turn(t)).await?;
    }
    let sid = session.id;
    store
        .call(move |c| {
            let steps = abridge::inspect::executed_step_ids(c)?;
            let last = *steps.last().expect("steps ran");
            let seen = abridge::replay::rebuild_step(c, last)?;
            let seen = String::from_utf8_lossy(&seen.bytes).into_owned();
            let escaped = |s: &str| {
                let j = serde_json::to_string(s).unwrap_or_default();
                j[1..j.len() - 1].to_string()
            };
            let mut out = Outcome {
                summariser: which,
                guard,
                compactions: abridge::testing::session_counts(c, sid)?.compactions_completed,
                facts: FACTS.len(),
                visible: 0,
                with_sentence: 0,
                by_kind: BTreeMap::new(),
                lost: Vec::new(),
                tool_ids: 0,
                tool_ids_visible: 0,
                tool_ids_live: 0,
                verified: abridge::verify::verify(c)?.ok,
                last_window: None,
            };
            let last_completed = abridge::inspect::compactions(c, sid)?
                .into_iter()
                .rev()
                .find(|r| r.status == abridge::store::CompactionStatus::Completed);
            if let Some(row) = last_completed {
                out.last_window = row.pins_window;
                let window = row.pins_window.map_or(usize::MAX, |w| w as usize);
                out.tool_ids_live =
                    abridge::inspect::live_pins(c, sid, row.up_to_turn_index, window)?
                        .iter()
                        .filter(|p| p.value.starts_with("tx_"))
                        .count();
            }
            for batch in 0..FILLER_TURNS {
                // user_turn() spends two filler turns on changes.
                if batch == 5 || batch == 11 {
                    continue;
                }
                for i in [7, 27, 47] {
                    out.tool_ids += 1;
                    if seen.contains(&format!("tx_{batch}f{i:02}")) {
                        out.tool_ids_visible += 1;
                    }
                }
            }
            for f in FACTS {
                let (sentence, value) = f.changed_to.unwrap_or((f.sentence, f.value));
                let entry = out.by_kind.entry(f.kind.to_string()).or_default();
                entry.1 += 1;
                if seen.contains(&escaped(value)) {
                    out.visible += 1;
                    entry.0 += 1;
                    if seen.contains(&escaped(sentence)) {
                        out.with_sentence += 1;
                    }
                } else {
                    out.lost.push(value.to_string());
                }
            }
            Ok(out)
        })
        .await
}
