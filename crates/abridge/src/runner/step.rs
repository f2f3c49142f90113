//! One step up to its model response: the step found (or claimed), its
//! compaction planned and resolved, its messages built, the model called.

use super::*;

/// What `prepare` found for the next step. The session's message context
/// travels with it.
pub(super) enum Prepared {
    /// A step with a persisted response: run its tools.
    Resume(store::StepRow, Option<Context>),
    /// The step fails the turn (max steps, compaction failure policy).
    Fail(store::StepRow, Error),
    /// A step to execute.
    Run(store::StepRow, Box<Work>),
}

/// The context-overflow remedies a step has used (each at most once).
#[derive(Default)]
pub(super) struct Remedies {
    pub(super) compacted: bool,
    pub(super) tried_elision: bool,
    /// The steps of the turn whose results the step's context elides.
    pub(super) elided: i64,
}

/// The work of a step to execute: what its compaction plan says must
/// happen first, and its context.
pub(super) struct Work {
    /// Carried out by the compactor before the model call.
    pub(super) plan: Plan,
    /// Built already when the plan let the step read its compaction now.
    pub(super) context: StepContext,
}

/// A step's context, as far as `prepare` could build it.
pub(super) enum StepContext {
    /// Built on the compaction the plan lets the step read now.
    Built(Context),
    /// To build on the compaction the plan's resolution returns: from the
    /// turn's previous context (if kept), eliding the results of the turn's
    /// first steps as its previous step did.
    After(Option<Context>, i64),
}

impl Runner {
    #[instrument(skip(self, turn, lease, session, first, slot), fields(session = %session.external_id, session_id = %turn.session_id, turn = turn.idx, turn_id = %turn.id))]
    pub(super) async fn drive(
        &self,
        turn: TurnRow,
        lease: Lease,
        session: SessionRow,
        first: Prepared,
        slot: Slot,
    ) -> Result<TurnOutcome> {
        let _hb = self.heartbeat(&lease);
        let turn_idx = Some(turn.idx);
        if let Some(from) = &lease.taken_from {
            self.tell(&session, turn_idx, || EventKind::LeaseTakenOver {
                turn_id: turn.id,
                from: from.clone(),
            });
        }
        self.tell(&session, turn_idx, || EventKind::TurnStarted {
            turn_id: turn.id,
            resumed: lease.epoch > 1,
        });
        let mut at_step = None;
        let out = match self
            .drive_steps(&turn, &lease, &session, first, slot, &mut at_step)
            .await
        {
            Ok(done) => Ok(done),
            Err(Stop::Recorded(e)) => Err(e),
            Err(Stop::Error(e)) if e.is_resumable() => Err(e),
            // Anything that cannot succeed on a retry (a row that does not read
            // back, a constraint refused) fails the turn: never left running.
            Err(Stop::Error(e)) => Err(self.fail(&lease, at_step, e).await),
        };
        match &out {
            Ok(done) if done.is_parked() => {}
            Ok(done) => self.tell(&session, turn_idx, || EventKind::TurnFinished {
                turn_id: turn.id,
                steps: done.steps,
            }),
            Err(e) if !e.is_resumable() => {
                self.tell(&session, turn_idx, || EventKind::TurnFailed {
                    turn_id: turn.id,
                    error: self.inner.events.error(e),
                })
            }
            Err(_) => {}
        }
        out
    }

