//! The scripted customer-support workload behind `abridge demo` and `abridge chaos`.
//!
//! Everything here is deterministic for a seed: the users' turns, the model's
//! answers (a pure function of the request it is sent), the tools' results, and
//! the offline summariser. A run killed at any point and run again produces the
//! same transcript as a run that was never interrupted.

use crate::demo_tables::{append_effect, append_external, DemoTable};
use abridge::async_trait;
use abridge::compaction::{ExtractiveSummariser, Summariser, SummaryRequest, SummaryResponse};
use abridge::message::{
    ContentBlock, ModelRequest, ModelResponse, ResponseBlock, Role, ToolSpec, Usage,
};
use abridge::model::{ModelClient, ModelError};
use abridge::tools::{Tool, ToolCall, ToolError, Tools, TransactionalTool};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// splitmix64: a tiny, well-mixed deterministic generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Picks one element.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// FNV-1a of some strings and a seed: a stable hash for deriving decisions.
pub fn stable_hash(seed: u64, parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for p in parts {
        for b in p.as_bytes() {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

const NAMES: &[&str] = &[
    "Ana", "Bruno", "Chen", "Dara", "Emeka", "Fatima", "Goran", "Hana", "Ines", "Jonas",
];
const PRODUCTS: &[&str] = &[
    "trail shoes",
    "rain jacket",
    "wool sweater",
    "desk lamp",
    "backpack",
    "kettle",
];
const SIZES: &[&str] = &["XS", "S", "M", "L", "XL", "42", "44"];
const DATES: &[&str] = &[
    "2026-12-03",
    "2026-12-09",
    "2026-12-14",
    "2026-12-20",
    "2027-01-05",
];

/// The system prompt of every demo session.
pub const SYSTEM_PROMPT: &str =
    "You are a customer-support agent for an online shop. Look orders up \
before answering, quote shipping before promising a date, and confirm every change you place.";

/// The model name demo sessions use.
pub const DEMO_MODEL: &str = "scripted-support-1";

/// The user's input for turn `idx` of session `session` (pure in seed/session/idx).
pub fn user_turn(seed: u64, session: u64, idx: u64) -> String {
    let mut r = Rng::new(stable_hash(seed, &[&session.to_string(), &idx.to_string()]));
    let name = NAMES[(stable_hash(seed, &[&session.to_string()]) % NAMES.len() as u64) as usize];
    let order = format!(
        "ORD-{}",
        10_000 + stable_hash(seed, &[&session.to_string(), "order"]) % 90_000
    );
    let postcode = format!("{:05}", r.below(99_999));
    let size = r.pick(SIZES);
    let product = r.pick(PRODUCTS);
    let budget = 20 + r.below(480);
    let date = r.pick(DATES);
    match (idx, r.below(6)) {
        (0, _) => format!(
            "Hi, I'm {name}. My order number is {order}. Can you tell me where it is?"
        ),
        (_, 0) => format!("Could you check if you deliver to postal code {postcode} for {order}?"),
        (_, 1) => format!("Please change the size on {order} to {size}; I need it by {date}."),
        (_, 2) => format!(
            "How much would shipping to postal code {postcode} cost for {order}? My budget is {budget} EUR."
        ),
        (_, 3) => format!("I'd also like to add a {product} to {order}, size {size}, under {budget} EUR."),
        (_, 4) => format!("Thanks. Just to confirm, what did we agree for {order} so far?"),
        _ => format!("Can you change the delivery date of {order} to {date} and ship to postal code {postcode}?"),
    }
}

fn find(input: &str, prefix: &str, len: usize) -> Option<String> {
    let i = input.find(prefix)?;
    let rest = &input[i + prefix.len()..];
    let v: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(len)
        .collect();
    (!v.is_empty()).then_some(v)
}

/// A tool call planned by the scripted model.
type Planned = (String, Value);

/// What the scripted model does for a turn input: steps of tool calls.
fn plan(input: &str) -> Vec<Vec<Planned>> {
    let order = find(input, "ORD-", 5).map(|o| format!("ORD-{o}"));
    let postcode = find(input, "postal code ", 5);
    let size = find(input, "size on ", 0)
        .or_else(|| find(input, " to ", 3).filter(|s| SIZES.contains(&s.as_str())));
    let date = DATES
        .iter()
        .find(|d| input.contains(*d))
        .map(|d| d.to_string());
    let Some(order) = order else {
        return Vec::new();
    };
    let mut steps: Vec<Vec<Planned>> = Vec::new();
    let mut first = vec![("lookup_order".to_string(), json!({"order_id": order}))];
    if let Some(pc) = &postcode {
        first.push(("check_postcode".into(), json!({"postcode": pc})));
    }
    steps.push(first);
    let lower = input.to_lowercase();
    let mut second = Vec::new();
    if let Some(pc) = &postcode {
        if lower.contains("cost") || lower.contains("ship") || lower.contains("deliver") {
            second.push((
                "quote_shipping".to_string(),
                json!({"order_id": order, "postcode": pc}),
            ));
        }
    }
    if lower.contains("change") || lower.contains("add") {
        let change = match (&size, &date) {
            (Some(s), _) if lower.contains("size") => {
                json!({"order_id": order, "field": "size", "value": s})
            }
            (_, Some(d)) => json!({"order_id": order, "field": "delivery_date", "value": d}),
            _ => json!({"order_id": order, "field": "items", "value": "+1"}),
        };
        second.push(("place_change".to_string(), change));
    }
    if !second.is_empty() {
        steps.push(second);
    }
    steps
}

/// The deterministic model of the demo: its answer is a pure function of the
/// request, so a repeated call after a crash gets the same answer.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    /// Seed for the phrasing.
    pub seed: u64,
    /// Simulated latency per call.
    pub latency: Duration,
    /// Whether usage is reported (otherwise abridge estimates).
    pub report_usage: bool,
    /// Extra tools the model may call in a turn's first step, after its
    /// transactional calls, by name (for the chaos workload: an idempotent and
    /// an at-most-once tool).
    pub extra_tools: Vec<String>,
}

impl ScriptedModel {
    /// A model for `seed` with no latency that reports usage.
    pub fn new(seed: u64) -> ScriptedModel {
        ScriptedModel {
            seed,
            latency: Duration::ZERO,
            report_usage: true,
            extra_tools: Vec::new(),
        }
    }

    /// The pure answer to a request.
    pub fn respond(&self, req: &ModelRequest) -> ModelResponse {
        let msgs = &req.messages;
        let user_at = msgs.iter().rposition(|m| {
            m.role == Role::User
                && matches!(m.content.first(), Some(ContentBlock::Text { text }) if !text.starts_with("[Summary of"))
        });
        let (input, after) = match user_at {
            Some(i) => match &msgs[i].content[0] {
                ContentBlock::Text { text } => (text.as_str(), &msgs[i + 1..]),
                _ => ("", &msgs[0..0]),
            },
            None => ("", &msgs[0..0]),
        };
        let done = after.iter().filter(|m| m.role == Role::Assistant).count();
        let mut steps = plan(input);
        if !self.extra_tools.is_empty() && !steps.is_empty() {
            let key = stable_hash(self.seed, &[input]);
            let extra: Vec<Planned> = self
                .extra_tools
                .iter()
                .enumerate()
                .filter(|(i, _)| (key >> i) & 1 == 1)
                .map(|(_, name)| {
                    (
                        name.clone(),
                        json!({"ref": format!("{:x}", key & 0xffff), "text": input.len()}),
                    )
                })
                .collect();
            // After the first step's transactional calls, in the same step: the
            // step then commits its response and those calls before the outside
            // calls happen, and a crash during them resumes a step whose first
            // calls are already completed (never to be run again).
            steps[0].extend(extra);
        }
        let input_tokens: u64 = msgs
            .iter()
            .map(|m| {
                4 + m
                    .content
                    .iter()
                    .map(|b| match b {
                        ContentBlock::Text { text } => text.chars().count() as u64,
                        ContentBlock::ToolResult { content, .. } => content.chars().count() as u64,
                        ContentBlock::ToolUse { input, .. } => input.to_string().len() as u64,
                        ContentBlock::Data { value } => value.to_string().len() as u64,
                        ContentBlock::Thinking { thinking, .. } => thinking.chars().count() as u64,
                        ContentBlock::RedactedThinking { data } => data.len() as u64,
                    })
                    .sum::<u64>()
                    / 4
            })
            .sum();
        let blocks = if done < steps.len() {
            let mut b = vec![ResponseBlock::Text {
                text: "Let me check that for you.".into(),
            }];
            for (j, (name, args)) in steps[done].iter().enumerate() {
                b.push(ResponseBlock::ToolUse {
                    id: format!("call_{done}_{j}"),
                    name: name.clone(),
                    input: args.clone(),
                    raw_input: None,
                });
            }
            b
        } else {
            vec![ResponseBlock::Text {
                text: final_answer(self.seed, input, after),
            }]
        };
        ModelResponse {
            blocks,
            usage: if self.report_usage {
                Usage {
                    input_tokens: Some(input_tokens),
                    output_tokens: Some(20),
                    ..Default::default()
                }
            } else {
                Usage::default()
            },
            ..Default::default()
        }
    }
}

fn final_answer(seed: u64, input: &str, after: &[abridge::message::Message]) -> String {
    let mut facts = Vec::new();
    for m in after {
        for b in &m.content {
            if let ContentBlock::ToolResult {
                content, is_error, ..
            } = b
            {
                if *is_error {
                    facts.push(format!(
                        "one check failed ({})",
                        abridge::compaction::truncate_chars(content, 60)
                    ));
                } else if let Ok(v) = serde_json::from_str::<Value>(content) {
                    if let Some(s) = v.get("status").and_then(Value::as_str) {
                        facts.push(format!("status {s}"));
                    }
                    if let Some(p) = v.get("price_eur") {
                        facts.push(format!("shipping {p} EUR"));
                    }
                    if let Some(c) = v.get("confirmation").and_then(Value::as_str) {
                        facts.push(format!("I have placed the change, confirmation {c}"));
                    }
                    if let Some(d) = v.get("eta").and_then(Value::as_str) {
                        facts.push(format!("I will have it delivered by {d}"));
                    }
                }
            }
        }
    }
    let opener = ["Thanks for waiting.", "Here is what I found.", "All set."]
        [(stable_hash(seed, &[input]) % 3) as usize];
    if facts.is_empty() {
        format!("{opener} Could you give me your order number so I can look it up?")
    } else {
        format!("{opener} {}.", facts.join("; "))
    }
}

#[async_trait]
impl ModelClient for ScriptedModel {
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        } else {
            // A real model call is network I/O: it always lets the runtime
            // run its other tasks (a background summary among them). An
            // instant answer that never yields would keep a session's turns
            // running back to back on its worker, the summary waiting.
            tokio::task::yield_now().await;
        }
        Ok(self.respond(request))
    }
}

