//! Events and tracing output carry ids, counts, sizes and hashes, never a
//! conversation's text, unless the host opts in (`RunnerConfig::log_content`):
//! a provider's or a summariser's error that quotes what it was sent shows as
//! its length and a hash. The store keeps the error whole.

#[path = "it/common.rs"]
mod common;

use abridge::{
    CompactionConfig, ModelClient, ModelError, ModelRequest, ModelResponse, Runner, RunnerConfig,
    Store, Summariser, SummaryRequest, SummaryResponse, Threshold,
};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

const SECRET: &str = "my card is 4111-1111-1111-1111";
/// A piece of the card number no log line holds by chance: "4111" alone
/// turned up in a timestamp (`06:08:28.411122Z`), and a digest's hex may
/// hold it too.
const CARD_PIECE: &str = "4111-1111";

/// Everything tracing writes in this test binary.
#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn captured() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let cap = Capture(buf.clone());
        tracing_subscriber::fmt()
            // Everything abridge logs, at every level. The PostgreSQL
            // client's own debug lines print statement parameters: they are
            // that library's (docs/design.md says so), kept to warnings here
            // as the command line keeps them.
            .with_env_filter("trace,tokio_postgres=warn")
            .with_ansi(false)
            .with_writer(move || cap.clone())
            .init();
        buf
    })
    .clone()
}

/// Answers with text, except for a turn whose input says FAIL: then it
/// refuses, quoting what it was sent (as providers' validation errors can).
struct Quoting;

#[abridge::async_trait]
impl ModelClient for Quoting {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let sent = serde_json::to_string(&*req.messages).unwrap();
        if sent.contains("FAIL") {
            return Err(ModelError::Permanent(format!("invalid request: {sent}")));
        }
        Ok(ModelResponse {
            blocks: vec![abridge::ResponseBlock::Text { text: "ok".into() }],
            usage: abridge::Usage::new(Some(5_000), Some(1)),
            ..Default::default()
        })
    }
}

/// Fails, quoting the transcript it was given.
struct QuotingSummariser;

#[abridge::async_trait]
impl Summariser for QuotingSummariser {
    async fn summarise(&self, r: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        Err(ModelError::Permanent(format!(
            "cannot summarise: {}",
            r.transcript
        )))
    }
}

async fn run(log_content: bool) -> (Vec<String>, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(common::db_for(&dir.path().join("l.db"))).unwrap();
    let mut cfg = RunnerConfig::default().with_owner(format!("logs-{log_content}"));
    cfg.log_content = log_content;
    cfg.model_retry = abridge::RetryPolicy::default().with_backoff(
        std::time::Duration::from_millis(1),
        std::time::Duration::from_millis(2),
    );
    // No verbatim tail: these few short turns would all fit it, and turn 0
    // must be folded (and its summary fail) for the events to show.
    cfg.compaction = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(1_000))
        .with_background(None)
        .with_keep_recent_share(None);
    cfg.compaction.retry = cfg.model_retry;
    let r = Runner::builder(store.clone(), Arc::new(Quoting))
        .summariser(QuotingSummariser)
        .config(cfg)
        .build()
        .unwrap();
    let mut events = r.subscribe();
    let s = r.create_session("s", "gpt-4o", "sys").await.unwrap();
    r.run_turn(s.id, &format!("hello, {SECRET}")).await.unwrap();
    // Compacting turn 0 fails (the summariser quotes it); the turn goes on.
    r.run_turn(s.id, "next").await.unwrap();
    let err = r
        .run_turn(s.id, &format!("FAIL now, {SECRET}"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(SECRET),
        "the error itself is whole"
    );
    let stored: String = store
        .with_conn(|c| {
            c.query_row("SELECT error FROM turns WHERE status = 'failed'", [], |r| {
                r.get(0)
            })
        })
        .unwrap();
    assert!(stored.contains(SECRET), "the store keeps the error whole");
    let mut seen = Vec::new();
    loop {
        // A lost event could be the one holding the secret: the stream is
        // whole or the test fails.
        match events.try_recv() {
            Ok(e) => seen.push(format!("{:?}", e.kind)),
            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => {
                panic!("the test's subscriber lost {n} events")
            }
            Err(_) => break,
        }
    }
    assert!(
        seen.iter().any(|e| e.starts_with("TurnFailed")),
        "{seen:#?}"
    );
    assert!(
        seen.iter().any(|e| e.starts_with("CompactionFailed")),
        "{seen:#?}"
    );
    (seen, stored)
}

#[tokio::test]
async fn events_and_logs_carry_no_conversation_text_unless_the_host_opts_in() {
    let log = captured();
    let (events, _) = run(false).await;
    for e in &events {
        assert!(!e.contains(SECRET) && !e.contains(CARD_PIECE), "{e}");
    }
    let failed = events.iter().find(|e| e.starts_with("TurnFailed")).unwrap();
    assert!(failed.contains("characters, sha256"), "{failed}");
    let text = String::from_utf8(log.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("turn failed"),
        "the logs were captured: {text}"
    );
    assert!(!text.contains(CARD_PIECE), "{text}");

    // Opted in, the same run's events say it whole.
    let (events, _) = run(true).await;
    let failed = events.iter().find(|e| e.starts_with("TurnFailed")).unwrap();
    assert!(failed.contains(SECRET), "{failed}");
}
