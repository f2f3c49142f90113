//! Tools and their effect modes.
//!
//! Each tool declares how its effect is made safe across crashes:
//!
//! | mode | on a crash mid-call | the tool must |
//! |---|---|---|
//! | [`TransactionalTool`] | its writes roll back with the invocation record | write only through the given transaction |
//! | idempotent ([`Tool`] registered with [`Tools::idempotent`]) | called again with the same idempotency key | treat a repeated key as the same request |
//! | at-most-once ([`Tools::at_most_once`]) | never called again; the model sees "outcome unknown" | nothing |
//!
//! In every mode a completed invocation is never called again: its stored
//! result is reused (G5).
//!
//! A tool can also be another agent: [`Tools::delegate`] runs a child
//! session as the effect of a call, once.
//!
//! A call can also wait: for a human's decision ([`Approval`], set on the
//! runner), or for a result another process delivers (a tool registered
//! with [`Tools::deferred`]). The step then records the call as parked and
//! the turn stops there, holding no process: see
//! [`Runner::decide`](crate::Runner::decide).

use crate::message::ToolSpec;
use crate::store::Effect;
use async_trait::async_trait;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One tool call as a tool sees it.
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// The session's external id.
    pub session: String,
    /// Turn index.
    pub turn_idx: i64,
    /// Step index in the turn.
    pub step_idx: i64,
    /// The model's call id.
    pub tool_call_id: String,
    /// Tool name.
    pub name: String,
    /// The arguments (a JSON object).
    pub input: Value,
    /// Stable across every retry of this call: pass it to the service the tool
    /// calls, so a repeated request is recognised.
    pub idempotency_key: String,
}

/// A tool's refusal or failure; the model sees the message as an error result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    /// A tool error with `msg`.
    pub fn new(msg: impl Into<String>) -> ToolError {
        ToolError(msg.into())
    }
}

/// An idempotent or at-most-once tool (async, may call the outside world).
///
/// Write `call` as an `async fn` under `#[abridge::async_trait]` (rustdoc
/// shows the boxed future that attribute expands it to):
///
/// ```
/// use abridge::{Tool, ToolCall, ToolError};
/// use serde_json::{json, Value};
///
/// struct Weather;
///
/// #[abridge::async_trait]
/// impl Tool for Weather {
///     async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
///         let city = call.input["city"].as_str().ok_or(ToolError::new("no city"))?;
///         // Pass call.idempotency_key to a service that de-duplicates.
///         Ok(json!({"city": city, "sky": "clear"}))
///     }
/// }
/// ```
#[async_trait]
pub trait Tool: Send + Sync {
    /// Runs the call. `Ok` is the result the model sees (strings as they are,
    /// other JSON as JSON text); `Err` is an error result the model sees. A panic
    /// is caught and becomes an error result.
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError>;
}

/// A tool whose effect is writes to the abridge database itself.
pub trait TransactionalTool: Send + Sync {
    /// Runs inside the IMMEDIATE transaction that records the invocation as
    /// completed: its writes commit together with that record, or not at all.
    /// Runs where blocking is allowed (see [`TransactionalTool::may_block`]).
    /// An `Err` rolls the tool's writes back and records an error result; a
    /// panic does the same.
    fn call(&self, tx: &crate::store::Transaction<'_>, call: &ToolCall)
        -> Result<Value, ToolError>;

    /// Whether [`call`](TransactionalTool::call) may block on anything but
    /// its own statements (I/O, another lock, `Handle::block_on`). True by
    /// default: the call then runs with its runtime worker's other tasks
    /// handed to the rest of the runtime (`block_in_place`), or on a
    /// blocking thread. A tool that only runs statements on `tx` returns
    /// false and runs on the step's worker as it is, saving that thread
    /// hand-off (see [`Blocking::InPlace`](crate::Blocking::InPlace)): it
    /// must not block otherwise, and `Handle::block_on` panics there.
    fn may_block(&self) -> bool {
        true
    }
}

#[derive(Clone)]
pub(crate) enum ToolImpl {
    Transactional(Arc<dyn TransactionalTool>),
    Async(Arc<dyn Tool>),
    /// No code runs here: the result is delivered (`Decision::Deliver`).
    Deferred,
    /// Runs a child session; its final answer is the result.
    Delegate(Arc<SubAgent>),
}

/// A sub-agent a parent delegates to ([`Tools::delegate`]): the model and
/// system prompt of the child sessions its calls run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAgent {
    /// The child's model (called through the runner's model client).
    pub model: String,
    /// The child's system prompt.
    pub system_prompt: String,
}