/// The offline summariser with simulated latency.
#[derive(Debug, Clone, Default)]
pub struct SlowSummariser {
    /// Simulated latency per call.
    pub latency: Duration,
}

#[async_trait]
impl Summariser for SlowSummariser {
    async fn summarise(&self, request: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        ExtractiveSummariser.summarise(request).await
    }
    fn model(&self) -> Option<String> {
        ExtractiveSummariser.model()
    }
}

/// The result of a demo tool (pure in its arguments).
pub fn tool_result(name: &str, args: &Value) -> Result<Value, ToolError> {
    let s = |k: &str| {
        args.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let h = stable_hash(7, &[name, &args.to_string()]);
    match name {
        "lookup_order" => {
            let order = s("order_id");
            let status = ["processing", "shipped", "in transit", "delivered"][(h % 4) as usize];
            let n_items = 1 + (h >> 8) % 3;
            // One lookup in eight returns a long history (several KB).
            let events = if (h >> 16).is_multiple_of(8) { 60 } else { 3 };
            let history: Vec<Value> = (0..events)
                .map(|i| json!({"at": format!("2026-11-{:02}T{:02}:00Z", 1 + i % 28, i % 24), "event": format!("scan at hub {} ({})", (h >> (i % 48)) % 97, order)}))
                .collect();
            Ok(json!({"order_id": order, "status": status, "items": n_items, "history": history}))
        }
        "check_postcode" => {
            let pc = s("postcode");
            if pc.len() != 5 {
                return Err(ToolError::new(format!("invalid postal code {pc:?}")));
            }
            Ok(json!({"postcode": pc, "deliverable": !h.is_multiple_of(5), "zone": 1 + h % 4}))
        }
        "quote_shipping" => Ok(json!({
            "order_id": s("order_id"), "postcode": s("postcode"),
            "price_eur": format!("{}.{:02}", 4 + h % 20, (h >> 8) % 100),
            "eta": DATES[((h >> 4) % DATES.len() as u64) as usize],
        })),
        "place_change" => Ok(json!({
            "order_id": s("order_id"), "field": s("field"), "value": s("value"),
            "confirmation": format!("CHG-{}", 100_000 + h % 900_000),
        })),
        "notify_customer" => Ok(json!({"sent": true, "ref": s("ref")})),
        "charge_card" => Ok(json!({"charged": true, "receipt": format!("RCP-{}", h % 1_000_000)})),
        other => Err(ToolError::new(format!("no such demo tool {other}"))),
    }
}

/// A transactional demo tool: appends its effect to `demo_effects` in the
/// invocation's transaction.
#[derive(Debug, Clone)]
pub struct DemoTxTool(pub &'static str);

impl TransactionalTool for DemoTxTool {
    fn call(
        &self,
        tx: &abridge::store::Transaction<'_>,
        call: &ToolCall,
    ) -> Result<Value, ToolError> {
        let result = tool_result(self.0, &call.input)?;
        append_effect(
            tx,
            DemoTable::Effects,
            &call.idempotency_key,
            self.0,
            &call.input.to_string(),
        )
        .map_err(|e| ToolError::new(e.to_string()))?;
        Ok(result)
    }

    fn may_block(&self) -> bool {
        false // one INSERT on its transaction
    }
}

/// Where the outside-service tools write their effects: the store's own
/// database (its `demo_external` table), on a connection of their own.
#[derive(Debug, Clone)]
pub struct OutsideService {
    /// The database file (or server URL).
    pub db: PathBuf,
    /// The key of an encrypted store.
    pub key: Option<abridge::store::Key>,
}

/// An outside-service demo tool (idempotent or at-most-once): appends its
/// effect to `demo_external` on its own connection.
#[derive(Debug, Clone)]
pub struct DemoExternalTool {
    /// Tool name.
    pub name: &'static str,
    /// Where it writes.
    pub service: OutsideService,
    /// Simulated latency.
    pub latency: Duration,
}

#[async_trait]
impl Tool for DemoExternalTool {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let result = tool_result(self.name, &call.input)?;
        let (service, key, name, args) = (
            self.service.clone(),
            call.idempotency_key.clone(),
            self.name,
            call.input.to_string(),
        );
        tokio::task::spawn_blocking(move || -> abridge::error::Result<()> {
            let mut conn = abridge::testing::connect(&service.db, service.key.as_ref())?;
            append_external(&mut conn, &key, name, &args)
        })
        .await
        .map_err(|e| ToolError::new(e.to_string()))?
        .map_err(|e| ToolError::new(e.to_string()))?;
        Ok(result)
    }
}

fn spec(name: &str, description: &str, props: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: json!({"type": "object", "properties": props}),
    }
}

