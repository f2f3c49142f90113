//! A long session that states one new fact in every turn: what a summary
//! and its pinned facts cost after hundreds of compactions (no thrash, a
//! pinned block that stays inside its share, no live rule or slot lost).
//!
//! Each turn's user message states one fact, in a rotation of kinds: a new
//! value for one of ten slots (the budget, the size, the carrier...), an
//! order id, a colleague's name, an amount, a date, an e-mail address, a
//! file path, a parcel the model looks up with a tool (whose result states a
//! tracking id), and every 60th turn a new rule; the model answers in a
//! sentence. At the default 8,000-token threshold with background
//! compaction off (deterministic), the session compacts every dozen turns or
//! so.

use crate::scripted;
use abridge::compaction::Summariser;
use abridge::{
    async_trait, CompactionConfig, ModelClient, ModelError, ModelRequest, ModelResponse, Result,
    Runner, RunnerConfig, Store, Threshold, Tool, ToolCall, ToolError, ToolSpec, Tools,
};
use serde::Serialize;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// The threshold of the workload (tokens).
pub const THRESHOLD: u64 = 8_000;

/// The ten slots the user changes, with a value for round `r`.
const SLOTS: [&str; 10] = [
    "budget",
    "shoe size",
    "deadline",
    "postcode",
    "colour",
    "carrier",
    "quantity",
    "delivery window",
    "phone",
    "gift message",
];

fn slot_value(slot: usize, r: u64) -> String {
    match slot {
        0 => format!("{} EUR", 900 + 25 * r),
        1 => format!("{}", 36 + r % 12),
        2 => format!("2027-{:02}-{:02}", 1 + r % 12, 1 + r % 28),
        3 => format!("{}", 10115 + 7 * r),
        4 => ["teal", "ochre", "slate", "plum", "sand", "moss"][(r % 6) as usize].to_string(),
        5 => ["DHL", "UPS", "GLS", "DPD", "Hermes"][(r % 5) as usize].to_string(),
        6 => format!("{}", 2 + r % 9),
        7 => format!("{}-{} h", 8 + r % 6, 12 + r % 6),
        8 => format!("+49 30 {}", 5550100 + r),
        _ => format!("Happy day {r}"),
    }
}

const FIRST: [&str; 8] = [
    "Bruno", "Carla", "Deniz", "Elif", "Farid", "Greta", "Hiro", "Ines",
];
const LAST: [&str; 7] = [
    "Carvalho",
    "Lindqvist",
    "Okafor",
    "Moreau",
    "Tanaka",
    "Novak",
    "Silva",
];
const CITIES: [&str; 6] = ["Lisbon", "Oslo", "Porto", "Riga", "Turin", "Ghent"];

/// What the user says in turn `t`: one new fact, and the kind it is.
pub fn user_turn(t: u64) -> (String, &'static str) {
    let name = |t: u64| {
        format!(
            "{} {}",
            FIRST[(t % 8) as usize],
            LAST[((t / 8) % 7) as usize]
        )
    };
    if t % 60 == 6 {
        let city = CITIES[((t / 60) % 6) as usize];
        return (
            format!(
                "One more rule: never route parcel group {} through {city}.",
                t / 60
            ),
            "rule",
        );
    }
    match t % 9 {
        0 | 5 => {
            let k = (t / 9) * 2 + u64::from(t % 9 == 5);
            let slot = (k % 10) as usize;
            let value = slot_value(slot, k / 10);
            (
                format!("Please change my {} to {value}.", SLOTS[slot]),
                "slot",
            )
        }
        1 => (
            format!(
                "Order ORD-{} came yesterday, the box was dented.",
                10_000 + t
            ),
            "id",
        ),
        2 => (
            format!("My colleague {} will sign for the next parcel.", name(t)),
            "name",
        ),
        3 => (
            format!("I paid €{}.50 for the lamp in that order.", 40 + t % 500),
            "amount",
        ),
        4 => (
            format!(
                "The invoice I got is dated 2026-{:02}-{:02}.",
                1 + t % 12,
                1 + t % 28
            ),
            "date",
        ),
        6 => (
            format!("Please copy desk{t}@example.org on the invoice."),
            "email",
        ),
        7 => (
            format!("The receipt scan is in /home/ana/receipts/r{t}.pdf for you."),
            "path",
        ),
        _ => (format!("Where is parcel {t} right now?"), "tool"),
    }
}

/// The scripted model: a parcel question is looked up with `track`; every
/// other turn is acknowledged in a sentence.
struct LongModel;

#[async_trait]
impl ModelClient for LongModel {
    async fn complete(&self, req: &ModelRequest) -> std::result::Result<ModelResponse, ModelError> {
        let last = scripted::last_content(req);
        if last.contains("tool_result") {
            return Ok(scripted::text(
                "The parcel is on its way; its tracking id is in the result above, and I will \
                 tell you when it reaches the hub.",
            ));
        }
        Ok(match scripted::number_after(&last, "Where is parcel ") {
            Some(n) => scripted::tool_use(format!("track_{n}"), "track", json!({"parcel": n})),
            None => scripted::text(
                "Noted. I have recorded that for your account and will use it from now on. \
             Everything else on the order stays as it was: the items, the invoice address \
             and the way you asked to be contacted. If the warehouse needs anything more \
             from you before the parcel leaves, I will ask here first, and I will not \
             change anything you have not confirmed. Deliveries in your area usually take \
             two to four working days once the parcel has been handed to the carrier, and \
             the tracking page updates after each scan. Tell me if anything else changes.",
            ),
        })
    }
}