impl SubAgent {
    /// A sub-agent on `model` with `system_prompt`.
    pub fn new(model: impl Into<String>, system_prompt: impl Into<String>) -> SubAgent {
        SubAgent {
            model: model.into(),
            system_prompt: system_prompt.into(),
        }
    }
}

/// Which tool calls wait for a human's decision before they run. Default:
/// none.
///
/// A call that needs one is recorded as pending in the step's transaction
/// and its turn is parked (see [`Runner::decide`](crate::Runner::decide));
/// a call a decision approved runs under its tool's effect mode, once.
/// Whether a call needs a decision is asked once, when the step that made it
/// first runs its tools; a parked call keeps waiting whatever a later
/// runner's policy says.
#[derive(Clone, Default)]
pub struct Approval {
    rule: ApprovalRule,
}

#[derive(Clone, Default)]
enum ApprovalRule {
    #[default]
    None,
    All,
    Tools(std::collections::BTreeSet<String>),
    When(Arc<dyn Fn(&ToolCall) -> bool + Send + Sync>),
}

impl std::fmt::Debug for Approval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.rule {
            ApprovalRule::None => f.write_str("Approval::none"),
            ApprovalRule::All => f.write_str("Approval::all"),
            ApprovalRule::Tools(t) => f.debug_tuple("Approval::tools").field(t).finish(),
            ApprovalRule::When(_) => f.write_str("Approval::when(..)"),
        }
    }
}

impl Approval {
    /// No call waits (the default).
    pub fn none() -> Approval {
        Approval::default()
    }

    /// Every call of every tool waits.
    pub fn all() -> Approval {
        Approval {
            rule: ApprovalRule::All,
        }
    }

    /// Every call of these tools waits.
    pub fn tools<I, S>(names: I) -> Approval
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Approval {
            rule: ApprovalRule::Tools(names.into_iter().map(Into::into).collect()),
        }
    }

    /// The calls for which `needs` says true wait (a host's rule over the
    /// tool and its arguments: a refund above an amount, a shell command
    /// outside a list). It must be a pure function of the call.
    pub fn when(needs: impl Fn(&ToolCall) -> bool + Send + Sync + 'static) -> Approval {
        Approval {
            rule: ApprovalRule::When(Arc::new(needs)),
        }
    }

    /// Whether no call ever waits.
    pub fn is_none(&self) -> bool {
        matches!(self.rule, ApprovalRule::None)
    }

    /// Whether `call` waits for a decision.
    pub fn requires(&self, call: &ToolCall) -> bool {
        match &self.rule {
            ApprovalRule::None => false,
            ApprovalRule::All => true,
            ApprovalRule::Tools(t) => t.contains(&call.name),
            ApprovalRule::When(f) => f(call),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Registered {
    pub spec: ToolSpec,
    pub effect: Effect,
    pub imp: ToolImpl,
}

/// The tools a runner offers the model, by name.
#[derive(Clone, Default)]
pub struct Tools {
    pub(crate) by_name: BTreeMap<String, Registered>,
}

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.by_name.iter().map(|(k, v)| (k, v.effect)))
            .finish()
    }
}

impl Tools {
    /// No tools.
    pub fn new() -> Tools {
        Tools::default()
    }

    /// Adds a transactional tool.
    pub fn transactional(
        mut self,
        spec: ToolSpec,
        tool: impl TransactionalTool + 'static,
    ) -> Tools {
        self.insert(
            spec,
            Effect::Transactional,
            ToolImpl::Transactional(Arc::new(tool)),
        );
        self
    }

