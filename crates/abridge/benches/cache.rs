//! How much of each step's input a provider's prompt cache can serve: abridge
//! (an append-only, byte-identical prefix between compactions) side by side
//! with a sliding-window trimmer (the newest messages that fit the same
//! budget), on one recorded long session.
//!
//! The session is the demo workload's (seed 42, session 1, `TURNS` turns,
//! threshold 4,000 tokens, compaction inline), run twice on fresh stores:
//! once with abridge compacting, once with compaction off; the trimmer is
//! applied to the second run's requests. Each request's bytes are what a
//! provider would cache; its cache is modelled as OpenAI documents its
//! prompt caching: a request of at least 1,024 tokens is served from the
//! cache for its longest prefix shared with a recent request (here the last
//! 16), in blocks of 128 tokens (a token taken as 4 bytes).
//!
//! Printed: steps, input tokens per step, the share of all input tokens read
//! from the cache, and the median share per step, for each strategy, in one
//! run. `cargo bench --bench cache` (a few seconds).

use abridge::{
    CompactionConfig, Message, ModelClient, ModelError, ModelRequest, ModelResponse, Runner,
    RunnerConfig, Store, Threshold,
};
use abridge_testkit::demo::{demo_tools, user_turn, ScriptedModel, DEMO_MODEL, SYSTEM_PROMPT};
use std::sync::{Arc, Mutex};

const TURNS: u64 = 300;
const BUDGET_TOKENS: u64 = 4_000;
/// A request shorter than this is not cached.
const MIN_CACHED: u64 = 1_024;
/// Cache hits come in blocks of this many tokens.
const BLOCK: u64 = 128;
/// Recent requests whose prefixes the cache still holds.
const RECENT: usize = 16;

/// The demo model, keeping each request's message array.
struct Recording {
    inner: ScriptedModel,
    sent: Mutex<Vec<Vec<Message>>>,
}

#[abridge::async_trait]
impl ModelClient for Recording {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.sent.lock().unwrap().push(req.messages.to_vec());
        self.inner.complete(req).await
    }
}

async fn record(compact_at: Threshold) -> Vec<Vec<Message>> {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("cache.db")).unwrap();
    let model = Arc::new(Recording {
        inner: ScriptedModel::new(42),
        sent: Mutex::new(Vec::new()),
    });
    let mut cfg = RunnerConfig::default().with_owner("cache-bench");
    cfg.compaction = CompactionConfig::default()
        .with_compact_at(compact_at)
        .with_context_window(DEMO_MODEL, 32_000)
        .with_background(None);
    let runner = Runner::builder(store, model.clone())
        .tools(demo_tools(None, std::time::Duration::ZERO))
        .config(cfg)
        .build()
        .unwrap();
    let s = runner
        .create_session("cache", DEMO_MODEL, SYSTEM_PROMPT)
        .await
        .unwrap();
    for t in 0..TURNS {
        runner.run_turn(s.id, &user_turn(42, 1, t)).await.unwrap();
    }
    let sent = model.sent.lock().unwrap().clone();
    sent
}

fn tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// The newest messages after the system prompt whose bytes fit `budget`
/// tokens, with the system prompt: what a sliding-window trimmer sends.
fn trim(messages: &[Message], budget: u64) -> Vec<Message> {
    let system = messages[0].clone();
    let mut used = tokens(serde_json::to_vec(&system).unwrap().len());
    let mut kept = Vec::new();
    for m in messages[1..].iter().rev() {
        let t = tokens(serde_json::to_vec(m).unwrap().len());
        if used + t > budget && !kept.is_empty() {
            break;
        }
        used += t;
        kept.push(m.clone());
    }
    kept.reverse();
    let mut out = vec![system];
    out.extend(kept);
    out
}

/// (input tokens, cached tokens) of each request under the cache model.
fn cached(requests: &[Vec<u8>]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        let total = tokens(r.len());
        let shared = requests[i.saturating_sub(RECENT)..i]
            .iter()
            .map(|p| p.iter().zip(r).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0);
        let hit = if total >= MIN_CACHED {
            (tokens(shared).min(total) / BLOCK) * BLOCK
        } else {
            0
        };
        out.push((total, hit.min(total)));
    }
    out
}

fn report(name: &str, requests: &[Vec<Message>]) {
    let bytes: Vec<Vec<u8>> = requests
        .iter()
        .map(|m| abridge::message::to_bytes(m))
        .collect();
    let per = cached(&bytes);
    let input: u64 = per.iter().map(|p| p.0).sum();
    let hit: u64 = per.iter().map(|p| p.1).sum();
    let mut shares: Vec<f64> = per
        .iter()
        .map(|(t, h)| *h as f64 / (*t).max(1) as f64)
        .collect();
    shares.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{name:<24} {:>6} {:>14.0} {:>14.1}% {:>14.1}%",
        per.len(),
        input as f64 / per.len() as f64,
        hit as f64 * 100.0 / input as f64,
        shares[shares.len() / 2] * 100.0
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that is not this bench skips it.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"cache".contains(&a))
    {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (abridged, full) = rt.block_on(async {
        (
            record(Threshold::Tokens(BUDGET_TOKENS)).await,
            record(Threshold::Off).await,
        )
    });
    let trimmed: Vec<Vec<Message>> = full.iter().map(|m| trim(m, BUDGET_TOKENS)).collect();
    println!(
        "demo session, {TURNS} turns, budget {BUDGET_TOKENS} tokens; cache: prefix of the last \
         {RECENT} requests, {BLOCK}-token blocks, requests of {MIN_CACHED}+ tokens\n"
    );
    println!(
        "{:<24} {:>6} {:>14} {:>15} {:>15}",
        "strategy", "steps", "input/step", "cached (all)", "cached (median)"
    );
    report("abridge (compaction)", &abridged);
    report("sliding window", &trimmed);
    report("no trimming (reference)", &full);
}