/// The tracking tool: a few lines about the parcel, with its tracking id.
struct Track;

#[async_trait]
impl Tool for Track {
    async fn call(&self, call: &ToolCall) -> std::result::Result<Value, ToolError> {
        let n = call
            .input
            .get("parcel")
            .and_then(Value::as_str)
            .unwrap_or("0");
        Ok(Value::String(format!(
            "parcel {n}: tracking id TRK{n}Z9, status in transit, hub north-3, \
             last scan 06:40, next scan expected within 12 h, signature required"
        )))
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Turns run.
    pub turns: u64,
    /// Completed compactions.
    pub compactions: usize,
    /// The context of each first step after a compaction, as a share of the
    /// threshold: the largest.
    pub max_first_step_share: f64,
    /// The same, the mean.
    pub mean_first_step_share: f64,
    /// Compactions whose boundary is one turn after the previous one's,
    /// after the first 50 turns.
    pub consecutive_after_50: usize,
    /// The longest stored summary (chars), and the pinned block in it.
    pub max_summary_chars: usize,
    /// The longest pinned block (chars).
    pub max_block_chars: usize,
    /// Live rules and slots at the last step's compaction, and how many of
    /// them the model sees (their current value) at the last step.
    pub rules_and_slots: usize,
    /// Of those, the ones visible at the last step.
    pub rules_and_slots_visible: usize,
    /// Values of live rules and slots not visible.
    pub lost: Vec<String>,
    /// Whether `verify` passed.
    pub verified: bool,
}

/// Runs `turns` turns on a new store at `path` with `summariser` and the
/// default configuration at [`THRESHOLD`] (background compaction off).
pub async fn run(
    path: &Path,
    turns: u64,
    summariser: Arc<dyn Summariser>,
    configure: impl FnOnce(CompactionConfig) -> CompactionConfig,
) -> Result<Outcome> {
    let store = Store::open(path)?;
    let spec = ToolSpec {
        name: "track".into(),
        description: "Where a parcel is.".into(),
        input_schema: json!({"type": "object", "properties": {"parcel": {"type": "string"}}}),
    };
    let compaction = configure(
        CompactionConfig::default()
            .with_compact_at(Threshold::Tokens(THRESHOLD))
            .with_background(None),
    );
    let cfg = RunnerConfig::default()
        .with_owner("long-session")
        .with_compaction(compaction);
    let runner = Runner::builder(store.clone(), Arc::new(LongModel))
        .tools(Tools::new().idempotent(spec, Track))
        .summariser_arc(summariser)
        .config(cfg)
        .build()?;
    let session = runner
        .create_session(
            "long",
            "long-model",
            "You help Ana with her orders and deliveries.",
        )
        .await?;
    for t in 0..turns {
        runner.run_turn(session.id, &user_turn(t).0).await?;
    }
    let sid = session.id;
    store
        .call(move |c| {
            let compactions: Vec<abridge::store::CompactionRow> =
                abridge::inspect::compactions(c, sid)?
                    .into_iter()
                    .filter(|r| r.status == abridge::store::CompactionStatus::Completed)
                    .collect();
            let mut shares = Vec::new();
            for r in &compactions {
                let first: Option<i64> = c.query_row(
                    "SELECT context_tokens FROM steps WHERE compaction_id = ?1 \
                     AND context_tokens IS NOT NULL ORDER BY id LIMIT 1",
                    [r.id.0],
                    |row| row.get(0),
                )?;
                if let Some(tokens) = first {
                    shares.push(tokens as f64 / THRESHOLD as f64);
                }
            }
            let consecutive_after_50 = compactions
                .windows(2)
                .filter(|w| w[1].up_to_turn_index > 50)
                .filter(|w| w[1].up_to_turn_index - w[0].up_to_turn_index <= 1)
                .count();
            let block_of = |s: &str| {
                s.find(abridge::pins::BLOCK_HEADING)
                    .map_or(0, |i| s[i..].chars().count())
            };
            let summaries: Vec<&str> = compactions
                .iter()
                .filter_map(|r| r.summary.as_deref())
                .collect();
            let steps = abridge::inspect::executed_step_ids(c)?;
            let last = *steps.last().expect("steps ran");
            let seen = abridge::replay::rebuild_step(c, last)?;
            let seen = String::from_utf8_lossy(&seen.bytes).into_owned();
            let boundary = compactions.last().map_or(-1, |r| r.up_to_turn_index);
            let pins = abridge::inspect::live_pins(c, sid, boundary, usize::MAX)?;
            let escaped = |s: &str| {
                let j = serde_json::to_string(s).unwrap_or_default();
                j[1..j.len() - 1].to_string()
            };
            let held: Vec<&abridge::pins::Pin> = pins
                .iter()
                .filter(|p| p.slot.is_some() || p.kind == abridge::pins::FactKind::Rule)
                .collect();
            let lost: Vec<String> = held
                .iter()
                .filter(|p| !seen.contains(&escaped(&p.value)))
                .map(|p| p.value.clone())
                .collect();
            Ok(Outcome {
                turns,
                compactions: compactions.len(),
                max_first_step_share: shares.iter().copied().fold(0.0, f64::max),
                mean_first_step_share: shares.iter().sum::<f64>() / shares.len().max(1) as f64,
                consecutive_after_50,
                max_summary_chars: summaries
                    .iter()
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0),
                max_block_chars: summaries.iter().map(|s| block_of(s)).max().unwrap_or(0),
                rules_and_slots: held.len(),
                rules_and_slots_visible: held.len() - lost.len(),
                lost,
                verified: abridge::verify::verify(c)?.ok,
            })
        })
        .await
}