/// The demo's tools (all transactional), plus, with an outside service, the
/// chaos workload's idempotent `notify_customer` and at-most-once
/// `charge_card`.
pub fn demo_tools(outside: Option<OutsideService>, latency: Duration) -> Tools {
    let str_prop = json!({"type": "string"});
    let mut t = Tools::new()
        .transactional(
            spec(
                "lookup_order",
                "Look up an order by id",
                json!({"order_id": str_prop}),
            ),
            DemoTxTool("lookup_order"),
        )
        .transactional(
            spec(
                "check_postcode",
                "Check that a postal code is deliverable",
                json!({"postcode": str_prop}),
            ),
            DemoTxTool("check_postcode"),
        )
        .transactional(
            spec(
                "quote_shipping",
                "Quote shipping for an order to a postal code",
                json!({"order_id": str_prop, "postcode": str_prop}),
            ),
            DemoTxTool("quote_shipping"),
        )
        .transactional(
            spec(
                "place_change",
                "Change a field of an order",
                json!({"order_id": str_prop, "field": str_prop, "value": str_prop}),
            ),
            DemoTxTool("place_change"),
        );
    if let Some(service) = outside {
        t = t
            .idempotent(
                spec(
                    "notify_customer",
                    "Send the customer a notification",
                    json!({"ref": str_prop}),
                ),
                DemoExternalTool {
                    name: "notify_customer",
                    service: service.clone(),
                    latency,
                },
            )
            .at_most_once(
                spec(
                    "charge_card",
                    "Charge the customer's card",
                    json!({"ref": str_prop}),
                ),
                DemoExternalTool {
                    name: "charge_card",
                    service,
                    latency,
                },
            );
    }
    t
}

