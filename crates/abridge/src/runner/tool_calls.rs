//! After the model response: the step's transaction (response, tools by
//! effect mode, completion, the next step claimed) and the tools that run
//! outside it.

use super::*;

impl Runner {
    /// One blocking call, and ONE fenced transaction, that takes a step as far
    /// as it can go without awaiting: writes the response (`persist`), records
    /// the result of the async tool that just ran (`finished`, the call before
    /// `from`), runs the transactional tool calls from `from` on, and either
    /// stops at the next async tool call, committing with its invocation claimed
    /// (everything before an outside effect is durable before it happens), or
    /// completes the step and claims the next one (completes the turn, for a
    /// final answer) and commits. The next step is then prepared in the same
    /// call. A crash anywhere inside rolls back to the previous commit: a step
    /// whose response is lost is called again (the model call is at-least-once),
    /// a tool whose record is lost had no effect outside this transaction.
    pub(super) async fn advance(
        &self,
        plan: &Arc<StepPlan>,
        from: usize,
        persist: Option<Responded>,
        finished: Option<(InvocationId, (bool, String))>,
    ) -> Result<Advanced> {
        let (this, p) = (self.clone(), plan.clone());
        let (advanced, happened) = self
            .inner
            .store
            .call_inline(move |c| {
                let mut happened = Vec::new();
                let advanced = this
                    .advance_blocking(c, &p, from, persist, finished, &mut happened)
                    .map_err(|e| store::explain_lost(c, e))?;
                Ok((advanced, happened))
            })
            .await?;
        // Sent once what they report has committed.
        if !happened.is_empty() {
            let subject = Subject::of(&plan.session, Some(plan.turn.idx));
            for kind in happened {
                self.inner.events.emit(&subject, kind);
            }
        }
        Ok(advanced)
    }