    pub(super) async fn drive_steps(
        &self,
        turn: &TurnRow,
        lease: &Lease,
        session: &SessionRow,
        first: Prepared,
        mut slot: Slot,
        at_step: &mut Option<StepId>,
    ) -> std::result::Result<TurnOutcome, Stop> {
        // `slot` is the turn's place in the runner's fair queue, taken before
        // its begin: held while the step works the store and the CPU, given
        // back around the model call, a summary and a tool that runs outside
        // the transaction.
        let mut next = first;
        // The turn's steps as this process wrote them, while it wrote every
        // one from the first (see `StepPlan::written`).
        let mut journal = match &next {
            Prepared::Run(step, _) if step.idx == 0 => Some(Vec::new()),
            _ => None,
        };
        loop {
            let (step, response, persist, ctx) = match next {
                Prepared::Resume(step, ctx) => {
                    *at_step = Some(step.id);
                    let r: ModelResponse =
                        serde_json::from_str(step.response.as_deref().unwrap_or("{}"))
                            .map_err(Error::from)?;
                    (step, r, None, ctx)
                }
                Prepared::Fail(step, e) => {
                    return Err(Stop::Recorded(self.fail(lease, Some(step.id), e).await))
                }
                Prepared::Run(step, work) => {
                    *at_step = Some(step.id);
                    self.tell(session, Some(turn.idx), || EventKind::StepStarted {
                        step_id: step.id,
                        step: step.idx,
                    });
                    self.inner.queue.retake(&mut slot).await;
                    match self.execute(session, turn, &step, *work, &mut slot).await {
                        Ok((r, persist, ctx)) => (step, r, Some(persist), Some(ctx)),
                        Err(e) if e.is_resumable() => return Err(Stop::Recorded(e)),
                        Err(e) => {
                            return Err(Stop::Recorded(self.fail(lease, Some(step.id), e).await))
                        }
                    }
                }
            };
            let calls: Vec<_> = response
                .tool_calls()
                .map(|(id, name, input)| (id.to_string(), name.to_string(), input.clone()))
                .collect();
            let written = Written {
                // A fresh step's response is set as it is written.
                response: persist.is_none().then(|| step.response.clone()).flatten(),
                results: vec![None; calls.len()],
                turn: journal.take(),
            };
            let plan = Arc::new(StepPlan {
                calls,
                written: std::sync::Mutex::new(written),
                final_text: response.text(),
                session: session.clone(),
                turn: turn.clone(),
                lease: lease.clone(),
                step_id: step.id,
                step_idx: step.idx,
                ctx: std::sync::Mutex::new(ctx),
                parked: std::sync::Mutex::new(Vec::new()),
                resumed: std::sync::atomic::AtomicBool::new(false),
                responded_here: persist.is_some(),
            });
            let mut advanced = self.advance(&plan, 0, persist, None).await?;
            next = loop {
                match advanced {
                    Advanced::Next(p) => {
                        journal = plan
                            .written
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .turn
                            .take();
                        break *p;
                    }
                    Advanced::Finished(turn, output) => {
                        return Ok(TurnOutcome {
                            turn,
                            output,
                            steps: step.idx + 1,
                            pending: Vec::new(),
                        })
                    }
                    Advanced::Parked(pending) => {
                        return Ok(TurnOutcome {
                            turn: TurnRow {
                                lease_owner: None,
                                lease_expires_at: None,
                                ..turn.clone()
                            },
                            output: String::new(),
                            steps: step.idx + 1,
                            pending,
                        })
                    }
                    Advanced::Async {
                        pos,
                        tool,
                        row,
                        inserted,
                        input,
                    } => {
                        self.tell(session, Some(turn.idx), || EventKind::ToolStarted {
                            step_id: step.id,
                            tool_call_id: row.tool_call_id.clone(),
                            tool: row.tool_name.clone(),
                            effect: row.effect,
                        });
                        slot.release();
                        let (result, interrupted) = super::delegate::interruption_of(
                            self.run_async_tool(&plan, pos, tool, &row, inserted, input),
                        )
                        .await;
                        self.inner.queue.retake(&mut slot).await;
                        // A delegating call whose child met an error about
                        // the moment (its turn leased by another live host,
                        // the store busy): the step stops with it, the call
                        // stays started and is made again on resume.
                        if let Some(e) = interrupted {
                            return Err(e.into());
                        }
                        // A crash injected inside a delegating call's child
                        // stops this turn as a crash would.
                        if let Some(p) = super::delegate::crash_of(&result.1) {
                            return Err(crate::Error::Injected(p).into());
                        }
                        crate::error::check_fault(
                            &self.inner.cfg.testing.fault_hook,
                            FaultPoint::AfterToolEffect,
                        )?;
                        advanced = self
                            .advance(&plan, pos + 1, None, Some((row.id, result)))
                            .await?;
                    }
                }
            };
        }
    }

