//! Model clients for real providers, each a [`crate::ModelClient`] (and so
//! usable as a [`crate::ModelSummariser`]'s client too):
//!
//! - [`OpenAiChat`] (feature `openai`): the Chat Completions API, at any base
//!   URL that speaks it (OpenAI, vLLM, llama.cpp's server, Ollama, LM Studio,
//!   gateways);
//! - [`OpenAiResponses`] (feature `openai`): the Responses API;
//! - [`Anthropic`] (feature `anthropic`): the Messages API, with extended
//!   thinking and prompt-cache breakpoints;
//! - [`OpenAiCompaction`] (feature `openai`): OpenAI's own compaction
//!   (`/responses/compact`) as a [`crate::Summariser`], its opaque items
//!   stored as the summary and sent back by [`OpenAiResponses`];
//! - [`AnthropicCompaction`] (feature `anthropic`): Anthropic's server-side
//!   compaction as a [`crate::Summariser`], its summary stored as text.
//!
//! Each streams too ([`crate::ModelClient::complete_streaming`], over
//! server-sent events parsed by the `eventsource-stream` crate): text,
//! tool-call arguments and reasoning arrive as [`crate::Delta`]s, and the
//! answer the stream assembles is the body a call without streaming gets,
//! parsed by the same code, so a streamed step stores exactly what an
//! unstreamed one would. A stream cut, stalled past
//! [`HttpOptions::stream_idle_timeout`], malformed, or ended by an error
//! event is an error like any other answer's (transient unless the event
//! says otherwise), and nothing of it is kept.
//!
//! Each maps tool definitions, tool calls (the arguments kept as the exact
//! JSON text received, where the provider sends text), tool results, usage
//! (input, output, cache read and write tokens: stored on the step) and stop
//! reasons. HTTP is `reqwest` over rustls, with a connect and a whole-request
//! timeout. The API key comes from the environment or the host, is sent as a
//! header marked sensitive, and is never printed: [`ApiKey`]'s `Debug` hides
//! it and no error text includes it.
//!
//! Errors are classified for the runner's retry policy ([`classify`]): 429 is
//! [`ModelError::RateLimited`] with the provider's `Retry-After`; 408, 409,
//! 5xx, 529 (overloaded), timeouts and network failures are
//! [`ModelError::Transient`]; an answer saying the prompt is longer than the
//! window is [`ModelError::ContextOverflow`]; any other 4xx is
//! [`ModelError::Permanent`].

use crate::error::{Error, Result};
use crate::model::ModelError;
use std::time::Duration;

#[cfg(feature = "anthropic")]
mod anthropic;
#[cfg(feature = "openai")]
mod compact;
mod http;
#[cfg(feature = "openai")]
mod openai;
#[cfg(feature = "openai")]
mod responses;

#[cfg(feature = "anthropic")]
pub use anthropic::{Anthropic, AnthropicCompaction};
#[cfg(feature = "openai")]
pub use compact::{compaction_items, OpenAiCompaction, OPENAI_COMPACTION_MARKER};
pub use http::{
    HttpOptions, Redirects, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_STREAM_IDLE_TIMEOUT,
    MAX_RETRY_AFTER,
};
#[cfg(feature = "openai")]
pub use openai::OpenAiChat;
#[cfg(feature = "openai")]
pub use responses::OpenAiResponses;