    /// The step's fenced transaction (a lease lost on a deleted turn is
    /// told apart by the caller, once it has ended: `store::explain_lost`).
    pub(super) fn advance_blocking(
        &self,
        c: &mut crate::store::Connection,
        plan: &StepPlan,
        from: usize,
        persist: Option<Responded>,
        finished: Option<(InvocationId, (bool, String))>,
        happened: &mut Vec<EventKind>,
    ) -> Result<Advanced> {
        let hook = &self.inner.cfg.testing.fault_hook;
        let lease = &plan.lease;
        let n = plan.calls.len();
        // Events only when someone listens (building them costs allocations).
        let tell = self.inner.events.listened();
        let tx = store::fenced_tx(c, lease)?;
        let fresh = persist.is_some();
        // A final answer (no tool call) is completed in this transaction with
        // nothing between: its response is written as completed at once.
        let then = if n == 0 {
            store::ResponseThen::Completed
        } else {
            store::ResponseThen::Responded
        };
        if let Some(r) = persist {
            store::write_response(&tx, lease, &r, then)?;
            crate::error::check_fault(hook, FaultPoint::AfterResponseWritten)?;
            if tell {
                happened.push(EventKind::StepResponded {
                    step_id: plan.step_id,
                    step: plan.step_idx,
                    tool_calls: n,
                    input_tokens: r.input_tokens,
                    output_tokens: r.output_tokens,
                });
            }
            // The very string stored, for what is built from this step's rows.
            plan.written
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .response = Some(r.response_json);
        }
        if let Some((id, (ok, result))) = &finished {
            let rerun = self.inner.cfg.testing.sabotage.rerun_completed_effects;
            store::finish_invocation(&tx, lease, *id, *ok, result, rerun)?;
            if from > 0 {
                plan.wrote_result(from - 1, *ok, result);
            }
            if tell && from > 0 {
                let call = plan.call(from - 1);
                let effect = self.prepare_tool(&call).map_or(Effect::None, |t| t.1);
                happened.push(EventKind::ToolCompleted {
                    step_id: plan.step_id,
                    invocation_id: *id,
                    tool_call_id: call.tool_call_id.clone(),
                    tool: call.name.clone(),
                    effect,
                    ok: *ok,
                });
            }
        }
        for pos in from..n {
            if pos > 0 {
                crate::error::check_fault(hook, FaultPoint::BetweenTools)?;
            }
            if let ToolStep::Outside {
                tool,
                row,
                inserted,
                input,
            } = self.tool_in_tx(&tx, plan, pos, fresh, tell, happened)?
            {
                // Everything so far is durable before the outside effect.
                tx.commit()?;
                return Ok(Advanced::Async {
                    pos,
                    tool,
                    row,
                    inserted,
                    input,
                });
            }
        }
        let parked = std::mem::take(&mut *plan.parked.lock().unwrap_or_else(|e| e.into_inner()));
        if !parked.is_empty() {
            // Calls wait: the step stays `responded`, the turn `running` with
            // its lease released. Resuming it comes back here, where the
            // decided calls run and the pending ones park it again.
            store::park_turn(&tx, lease)?;
            tx.commit()?;
            if tell {
                happened.push(EventKind::TurnParked {
                    turn_id: plan.turn.id,
                    calls: parked.len(),
                });
            }
            return Ok(Advanced::Parked(parked));
        }
        crate::error::check_fault(hook, FaultPoint::BeforeStepComplete)?;
        let final_output = (n == 0).then_some(plan.final_text.as_str());
        let finished = store::complete_step(
            &tx,
            lease,
            &plan.turn,
            plan.step_id,
            plan.step_idx,
            final_output,
            fresh && then == store::ResponseThen::Completed,
        )?;
        let mut ctx = plan.ctx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let step_completed = || EventKind::StepCompleted {
            step_id: plan.step_id,
            step: plan.step_idx,
        };
        // The step's rows as written here, when every one of them was: the
        // next step's context and the turn's pins need not read them back.
        let mut written = plan.written.lock().unwrap_or_else(|e| e.into_inner());
        let done = written.step(plan.step_idx);
        if let Some(turn) = finished {
            // The session's next turn starts from the whole of this one.
            if let (Some(c), Some(done)) = (&mut ctx, &done) {
                if c.finish_turn_written(plan.turn.idx, done).is_err() {
                    ctx = None;
                }
            }
            let whole = match (written.turn.take(), done) {
                (Some(mut steps), Some(done)) => {
                    steps.push(done);
                    Some(HistoryTurn {
                        idx: plan.turn.idx,
                        input: plan.turn.input.clone(),
                        steps,
                    })
                }
                _ => None,
            };
            drop(written);
            self.pin_turn(&tx, &plan.session, plan.turn.idx, whole.as_ref())?;
            tx.commit()?;
            if let Some(whole) = &whole {
                // Its size, for the session's next tail walk (not read back).
                self.inner.compactor.turn_finished(&plan.session, whole);
            }
            if tell {
                happened.push(step_completed());
            }
            if let Some(ctx) = ctx {
                self.inner.contexts.put(ctx); // for the session's next turn
            }
            return Ok(Advanced::Finished(turn, plan.final_text.clone()));
        }
        match done {
            Some(done) => {
                // On a failure the next step builds its context as usual.
                if let Some(c) = &mut ctx {
                    if c.extend_written(plan.turn.idx, &done).is_err() {
                        ctx = None;
                    }
                }
                if let Some(steps) = &mut written.turn {
                    steps.push(done);
                }
            }
            None => written.turn = None,
        }
        drop(written);
        // The next step's reads go with this COMMIT (on PostgreSQL).
        let next = tx.commit_then(|c| self.prepare(c, &plan.session, &plan.turn, lease, ctx))?;
        if tell {
            happened.push(step_completed());
        }
        Ok(Advanced::Next(Box::new(next?)))
    }

