//! The probe evaluation: scripted sessions that state facts of the kinds
//! summaries lose (preferences without digits or capitals, negated and
//! conditional rules, facts in German, Portuguese, Japanese and Hindi, a
//! value corrected twice, a fact a tool states, a fact restated in other
//! words, values of two entities), then run filler turns until the session
//! has compacted 20 times. After the 1st, 3rd, 10th and 20th compaction each
//! probe is scored on what the model sees at the first step that reads it:
//!
//! - 2: the gold value is visible (on token boundaries; a value shorter than
//!   four characters only on a line that names it) and no stale value is
//!   labelled current in the summary (a stale value on a line marked
//!   `replaces` / `superseded`, or only in the verbatim turns before the
//!   correction, is not current; nor is one in the summary's section of
//!   the user's own words, which quotes turns, newest first, as said);
//! - 1: the gold value is visible beside a stale one labelled current;
//! - 0: the gold value is not visible.
//!
//! No model is needed: the scripted model answers in a sentence and calls a
//! booking tool once. `crates/abridge/examples/probes.rs` prints the tables
//! of docs/fidelity.md.

use crate::scripted;
use abridge::compaction::Summariser;
use abridge::message::Message;
use abridge::{
    async_trait, CompactionConfig, ModelClient, ModelError, ModelRequest, ModelResponse, Result,
    Runner, RunnerConfig, Store, Threshold, Tool, ToolCall, ToolError, ToolSpec, Tools,
};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// One question about the session, with its answer.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    /// The kind of fact (a column of the table).
    pub kind: &'static str,
    /// The question a user would ask later.
    pub question: &'static str,
    /// The current answer, verbatim.
    pub gold: &'static str,
    /// Words, one of which a line must hold for a short gold value to count.
    pub label: &'static [&'static str],
    /// Values the answer had before, which must not read as current.
    pub stale: &'static [&'static str],
}

/// The user's turns that state the facts, in order (the booking question
/// makes the model call its tool).
pub const FACT_TURNS: &[&str] = &[
    "Hi, I'm furnishing a new flat and need a few things delivered.",
    "Please wrap everything in gift paper, no plastic at all.",
    "Our dog is called biscuit, so the courier should ring twice and wait.",
    "Contact me by e-mail only, never by phone.",
    "Never deliver on a Saturday.",
    "Only leave the parcel with a neighbour if nobody answers the door.",
    "My shoe size is 42.",
    "No wait, make it 43.",
    "Actually, make it 44.",
    "The sofa budget is 1,200 EUR.",
    "The lamp budget is 90 EUR.",
    "Lieferung bitte nur nach 18 Uhr, ich arbeite tagsüber.",
    "O orçamento total é R$ 2.500,00 e meu CEP é 01310-100.",
    "置き配は絶対にしないでください。",
    "कृपया केवल शाम 6 बजे के बाद फ़ोन करें।",
    "When can the sofa be delivered? Please book it.",
    "My overall budget is 3,000 EUR.",
    "Thinking about it again, I can spend up to 3,400 EUR in total, not more.",
    "Use brown paper instead.",
    "My postcode is 10115.",
    "Could you check if you deliver to postal code 37527?",
    "The deadline for the shelves is 2027-01-10.",
    "We moved the deadline to 2027-01-15.",
    "I'd rather you text me than ring the bell late in the evening.",
    "私の予算は5万円です。",
    "Prefiro entrega pela manhã.",
];

/// The probes, one per fact.
pub const PROBES: &[Probe] = &[
    Probe {
        kind: "no digits or capitals",
        question: "How should the parcels be wrapped?",
        gold: "brown paper",
        label: &[],
        stale: &["gift paper"],
    },
    Probe {
        kind: "no digits or capitals",
        question: "What is the dog called?",
        gold: "biscuit",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "no digits or capitals",
        question: "How would the customer rather be reached in the evening?",
        gold: "text me",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "rule",
        question: "How may we contact the customer?",
        gold: "by e-mail only",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "rule",
        question: "Which day is delivery not allowed?",
        gold: "Never deliver on a Saturday",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "rule",
        question: "When may the parcel go to a neighbour?",
        gold: "if nobody answers the door",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "corrected",
        question: "What is the shoe size?",
        gold: "44",
        label: &["size"],
        stale: &["42", "43"],
    },
    Probe {
        kind: "corrected",
        question: "What is the deadline for the shelves?",
        gold: "2027-01-15",
        label: &["deadline"],
        stale: &["2027-01-10"],
    },
    Probe {
        kind: "corrected",
        question: "What is the postcode?",
        gold: "10115",
        label: &["postcode", "postal code"],
        stale: &["37527"],
    },
    Probe {
        kind: "two entities",
        question: "What is the budget for the sofa?",
        gold: "1,200 EUR",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "two entities",
        question: "What is the budget for the lamp?",
        gold: "90 EUR",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "other languages",
        question: "From what time may we deliver (German)?",
        gold: "nur nach 18 Uhr",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "other languages",
        question: "What is the total budget in reais?",
        gold: "R$ 2.500,00",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "other languages",
        question: "What is the CEP?",
        gold: "01310-100",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "other languages",
        question: "May the parcel be left at the door (Japanese)?",
        gold: "置き配は絶対にしないでください",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "other languages",
        question: "When may we call (Hindi)?",
        gold: "केवल शाम 6 बजे के बाद",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "other languages",
        question: "What is the budget in yen (Japanese)?",
        gold: "5万円",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "other languages",
        question: "When does the customer prefer deliveries (Portuguese)?",
        gold: "entrega pela manhã",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "stated by a tool",
        question: "When is the sofa delivered?",
        gold: "2026-12-18",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "stated by a tool",
        question: "What is the delivery reference?",
        gold: "DLV-5521",
        label: &[],
        stale: &[],
    },
    Probe {
        kind: "restated in other words",
        question: "What is the overall budget?",
        gold: "3,400 EUR",
        label: &[],
        stale: &["3,000 EUR"],
    },
];

