//! A local stand-in for a provider's API: answers every request, in the
//! wire format of Chat Completions, Responses or Messages, whole or as a
//! stream when the request asks for one, with a short echo of the user's
//! last words (and a short summary to a summary request). The provider
//! examples run against it when no key is set, so they run in CI.

use crate::fake_http::{answer, serve, FakeServer, Reply};
use serde_json::{json, Value};
use std::time::Duration;

/// Which API the stand-in speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI's Chat Completions.
    OpenAiChat,
    /// OpenAI's Responses.
    OpenAiResponses,
    /// Anthropic's Messages.
    Anthropic,
}

/// Starts the stand-in on 127.0.0.1; its `base` is the clients' base URL.
pub async fn start(wire: Wire) -> FakeServer {
    serve("127.0.0.1", move |_, body| {
        let text = answer_to(wire, body);
        if body.get("stream") == Some(&json!(true)) {
            streamed(wire, &text)
        } else {
            answer(200, &[], &body_of(wire, &text).to_string())
        }
    })
    .await
}

/// The user's last words, as the request carries them in `wire`'s shape.
fn last_user_text(wire: Wire, body: &Value) -> String {
    let list = match wire {
        Wire::OpenAiResponses => &body["input"],
        _ => &body["messages"],
    };
    let Some(user) = list
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &user["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn answer_to(wire: Wire, body: &Value) -> String {
    let said = last_user_text(wire, body);
    if said.to_lowercase().contains("summar") {
        return "The user introduced themselves and asked about their order.".into();
    }
    let words: Vec<&str> = said.split_whitespace().take(12).collect();
    format!("(local stand-in) You said: {}", words.join(" "))
}

fn body_of(wire: Wire, text: &str) -> Value {
    match wire {
        Wire::OpenAiChat => json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 12}}),
        Wire::OpenAiResponses => json!({
            "status": "completed",
            "output": [{"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": 40, "output_tokens": 12}}),
        Wire::Anthropic => json!({
            "id": "msg_local", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 40, "output_tokens": 12}}),
    }
}

/// `text` streamed a word at a time, in `wire`'s events.
fn streamed(wire: Wire, text: &str) -> Reply {
    let words: Vec<String> = text.split_inclusive(' ').map(str::to_string).collect();
    let data = |v: Value| format!("data: {v}\n\n");
    let event = |kind: &str, mut v: Value| {
        v["type"] = json!(kind);
        format!("event: {kind}\ndata: {v}\n\n")
    };
    let mut events = Vec::new();
    match wire {
        Wire::OpenAiChat => {
            for w in &words {
                events.push(data(
                    json!({"choices": [{"index": 0, "delta": {"content": w}}]}),
                ));
            }
            events.push(data(
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ));
            events.push(data(json!({"choices": [],
                "usage": {"prompt_tokens": 40, "completion_tokens": 12}})));
            events.push("data: [DONE]\n\n".into());
        }
        Wire::OpenAiResponses => {
            for w in &words {
                events.push(event(
                    "response.output_text.delta",
                    json!({"output_index": 0, "delta": w}),
                ));
            }
            events.push(event(
                "response.completed",
                json!({"response": body_of(wire, text)}),
            ));
        }
        Wire::Anthropic => {
            events.push(event(
                "message_start",
                json!({"message": {"id": "msg_local", "type": "message", "role": "assistant",
                    "content": [], "usage": {"input_tokens": 40, "output_tokens": 1}}}),
            ));
            events.push(event(
                "content_block_start",
                json!({"index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            for w in &words {
                events.push(event(
                    "content_block_delta",
                    json!({"index": 0, "delta": {"type": "text_delta", "text": w}}),
                ));
            }
            events.push(event("content_block_stop", json!({"index": 0})));
            events.push(event(
                "message_delta",
                json!({"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 12}}),
            ));
            events.push(event("message_stop", json!({})));
        }
    }
    Reply::Pieces {
        head: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            .into(),
        pieces: events.into_iter().map(String::into_bytes).collect(),
        gap: Duration::from_millis(15),
        hang: Duration::ZERO,
    }
}