    /// Tool call `pos` of the step, inside the step's transaction: a refusal
    /// or a transactional tool runs here (its write and result commit with the
    /// step); an outside tool's invocation is claimed and handed back to run
    /// once this transaction has committed; one completed before is skipped
    /// (its stored result is reused, G5).
    pub(super) fn tool_in_tx(
        &self,
        tx: &crate::store::Transaction<'_>,
        plan: &StepPlan,
        pos: usize,
        fresh: bool,
        tell: bool,
        happened: &mut Vec<EventKind>,
    ) -> Result<ToolStep> {
        let hook = &self.inner.cfg.testing.fault_hook;
        let rerun = self.inner.cfg.testing.sabotage.rerun_completed_effects;
        let lease = &plan.lease;
        let mut call = plan.call(pos);
        let mut approved_input = None;
        match self.gate(tx, plan, pos, &call, fresh, tell, happened)? {
            Gate::Open => {}
            Gate::Park(row) => {
                plan.park(*row);
                return Ok(ToolStep::Ran);
            }
            Gate::Run(input) => {
                if let Some(input) = input {
                    call.input = input.clone();
                    approved_input = Some(input);
                }
            }
            Gate::Answer(ok, text) => {
                // The decision's result, recorded as the call's: no tool runs.
                let inv = new_invocation(plan.step_id, pos, &call, Effect::None);
                let body = Box::new(move |_: &crate::store::Transaction<'_>| {
                    Ok(if ok { Ok(text) } else { Err(text) })
                });
                let ran = store::run_transactional(tx, lease, &inv, body, tell, fresh, rerun)?;
                if let Some((_, ok, result)) = &ran {
                    plan.wrote_result(pos, *ok, result);
                }
                return Ok(ToolStep::Ran);
            }
        }
        let (ran, effect) = match self.prepare_tool(&call) {
            Err(refusal) => {
                // No tool runs: record the error result the model sees.
                let inv = new_invocation(plan.step_id, pos, &call, Effect::None);
                let body = Box::new(move |_: &crate::store::Transaction<'_>| Ok(Err(refusal)));
                (
                    store::run_transactional(tx, lease, &inv, body, tell, fresh, rerun)?,
                    Effect::None,
                )
            }
            Ok((ToolImpl::Transactional(tool), _)) => {
                let inv = new_invocation(plan.step_id, pos, &call, Effect::Transactional);
                let tc = call.clone();
                let body = move |tx: &crate::store::Transaction<'_>| {
                    // The tool's statements are the host's: on PostgreSQL they
                    // reach the server as written.
                    let run = || {
                        std::panic::catch_unwind(AssertUnwindSafe(|| {
                            tx.as_host(|| tool.call(tx, &tc))
                        }))
                    };
                    let r = match tool.may_block() {
                        true => crate::store::may_block(run),
                        false => run(),
                    };
                    let out = match r {
                        Ok(Ok(v)) => render_result(v),
                        Ok(Err(e)) => Err(e.0),
                        Err(p) => Err(format!("tool panicked: {}", panic_message(&p))),
                    };
                    crate::error::check_fault(hook, FaultPoint::InsideTransactionalTool)?;
                    Ok(out)
                };
                let ran =
                    store::run_transactional(tx, lease, &inv, Box::new(body), tell, fresh, rerun)?;
                (ran, Effect::Transactional)
            }
            Ok((ToolImpl::Deferred, _)) => {
                // Not reached: a deferred call always passes the gate.
                let inv = new_invocation(plan.step_id, pos, &call, Effect::None);
                let msg = format!("{} has no result: it is delivered, never run", call.name);
                let body = Box::new(move |_: &crate::store::Transaction<'_>| Ok(Err(msg)));
                (
                    store::run_transactional(tx, lease, &inv, body, tell, fresh, rerun)?,
                    Effect::None,
                )
            }
            Ok((ToolImpl::Delegate(agent), effect)) => {
                let inv = new_invocation(plan.step_id, pos, &call, effect);
                let (row, inserted) = store::start_invocation(tx, &inv)?;
                if row.status == InvocationStatus::Started || rerun {
                    let tool: Arc<dyn crate::tools::Tool> = Arc::new(super::delegate::ChildRun {
                        runner: self.clone(),
                        agent,
                        parent: plan.session.clone(),
                        turn_idx: plan.turn.idx,
                        step_id: plan.step_id,
                    });
                    return Ok(ToolStep::Outside {
                        tool,
                        row,
                        inserted,
                        input: approved_input,
                    });
                }
                return Ok(ToolStep::Ran);
            }
            Ok((ToolImpl::Async(tool), effect)) => {
                let inv = new_invocation(plan.step_id, pos, &call, effect);
                let (row, inserted) = store::start_invocation(tx, &inv)?;
                if row.status == InvocationStatus::Started || rerun {
                    return Ok(ToolStep::Outside {
                        tool,
                        row,
                        inserted,
                        input: approved_input,
                    });
                }
                return Ok(ToolStep::Ran);
            }
        };
        if let Some((_, ok, result)) = &ran {
            plan.wrote_result(pos, *ok, result);
        }
        if let Some((Some(invocation_id), ok, _)) = ran {
            happened.push(EventKind::ToolStarted {
                step_id: plan.step_id,
                tool_call_id: call.tool_call_id.clone(),
                tool: call.name.clone(),
                effect,
            });
            happened.push(EventKind::ToolCompleted {
                step_id: plan.step_id,
                invocation_id,
                tool_call_id: call.tool_call_id.clone(),
                tool: call.name.clone(),
                effect,
                ok,
            });
        }
        Ok(ToolStep::Ran)
    }