/// The compactions after which the probes are scored.
pub const CHECKPOINTS: [i64; 4] = [1, 3, 10, 20];

/// The threshold of the workload (tokens).
pub const THRESHOLD: u64 = 3_000;

/// Filler turns stop here whatever the compactions.
const MAX_TURNS: u64 = 600;

/// The scripted model.
struct ProbeModel;

#[async_trait]
impl ModelClient for ProbeModel {
    async fn complete(&self, req: &ModelRequest) -> std::result::Result<ModelResponse, ModelError> {
        let last = scripted::last_content(req);
        if last.contains("tool_result") {
            return Ok(scripted::text(
                "It is booked; the details are in the result above.",
            ));
        }
        if last.contains("Please book it") {
            return Ok(scripted::tool_use(
                "book_1",
                "book_delivery",
                json!({"item": "sofa"}),
            ));
        }
        Ok(match scripted::number_after(&last, "catalogue page ") {
            Some(n) => scripted::tool_use(format!("page_{n}"), "catalogue", json!({"page": n})),
            None => scripted::text("Noted, thank you. I will keep that in mind."),
        })
    }
}

/// Books the delivery: the facts a tool states.
struct Book;

#[async_trait]
impl Tool for Book {
    async fn call(&self, _: &ToolCall) -> std::result::Result<Value, ToolError> {
        Ok(Value::String(
            "Delivery booked for 2026-12-18 between 14 and 16 h, reference DLV-5521.".into(),
        ))
    }
}

/// A catalogue page: long prose with no facts worth pinning.
struct Catalogue;

#[async_trait]
impl Tool for Catalogue {
    async fn call(&self, call: &ToolCall) -> std::result::Result<Value, ToolError> {
        let page = call
            .input
            .get("page")
            .and_then(Value::as_str)
            .unwrap_or("0");
        let para = "this page shows chairs, tables and shelves in several woods and \
                    finishes, with notes on care, assembly and the materials used; the \
                    prices shown include tax and the usual delivery charge. ";
        Ok(Value::String(format!("page {page}: {}", para.repeat(12))))
    }
}

/// The user's turn `t`: the facts first, then filler that looks at the
/// catalogue.
pub fn user_turn(t: u64) -> String {
    match FACT_TURNS.get(t as usize) {
        Some(s) => s.to_string(),
        None => format!(
            "Could you show me catalogue page {} please?",
            t - FACT_TURNS.len() as u64
        ),
    }
}

/// The summarisers measured (those of the fidelity benchmark).
pub use crate::fidelity::Which;

/// The scores of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The summariser.
    pub summariser: Which,
    /// Whether the pins guard was on.
    pub guard: bool,
    /// Points per checkpoint (compactions → points), out of `2 × probes`.
    pub points: BTreeMap<i64, usize>,
    /// At the last checkpoint, by kind: (points, max).
    pub by_kind: BTreeMap<String, (usize, usize)>,
    /// At the last checkpoint, the probes below 2 points and their score.
    pub missed: Vec<(String, usize)>,
    /// The maximum per checkpoint.
    pub max: usize,
    /// Whether `verify` passed.
    pub verified: bool,
    /// With a grading model ([`run_graded`]): its points per checkpoint,
    /// out of the same maximum; empty without one.
    pub graded: BTreeMap<i64, usize>,
    /// With a grading model: at the last checkpoint, each probe's question,
    /// the model's answer and its points, where below 2.
    pub graded_missed: Vec<(String, String, usize)>,
    /// The summary the model saw at the last checkpoint.
    #[serde(skip)]
    pub last_summary: String,
}

