//! OpenTelemetry spans and metrics (feature `otel`), after the GenAI
//! semantic conventions.
//!
//! Give a runner a [`Telemetry`] made from the host's tracer and meter
//! providers ([`RunnerBuilder::telemetry`](crate::RunnerBuilder::telemetry)):
//!
//! | span | kind | when | attributes |
//! |---|---|---|---|
//! | `invoke_agent` | internal | a turn, from the runner taking it to its end (finished, failed or parked) | `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.conversation.id` (the session), `abridge.turn.index`, `abridge.turn.resumed`, `abridge.turn.steps`, `abridge.turn.parked`, `error.type` |
//! | `chat {model}` | client | each model call (each attempt), a child of its turn's | `gen_ai.operation.name` = `chat`, `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.response.model`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `gen_ai.usage.cache_read.input_tokens`, `gen_ai.response.finish_reasons`, `gen_ai.conversation.id`, `abridge.step.index`, `abridge.attempt`, `error.type`; with content on, `gen_ai.input.messages` and `gen_ai.output.messages` |
//! | `execute_tool {tool}` | internal | each tool call, a child of its turn's | `gen_ai.operation.name` = `execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id`, `gen_ai.tool.type` = `function`, `abridge.tool.effect`, `error.type` |
//! | `compaction` | internal | from a claim to the summary's completion or failure, a child of the turn that claimed it (a root span for a manual or background one without an open turn) | `abridge.compaction.boundary`, `abridge.compaction.attempt`, `abridge.compaction.trigger_tokens`, `abridge.compaction.tokens_before`, `abridge.compaction.tokens_after`, `abridge.compaction.pins`, `abridge.compaction.pins_added`, `abridge.summary.wait_ms` (when a step waited for it), `gen_ai.request.model` (the summariser's), `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `error.type` |
//!
//! A delegated child's `invoke_agent` is a child of its parent's open turn.
//!
//! Metrics: `gen_ai.client.token.usage` (histogram, `{token}`, by
//! `gen_ai.token.type`), `gen_ai.client.operation.duration` (histogram,
//! seconds), `abridge.compactions` (counter, by `abridge.outcome`:
//! `completed`, `failed`), `abridge.summary.waits` (histogram, seconds: a
//! step's wait for a summary) and `abridge.compaction.tokens_saved`
//! (counter: tokens before minus after).
//!
//! Message content is sent only when the host opted in with
//! [`RunnerConfig::log_content`](crate::RunnerConfig::log_content), the same
//! rule as for logs and events; error texts that can quote content are
//! shown as events and logs show them.

use crate::events::{Event, EventKind, Subject};
use crate::ids::{CompactionId, SessionId, StepId};
use crate::message::{ModelRequest, ModelResponse};
use opentelemetry::global::{BoxedSpan, BoxedTracer, ObjectSafeTracerProvider};
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, InstrumentationScope, KeyValue, StringValue, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Open spans kept at most; past it the oldest are ended (a turn whose
/// future was dropped never sends its end).
const MAX_OPEN: usize = 10_000;

/// Spans and metrics for runners (cheap to clone: clones share the open
/// spans).
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
    /// `gen_ai.provider.name` (from the model client, unless set).
    provider: Option<String>,
    /// Whether spans may carry message content.
    content: bool,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("provider", &self.provider)
            .field("content", &self.content)
            .finish()
    }
}

struct Inner {
    tracer: BoxedTracer,
    metrics: Metrics,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    turns: HashMap<(SessionId, i64), Context>,
    tools: HashMap<(StepId, String), Context>,
    compactions: HashMap<CompactionId, Context>,
    /// A summary's wait, when a step waited before the compaction ended.
    waits: HashMap<(SessionId, i64), i64>,
}

struct Metrics {
    tokens: Histogram<u64>,
    duration: Histogram<f64>,
    compactions: Counter<u64>,
    waits: Histogram<f64>,
    saved: Counter<u64>,
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("abridge")
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_schema_url("https://opentelemetry.io/schemas/1.37.0")
        .build()
}

impl Telemetry {
    /// Spans from `tracer_provider` and metrics from `meter_provider` (the
    /// host's, configured with its exporters).
    pub fn new<T, M>(tracer_provider: &T, meter_provider: &M) -> Telemetry
    where
        T: ObjectSafeTracerProvider + ?Sized,
        M: MeterProvider + ?Sized,
    {
        let tracer = BoxedTracer::new(tracer_provider.boxed_tracer(scope()));
        Telemetry::from_parts(tracer, meter_provider.meter_with_scope(scope()))
    }

    /// Spans and metrics from OpenTelemetry's global providers.
    pub fn global() -> Telemetry {
        let tracer =
            BoxedTracer::new(opentelemetry::global::tracer_provider().boxed_tracer(scope()));
        Telemetry::from_parts(
            tracer,
            opentelemetry::global::meter_provider().meter_with_scope(scope()),
        )
    }

