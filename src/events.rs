//! The event stream hosts and UIs subscribe to.
//!
//! Events are also emitted as `tracing` events; the stream is for code that
//! wants to react (a progress indicator, a metrics exporter). Sending never
//! blocks: a slow subscriber misses events (tokio broadcast semantics).

use crate::ids::{CompactionId, SessionId};
use serde::Serialize;
use tokio::sync::broadcast;

/// Something a host may want to show or count.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// A compaction row was claimed (or taken over) and the summariser is running.
    Compacting {
        /// Session id.
        session_id: SessionId,
        /// Turns 0..=boundary are being summarised.
        boundary: i64,
        /// The row.
        compaction_id: CompactionId,
        /// Claims and takeovers of the row so far.
        attempt: i64,
        /// The measure that triggered it.
        trigger_tokens: Option<i64>,
    },
    /// A compaction completed.
    Compacted {
        /// Session id.
        session_id: SessionId,
        /// Boundary.
        boundary: i64,
        /// The row.
        compaction_id: CompactionId,
        /// Tokens of what the summary replaces.
        tokens_before: i64,
        /// Tokens of the summary.
        tokens_after: i64,
        /// Summariser input tokens.
        input_tokens: Option<i64>,
        /// Summariser output tokens.
        output_tokens: Option<i64>,
        /// Summariser calls.
        summary_calls: i64,
    },
    /// A summariser attempt failed; `last` is true when the row is now failed.
    CompactionFailed {
        /// Session id.
        session_id: SessionId,
        /// Boundary.
        boundary: i64,
        /// The row.
        compaction_id: CompactionId,
        /// The error.
        error: String,
        /// True after the last attempt.
        last: bool,
    },
    /// The row is pending under another live claim (another task, runner or
    /// process is summarising): this caller waits for it to settle, up to the
    /// compaction's `wait_timeout`. Sent once per wait.
    CompactionWaiting {
        /// Session id.
        session_id: SessionId,
        /// Boundary.
        boundary: i64,
        /// The row.
        compaction_id: CompactionId,
        /// The owner name of the claim being waited on.
        holder: String,
    },
    /// A warning a host should see once (e.g. an unknown context window).
    Warning {
        /// What.
        message: String,
    },
}

/// The sending side, shared by the runner and the compactor.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: broadcast::Sender<Event>,
}

impl Default for EventSink {
    fn default() -> Self {
        EventSink {
            tx: broadcast::channel(1024).0,
        }
    }
}

impl EventSink {
    /// Sends an event to every current subscriber.
    pub fn emit(&self, e: Event) {
        let _ = self.tx.send(e);
    }

    /// A new subscription.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}