impl Outcome {
    /// The graded share of the maximum at `checkpoint` (None without a
    /// grading model).
    pub fn graded_share(&self, checkpoint: i64) -> Option<f64> {
        self.graded
            .get(&checkpoint)
            .map(|&p| p as f64 / self.max.max(1) as f64)
    }

    /// The share of the maximum at `checkpoint`.
    pub fn share(&self, checkpoint: i64) -> f64 {
        self.points.get(&checkpoint).copied().unwrap_or(0) as f64 / self.max.max(1) as f64
    }
}

/// Whether `needle` stands in `hay` on token boundaries: neither end
/// joined to a word character, nor, for a number, to a decimal or thousands
/// part (`2` in `2.5`).
fn on_boundaries(hay: &str, needle: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let digit = |c: Option<char>| c.is_some_and(|c| c.is_ascii_digit());
    let (first, last) = (needle.chars().next(), needle.chars().next_back());
    hay.match_indices(needle).any(|(i, _)| {
        let mut before = hay[..i].chars().rev();
        let mut after = hay[i + needle.len()..].chars();
        let (b, bb) = (before.next(), before.next());
        let (a, aa) = (after.next(), after.next());
        let joined_before =
            word(first) && (word(b) || (digit(first) && matches!(b, Some('.' | ',')) && digit(bb)));
        let joined_after =
            word(last) && (word(a) || (digit(last) && matches!(a, Some('.' | ',')) && digit(aa)));
        !joined_before && !joined_after
    })
}

