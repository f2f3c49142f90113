//! The Rust side of the Python package's overhead measurement
//! (`bindings/python/bench/overhead.py`): a host that runs TURNS turns of
//! one session, one step each, with a model that answers at once, on a fresh
//! SQLite store at DB, and prints the microseconds each turn took, one JSON
//! array on stdout. The Python host in that script does the same through
//! `abridge.Runner` with an async callable as its model.
//!
//! `cargo run --release --example host_loop -- DB TURNS [COMPACT_AT]`

use abridge::{
    ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner, Store, Threshold,
    Usage,
};
use std::sync::Arc;
use std::time::Instant;

/// Echoes the count of messages it was sent, at once.
struct Instant0;

#[async_trait::async_trait]
impl ModelClient for Instant0 {
    async fn complete(&self, r: &ModelRequest) -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse {
            blocks: vec![ResponseBlock::Text {
                text: format!("answer {}", r.messages.len()),
            }],
            usage: Usage {
                input_tokens: Some(40 * r.messages.len() as u64),
                output_tokens: Some(3),
                ..Default::default()
            },
            ..Default::default()
        })
    }
}

#[tokio::main]
async fn main() -> abridge::Result<()> {
    let mut args = std::env::args().skip(1);
    let db = args.next().expect("DB");
    let turns: i64 = args
        .next()
        .expect("TURNS")
        .parse()
        .expect("TURNS: a number");
    let compact_at: u64 = args
        .next()
        .map_or(8_000, |s| s.parse().expect("COMPACT_AT"));
    let store = Store::open(db.as_str())?;
    let compaction =
        abridge::CompactionConfig::default().with_compact_at(Threshold::Tokens(compact_at));
    let runner = Runner::builder(store, Arc::new(Instant0))
        .compaction(compaction)
        .build()?;
    let s = runner.create_session("host", "gpt-4o", "sys").await?;
    let mut micros = Vec::with_capacity(turns as usize);
    for i in 0..turns {
        let began = Instant::now();
        runner
            .run_turn_at(s.id, i, &format!("turn {i}: order ORD-{}", 7000 + i))
            .await?;
        micros.push(began.elapsed().as_micros() as u64);
    }
    runner.finish_background().await;
    println!("{}", serde_json::to_string(&micros).expect("json"));
    Ok(())
}
