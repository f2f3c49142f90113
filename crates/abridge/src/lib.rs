//! # abridge
//!
//! Durable, exactly-once context compaction for LLM agent hosts, on an embedded
//! SQLite database.
//!
//! An agent host runs sessions for thousands of turns, far past any model's
//! context window. Before each model step abridge decides whether the context
//! has outgrown its threshold, claims one compaction row under a UNIQUE
//! (session, up_to_turn) index, has a summariser fold the older turns (and the
//! previous summary) into a summary, and from then on builds the messages from
//! summary + recent turns. Turns, steps and tool invocations are stored as they
//! happen, so that a process killed at any instant resumes where it stopped, no
//! compaction happens twice, every executed step's messages rebuild byte for byte,
//! and a completed tool effect is never repeated.
//!
//! ```no_run
//! use abridge::{Runner, Store, Tools};
//! # use abridge::{ModelClient, ModelRequest, ModelResponse, ModelError};
//! # struct MyModel;
//! # #[async_trait::async_trait]
//! # impl ModelClient for MyModel {
//! #     async fn complete(&self, _: &ModelRequest) -> Result<ModelResponse, ModelError> { unimplemented!() }
//! # }
//! # async fn run() -> abridge::Result<()> {
//! let store = Store::open("agent.db")?;
//! let runner = Runner::builder(store, std::sync::Arc::new(MyModel)).build()?;
//! let session = runner.create_session("user-42", "gpt-4o", "You are helpful.").await?;
//! let outcome = runner.run_turn(session.id, "Where is my order A-1234?").await?;
//! println!("{}", outcome.output);
//! # Ok(()) }
//! ```
//!
//! # Features
//! None by default: the engine alone, with no command-line, demo or test
//! machinery and no network client; it builds off Unix (where a lease is
//! freed by its expiry only).
//! - `providers` (= `openai` + `anthropic`): model clients for real
//!   providers in `providers` (reqwest over rustls).
//! - `postgres`: the PostgreSQL backend (`Store::open("postgres://…")`).
//! - `tiktoken`: `TiktokenCounter`, a real tokenizer as the token counter.
//! - `encryption`: SQLite built as SQLCipher; `StoreOptions::with_key`.
//! - `testing` (unstable, outside semver): counters a test kit reads.
//!
//! The `abridge` command is the `abridge-cli` package; the demo workload, the
//! chaos harness and the fidelity workload are the unpublished
//! `abridge-testkit`. [`rusqlite`] and [`macro@async_trait`] are re-exported,
//! so a host's SQL and tool code use the versions abridge does.
//!
//! # Layout
//! - [`store`]: every SQL statement; schema, pool, claims, leases, row structs.
//! - [`message`]: provider-neutral messages, requests, responses; bytes and hashes.
//! - [`render`]: the message renderer, a pure function (rows in, message array out).
//! - [`replay`]: rebuilding an executed step's messages from the store (G3).
//! - [`runner`]: the durable turn/step runner, leases and fencing, tool
//!   effect modes; the message context it extends step by step (and keeps
//!   between turns), byte for byte what a full rebuild gives.
//! - [`tools`]: the tool traits and registry.
//! - [`model`]: the model client trait and its crash contract.
//! - `providers` (features `openai`, `anthropic`): OpenAI Chat Completions
//!   and Responses, Anthropic Messages; errors classified.
//! - [`compaction`]: ensure(), claim/complete protocol, summarisers, planner.
//! - [`events`]: the subscribable event stream.
//! - [`fault`]: named fault points for crash tests and the chaos harness.
//! - [`owner`]: lease owner identities and a local liveness check.
//! - `platform`: what differs by operating system (`/proc`, inodes), gated.
//! - [`retry`]: the one retry policy (capped, jittered) of model and summariser calls.
//! - [`inspect`]: read-only views: sessions, turns, compactions, full transcript export.
//! - [`pins`]: pinned facts (extraction, supersession, the guard's block; G8).
//! - [`text`]: grapheme-safe cuts for caps and display.
//! - [`verify`]: whole-database checks of the guarantees G1-G8.

#![warn(missing_docs)]

pub mod admin;
mod backend_kind;
pub mod clock;
pub mod compaction;
pub mod error;
pub mod events;
pub mod fault;
pub mod ids;
mod lease;
mod legacy;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod message;
pub mod model;
pub mod owner;
pub mod pins;
mod platform;
#[cfg(any(feature = "openai", feature = "anthropic"))]
pub mod providers;
mod read;
pub use read::{inspect, replay, verify};
pub mod render;
mod render_format;
pub mod retry;
pub mod runner;
pub mod store;
#[cfg(feature = "otel")]
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod text;
pub mod tools;
mod unwind;

pub use clock::{Clock, ManualClock, SystemClock};
#[cfg(feature = "tiktoken")]
pub use compaction::TiktokenCounter;
pub use compaction::{
    Background, BackgroundWorker, CompactionConfig, Compactor, ExtractiveSummariser, FailurePolicy,
    ModelSummariser, PromptStyle, Served, Summariser, SummaryRequest, SummaryResponse, Threshold,
    TokenCounter,
};
pub use error::{Error, Result};
pub use events::{Event, EventKind, Subject};
pub use fault::{FaultHook, FaultPoint, Sabotage, TestKnobs};
pub use ids::{CallId, CompactionId, InvocationId, SessionId, StepId, TurnId};
pub use inspect::{ExportFormat, SessionKey};
pub use message::{
    ContentBlock, Message, ModelRequest, ModelResponse, ResponseBlock, Role, ToolSpec, Usage,
};
pub use model::{Delta, ModelClient, ModelError, OnDelta};
pub use replay::Rebuilt;
pub use retry::RetryPolicy;
pub use runner::{Runner, RunnerBuilder, RunnerConfig, TurnOutcome};
pub use store::Decision;
pub use store::{Blocking, Checkpoints, Store, StoreOptions, Synchronous};
pub use tools::{Approval, SubAgent, Tool, ToolCall, ToolError, Tools, TransactionalTool};

/// The SQLite binding of [`TransactionalTool::call`]'s transaction, re-exported
/// so a host uses the very version abridge was built with.
pub use rusqlite;

/// The attribute the model, summariser and tool traits are implemented with
/// (`#[abridge::async_trait]`), re-exported so a host need not depend on it.
pub use async_trait::async_trait;