    fn from_parts(tracer: BoxedTracer, meter: Meter) -> Telemetry {
        let metrics = Metrics {
            tokens: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Tokens of each model call, by gen_ai.token.type")
                .build(),
            duration: meter
                .f64_histogram("gen_ai.client.operation.duration")
                .with_unit("s")
                .with_description("Duration of each model call")
                .build(),
            compactions: meter
                .u64_counter("abridge.compactions")
                .with_description("Compactions ended, by abridge.outcome")
                .build(),
            waits: meter
                .f64_histogram("abridge.summary.waits")
                .with_unit("s")
                .with_description("How long a step waited for a summary before its model call")
                .build(),
            saved: meter
                .u64_counter("abridge.compaction.tokens_saved")
                .with_unit("{token}")
                .with_description("Tokens a completed compaction took out of the context")
                .build(),
        };
        Telemetry {
            inner: Arc::new(Inner {
                tracer,
                metrics,
                open: Mutex::new(Open::default()),
            }),
            provider: None,
            content: false,
        }
    }

    /// `gen_ai.provider.name` on every span (default: what the runner's
    /// model client says, [`crate::ModelClient::provider_name`]).
    pub fn provider_name(mut self, name: impl Into<String>) -> Telemetry {
        self.provider = Some(name.into());
        self
    }

    /// As a runner binds it: its client's provider unless one was set, and
    /// whether content may be sent.
    pub(crate) fn bound(mut self, provider: Option<&str>, content: bool) -> Telemetry {
        if self.provider.is_none() {
            self.provider = provider.map(str::to_string);
        }
        self.content = content;
        self
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.inner.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn common(&self, subject: &Subject, operation: &'static str) -> Vec<KeyValue> {
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("gen_ai.conversation.id", subject.session.clone()),
        ];
        if let Some(p) = &self.provider {
            attrs.push(KeyValue::new("gen_ai.provider.name", p.clone()));
        }
        attrs
    }

    fn start(
        &self,
        name: String,
        kind: SpanKind,
        attrs: Vec<KeyValue>,
        parent: &Context,
    ) -> Context {
        let span: BoxedSpan = self
            .inner
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attrs)
            .start_with_context(&self.inner.tracer, parent);
        parent.with_span(span)
    }

    /// The open turn span of `subject`'s turn, else its parent session's
    /// newest open turn (a delegated child), else no parent.
    fn turn_parent(
        &self,
        open: &Open,
        session: SessionId,
        turn: Option<i64>,
        parent: Option<SessionId>,
    ) -> Context {
        if let Some(cx) = turn.and_then(|t| open.turns.get(&(session, t))) {
            return cx.clone();
        }
        if let Some(p) = parent {
            if let Some((_, cx)) = open
                .turns
                .iter()
                .filter(|((s, _), _)| *s == p)
                .max_by_key(|((_, t), _)| *t)
            {
                return cx.clone();
            }
        }
        Context::new()
    }

    /// Ends every open span when too many are open.
    fn bound_open(open: &mut Open) {
        let n = open.turns.len() + open.tools.len() + open.compactions.len();
        if n > MAX_OPEN {
            for (_, cx) in open.turns.drain() {
                cx.span().end();
            }
            for (_, cx) in open.tools.drain() {
                cx.span().end();
            }
            for (_, cx) in open.compactions.drain() {
                cx.span().end();
            }
            open.waits.clear();
        }
    }
}

