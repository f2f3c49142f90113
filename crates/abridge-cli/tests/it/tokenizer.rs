//! The `tiktoken` feature: a real tokenizer as the token counter.
#![cfg(feature = "tiktoken")]

use crate::common;

use abridge::{
    CompactionConfig, ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner,
    Store, Threshold, TiktokenCounter, TokenCounter,
};
use std::sync::{Arc, Mutex};

/// Answers with text and no usage, keeping the bytes of each request.
struct NoUsage(Mutex<Vec<Vec<u8>>>);

#[abridge::async_trait]
impl ModelClient for NoUsage {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.0
            .lock()
            .unwrap()
            .push(abridge::message::to_bytes(&req.messages));
        Ok(ModelResponse {
            blocks: vec![ResponseBlock::Text {
                text: "d'accord — 好的 👍".into(),
            }],
            ..Default::default()
        })
    }
}

#[test]
fn tiktoken_counts_tokens_as_openai_does() {
    let o200k = TiktokenCounter::o200k_base();
    assert_eq!(o200k.count("hello world"), 2);
    assert_eq!(o200k.count(""), 0);
    assert_eq!(TiktokenCounter::cl100k_base().count("hello world"), 2);
    assert_eq!(
        TiktokenCounter::for_model("gpt-4o").unwrap().encoding(),
        "o200k_base"
    );
    assert_eq!(
        TiktokenCounter::for_model("gpt-4").unwrap().encoding(),
        "cl100k_base"
    );
    assert!(matches!(
        TiktokenCounter::for_model("claude-sonnet-4-5"),
        Err(abridge::Error::Config(_))
    ));
    // Not characters / 4: a long repeated word is few tokens.
    let text = "token ".repeat(1000);
    assert!(o200k.count(&text) < (text.len() as u64).div_ceil(4));
}

/// Without provider usage, each step's context measure is the tokenizer's
/// count of the exact bytes the step sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_usage_the_measure_is_tiktokens_count_of_the_bytes_sent() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(common::db_for(&dir.path().join("t.db"))).unwrap();
    let model = Arc::new(NoUsage(Mutex::new(Vec::new())));
    let counter = TiktokenCounter::o200k_base();
    let runner = Runner::builder(store.clone(), model.clone())
        .compaction(
            CompactionConfig::default()
                .with_compact_at(Threshold::Off)
                .with_token_counter(counter),
        )
        .build()
        .unwrap();
    let s = runner
        .create_session("s", "gpt-4o", "système")
        .await
        .unwrap();
    for t in 0..3 {
        runner
            .run_turn(s.id, &format!("turn {t}: naïve 👩‍👩‍👧 \"quoted\""))
            .await
            .unwrap();
    }
    let mut measured = Vec::new();
    for turn in store.turns(s.id).await.unwrap() {
        for step in store.steps(turn.id).await.unwrap() {
            assert!(step.estimated);
            measured.push(step.context_tokens.unwrap() as u64);
        }
    }
    let want: Vec<u64> = model
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|b| counter.count(std::str::from_utf8(b).unwrap()))
        .collect();
    assert_eq!(measured, want);
}
