//! The HTTP side every adapter shares: one client, a JSON POST, errors
//! classified.
//!
//! # What a provider's answer cannot do
//! - **Take the key elsewhere.** No redirect is followed unless the host
//!   allows same-origin ones ([`Redirects::SameOrigin`]); a redirect to another
//!   host, port or scheme is never followed, so neither the key header nor the
//!   conversation is sent anywhere but the configured base URL.
//! - **Panic the client, or stall a turn.** `Retry-After` and
//!   `retry-after-ms` are parsed saturating (any number, any size) and capped
//!   at [`MAX_RETRY_AFTER`]; the runner then waits at most its retry policy's
//!   `max_backoff` and reports a longer demand as a typed error.
//! - **Exhaust memory or the store.** A body longer than
//!   [`HttpOptions::max_response_bytes`] is refused as
//!   [`ModelError::ResponseTooLarge`] once its declared length or the bytes
//!   read so far exceed it, before it is buffered whole or stored.
//! - **Echo the key into the store.** Every error text built from an answer has
//!   the configured key, and any run of [`SCRUB_MIN`] or more of its
//!   characters, replaced by `[redacted]` before it leaves the client.

use super::{classify, ApiKey};
use crate::model::ModelError;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use std::time::Duration;

/// The longest wait a provider's `Retry-After` is read as (one day); any
/// longer or absurd value (`1e300`) is read as this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// The default of [`HttpOptions::max_response_bytes`]: 32 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// Runs of the key at least this long are scrubbed from error texts.
pub const SCRUB_MIN: usize = 8;

/// Which redirects a client follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Redirects {
    /// None (the default): a 3xx answer is a [`ModelError::Permanent`] that
    /// names where it pointed.
    #[default]
    None,
    /// Those to the same scheme, host and port as the request, at most 5 in a
    /// row; any other is not followed.
    SameOrigin,
}

/// Where and how an adapter sends its requests.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpOptions {
    /// The API's base URL, without the endpoint path
    /// (`https://api.openai.com/v1`, `http://127.0.0.1:8080/v1`).
    pub base_url: String,
    /// Longest a whole request may take (the runner's `model_timeout` also
    /// bounds it). Default 600 s: a long answer takes minutes.
    pub timeout: Duration,
    /// Longest the connection may take. Default 10 s.
    pub connect_timeout: Duration,
    /// Extra headers sent with every request (a gateway's, an organisation).
    pub headers: Vec<(String, String)>,
    /// Which redirects are followed. Default: none.
    pub redirects: Redirects,
    /// Largest answer body read, in bytes; a longer one is
    /// [`ModelError::ResponseTooLarge`]. Default:
    /// [`DEFAULT_MAX_RESPONSE_BYTES`] (32 MiB).
    pub max_response_bytes: usize,
    /// Longest a streamed answer may go without an event (a keep-alive
    /// comment or a ping counts) before it is given up as stalled, a
    /// [`ModelError::Transient`] the runner retries. Default 120 s; a
    /// reasoning model that thinks in silence for longer needs more.
    pub stream_idle_timeout: Duration,
}

/// The default of [`HttpOptions::stream_idle_timeout`]: 120 s.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

impl HttpOptions {
    /// Defaults at `base_url`.
    pub fn new(base_url: impl Into<String>) -> HttpOptions {
        HttpOptions {
            base_url: base_url.into().trim_end_matches('/').to_string(),
            timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            headers: Vec::new(),
            redirects: Redirects::None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
        }
    }

    /// Sets how long a streamed answer may go without an event. Default: 120 s.
    pub fn with_stream_idle_timeout(mut self, idle: Duration) -> Self {
        self.stream_idle_timeout = idle;
        self
    }

    /// Sets the whole-request timeout. Default: 600 s.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the connect timeout. Default: 10 s.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Adds a header sent with every request.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets which redirects are followed. Default: [`Redirects::None`].
    pub fn with_redirects(mut self, redirects: Redirects) -> Self {
        self.redirects = redirects;
        self
    }