impl crate::events::Observer for Telemetry {
    /// Turns, tools and compactions, from the runner's events.
    fn observe(&self, event: &Event) {
        let s = &event.subject;
        let mut open = self.open();
        match &event.kind {
            EventKind::TurnStarted { resumed, .. } => {
                let Some(t) = s.turn else { return };
                let mut attrs = self.common(s, "invoke_agent");
                attrs.push(KeyValue::new("gen_ai.request.model", s.model.clone()));
                attrs.push(KeyValue::new("abridge.turn.index", t));
                attrs.push(KeyValue::new("abridge.turn.resumed", *resumed));
                let parent = if s.parent.is_some() {
                    self.turn_parent(&open, s.session_id, None, s.parent)
                } else {
                    Context::new()
                };
                let cx = self.start("invoke_agent".into(), SpanKind::Internal, attrs, &parent);
                Telemetry::bound_open(&mut open);
                if let Some(old) = open.turns.insert((s.session_id, t), cx) {
                    old.span().end();
                }
            }
            EventKind::TurnFinished { steps, .. } => {
                if let Some(cx) = s.turn.and_then(|t| open.turns.remove(&(s.session_id, t))) {
                    cx.span()
                        .set_attribute(KeyValue::new("abridge.turn.steps", *steps));
                    cx.span().set_status(Status::Ok);
                    cx.span().end();
                }
            }
            EventKind::TurnFailed { error, .. } => {
                if let Some(cx) = s.turn.and_then(|t| open.turns.remove(&(s.session_id, t))) {
                    cx.span()
                        .set_attribute(KeyValue::new("error.type", "turn_failed"));
                    cx.span().set_status(Status::error(error.clone()));
                    cx.span().end();
                }
            }
            EventKind::TurnParked { calls, .. } => {
                if let Some(cx) = s.turn.and_then(|t| open.turns.remove(&(s.session_id, t))) {
                    cx.span()
                        .set_attribute(KeyValue::new("abridge.turn.parked", true));
                    cx.span()
                        .set_attribute(KeyValue::new("abridge.turn.waiting_calls", *calls as i64));
                    cx.span().end();
                }
            }
            EventKind::ToolStarted {
                step_id,
                tool_call_id,
                tool,
                effect,
            } => {
                let mut attrs = self.common(s, "execute_tool");
                attrs.push(KeyValue::new("gen_ai.tool.name", tool.clone()));
                attrs.push(KeyValue::new("gen_ai.tool.call.id", tool_call_id.clone()));
                attrs.push(KeyValue::new("gen_ai.tool.type", "function"));
                attrs.push(KeyValue::new("abridge.tool.effect", effect.as_str()));
                let parent = self.turn_parent(&open, s.session_id, s.turn, None);
                let cx = self.start(
                    format!("execute_tool {tool}"),
                    SpanKind::Internal,
                    attrs,
                    &parent,
                );
                Telemetry::bound_open(&mut open);
                open.tools.insert((*step_id, tool_call_id.clone()), cx);
            }
            EventKind::ToolCompleted {
                step_id,
                tool_call_id,
                ok,
                ..
            } => {
                if let Some(cx) = open.tools.remove(&(*step_id, tool_call_id.clone())) {
                    if !ok {
                        cx.span()
                            .set_attribute(KeyValue::new("error.type", "tool_error"));
                        cx.span()
                            .set_status(Status::error("the tool's result is an error"));
                    }
                    cx.span().end();
                }
            }
            EventKind::CompactionClaimed {
                compaction_id,
                boundary,
                attempt,
                trigger_tokens,
            } => {
                let mut attrs = vec![
                    KeyValue::new("abridge.compaction.boundary", *boundary),
                    KeyValue::new("abridge.compaction.attempt", *attempt),
                    KeyValue::new("gen_ai.conversation.id", s.session.clone()),
                ];
                if let Some(t) = trigger_tokens {
                    attrs.push(KeyValue::new("abridge.compaction.trigger_tokens", *t));
                }
                let parent = self.turn_parent(&open, s.session_id, s.turn, None);
                let cx = self.start("compaction".into(), SpanKind::Internal, attrs, &parent);
                Telemetry::bound_open(&mut open);
                if let Some(old) = open.compactions.insert(*compaction_id, cx) {
                    old.span().end();
                }
            }
            EventKind::WaitedForSummary {
                boundary,
                waited_ms,
                ..
            } => {
                self.inner
                    .metrics
                    .waits
                    .record(*waited_ms as f64 / 1000.0, &[]);
                open.waits.insert((s.session_id, *boundary), *waited_ms);
            }
            EventKind::Compacted {
                compaction_id,
                boundary,
                tokens_before,
                tokens_after,
                summariser_model,
                input_tokens,
                output_tokens,
                pins_live,
                pins_added,
                ..
            } => {
                let m = &self.inner.metrics;
                m.compactions
                    .add(1, &[KeyValue::new("abridge.outcome", "completed")]);
                m.saved.add(
                    tokens_before.saturating_sub(*tokens_after).max(0) as u64,
                    &[],
                );
                if let Some(cx) = open.compactions.remove(compaction_id) {
                    let span = cx.span();
                    span.set_attribute(KeyValue::new(
                        "abridge.compaction.tokens_before",
                        *tokens_before,
                    ));
                    span.set_attribute(KeyValue::new(
                        "abridge.compaction.tokens_after",
                        *tokens_after,
                    ));
                    span.set_attribute(KeyValue::new("abridge.compaction.pins", *pins_live));
                    span.set_attribute(KeyValue::new("abridge.compaction.pins_added", *pins_added));
                    if let Some(model) = summariser_model {
                        span.set_attribute(KeyValue::new("gen_ai.request.model", model.clone()));
                    }
                    if let Some(n) = input_tokens {
                        span.set_attribute(KeyValue::new("gen_ai.usage.input_tokens", *n));
                    }
                    if let Some(n) = output_tokens {
                        span.set_attribute(KeyValue::new("gen_ai.usage.output_tokens", *n));
                    }
                    if let Some(w) = open.waits.remove(&(s.session_id, *boundary)) {
                        span.set_attribute(KeyValue::new("abridge.summary.wait_ms", w));
                    }
                    span.set_status(Status::Ok);
                    span.end();
                }
            }
            EventKind::CompactionFailed {
                compaction_id,
                error,
                last,
                ..
            } => {
                if *last {
                    self.inner
                        .metrics
                        .compactions
                        .add(1, &[KeyValue::new("abridge.outcome", "failed")]);
                }
                if let Some(cx) = open.compactions.remove(compaction_id) {
                    cx.span()
                        .set_attribute(KeyValue::new("error.type", "compaction_failed"));
                    cx.span().set_status(Status::error(error.clone()));
                    cx.span().end();
                }
            }
            _ => {}
        }
    }
}