    /// Whether call `pos` runs now, waits, or is answered by a decision,
    /// inside the step's transaction.
    ///
    /// A step whose response this process wrote has no parked call but
    /// those its plan parked: only a call the policy or a deferred tool
    /// wants parked is looked at, so a host without approvals reads nothing
    /// more, before or after an outside call. A resumed step's call is
    /// looked up: a decision taken for it is applied whatever the policy
    /// says now, and one that ran before is never asked about.
    #[allow(clippy::too_many_arguments)]
    fn gate(
        &self,
        tx: &crate::store::Transaction<'_>,
        plan: &StepPlan,
        pos: usize,
        call: &ToolCall,
        fresh: bool,
        tell: bool,
        happened: &mut Vec<EventKind>,
    ) -> Result<Gate> {
        let registered = self.inner.tools.get(&call.name);
        let deferred = matches!(registered.map(|r| &r.imp), Some(ToolImpl::Deferred));
        let wants = deferred
            || (registered.is_some()
                && call.input.is_object()
                && self.inner.cfg.approval.requires(call));
        let written_here = fresh || plan.responded_here;
        if written_here && !wants {
            return Ok(Gate::Open);
        }
        if !written_here {
            if let Some(mut row) = store::approval_for_call(tx, plan.step_id, &call.tool_call_id)? {
                if let Some(deadline) = self.inner.cfg.decision_deadline {
                    let waited = tx.now_ms().saturating_sub(row.created_at);
                    if row.status == ApprovalStatus::Pending
                        && waited >= deadline.as_millis() as i64
                    {
                        let reason = format!(
                            "no decision within {}",
                            crate::text::human_duration_ms(deadline.as_millis() as i64)
                        );
                        row = store::expire_call(tx, row.id, &reason)?;
                    }
                }
                if row.status != ApprovalStatus::Pending
                    && tell
                    && !plan
                        .resumed
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    happened.push(EventKind::TurnResumed {
                        turn_id: plan.turn.id,
                    });
                }
                return Ok(decided(row));
            }
            if !wants || store::invocation_exists(tx, plan.step_id, &call.tool_call_id)? {
                return Ok(Gate::Open);
            }
        }
        let granted = match deferred {
            true => None,
            false => store::granted(tx, plan.session.id, &call.name)?,
        };
        let effect = match registered {
            Some(r) if !deferred => r.effect.as_str(),
            _ => "deferred",
        };
        let kind = match deferred {
            true => ApprovalKind::Result,
            false => ApprovalKind::Approval,
        };
        let new = NewApproval {
            session_id: plan.session.id,
            turn_id: plan.turn.id,
            step_id: plan.step_id,
            position: pos as i64,
            tool_call_id: &call.tool_call_id,
            tool_name: &call.name,
            arguments: call.input.to_string(),
            effect,
            kind,
        };
        let (row, inserted) = store::park_call(tx, &new, granted)?;
        if row.status != ApprovalStatus::Pending {
            return Ok(decided(row));
        }
        if inserted && tell {
            happened.push(EventKind::ApprovalRequested {
                step_id: plan.step_id,
                call: row.id,
                tool: row.tool_name.clone(),
                kind,
            });
        }
        Ok(Gate::Park(Box::new(row)))
    }

    /// The registered tool for a call, or the refusal the model sees instead.
    pub(super) fn prepare_tool(
        &self,
        call: &ToolCall,
    ) -> std::result::Result<(ToolImpl, Effect), String> {
        match self.inner.tools.get(&call.name) {
            None => Err(format!("unknown tool: {}", call.name)),
            Some(_) if !call.input.is_object() => Err(format!(
                "malformed arguments for {}: expected a JSON object, got {}",
                call.name,
                crate::compaction::truncate_chars(&call.input.to_string(), 200)
            )),
            Some(r) => Ok((r.imp.clone(), r.effect)),
        }
    }

    /// Calls an idempotent or at-most-once tool whose invocation is claimed;
    /// returns (ok, result). At-most-once: a call that had started before (a
    /// crash cut it) is not repeated; its outcome is reported as unknown.
    pub(super) async fn run_async_tool(
        &self,
        plan: &StepPlan,
        pos: usize,
        tool: Arc<dyn crate::tools::Tool>,
        row: &store::InvocationRow,
        inserted: bool,
        input: Option<serde_json::Value>,
    ) -> (bool, String) {
        let mut call = plan.call(pos);
        // Approved with edited arguments: the call goes out with those (as
        // its invocation row records them).
        if let Some(input) = input {
            call.input = input;
        }
        // A call that had started goes out again under the key it first had.
        call.idempotency_key = row.idempotency_key.clone();
        if row.effect == Effect::AtMostOnce && !inserted {
            return (
                false,
                format!(
                    "outcome unknown: the call to {} may or may not have taken effect \
                     (the process stopped during it); it was not repeated",
                    call.name
                ),
            );
        }
        match CatchUnwind(tool.call(&call)).await {
            Ok(Ok(v)) => match render_result(v) {
                Ok(text) => (true, text),
                Err(text) => (false, text),
            },
            Ok(Err(e)) => (false, e.0),
            Err(p) => (false, format!("tool panicked: {}", panic_message(&p))),
        }
    }
}

