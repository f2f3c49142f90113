//! The model client a host plugs in, and the pieces of an answer a
//! streaming client hands over as they arrive ([`Delta`]).

use crate::message::{ModelRequest, ModelResponse};
use async_trait::async_trait;

/// Why a model call failed.
///
/// The runner retries [`ModelError::Transient`] and [`ModelError::RateLimited`]
/// under `RunnerConfig::model_retry`, fails the step on
/// [`ModelError::Permanent`], and meets [`ModelError::ContextOverflow`] by
/// making the context smaller and trying the step once more (see
/// `docs/design.md`, "Context overflow").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Worth retrying (overload, 5xx, network, timeout).
    #[error("transient model error: {0}")]
    Transient(String),
    /// Rate limited (HTTP 429): worth retrying, not before `retry_after` when
    /// the provider said when.
    #[error("rate limited: {message}")]
    RateLimited {
        /// What the provider said.
        message: String,
        /// The provider's `Retry-After`, if it sent one.
        retry_after: Option<std::time::Duration>,
    },
    /// The request is longer than the model's context window. Retrying the
    /// same request cannot help; a smaller one can.
    #[error("context overflow: {0}")]
    ContextOverflow(String),
    /// Retrying will not help (bad request, auth).
    #[error("model error: {0}")]
    Permanent(String),
    /// The answer's body is longer than the client reads
    /// (`HttpOptions::max_response_bytes`); refused before it was buffered
    /// whole. Not retried: the same request is likely to get the same answer.
    #[error("the provider's answer is larger than {limit_bytes} bytes; refused")]
    ResponseTooLarge {
        /// The limit in force.
        limit_bytes: u64,
    },
}

impl ModelError {
    /// True for the errors a retry of the same request can cure.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ModelError::Transient(_) | ModelError::RateLimited { .. }
        )
    }
}

/// A piece of a model's answer as it arrives, from a client that streams
/// ([`ModelClient::complete_streaming`]). Pieces are for showing progress:
/// what is stored is the response the client returns once the answer is
/// whole, the same response a call without streaming returns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Delta {
    /// More of the answer's text.
    Text {
        /// The new text.
        text: String,
    },
    /// More of the model's reasoning (Anthropic's thinking, OpenAI's
    /// reasoning summary).
    Thinking {
        /// The new text.
        text: String,
    },
    /// More of a tool call: its id and name when they first arrive, then
    /// pieces of its arguments' JSON text.
    ToolCall {
        /// The call's position among the answer's tool calls, from 0.
        index: usize,
        /// The call's id, in the first piece that carries it.
        id: Option<String>,
        /// The tool's name, in the first piece that carries it.
        name: Option<String>,
        /// The next piece of the arguments' text (may be empty).
        arguments: String,
    },
}

/// Where a streaming client hands its [`Delta`]s: called in order, on the
/// task that polls the call, never after the call returns.
pub type OnDelta<'a> = &'a (dyn Fn(Delta) + Send + Sync);

/// A model endpoint.
///
/// # Contract
/// - It **may be called again for the same step** after a crash: a process
///   killed after the request was sent but before the response was persisted
///   repeats the call on resume. A response is persisted in its step's
///   transaction, with the step's transactional tool calls, and always before
///   any outside tool call it makes. Once persisted it is never requested
///   again. Like every durable-execution system, the call itself is
///   at-least-once; what is exactly-once is the recorded outcome.
/// - It should report usage where the provider does; without input tokens
///   abridge estimates the context size with the configured token counter.
/// - It must not panic; a panic is caught and treated as a transient error.
/// - It is polled in the step's own task, not spawned: a call that outlives
///   `RunnerConfig::model_timeout` is dropped (cancelled), not left running.
/// - It must not block its thread (await I/O instead): a blocking client holds
///   up a runtime worker for as long as it blocks.
///
/// # Implementing it
/// Write the methods as `async fn` under `#[abridge::async_trait]` (the
/// signatures rustdoc shows below are what that attribute expands them to:
/// a boxed future with lifetimes, so that the trait can be used as
/// `Arc<dyn ModelClient>`):
///
/// ```
/// use abridge::{ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock};
///
/// struct Echo;
///
/// #[abridge::async_trait]
/// impl ModelClient for Echo {
///     async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
///         let n = request.messages.len();
///         Ok(ModelResponse {
///             blocks: vec![ResponseBlock::Text { text: format!("{n} messages") }],
///             ..Default::default()
///         })
///     }
/// }
/// ```
#[async_trait]
pub trait ModelClient: Send + Sync {
    /// Sends one request and returns the response.
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError>;

    /// Sends one request and streams its answer: `on_delta` gets each piece
    /// as it arrives, and the response returned is the whole answer,
    /// assembled, and exactly what [`ModelClient::complete`] returns for
    /// the same answer (the runner stores it the same way, so a streamed
    /// step rebuilds byte for byte like any other).
    ///
    /// A stream cut short, stalled or malformed is a
    /// [`ModelError::Transient`]: nothing of it is kept, and the runner
    /// tries the step again. The default sends no pieces: it calls
    /// [`ModelClient::complete`], so a client that does not stream works
    /// unchanged with a runner that asks for streaming.
    async fn complete_streaming(
        &self,
        request: &ModelRequest,
        on_delta: OnDelta<'_>,
    ) -> Result<ModelResponse, ModelError> {
        let _ = on_delta;
        self.complete(request).await
    }

    /// The provider behind the client, as OpenTelemetry's GenAI conventions
    /// name it (`gen_ai.provider.name`: `openai`, `anthropic`, ...), for the
    /// spans of the `otel` feature. Default: None (not said).
    fn provider_name(&self) -> Option<&str> {
        None
    }
}