impl Telemetry {
    /// A model call (one attempt) begins: its `chat` span.
    pub(crate) fn model_call(
        &self,
        subject: &Subject,
        step: i64,
        attempt: u32,
        request: &ModelRequest,
    ) -> ModelCall {
        let mut attrs = self.common(subject, "chat");
        attrs.push(KeyValue::new("gen_ai.request.model", request.model.clone()));
        attrs.push(KeyValue::new("abridge.step.index", step));
        attrs.push(KeyValue::new("abridge.attempt", attempt as i64));
        if self.content {
            if let Ok(json) = serde_json::to_string(&*request.messages) {
                attrs.push(KeyValue::new("gen_ai.input.messages", json));
            }
        }
        let parent = {
            let open = self.open();
            self.turn_parent(&open, subject.session_id, subject.turn, None)
        };
        let name = format!("chat {}", request.model);
        let cx = self.start(name, SpanKind::Client, attrs, &parent);
        ModelCall {
            cx,
            started: Instant::now(),
            telemetry: self.clone(),
            model: request.model.clone(),
        }
    }
}

/// An open `chat` span.
pub(crate) struct ModelCall {
    cx: Context,
    started: Instant,
    telemetry: Telemetry,
    model: String,
}

impl ModelCall {
    fn metric_attrs(&self, response_model: Option<&str>) -> Vec<KeyValue> {
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.request.model", self.model.clone()),
        ];
        if let Some(p) = &self.telemetry.provider {
            attrs.push(KeyValue::new("gen_ai.provider.name", p.clone()));
        }
        if let Some(m) = response_model {
            attrs.push(KeyValue::new("gen_ai.response.model", m.to_string()));
        }
        attrs
    }

    /// The call answered.
    pub(crate) fn answered(self, response: &ModelResponse) {
        let span = self.cx.span();
        let m = &self.telemetry.inner.metrics;
        let attrs = self.metric_attrs(response.model.as_deref());
        if let Some(model) = &response.model {
            span.set_attribute(KeyValue::new("gen_ai.response.model", model.clone()));
        }
        let u = &response.usage;
        for (key, kind, n) in [
            ("gen_ai.usage.input_tokens", "input", u.input_tokens),
            ("gen_ai.usage.output_tokens", "output", u.output_tokens),
        ] {
            if let Some(n) = n {
                span.set_attribute(KeyValue::new(key, n.min(i64::MAX as u64) as i64));
                let mut a = attrs.clone();
                a.push(KeyValue::new("gen_ai.token.type", kind));
                m.tokens.record(n, &a);
            }
        }
        if let Some(n) = u.cache_read_tokens {
            span.set_attribute(KeyValue::new(
                "gen_ai.usage.cache_read.input_tokens",
                n.min(i64::MAX as u64) as i64,
            ));
        }
        if let Some(reason) = &response.stop_reason {
            span.set_attribute(KeyValue::new(
                "gen_ai.response.finish_reasons",
                Value::Array(vec![StringValue::from(reason.clone())].into()),
            ));
        }
        if self.telemetry.content {
            if let Ok(json) = serde_json::to_string(&response.blocks) {
                span.set_attribute(KeyValue::new("gen_ai.output.messages", json));
            }
        }
        m.duration
            .record(self.started.elapsed().as_secs_f64(), &attrs);
        span.set_status(Status::Ok);
        span.end();
    }

    /// The call failed (`kind`: the error's class; `message` as logs show it).
    pub(crate) fn failed(self, kind: &'static str, message: &str) {
        let span = self.cx.span();
        let mut attrs = self.metric_attrs(None);
        attrs.push(KeyValue::new("error.type", kind));
        span.set_attribute(KeyValue::new("error.type", kind));
        span.set_status(Status::error(message.to_string()));
        self.telemetry
            .inner
            .metrics
            .duration
            .record(self.started.elapsed().as_secs_f64(), &attrs);
        span.end();
    }
}