/// The external id of demo session `i`.
pub fn session_external_id(seed: u64, i: u64) -> String {
    format!("demo-{seed}-{i}")
}

/// Options of a demo run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Database file.
    pub db: PathBuf,
    /// Sessions, run concurrently.
    pub sessions: u64,
    /// Turns per session.
    pub turns: u64,
    /// Compaction threshold.
    pub compact_at: abridge::compaction::Threshold,
    /// Seed of the script.
    pub seed: u64,
    /// Simulated model latency.
    pub model_latency: Duration,
    /// Simulated summariser latency.
    pub summary_latency: Duration,
    /// Lease owner identity; None: this process (a rerun after a kill takes the
    /// dead process's leases over at once).
    pub owner: Option<String>,
    /// Background compaction (the default); false compacts inline only, so
    /// that a run's transcript is the same whatever the timing.
    pub background: bool,
    /// The key of an encrypted store (see [`abridge::store::Key`]).
    pub key: Option<abridge::store::Key>,
    /// Tools whose calls wait for a decision (`abridge approve`/`reject`):
    /// a session stops at its first such call; a run with the same options
    /// resumes every turn whose calls were decided.
    pub require_approval: Vec<String>,
    /// The verbatim tail as a share of the threshold
    /// (`CompactionConfig::keep_recent_share`); None: the default.
    pub keep_recent_share: Option<f64>,
    /// OpenTelemetry spans and metrics of the demo's runner.
    pub telemetry: Option<abridge::telemetry::Telemetry>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            db: PathBuf::from("abridge-demo.db"),
            sessions: 3,
            turns: 40,
            compact_at: abridge::compaction::Threshold::Tokens(4_000),
            seed: 42,
            model_latency: Duration::ZERO,
            summary_latency: Duration::ZERO,
            owner: None,
            background: true,
            key: None,
            require_approval: Vec::new(),
            keep_recent_share: None,
            telemetry: None,
        }
    }
}