    /// Adds an idempotent tool.
    pub fn idempotent(mut self, spec: ToolSpec, tool: impl Tool + 'static) -> Tools {
        self.insert(spec, Effect::Idempotent, ToolImpl::Async(Arc::new(tool)));
        self
    }

    /// Adds an at-most-once tool.
    pub fn at_most_once(mut self, spec: ToolSpec, tool: impl Tool + 'static) -> Tools {
        self.insert(spec, Effect::AtMostOnce, ToolImpl::Async(Arc::new(tool)));
        self
    }

    /// Adds a deferred tool: a call of it parks its turn until another
    /// process delivers the result ([`Runner::decide`](crate::Runner::decide)
    /// with [`Decision::Deliver`](crate::store::Decision::Deliver), or
    /// `abridge deliver`), once; the host hands the call to whatever
    /// produces the result (a job queue, a webhook) from the turn's outcome,
    /// its events or [`Store::pending_calls`](crate::Store::pending_calls).
    pub fn deferred(mut self, spec: ToolSpec) -> Tools {
        self.insert(spec, Effect::None, ToolImpl::Deferred);
        self
    }

    /// Adds a delegating tool: each call runs a child session (a
    /// sub-agent on `agent`'s model and system prompt, with this runner's
    /// model client and tools) whose first turn's input is the call's
    /// `task` argument (a string; otherwise the arguments as JSON text),
    /// and whose final answer is the call's result, once.
    ///
    /// The child is created once per call (session, turn, call id), named
    /// `{parent}/{turn}/{call id}`, and knows its parent
    /// ([`crate::store::SessionRow::parent`]). It runs its turn with its
    /// own compaction and pins. After a crash anywhere in the call, the
    /// resumed parent finds the same child and resumes (or reads) its turn:
    /// never a second child, never a second result. A child that fails is
    /// the call's error result. Dropping the parent's turn drops the child's
    /// with it (both stay resumable); abandoning the parent's turn abandons
    /// the child's running turn. Recorded as an idempotent call.
    pub fn delegate(mut self, spec: ToolSpec, agent: SubAgent) -> Tools {
        self.insert(
            spec,
            Effect::Idempotent,
            ToolImpl::Delegate(Arc::new(agent)),
        );
        self
    }

    fn insert(&mut self, spec: ToolSpec, effect: Effect, imp: ToolImpl) {
        self.by_name
            .insert(spec.name.clone(), Registered { spec, effect, imp });
    }

    /// The specs, in name order (the order the model is shown them).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.by_name.values().map(|r| r.spec.clone()).collect()
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Registered> {
        self.by_name.get(name)
    }
}

/// Renders a tool's JSON result as the text the model sees; a result nested
/// deeper than [`crate::message::MAX_JSON_DEPTH`] is an error result instead.
pub(crate) fn render_result(mut value: Value) -> Result<String, String> {
    if crate::message::cap_depth(&mut value, "results") {
        return Err(format!(
            "the tool's result was nested deeper than {} levels and was not kept",
            crate::message::MAX_JSON_DEPTH
        ));
    }
    Ok(match value {
        Value::String(s) => s,
        other => other.to_string(),
    })
}

/// Derives the idempotency key of a call: stable across retries and processes,
/// unique per (session, turn, step, call id) over the store's whole life.
///
/// The session enters by its external id *and* its row (`session_row`: the
/// row id and its creation time in ms), so that a session deleted and created
/// again under the same external id never repeats the deleted one's keys (an
/// idempotent outside API would silently skip the new session's effects).
/// A call that had started is called again with the key stored in its
/// invocation row, whatever derivation made it (an older version's included).
pub(crate) fn idempotency_key(
    session: &str,
    session_row: (i64, i64),
    turn_idx: i64,
    step_idx: i64,
    call_id: &str,
) -> String {
    let (row_id, created_at) = session_row;
    let material =
        format!("{session}\u{0}{row_id}.{created_at}\u{0}{turn_idx}\u{0}{step_idx}\u{0}{call_id}");
    let hex = crate::message::sha256_hex(material.as_bytes());
    format!("abr_{}", &hex[..32])
}