    /// The finding of `prepare`, run in the caller's blocking call: the step to
    /// run (a read: the transaction that completed the previous step, or began
    /// the turn, claimed it); if it is to run, its compaction decided and, when
    /// there is nothing to compact, its messages built.
    pub(super) fn prepare(
        &self,
        c: &mut crate::store::Connection,
        session: &SessionRow,
        turn: &TurnRow,
        lease: &Lease,
        mut ctx: Option<Context>,
    ) -> Result<Prepared> {
        let max_steps = self.inner.cfg.max_steps as i64;
        // The common case: the step claimed by the transaction that completed
        // the previous one (or began the turn) is read in the same read
        // transaction as the rest, in one round trip with its first reads on
        // PostgreSQL.
        let mut running = None;
        let compactor = &self.inner.compactor;
        // A context that holds the whole of the turn before takes this
        // turn's input from its row: the turn's first step reads no history.
        if let Some(ctx) = &mut ctx {
            ctx.begin_turn_written(turn);
        }
        let fast = store::in_step_read_tx(c, |c| {
            let next = Context::prefetch_next(ctx.as_ref(), c, session.id, turn.idx)?;
            compactor.prefetch_decision(c, session, turn.idx, next)?;
            match store::last_step(c, lease.turn_id)? {
                Some(s) if s.status == StepStatus::Running && s.idx < max_steps => {
                    let found = self.read_step(c, session, turn, &s, ctx.take());
                    running = Some(s);
                    found.map(Some)
                }
                _ => Ok(None),
            }
        })?;
        let (step, found) = match (running, fast) {
            (Some(step), Some(found)) => (step, found),
            _ => {
                let step = store::claim_step(c, lease)?;
                if step.status != StepStatus::Running {
                    return Ok(Prepared::Resume(step, ctx));
                }
                if step.idx >= max_steps {
                    return Ok(Prepared::Fail(
                        step,
                        Error::MaxSteps {
                            turn_id: turn.id,
                            max_steps: self.inner.cfg.max_steps,
                        },
                    ));
                }
                let found = store::in_step_read_tx(c, |c| {
                    compactor.prefetch_decision(c, session, turn.idx, step.idx)?;
                    self.read_step(c, session, turn, &step, ctx)
                })?;
                (step, found)
            }
        };
        match found {
            Ok(work) => Ok(Prepared::Run(step, Box::new(work))),
            Err(e) => Ok(Prepared::Fail(step, e)),
        }
    }

    /// The reads of a running step, in the caller's read transaction: its
    /// compaction decided and, when there is nothing to compact, its
    /// messages built. An error that fails the step (not the call) is the
    /// inner one.
    pub(super) fn read_step(
        &self,
        c: &crate::store::Connection,
        session: &SessionRow,
        turn: &TurnRow,
        step: &store::StepRow,
        ctx: Option<Context>,
    ) -> Result<Result<Work>> {
        let (at, compactor) = ((turn.idx, step.idx), &self.inner.compactor);

        // What the turn's previous step read: the turn keeps it, and
        // the results it elided (context overflow) stay elided.
        let (prior, elided) = match &ctx {
            _ if step.idx == 0 => (None, 0),
            Some(ctx) if ctx.at().0 == turn.idx => (Some(ctx.compaction_id()), ctx.elided()),
            _ => {
                let (read, elided) = store::step_read(c, turn.id, step.idx - 1)?;
                (Some(read), elided)
            }
        };
        let plan = match compactor.plan(c, session, turn.idx, step.idx, prior) {
            Ok(p) => p,
            Err(e) if e.is_resumable() => return Err(e),
            Err(e) => return Ok(Err(e)),
        };
        let context = match plan.read_now() {
            Some(row) => StepContext::Built(Context::advance(ctx, c, session, row, at, elided)?),
            None => StepContext::After(ctx, elided),
        };
        Ok(Ok(Work { plan, context }))
    }