/// One finished turn, for progress output.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Progress {
    /// Session external id.
    pub session: String,
    /// Turn index.
    pub turn: i64,
    /// Steps it took.
    pub steps: i64,
    /// Context tokens of its last step.
    pub context_tokens: Option<i64>,
    /// Completed compactions of the session so far.
    pub compactions: i64,
}

/// One compaction, for the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompactionFigure {
    /// Session external id.
    pub session: String,
    /// Boundary.
    pub up_to_turn: i64,
    /// Status.
    pub status: String,
    /// Tokens replaced.
    pub tokens_before: Option<i64>,
    /// Tokens of the summary.
    pub tokens_after: Option<i64>,
    /// Live pins it carries (G8).
    pub pins_live: Option<i64>,
    /// Of those, the ones the guard appended.
    pub pins_added: Option<i64>,
    /// Summarised in the background.
    pub background: bool,
}

/// The figures of a demo run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoReport {
    /// Sessions.
    pub sessions: i64,
    /// Tool calls that wait for a decision (`--require-approval`).
    pub calls_waiting: i64,
    /// Tool calls that waited and were decided.
    pub calls_decided: i64,
    /// Sessions parked at a call that waits.
    pub sessions_parked: i64,
    /// Turns.
    pub turns: i64,
    /// Turns failed by policy.
    pub turns_failed: i64,
    /// Steps.
    pub steps: i64,
    /// Tool calls.
    pub tool_calls: i64,
    /// Compactions completed.
    pub compactions_completed: i64,
    /// Compactions failed.
    pub compactions_failed: i64,
    /// Of the completed ones, those summarised in the background.
    pub compactions_background: i64,
    /// Steps that waited for a summary before their model call.
    pub steps_waited_for_summary: i64,
    /// Their waits, summed (ms).
    pub summary_wait_ms: i64,
    /// Per compaction.
    pub compactions: Vec<CompactionFigure>,
    /// Facts pinned (every value stated, superseded ones included).
    pub pins: i64,
    /// Pins live now (the newest value of each slot, and every fact without one).
    pub pins_live: i64,
    /// Live pins carried by each session's newest summary, summed.
    pub pins_carried: i64,
    /// Of those, the ones the guard appended because the summariser's text lacked them.
    pub pins_added: i64,
    /// Wall time, seconds.
    pub wall_seconds: f64,
    /// The database file.
    pub db: String,
}