/// A provider's API key. Its `Debug` and `Display` print `[redacted]`.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key the host holds.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key in environment variable `var`; [`Error::Config`] naming the
    /// variable (never a value) when it is unset or empty.
    pub fn from_env(var: &str) -> Result<ApiKey> {
        match std::env::var(var) {
            Ok(k) if !k.trim().is_empty() => Ok(ApiKey(k.trim().to_string())),
            _ => Err(Error::Config(format!(
                "environment variable {var} holds no API key"
            ))),
        }
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

impl std::fmt::Display for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// OpenAI's key (`OPENAI_API_KEY`) and base URL (`OPENAI_BASE_URL`, read by
/// [`openai_base_url`]; else OpenAI's own), for the OpenAI clients' `from_env`.
#[cfg(feature = "openai")]
pub(crate) fn openai_env() -> Result<(HttpOptions, ApiKey)> {
    let key = ApiKey::from_env("OPENAI_API_KEY")?;
    let base = std::env::var("OPENAI_BASE_URL")
        .ok()
        .filter(|b| !b.trim().is_empty())
        .map_or_else(
            || OpenAiChat::DEFAULT_BASE_URL.to_string(),
            |b| openai_base_url(&b),
        );
    Ok((HttpOptions::new(base), key))
}

/// Anthropic's key (`ANTHROPIC_API_KEY`) and base URL (`ANTHROPIC_BASE_URL`,
/// read by [`anthropic_base_url`]; else Anthropic's own), for the Anthropic
/// clients' `from_env`.
#[cfg(feature = "anthropic")]
pub(crate) fn anthropic_env() -> Result<(HttpOptions, ApiKey)> {
    let key = ApiKey::from_env("ANTHROPIC_API_KEY")?;
    let base = std::env::var("ANTHROPIC_BASE_URL")
        .ok()
        .filter(|b| !b.trim().is_empty())
        .map_or_else(
            || Anthropic::DEFAULT_BASE_URL.to_string(),
            |b| anthropic_base_url(&b),
        );
    Ok((HttpOptions::new(base), key))
}

/// The base URL the Anthropic clients send to (`{base}/messages`), from a
/// value of `ANTHROPIC_BASE_URL` as Anthropic's own SDKs read it: the API's
/// root (`https://api.anthropic.com`, a proxy's `https://proxy.example`), to
/// which they add `/v1/messages`. A value that already ends in `/v1` is
/// taken as it is (it used to be the only form abridge read); a trailing `/`
/// is dropped.
pub fn anthropic_base_url(root: &str) -> String {
    let root = root.trim().trim_end_matches('/');
    if root.ends_with("/v1") {
        root.to_string()
    } else {
        format!("{root}/v1")
    }
}

/// The base URL the OpenAI clients send to (`{base}/chat/completions`,
/// `{base}/responses`), from a value of `OPENAI_BASE_URL` as OpenAI's own
/// SDKs read it: the URL the paths are added to, `/v1` included when the
/// server has it (`https://api.openai.com/v1`; a local server's
/// `http://localhost:8000/v1`, or one that serves `/chat/completions` at its
/// root). Taken as it is, less a trailing `/`.
pub fn openai_base_url(base: &str) -> String {
    base.trim().trim_end_matches('/').to_string()
}

/// Phrases with which providers and the servers that speak their APIs say a
/// request is longer than the model's window (matched case-insensitively in
/// an error body).
const OVERFLOW_PHRASES: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "input is too long",
    "exceeds the context window",
    "exceeds the available context size",
    "context window",
    "too many tokens",
    "request_too_large",
    "string_above_max_length",
];

/// The kind of a provider's error answer: `status`, its `Retry-After` (if
/// sent) and its body.
pub fn classify(status: u16, retry_after: Option<Duration>, body: &str) -> ModelError {
    let message = error_message(status, body);
    let lower = body.to_ascii_lowercase();
    let overflow = OVERFLOW_PHRASES.iter().any(|p| lower.contains(p));
    match status {
        429 => ModelError::RateLimited {
            message,
            retry_after,
        },
        400 | 413 | 422 if overflow => ModelError::ContextOverflow(message),
        408 | 409 | 500..=599 => ModelError::Transient(message),
        // Anthropic's `overloaded_error` can come with other codes behind a
        // gateway.
        _ if lower.contains("overloaded") => ModelError::Transient(message),
        _ => ModelError::Permanent(message),
    }
}

/// A 2xx answer that is not the shape the API documents: transient (a
/// gateway's or a truncated answer), with the start of the body.
pub(crate) fn malformed(what: &str, body: &serde_json::Value) -> ModelError {
    ModelError::Transient(format!(
        "malformed answer ({what}): {}",
        crate::text::truncate_chars(&body.to_string(), 200)
    ))
}

/// `HTTP <status>: <the provider's message>`, the message taken from the
/// usual `{"error": {"message": ...}}` shapes, else the body's first 500
/// characters.
fn error_message(status: u16, body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let said = parsed.as_ref().and_then(|v| {
        let e = v.get("error").unwrap_or(v);
        e.get("message")
            .and_then(|m| m.as_str())
            .or_else(|| e.as_str())
            .map(str::to_string)
    });
    let said = crate::text::truncate_chars(said.as_deref().unwrap_or(body).trim(), 500);
    format!("HTTP {status}: {said}")
}