/// A step with its model response, as the blocking half needs it.
pub(super) struct StepPlan {
    pub(super) calls: Vec<(String, String, serde_json::Value)>,
    /// The step's rows as this process writes them.
    pub(super) written: std::sync::Mutex<Written>,
    pub(super) final_text: String,
    pub(super) session: SessionRow,
    pub(super) turn: TurnRow,
    pub(super) lease: Lease,
    pub(super) step_id: StepId,
    pub(super) step_idx: i64,
    /// The session's message context, handed to the next step's `prepare`.
    pub(super) ctx: std::sync::Mutex<Option<Context>>,
    /// The calls of the step that wait (for a decision or a result).
    pub(super) parked: std::sync::Mutex<Vec<ApprovalRow>>,
    /// Whether `TurnResumed` was told.
    pub(super) resumed: std::sync::atomic::AtomicBool,
    /// Whether this process wrote the step's response: then every parked
    /// row of the step is one this plan wrote, and a call nothing wants
    /// parked needs no look-up (after an outside call, too).
    pub(super) responded_here: bool,
}

/// A step's rows as this process writes them, rendered later exactly as the
/// stored rows are (`render::render_steps`): the response JSON and each
/// call's result, None where it was written before (a resumed step), and the
/// turn's earlier steps while this process wrote every one of them. Each
/// string is the very one bound to the statement that stored it, so what is
/// built from them is what a read of the rows gives (G3).
pub(super) struct Written {
    pub(super) response: Option<String>,
    pub(super) results: Vec<Option<(String, String, bool)>>,
    pub(super) turn: Option<Vec<HistoryStep>>,
}

impl Written {
    /// The completed step `idx`, when all of it was written here.
    pub(super) fn step(&mut self, idx: i64) -> Option<HistoryStep> {
        if !self.results.iter().all(Option::is_some) {
            return None;
        }
        Some(HistoryStep {
            idx,
            response: self.response.take()?,
            results: self.results.drain(..).flatten().collect(),
        })
    }
}

impl StepPlan {
    /// Records that a call waits (once, whatever retried the transaction).
    pub(super) fn park(&self, row: ApprovalRow) {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if !parked.iter().any(|p| p.id == row.id) {
            parked.push(row);
        }
    }

