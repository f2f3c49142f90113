//! What abridge's command, test suites and benchmarks run on top of the
//! engine. Not published; nothing here is part of the engine's API.
//!
//! - [`demo`]: the deterministic customer-support workload behind
//!   `abridge demo` (its scripted model, tools and summariser).
//! - [`demo_tables`]: the demo's own host tables (the effects its tools
//!   apply) and the effect check `verify` runs on them.
//! - [`chaos`] (Unix): the kill/race/fault harness behind `abridge chaos`,
//!   with the deliberately broken runners of the `broken-*` features.
//! - [`fidelity`]: the workload measuring what summaries keep.
//! - [`long_session`]: one new fact a turn for hundreds of compactions.
//! - [`probes`]: the probe evaluation (what the model can answer after 1, 3,
//!   10 and 20 compactions).
//! - [`mcp_fixture`]: an MCP server of the project's own (the binary
//!   `abridge-mcp-fixture`), for the MCP tests.
//! - [`fake_http`]: a scripted HTTP server for provider clients.
//! - [`local_provider`]: a local stand-in for each provider's API (the
//!   provider examples' server when no key is set).
//! - [`seed`]: bulk history for benchmarks, written as a runner would have.
//! - [`sabotage`]: which deliberately broken behaviour this build's runners
//!   have (none unless a `broken-*` feature is on).

#![warn(missing_docs)]

#[cfg(unix)]
pub mod chaos;
pub mod demo;
pub mod demo_tables;
pub mod fake_http;
pub mod fidelity;
pub mod local_provider;
pub mod long_session;
pub mod mcp_fixture;
pub mod probes;
pub mod sabotage;
pub mod scripted;

/// Bulk history for benchmarks, written as a runner would have (the
/// engine's, under its `testing` feature: it writes rows as the engine does).
pub use abridge::testing::seed;