    /// Sets the largest answer body read. Default: 32 MiB.
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }
}

/// A client bound to one API: base URL, auth header, timeouts.
#[derive(Clone)]
pub(crate) struct Http {
    client: reqwest::Client,
    base_url: String,
    max_response_bytes: usize,
    stream_idle_timeout: Duration,
    /// The key, to scrub from error texts.
    secret: Option<ApiKey>,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Http {
    /// A client sending `auth` (header name and the key, with a prefix such as
    /// `Bearer `) and `fixed` headers with every request.
    pub(crate) fn new(
        options: &HttpOptions,
        auth: Option<(&'static str, &str, &ApiKey)>,
        fixed: &[(&'static str, &str)],
    ) -> crate::Result<Http> {
        let bad = |what: &str| crate::Error::Config(format!("invalid HTTP header {what}"));
        let mut headers = HeaderMap::new();
        if let Some((name, prefix, key)) = auth {
            let mut v = HeaderValue::from_str(&format!("{prefix}{}", key.expose()))
                .map_err(|_| bad(&format!("value for {name} (the API key)")))?;
            v.set_sensitive(true);
            headers.insert(HeaderName::from_static(name), v);
        }
        for (name, value) in fixed {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_str(value).map_err(|_| bad(name))?,
            );
        }
        for (name, value) in &options.headers {
            let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad(name))?;
            headers.insert(n, HeaderValue::from_str(value).map_err(|_| bad(name))?);
        }
        let redirect = match options.redirects {
            Redirects::None => reqwest::redirect::Policy::none(),
            Redirects::SameOrigin => reqwest::redirect::Policy::custom(|attempt| {
                let first = attempt.previous().first();
                let same = first.is_some_and(|from| same_origin(from, attempt.url()));
                if !same || attempt.previous().len() > 5 {
                    attempt.stop()
                } else {
                    attempt.follow()
                }
            }),
        };
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .redirect(redirect)
            .timeout(options.timeout)
            .connect_timeout(options.connect_timeout)
            .build()
            .map_err(|e| crate::Error::Config(format!("HTTP client: {e}")))?;
        Ok(Http {
            client,
            base_url: options.base_url.trim_end_matches('/').to_string(),
            max_response_bytes: options.max_response_bytes,
            stream_idle_timeout: options.stream_idle_timeout,
            secret: auth.map(|(_, _, k)| k.clone()),
        })
    }

    /// A client of OpenAI's APIs: `key`, if any, as a bearer token.
    #[cfg(feature = "openai")]
    pub(crate) fn bearer(options: &HttpOptions, key: Option<&ApiKey>) -> crate::Result<Http> {
        Http::new(options, key.map(|k| ("authorization", "Bearer ", k)), &[])
    }

    /// A client of Anthropic's API: `key` as `x-api-key`, the API version,
    /// and `beta` features.
    #[cfg(feature = "anthropic")]
    pub(crate) fn anthropic(
        options: &HttpOptions,
        key: &ApiKey,
        beta: Option<&str>,
    ) -> crate::Result<Http> {
        let mut fixed = vec![("anthropic-version", super::Anthropic::API_VERSION)];
        fixed.extend(beta.map(|b| ("anthropic-beta", b)));
        Http::new(options, Some(("x-api-key", "", key)), &fixed)
    }

    /// POSTs `body` to `path` and returns the JSON answer, or the error
    /// classified, with the key scrubbed from its text.
    pub(crate) async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, ModelError> {
        self.post_raw(path, body)
            .await
            .map_err(|e| scrub_error(e, self.secret.as_ref()))
    }

    async fn post_raw(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, ModelError> {
        let resp = self.send(path, body).await?;
        let bytes = self.read_body(resp).await?;
        parse_json(&bytes)
    }

    /// POSTs `body` to `path` and reads the answer as server-sent events,
    /// handing each event's name and data to `on_event` until it says the
    /// answer is whole ([`Flow::Done`]). A server that answers with one
    /// JSON body instead of a stream (it ignored `stream: true`) gets that
    /// body back as [`Streamed::Whole`].
    ///
    /// Errors (the key scrubbed from each): the status's, classified, before
    /// any event; then [`ModelError::Transient`] for a connection cut, a
    /// stream that ends before `on_event` said done, a stall longer than
    /// [`HttpOptions::stream_idle_timeout`], bytes that are not UTF-8 or not
    /// an event stream; [`ModelError::ResponseTooLarge`] past
    /// [`HttpOptions::max_response_bytes`]; and whatever `on_event` returns.
    pub(crate) async fn post_stream(
        &self,
        path: &str,
        body: &serde_json::Value,
        on_event: &mut (dyn FnMut(&str, &str) -> Result<Flow, ModelError> + Send),
    ) -> Result<Streamed, ModelError> {
        self.post_stream_raw(path, body, on_event)
            .await
            .map_err(|e| scrub_error(e, self.secret.as_ref()))
    }

    async fn post_stream_raw(
        &self,
        path: &str,
        body: &serde_json::Value,
        on_event: &mut (dyn FnMut(&str, &str) -> Result<Flow, ModelError> + Send),
    ) -> Result<Streamed, ModelError> {
        use eventsource_stream::Eventsource;
        use futures_util::StreamExt;
        let resp = self.send(path, body).await?;
        let is_json = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"));
        if is_json {
            let bytes = self.read_body(resp).await?;
            return parse_json(&bytes).map(Streamed::Whole);
        }
        let limit = self.max_response_bytes;
        let too_large = ModelError::ResponseTooLarge {
            limit_bytes: limit as u64,
        };
        if resp.content_length().is_some_and(|n| n > limit as u64) {
            return Err(too_large);
        }
        // Counted as they arrive: a stream longer than the limit ends here,
        // and with it whatever the parser holds.
        let mut read = 0usize;
        let bytes = resp.bytes_stream().map(move |chunk| {
            let chunk = chunk.map_err(|e| StreamFailure::Transport(describe(e)))?;
            read += chunk.len();
            if read > limit {
                return Err(StreamFailure::TooLarge);
            }
            Ok(chunk)
        });
        let mut events = std::pin::pin!(bytes.eventsource());
        loop {
            let next = tokio::time::timeout(self.stream_idle_timeout, events.next()).await;
            let event = match next {
                Err(_) => {
                    return Err(ModelError::Transient(format!(
                        "the answer's stream stalled: no event for {:?}",
                        self.stream_idle_timeout
                    )))
                }
                Ok(None) => {
                    return Err(ModelError::Transient(
                        "the answer's stream ended before the answer did".into(),
                    ))
                }
                Ok(Some(Err(eventsource_stream::EventStreamError::Transport(f)))) => {
                    return Err(match f {
                        StreamFailure::TooLarge => too_large,
                        StreamFailure::Transport(m) => {
                            ModelError::Transient(format!("the answer's stream was cut: {m}"))
                        }
                    })
                }
                Ok(Some(Err(e))) => {
                    return Err(ModelError::Transient(format!(
                        "the answer's stream is malformed: {}",
                        crate::text::truncate_chars(&e.to_string(), 200)
                    )))
                }
                Ok(Some(Ok(event))) => event,
            };
            if on_event(&event.event, &event.data)? == Flow::Done {
                return Ok(Streamed::Events);
            }
        }
    }

    /// Sends the POST and returns its answer when it is a success; a
    /// redirect (never followed here) and an error status are errors, the
    /// latter classified from its body.
    async fn send(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<reqwest::Response, ModelError> {
        let url = format!("{}{path}", self.base_url);
        let resp = match self.client.post(&url).json(body).send().await {
            Ok(r) => r,
            Err(e) => return Err(ModelError::Transient(describe(e))),
        };
        let status = resp.status().as_u16();
        if (300..400).contains(&status) {
            let to = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(|l| crate::text::truncate_chars(l, 200))
                .unwrap_or_else(|| "nowhere".into());
            return Err(ModelError::Permanent(format!(
                "HTTP {status}: the provider redirected the request to {to}; not followed \
                 (HttpOptions::redirects)"
            )));
        }
        if !(200..300).contains(&status) {
            let retry_after = retry_after(resp.headers());
            let bytes = self.read_body(resp).await?;
            return Err(classify(
                status,
                retry_after,
                &String::from_utf8_lossy(&bytes),
            ));
        }
        Ok(resp)
    }

    /// The answer's body, refused once its declared length or the bytes read
    /// so far pass the limit.
    async fn read_body(&self, mut resp: reqwest::Response) -> Result<Vec<u8>, ModelError> {
        let limit = self.max_response_bytes;
        let too_large = || ModelError::ResponseTooLarge {
            limit_bytes: limit as u64,
        };
        if resp.content_length().is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| ModelError::Transient(describe(e)))?
        {
            if body.len() + chunk.len() > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// What [`Http::post_stream`] read.
#[derive(Debug)]
pub(crate) enum Streamed {
    /// Events, each handed over; the answer is what they said.
    Events,
    /// One JSON body: the server did not stream.
    Whole(serde_json::Value),
}

/// What an adapter's event handler says after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// More events are due.
    More,
    /// The answer is whole: stop reading.
    Done,
}

/// Why the bytes of a stream stopped, as the event parser passes it on.
#[derive(Debug)]
enum StreamFailure {
    Transport(String),
    TooLarge,
}

impl std::fmt::Display for StreamFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamFailure::Transport(m) => f.write_str(m),
            StreamFailure::TooLarge => f.write_str("too large"),
        }
    }
}

/// A 2xx body as JSON; one that is not is transient (a gateway's page, a
/// truncated answer), quoted by its start.
fn parse_json(bytes: &[u8]) -> Result<serde_json::Value, ModelError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ModelError::Transient(format!(
            "the answer is not JSON ({e}): {}",
            crate::text::truncate_chars(&String::from_utf8_lossy(bytes), 200)
        ))
    })
}