    /// Runs a claimed step up to its model response: compaction if one is due,
    /// the messages assembled and hashed, the model call. Returns the response
    /// and what [`Runner::advance`] persists with it.
    pub(super) async fn execute(
        &self,
        session: &SessionRow,
        turn: &TurnRow,
        step: &store::StepRow,
        work: Work,
        slot: &mut Slot,
    ) -> Result<(ModelResponse, Responded, Context)> {
        let (step_id, step_idx) = (step.id, step.idx);
        let subject = || Subject::of(session, Some(turn.idx));
        let mut summary_wait_ms = None;
        // The hook where compaction runs: the step reads only what the
        // compactor returns, and waits for it when it must.
        let Work { plan, context } = work;
        // A summary made or waited for here holds no slot.
        if plan.may_wait() {
            slot.release();
        }
        let resolved = self
            .inner
            .compactor
            .resolve(&subject(), turn.idx, plan)
            .await?;
        if let Some((boundary, waited_ms)) = resolved.waited {
            summary_wait_ms = Some(waited_ms);
            self.tell(session, Some(turn.idx), || EventKind::WaitedForSummary {
                step_id,
                boundary,
                waited_ms,
            });
        }
        self.inner.queue.retake(slot).await;
        let mut compaction = resolved.row;
        let mut ctx = match context {
            StepContext::Built(ctx) => ctx,
            StepContext::After(ctx, elided) => {
                let (s, at, r) = (session.clone(), (turn.idx, step_idx), compaction.clone());
                self.inner
                    .store
                    .call(move |conn| Context::advance(ctx, conn, &s, r.as_ref(), at, elided))
                    .await?
            }
        };
        crate::error::check_fault(
            &self.inner.cfg.testing.fault_hook,
            FaultPoint::BeforeModelCall,
        )?;

        // A context the model refuses as too long is made smaller, once by
        // each remedy, and the step tried again; see `Runner::shrink`.
        let mut remedies = Remedies {
            elided: ctx.elided(),
            ..Remedies::default()
        };
        let mut response = loop {
            // Built holding the slot; the model is called without it.
            let request = ctx.request(&session.model, self.inner.tools.specs());
            slot.release();
            match self
                .call_model(request, session, turn.idx, (step_id, step_idx))
                .await
            {
                Err(Error::ContextOverflow { message, .. }) => {
                    match self
                        .shrink(session, turn, step, &compaction, &mut remedies, &message)
                        .await?
                    {
                        Some((row, smaller)) => (compaction, ctx) = (row, smaller),
                        None => return Err(Error::ContextOverflow { step_id, message }),
                    }
                }
                other => break other?,
            }
        };
        self.inner.queue.retake(slot).await;
        let r = self.responded(
            step_id,
            &mut response,
            &ctx,
            compaction.as_ref(),
            summary_wait_ms,
        )?;
        Ok((response, r, ctx))
    }

    /// What the step's transaction writes of a model response, checked
    /// first: nothing deeper than the parser takes (replaced), not empty,
    /// tool calls well formed; the context measure from the provider's usage
    /// or, without it, counted.
    fn responded(
        &self,
        step_id: StepId,
        response: &mut ModelResponse,
        ctx: &Context,
        compaction: Option<&CompactionRow>,
        summary_wait_ms: Option<i64>,
    ) -> Result<Responded> {
        let sha = ctx.sha256();
        // What is committed must read back: nothing deeper than the parser takes.
        if response.cap_depth() > 0 {
            warn!(step_id = %step_id, "a response value nested too deep was replaced");
        }
        if response.is_empty() {
            return Err(Error::EmptyResponse { step_id });
        }
        validate_calls(response, step_id)?;

        let (context_tokens, estimated) = match response.usage.input_tokens {
            Some(n) => (saturating_tokens(n, "input", step_id), false),
            None => {
                let counter = &self.inner.cfg.compaction.token_counter;
                let n = counter
                    .count_chars(ctx.chars())
                    .unwrap_or_else(|| counter.count(&ctx.text()));
                (n as i64, true)
            }
        };
        let usage = &response.usage;
        let tokens = |n: Option<u64>, what| n.map(|n| saturating_tokens(n, what, step_id));
        Ok(Responded {
            step_id,
            compaction_id: compaction.map(|c| c.id),
            messages_sha256: sha,
            response_json: serde_json::to_string(&*response)?,
            input_tokens: tokens(usage.input_tokens, "input"),
            output_tokens: tokens(usage.output_tokens, "output"),
            context_tokens,
            estimated,
            summary_wait_ms,
            cache_read_tokens: tokens(usage.cache_read_tokens, "cache read"),
            cache_write_tokens: tokens(usage.cache_write_tokens, "cache write"),
            elided_steps: ctx.elided(),
        })
    }
}
