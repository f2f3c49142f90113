//! Agents that delegate: a tool call whose effect is a child session's turn.
//!
//! The call is recorded as an idempotent invocation of the parent's step.
//! Its effect is (1) the child session, created once per call under a
//! unique index, and (2) the child's turn 0 with the call's task, begun
//! idempotently on (child, 0, task). A crash anywhere leaves the parent's
//! invocation `started`; the resumed parent calls again, finds the same
//! child, and resumes its turn or reads its final answer, which becomes the
//! parent's result once (the invocation completes once).

use super::Runner;
use crate::events::{EventKind, Subject};
use crate::fault::FaultPoint;
use crate::ids::StepId;
use crate::store::{self, SessionRow};
use crate::tools::{SubAgent, Tool, ToolCall, ToolError};
use serde_json::Value;
use std::sync::Arc;

tokio::task_local! {
    static CHILD: ();
    /// Where a delegating call leaves an error about the moment (a store
    /// busy or unreachable, the child's turn leased by another live host):
    /// the parent's step returns it instead of recording a result.
    static INTERRUPTED: std::cell::RefCell<Option<crate::Error>>;
}

/// Runs `call` (a step's outside tool call) and returns, beside its
/// outcome, the error about the moment a delegating call in it was
/// interrupted by, if any: then its outcome is not the call's result (the
/// call stays started, and the step is resumed as after any such error).
pub(super) async fn interruption_of<F: std::future::Future>(
    call: F,
) -> (F::Output, Option<crate::Error>) {
    INTERRUPTED
        .scope(std::cell::RefCell::new(None), async {
            let out = call.await;
            (out, INTERRUPTED.with(|i| i.borrow_mut().take()))
        })
        .await
}

/// The tool error for `e`, an error of the child's turn or of its setup: one
/// about the moment interrupts the parent's step (see [`interruption_of`]);
/// any other fails the call, its result.
fn child_error(e: crate::Error) -> ToolError {
    let text = e.to_string();
    if e.is_resumable() && INTERRUPTED.try_with(|i| *i.borrow_mut() = Some(e)).is_ok() {
        return ToolError::new(format!("the sub-agent was interrupted: {text}"));
    }
    ToolError::new(format!("the sub-agent failed: {text}"))
}

/// Whether the caller runs inside a delegated child's turn, started by a
/// parent's delegating call in this task (fault hooks use it to say where a
/// point was reached).
pub fn in_child() -> bool {
    CHILD.try_with(|_| ()).is_ok()
}

/// One delegating call of a parent's step, as the tool the runner calls.
pub(super) struct ChildRun {
    pub(super) runner: Runner,
    pub(super) agent: Arc<SubAgent>,
    pub(super) parent: SessionRow,
    pub(super) turn_idx: i64,
    pub(super) step_id: StepId,
}

impl ChildRun {
    /// The task the child's turn is given: the `task` argument, or the
    /// arguments as JSON text.
    fn task(call: &ToolCall) -> String {
        match call.input.get("task") {
            Some(Value::String(t)) if !t.trim().is_empty() => t.clone(),
            _ => call.input.to_string(),
        }
    }

    async fn run(&self, call: &ToolCall) -> Result<Value, ToolError> {
        let hook = &self.runner.inner.cfg.testing.fault_hook;
        let (parent, turn_idx, call_id) = (
            self.parent.clone(),
            self.turn_idx,
            call.tool_call_id.clone(),
        );
        let (model, prompt) = (self.agent.model.clone(), self.agent.system_prompt.clone());
        let (child, created) = self
            .runner
            .inner
            .store
            .call(move |c| store::delegate_child(c, &parent, turn_idx, &call_id, &model, &prompt))
            .await
            .map_err(child_error)?;
        self.runner.inner.events.emit(
            &Subject::of(&self.parent, Some(self.turn_idx)),
            EventKind::Delegated {
                step_id: self.step_id,
                tool_call_id: call.tool_call_id.clone(),
                child_id: child.id,
                child: child.external_id.clone(),
                created,
            },
        );
        crate::error::check_fault(hook, FaultPoint::ChildCreated).map_err(crashed)?;
        // Boxed: the child's turn may delegate again.
        let task = Self::task(call);
        let outcome = CHILD
            .scope((), Box::pin(self.runner.run_turn_at(child.id, 0, &task)))
            .await;
        let outcome = match outcome {
            Ok(o) => o,
            // A crash inside the child's turn is the parent's crash too.
            Err(e @ crate::Error::Injected(_)) => return Err(crashed(e)),
            Err(e) => return Err(child_error(e)),
        };
        if outcome.is_parked() {
            return Err(ToolError::new(format!(
                "the sub-agent {} is waiting for a decision on {} call(s); decide them, \
                 then resume its turn",
                child.external_id,
                outcome.pending.len()
            )));
        }
        if outcome.turn.status == store::TurnStatus::Failed {
            return Err(ToolError::new(format!(
                "the sub-agent failed: {}",
                outcome
                    .turn
                    .error
                    .as_deref()
                    .unwrap_or("no reason recorded")
            )));
        }
        crate::error::check_fault(hook, FaultPoint::ChildAnswered).map_err(crashed)?;
        Ok(Value::String(outcome.output))
    }
}

/// An injected fault as the tool error that carries it out of the call.
fn crashed(e: crate::Error) -> ToolError {
    match e {
        crate::Error::Injected(p) => ToolError::new(format!("{CRASHED}{}", p.name())),
        other => ToolError::new(format!("the sub-agent failed: {other}")),
    }
}

/// The injected fault a tool error carries, if it carries one.
pub(super) fn crash_of(result: &str) -> Option<FaultPoint> {
    result.strip_prefix(CRASHED).and_then(FaultPoint::from_name)
}

/// Marks a tool error that stands for a crash of the process (an injected
/// fault inside the child): the runner stops as a crash would instead of
/// recording it as the call's result.
pub(super) const CRASHED: &str = "\u{0}abridge-crashed: ";

#[async_trait::async_trait]
impl Tool for ChildRun {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        self.run(call).await
    }
}