/// An event's (or a chunk's) data as JSON; data that is not is a
/// transient error quoting its start.
pub(crate) fn event_json(data: &str) -> Result<serde_json::Value, ModelError> {
    serde_json::from_str(data).map_err(|e| {
        ModelError::Transient(format!(
            "an event of the answer's stream is not JSON ({e}): {}",
            crate::text::truncate_chars(data, 200)
        ))
    })
}

/// An error a provider sends inside a stream (an `error` event, an error
/// object in place of a chunk) as the error of the HTTP status it stands
/// for: `kind` is the provider's error type or code (`overloaded_error`,
/// `rate_limit_exceeded`, `context_length_exceeded`, ...), `body` the
/// event's JSON. An unknown kind is transient: a failure after the answer
/// began is the server's.
pub(crate) fn stream_error(kind: &str, body: &str) -> ModelError {
    let status = match kind {
        "rate_limit_error" | "rate_limit_exceeded" | "rate_limited" => 429,
        "invalid_request_error" | "context_length_exceeded" | "invalid_prompt" => 400,
        "authentication_error" | "invalid_api_key" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "overloaded_error" => 529,
        _ => 500,
    };
    classify(status, None, body)
}

fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// `e` with `key` scrubbed from its text.
fn scrub_error(e: ModelError, key: Option<&ApiKey>) -> ModelError {
    let Some(key) = key else { return e };
    let s = |m: String| scrub(&m, key.expose());
    match e {
        ModelError::Transient(m) => ModelError::Transient(s(m)),
        ModelError::RateLimited {
            message,
            retry_after,
        } => ModelError::RateLimited {
            message: s(message),
            retry_after,
        },
        ModelError::ContextOverflow(m) => ModelError::ContextOverflow(s(m)),
        ModelError::Permanent(m) => ModelError::Permanent(s(m)),
        other => other,
    }
}