/// The texts of `messages`, and which of them is the summary.
fn texts(messages: &[Message]) -> (Vec<String>, Option<String>) {
    fn strings(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            Value::Object(o) => o.values().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    let mut summary = None;
    for m in messages {
        let mut found = Vec::new();
        strings(
            &serde_json::to_value(&m.content).unwrap_or_default(),
            &mut found,
        );
        for s in found {
            if s.starts_with("[Summary of the conversation so far") {
                summary = Some(s.clone());
            }
            all.push(s);
        }
    }
    (all, summary)
}

/// The lines of a summary outside its section of the user's own words
/// (quoted turns, like the verbatim ones).
fn outside_user_words(summary: &str) -> impl Iterator<Item = &str> {
    let mut inside = false;
    summary.lines().filter(move |line| {
        if line.starts_with("## ") {
            inside = line.trim_end() == abridge::compaction::USER_WORDS_HEADING;
            return !inside;
        }
        !inside
    })
}

/// The score of `p` on what the model sees.
pub fn score(p: &Probe, messages: &[Message]) -> usize {
    let (all, summary) = texts(messages);
    let visible_in = |text: &str, value: &str| {
        text.lines().any(|line| {
            on_boundaries(line, value)
                && (value.chars().count() >= 4
                    || p.label.is_empty()
                    || p.label
                        .iter()
                        .any(|l| line.to_lowercase().contains(&l.to_lowercase())))
        })
    };
    if !all.iter().any(|t| visible_in(t, p.gold)) {
        return 0;
    }
    // A stale value reads as current on a line that names the fact (any
    // line, for a fact with no label words) and does not mark it replaced.
    let stale_current = p.stale.iter().any(|s| {
        summary.as_deref().is_some_and(|sum| {
            outside_user_words(sum).any(|line| {
                let lower = line.to_lowercase();
                on_boundaries(line, s)
                    && (p.label.is_empty() || p.label.iter().any(|l| lower.contains(l)))
                    && !line.contains("replaces")
                    && !line.contains("superseded")
                    // A question asked about it states nothing.
                    && !line.contains("?\"")
            })
        })
    });
    if stale_current {
        1
    } else {
        2
    }
}

/// Runs the probe session on a new store at `path`.
pub async fn run(path: &Path, which: Which, guard: bool) -> Result<Outcome> {
    run_with(path, which.summariser(), which, guard).await
}

/// [`run`] with any summariser (reported as `which`).
pub async fn run_with(
    path: &Path,
    summariser: Arc<dyn Summariser>,
    which: Which,
    guard: bool,
) -> Result<Outcome> {
    run_inner(path, summariser, which, guard, None).await
}

/// The optional model-graded mode: a model (a host's, with its key) is
/// asked each probe's question about what the model saw at each
/// checkpoint, and its answer is scored like the text
/// ([`score_answer`]). One call per probe and checkpoint.
#[derive(Clone)]
pub struct Grader {
    /// The client.
    pub client: Arc<dyn ModelClient>,
    /// The model it is asked for.
    pub model: String,
}

/// What the grading model is told before the conversation and the question.
pub const GRADER_INSTRUCTIONS: &str = "You are shown, as JSON, the messages an assistant \
     was given at one step of a conversation (the summary of earlier turns included). Answer \
     the question that follows from those messages alone, as the assistant would now: give the \
     current value only, in the words or figures the conversation uses, nothing else. If the \
     messages do not say, answer: unknown.";

/// [`run`], with each checkpoint also graded by `grader`
/// ([`Outcome::graded`]).
pub async fn run_graded(
    path: &Path,
    which: Which,
    guard: bool,
    grader: &Grader,
) -> Result<Outcome> {
    run_inner(path, which.summariser(), which, guard, Some(grader)).await
}

/// The grading model's answer to `p` about `messages`.
pub async fn ask(grader: &Grader, p: &Probe, messages: &[Message]) -> Result<String> {
    use abridge::message::Role;
    let shown = serde_json::to_string_pretty(messages).unwrap_or_default();
    let req = ModelRequest {
        model: grader.model.clone(),
        messages: Arc::new(vec![
            Message::text(Role::System, GRADER_INSTRUCTIONS),
            Message::text(
                Role::User,
                format!("Messages:\n{shown}\n\nQuestion: {}", p.question),
            ),
        ]),
        tools: Vec::new(),
        max_output_tokens: Some(100),
    };
    let resp = grader
        .client
        .complete(&req)
        .await
        .map_err(|e| abridge::Error::Config(format!("the grading model failed: {e}")))?;
    Ok(resp.text())
}

/// The points of a model's `answer` to `p`: 2 when it holds the gold value
/// (on token boundaries, case aside) and no stale one, 1 when it holds both,
/// 0 when it does not hold the gold value.
pub fn score_answer(p: &Probe, answer: &str) -> usize {
    let answer = answer.to_lowercase();
    if !on_boundaries(&answer, &p.gold.to_lowercase()) {
        return 0;
    }
    if p.stale
        .iter()
        .any(|s| on_boundaries(&answer, &s.to_lowercase()))
    {
        1
    } else {
        2
    }
}

async fn run_inner(
    path: &Path,
    summariser: Arc<dyn Summariser>,
    which: Which,
    guard: bool,
    grader: Option<&Grader>,
) -> Result<Outcome> {
    let store = Store::open(path)?;
    let spec = |name: &str| ToolSpec {
        name: name.into(),
        description: name.into(),
        input_schema: json!({"type": "object"}),
    };
    let mut compaction = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(THRESHOLD))
        .with_background(None);
    compaction.guard_pins = guard;
    let runner = Runner::builder(store.clone(), Arc::new(ProbeModel))
        .tools(
            Tools::new()
                .idempotent(spec("book_delivery"), Book)
                .idempotent(spec("catalogue"), Catalogue),
        )
        .summariser_arc(summariser)
        .config(
            RunnerConfig::default()
                .with_owner("probes")
                .with_compaction(compaction),
        )
        .build()?;
    let session = runner
        .create_session("probes", "probe-model", "You help Ana furnish her flat.")
        .await?;
    let sid = session.id;
    let mut points = BTreeMap::new();
    let mut by_kind: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut missed = Vec::new();
    let mut last_summary = String::new();
    let (mut graded, mut graded_missed) = (BTreeMap::new(), Vec::new());
    let last = *CHECKPOINTS.last().expect("checkpoints");
    for t in 0..MAX_TURNS {
        runner.run_turn(sid, &user_turn(t)).await?;
        let done = store
            .call(move |c| Ok(abridge::testing::session_counts(c, sid)?.compactions_completed))
            .await?;
        let Some(&at) = CHECKPOINTS
            .iter()
            .find(|&&k| k <= done && !points.contains_key(&k))
        else {
            continue;
        };
        let messages = store
            .call(move |c| {
                let steps = abridge::inspect::executed_step_ids(c)?;
                let step = *steps.last().expect("steps ran");
                Ok(abridge::replay::rebuild_step(c, step)?.messages)
            })
            .await?;
        let mut total = 0;
        for p in PROBES {
            let s = score(p, &messages);
            total += s;
            if at == last {
                let e = by_kind.entry(p.kind.to_string()).or_default();
                e.0 += s;
                e.1 += 2;
                if s < 2 {
                    missed.push((p.question.to_string(), s));
                }
            }
        }
        points.insert(at, total);
        if let Some(grader) = grader {
            let mut total = 0;
            for p in PROBES {
                let answer = ask(grader, p, &messages).await?;
                let s = score_answer(p, &answer);
                total += s;
                if at == last && s < 2 {
                    graded_missed.push((p.question.to_string(), answer, s));
                }
            }
            graded.insert(at, total);
        }
        if at == last {
            last_summary = texts(&messages).1.unwrap_or_default();
            break;
        }
    }
    let verified = store.call(|c| Ok(abridge::verify::verify(c)?.ok)).await?;
    Ok(Outcome {
        summariser: which,
        guard,
        points,
        by_kind,
        missed,
        max: 2 * PROBES.len(),
        verified,
        last_summary,
        graded,
        graded_missed,
    })
}