    /// Records the result written for call `pos`.
    pub(super) fn wrote_result(&self, pos: usize, ok: bool, result: &str) {
        let mut w = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(slot), Some((id, _, _))) = (w.results.get_mut(pos), self.calls.get(pos)) {
            *slot = Some((id.clone(), result.to_string(), !ok));
        }
    }

    pub(super) fn call(&self, pos: usize) -> ToolCall {
        let (id, name, input) = &self.calls[pos];
        ToolCall {
            session: self.session.external_id.clone(),
            turn_idx: self.turn.idx,
            step_idx: self.step_idx,
            tool_call_id: id.clone(),
            name: name.clone(),
            input: input.clone(),
            idempotency_key: idempotency_key(
                &self.session.external_id,
                (self.session.id.0, self.session.created_at),
                self.turn.idx,
                self.step_idx,
                id,
            ),
        }
    }
}

/// Why a turn's steps stopped short of a final answer.
pub(super) enum Stop {
    /// Handled already: the turn was failed (the error says why), or the error
    /// leaves it running to be resumed.
    Recorded(Error),
    /// Not handled yet: fails the turn unless it is resumable.
    Error(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Error(e)
    }
}

/// What a call's parked row (or its absence) says of it.
pub(super) enum Gate {
    /// Not parked: runs as any call.
    Open,
    /// Waits: the step parks its turn.
    Park(Box<ApprovalRow>),
    /// Approved: runs, with the edited arguments when given.
    Run(Option<serde_json::Value>),
    /// Rejected, delivered or abandoned: this is its result (ok, text).
    Answer(bool, String),
}

/// The gate of a decided call.
fn decided(row: ApprovalRow) -> Gate {
    match row.status {
        ApprovalStatus::Pending => Gate::Park(Box::new(row)),
        ApprovalStatus::Approved => match row.input.as_deref().map(serde_json::from_str) {
            None => Gate::Run(None),
            Some(Ok(v)) => Gate::Run(Some(v)),
            Some(Err(e)) => {
                Gate::Answer(false, format!("the approved arguments do not parse: {e}"))
            }
        },
        ApprovalStatus::Rejected => Gate::Answer(false, rejection(row.note.as_deref())),
        ApprovalStatus::Delivered => {
            Gate::Answer(row.ok.unwrap_or(true), row.note.unwrap_or_default())
        }
        ApprovalStatus::Abandoned => Gate::Answer(
            false,
            "the call was abandoned before a decision".to_string(),
        ),
    }
}

/// What the model sees of a rejected call.
pub(crate) fn rejection(reason: Option<&str>) -> String {
    match reason.map(str::trim) {
        Some(r) if !r.is_empty() => format!("rejected: {r}"),
        _ => "rejected".to_string(),
    }
}

/// Where [`Runner::advance`] stopped.
pub(super) enum Advanced {
    /// Calls of the step wait: the turn is parked (committed).
    Parked(Vec<ApprovalRow>),
    /// The async tool call at `pos` is to run; its invocation row is claimed
    /// (`input`: the arguments a decision approved, when edited).
    Async {
        pos: usize,
        tool: Arc<dyn crate::tools::Tool>,
        row: store::InvocationRow,
        inserted: bool,
        input: Option<serde_json::Value>,
    },
    /// The step was the turn's last.
    Finished(TurnRow, String),
    /// The step is completed; the next one is prepared.
    Next(Box<Prepared>),
}

/// What [`Runner::tool_in_tx`] did with a tool call.
// Returned once per call and matched at once: never stored, so not boxed.
#[allow(clippy::large_enum_variant)]
pub(super) enum ToolStep {
    /// Ran in the step's transaction (or had run before): go on.
    Ran,
    /// An outside tool whose invocation is claimed: commit, then call it
    /// (with `input`, the arguments a decision approved, when edited).
    Outside {
        tool: Arc<dyn crate::tools::Tool>,
        row: store::InvocationRow,
        inserted: bool,
        input: Option<serde_json::Value>,
    },
}

pub(super) fn new_invocation<'a>(
    step_id: StepId,
    position: usize,
    call: &'a ToolCall,
    effect: Effect,
) -> NewInvocation<'a> {
    NewInvocation {
        step_id,
        position: position as i64,
        tool_call_id: &call.tool_call_id,
        tool_name: &call.name,
        arguments: call.input.to_string(),
        effect,
        idempotency_key: &call.idempotency_key,
    }
}