/// `text` with every occurrence of a run of at least [`SCRUB_MIN`]
/// characters of `key` (the key itself, its head, its tail, any part of it
/// that an answer echoes) replaced by `[redacted]`. A key shorter than
/// `SCRUB_MIN` is scrubbed whole only.
pub(crate) fn scrub(text: &str, key: &str) -> String {
    let key: Vec<char> = key.chars().collect();
    if key.is_empty() {
        return text.to_string();
    }
    let chars: Vec<char> = text.chars().collect();
    let min = SCRUB_MIN.min(key.len());
    let mut hidden = vec![false; chars.len()];
    let mut i = 0;
    while i + min <= chars.len() {
        // The longest run of the key that starts at text position i.
        let mut best = 0;
        for start in 0..key.len() {
            let n = chars[i..]
                .iter()
                .zip(&key[start..])
                .take_while(|(a, b)| a == b)
                .count();
            best = best.max(n);
        }
        if best >= min {
            hidden[i..i + best].iter_mut().for_each(|h| *h = true);
            i += best;
        } else {
            i += 1;
        }
    }
    if !hidden.contains(&true) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut k = 0;
    while k < chars.len() {
        if hidden[k] {
            out.push_str("[redacted]");
            while k < chars.len() && hidden[k] {
                k += 1;
            }
        } else {
            out.push(chars[k]);
            k += 1;
        }
    }
    out
}

