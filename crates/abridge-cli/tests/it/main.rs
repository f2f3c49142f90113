//! The integration tests, one binary: a module per guarantee or surface
//! (each was a test binary of its own; linking the whole stack once instead
//! of once per file is most of what `cargo test` saves). `crates/abridge-cli/tests/logs.rs` and
//! `crates/abridge-cli/tests/query_count.rs` stay binaries of their own: one installs a
//! process-wide log subscriber, the other counts statements in process-wide
//! counters, and neither may see another test's work.

mod common;

mod approvals;
mod background;
mod bad_input;
mod cancel_safety;
#[cfg(unix)]
mod chaos;
mod chat;
mod cli;
mod compaction;
mod crash_points;
mod delegation;
mod docs;
mod encryption;
mod engine;
mod erase;
mod fidelity;
mod forks;
mod golden;
mod host_patterns;
mod hostile;
mod layering;
mod lease;
mod many_sessions;
#[cfg(feature = "mcp")]
mod mcp;
mod portable;
mod postgres;
mod process_kill;
mod providers;
mod read_api;
mod redact;
mod report;
mod schema;
mod streaming;
#[cfg(feature = "otel")]
mod telemetry;
mod tokenizer;
