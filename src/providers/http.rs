//! The HTTP side every adapter shares: one client, a JSON POST, errors
//! classified.

use super::{classify, ApiKey};
use crate::model::ModelError;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use std::time::Duration;

/// Where and how an adapter sends its requests.
#[derive(Debug, Clone)]
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
}

impl HttpOptions {
    /// Defaults at `base_url`.
    pub fn new(base_url: impl Into<String>) -> HttpOptions {
        HttpOptions {
            base_url: base_url.into().trim_end_matches('/').to_string(),
            timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            headers: Vec::new(),
        }
    }
}

/// A client bound to one API: base URL, auth header, timeouts.
#[derive(Clone)]
pub(crate) struct Http {
    client: reqwest::Client,
    base_url: String,
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
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(options.timeout)
            .connect_timeout(options.connect_timeout)
            .build()
            .map_err(|e| crate::Error::Config(format!("HTTP client: {e}")))?;
        Ok(Http {
            client,
            base_url: options.base_url.trim_end_matches('/').to_string(),
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
    /// classified.
    pub(crate) async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, ModelError> {
        let url = format!("{}{path}", self.base_url);
        let sent = self.client.post(&url).json(body).send().await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => return Err(ModelError::Transient(describe(e))),
        };
        let status = resp.status().as_u16();
        let retry_after = retry_after(resp.headers());
        let text = resp
            .text()
            .await
            .map_err(|e| ModelError::Transient(describe(e)))?;
        if !(200..300).contains(&status) {
            return Err(classify(status, retry_after, &text));
        }
        serde_json::from_str(&text).map_err(|e| {
            ModelError::Transient(format!(
                "the answer is not JSON ({e}): {}",
                crate::text::truncate_chars(&text, 200)
            ))
        })
    }
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

/// `Retry-After` in seconds (an HTTP date is not waited for), or OpenAI's
/// `retry-after-ms`.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let secs = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())?
        .trim()
        .parse::<f64>()
        .ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(3600.0)))
}