/// A transport error without its URL's query or any header: the kind and the
/// host.
fn describe(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the answer's body failed"
    } else {
        "the request failed"
    };
    let host = e
        .url()
        .and_then(|u| u.host_str().map(|h| format!(" ({h})")))
        .unwrap_or_default();
    format!("{kind}{host}: {}", e.without_url())
}

/// A header's number of seconds as a wait: any finite, non-negative number,
/// however large, read saturating and capped at [`MAX_RETRY_AFTER`]; None for
/// anything else (negative, NaN, not a number, an HTTP date).
pub(crate) fn wait_of(secs: &str) -> Option<Duration> {
    let secs: f64 = secs.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(
        Duration::try_from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64()))
            .unwrap_or(MAX_RETRY_AFTER),
    )
}

/// OpenAI's `retry-after-ms`, else `Retry-After` in seconds (an HTTP date is
/// not waited for): see [`wait_of`].
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return wait_of(&(ms / 1000.0).to_string());
        }
    }
    wait_of(get(RETRY_AFTER.as_str())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_retry_after_is_read_saturating_and_capped() {
        for (value, want) in [
            ("1", Some(Duration::from_secs(1))),
            ("0.25", Some(Duration::from_millis(250))),
            ("1e300", Some(MAX_RETRY_AFTER)),
            ("3600000", Some(MAX_RETRY_AFTER)),
            ("18446744073709551616", Some(MAX_RETRY_AFTER)),
            ("-1", None),
            ("NaN", None),
            ("inf", None),
            ("Wed, 21 Oct 2015 07:28:00 GMT", None),
            ("", None),
        ] {
            assert_eq!(wait_of(value), want, "{value:?}");
        }
        let mut h = HeaderMap::new();
        h.insert("retry-after-ms", HeaderValue::from_static("1e300"));
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
        let mut h = HeaderMap::new();
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn the_key_and_its_fragments_are_scrubbed() {
        let key = "sk-live-0123456789abcdefXYZ";
        assert_eq!(
            scrub(&format!("Incorrect API key provided: {key}."), key),
            "Incorrect API key provided: [redacted]."
        );
        // An echo that elides the middle still shows neither end.
        assert_eq!(
            scrub("key sk-live-01****bcdefXYZ is wrong", key),
            "key [redacted]****[redacted] is wrong"
        );
        assert_eq!(scrub("nothing here: sk-", key), "nothing here: sk-");
        assert_eq!(scrub("short ab", "ab"), "short [redacted]");
        assert_eq!(scrub("é{key}é", key), "é{key}é");
        assert_eq!(scrub(&format!("é{key}é"), key), "é[redacted]é");
    }
}