/// How long the demo keeps retrying one call that fails with resumable errors
/// in a row (busy or locked store, a pool timeout, a lost server connection,
/// a lease another live process holds) before it gives up with the last one.
pub const DEMO_PATIENCE: Duration = Duration::from_secs(120);

/// Calls `f` until it returns anything but a resumable error, pausing between
/// tries (20 ms doubling to 1 s), for at most [`DEMO_PATIENCE`] of failures
/// in a row. What the demo does with every store or runner call: the errors
/// about the moment are waited out, never the end of the run.
async fn patiently<T, F, Fut>(mut f: F) -> abridge::error::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = abridge::error::Result<T>>,
{
    // tokio's clock: a paused test runtime moves it.
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        match f().await {
            Err(e) if e.is_resumable() && started.elapsed() < DEMO_PATIENCE => {
                tracing::debug!(error = %e, "demo: retrying after a resumable error");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// The demo runner for `opts` over `store`.
pub fn demo_runner(
    store: &abridge::store::Store,
    opts: &DemoOptions,
) -> abridge::error::Result<abridge::runner::Runner> {
    let mut cfg = abridge::RunnerConfig::default();
    if let Some(o) = &opts.owner {
        cfg.owner = o.clone();
    } else {
        cfg.owner = abridge::owner::process_owner("demo");
    }
    cfg.compaction = abridge::compaction::CompactionConfig::default()
        .with_compact_at(opts.compact_at)
        .with_context_window(DEMO_MODEL, 32_000);
    if !opts.background {
        cfg.compaction.background = None;
    }
    if let Some(share) = opts.keep_recent_share {
        cfg.compaction.keep_recent_share = Some(share);
    }
    cfg.testing = crate::sabotage::apply(cfg.testing);
    let mut model = ScriptedModel::new(opts.seed);
    model.latency = opts.model_latency;
    if !opts.require_approval.is_empty() {
        cfg.approval = abridge::Approval::tools(opts.require_approval.iter().cloned());
    }
    let mut builder = abridge::runner::Runner::builder(store.clone(), std::sync::Arc::new(model))
        .tools(demo_tools(None, Duration::ZERO))
        .summariser(SlowSummariser {
            latency: opts.summary_latency,
        })
        .config(cfg);
    if let Some(t) = &opts.telemetry {
        builder = builder.telemetry(t.clone().provider_name("abridge-demo"));
    }
    builder.build()
}

/// Runs (or resumes) the demo: `sessions` sessions of `turns` scripted turns,
/// concurrently. Calls `progress` after each turn.
pub async fn run_demo(
    opts: &DemoOptions,
    progress: impl Fn(&Progress) + Send + Sync + 'static,
) -> abridge::error::Result<DemoReport> {
    let started = std::time::Instant::now();
    let store_options = match &opts.key {
        Some(k) => abridge::store::StoreOptions::default().with_key(k.clone()),
        None => abridge::store::StoreOptions::default(),
    };
    let store = abridge::store::Store::open_with(&opts.db, store_options)?;
    store.with_conn(crate::demo_tables::create_demo_tables)?;
    let runner = demo_runner(&store, opts)?;
    let progress = std::sync::Arc::new(progress);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..opts.sessions {
        let (runner, progress, seed, turns) =
            (runner.clone(), progress.clone(), opts.seed, opts.turns);
        tasks.spawn(async move {
            let ext = session_external_id(seed, i);
            let session =
                patiently(|| runner.create_session(&ext, DEMO_MODEL, SYSTEM_PROMPT)).await?;
            for t in 0..turns {
                let input = user_turn(seed, i, t);
                let out = match patiently(|| runner.run_turn_at(session.id, t as i64, &input)).await
                {
                    Ok(o) => Some(o),
                    Err(abridge::error::Error::TurnFinished { .. }) => None, // failed by policy
                    // The session was deleted under the demo: it stops.
                    Err(
                        e @ (abridge::error::Error::SessionDeleted { .. }
                        | abridge::error::Error::TurnDeleted { .. }),
                    ) => return Err(e),
                    Err(e) if !e.is_resumable() => None,
                    Err(e) => return Err(e),
                };
                // Parked at a call that waits for a decision: the session
                // stops here until a run after the decision.
                let parked = out.as_ref().is_some_and(|o| o.is_parked());
                let sid = session.id;
                let counts = patiently(|| {
                    runner
                        .store()
                        .call(move |c| abridge::testing::session_counts(c, sid))
                })
                .await?;
                progress(&Progress {
                    session: ext.clone(),
                    turn: t as i64,
                    steps: out.map_or(0, |o| o.steps),
                    context_tokens: counts.context_tokens,
                    compactions: counts.compactions_completed,
                });
                if parked {
                    break;
                }
            }
            Ok::<_, abridge::error::Error>(())
        });
    }
    // Every task is awaited, even after one fails: none is left to be dropped
    // by the runtime's shutdown in the middle of a store call.
    let mut failed = None;
    while let Some(r) = tasks.join_next().await {
        let r = match r {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => continue,
            Err(e) => Err(abridge::error::Error::Task(e.to_string())),
        };
        if let Err(e) = r {
            if failed.is_none() {
                failed = Some(e);
                tasks.abort_all();
            }
        }
    }
    if let Some(e) = failed {
        runner.finish_background().await;
        return Err(e);
    }
    // The summaries still being made in the background, finished before the
    // report (a run killed before this leaves them to the next one).
    runner.finish_background().await;
    let seed = opts.seed;
    let n = opts.sessions;
    let mut report = store
        .call(move |c| {
            let mut rep = DemoReport {
                sessions: 0,
                turns: 0,
                turns_failed: 0,
                steps: 0,
                tool_calls: 0,
                compactions_completed: 0,
                compactions_failed: 0,
                compactions_background: 0,
                steps_waited_for_summary: 0,
                summary_wait_ms: 0,
                compactions: Vec::new(),
                pins: 0,
                pins_live: 0,
                pins_carried: 0,
                pins_added: 0,
                calls_waiting: 0,
                calls_decided: 0,
                sessions_parked: 0,
                wall_seconds: 0.0,
                db: String::new(),
            };
            for i in 0..n {
                let ext = session_external_id(seed, i);
                let Some(s) = abridge::testing::find_session(c, &ext)? else {
                    continue;
                };
                let k = abridge::testing::session_counts(c, s.id)?;
                rep.sessions += 1;
                rep.turns += k.turns;
                rep.turns_failed += k.turns_failed;
                rep.steps += k.steps;
                rep.tool_calls += k.tool_calls;
                rep.compactions_completed += k.compactions_completed;
                rep.compactions_failed += k.compactions_failed;
                let (waited, wait_ms) = abridge::testing::summary_waits(c, s.id)?;
                rep.steps_waited_for_summary += waited;
                rep.summary_wait_ms += wait_ms;
                rep.pins += abridge::inspect::pins(c, s.id)?.len() as i64;
                let calls = abridge::inspect::approvals(c, s.id)?;
                let waiting = calls
                    .iter()
                    .filter(|a| a.status == abridge::store::ApprovalStatus::Pending)
                    .count() as i64;
                rep.calls_waiting += waiting;
                rep.calls_decided += calls.len() as i64 - waiting;
                rep.sessions_parked += (waiting > 0) as i64;
                rep.pins_live += abridge::inspect::live_pins(
                    c,
                    s.id,
                    i64::MAX,
                    abridge::pins::DEFAULT_PINS_WINDOW,
                )?
                .len() as i64;
                let rows = abridge::inspect::compactions(c, s.id)?;
                if let Some(newest) = rows
                    .iter()
                    .rev()
                    .find(|r| r.status == abridge::store::CompactionStatus::Completed)
                {
                    rep.pins_carried += newest.pins_live.unwrap_or(0);
                    rep.pins_added += newest.pins_added.unwrap_or(0);
                }
                for row in rows {
                    if row.background && row.status == abridge::store::CompactionStatus::Completed {
                        rep.compactions_background += 1;
                    }
                    rep.compactions.push(CompactionFigure {
                        session: ext.clone(),
                        up_to_turn: row.up_to_turn_index,
                        status: row.status.to_string(),
                        tokens_before: row.tokens_before,
                        tokens_after: row.tokens_after,
                        pins_live: row.pins_live,
                        pins_added: row.pins_added,
                        background: row.background,
                    });
                }
            }
            Ok(rep)
        })
        .await?;
    report.wall_seconds = started.elapsed().as_secs_f64();
    report.db = opts.db.display().to_string();
    Ok(report)
}

/// The demo's effect check for `verify` (G5): every effect row applied once,
/// and every completed transactional invocation with its effect.
impl abridge::verify::EffectCheck for crate::demo_tables::DemoEffects {
    fn check(
        &self,
        conn: &abridge::store::Connection,
    ) -> abridge::error::Result<(i64, Vec<String>)> {
        if !crate::demo_tables::has_demo_tables(conn)? {
            return Ok((0, Vec::new()));
        }
        let (mut checked, mut violations) = (0, Vec::new());
        for table in [DemoTable::Effects, DemoTable::External] {
            checked += crate::demo_tables::count_effects(conn, table)?;
            for (key, tool, n) in crate::demo_tables::duplicate_effects(conn, table)? {
                violations.push(format!("effect {key} of {tool} applied {n} times"));
            }
        }
        let (unapplied, orphaned) = crate::demo_tables::transactional_effect_balance(conn)?;
        if unapplied > 0 {
            violations.push(format!(
                "{unapplied} completed transactional invocations have no applied effect"
            ));
        }
        let deleted: i64 = conn.query_row(
            "SELECT count(*) FROM erasures WHERE kind = 'delete'",
            [],
            |r| r.get(0),
        )?;
        if orphaned > 0 && deleted == 0 {
            violations.push(format!(
                "{orphaned} applied effects have no completed transactional invocation"
            ));
        }
        Ok((checked, violations))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abridge::error::Error;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn busy() -> Error {
        Error::Task("store busy".into())
    }

    #[tokio::test(start_paused = true)]
    async fn resumable_errors_are_waited_out_and_final_ones_end_at_once() {
        let calls = AtomicUsize::new(0);
        let got = patiently(|| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 3 {
                    Err(busy())
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(got.unwrap(), 3);

        let calls = AtomicUsize::new(0);
        let got: abridge::error::Result<()> = patiently(|| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(Error::Config("bad".into())) }
        })
        .await;
        assert!(matches!(got, Err(Error::Config(_))));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "a final error is not retried"
        );

        // Patience runs out: the last resumable error is returned.
        let calls = AtomicUsize::new(0);
        let got: abridge::error::Result<()> = patiently(|| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(busy()) }
        })
        .await;
        assert!(matches!(got, Err(Error::Task(_))));
        assert!(calls.load(Ordering::SeqCst) > 100);
    }
}
