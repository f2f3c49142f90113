//! Claims: the one row per (session, boundary), claimed, finished, waited
//! for or taken over; manual compaction and the overflow remedy's.

use super::*;

impl Compactor {
    /// Compacts every turn before `turn_idx` now, for a step whose context
    /// the model refused as too long (the claim and protocol of any other
    /// compaction; exactly once). None when there is nothing more to fold
    /// or the compaction failed: the caller tries the next remedy.
    pub(crate) async fn compact_for_overflow(
        &self,
        subject: &Subject,
        turn_idx: i64,
    ) -> Result<Option<CompactionRow>> {
        let (sid, b) = (subject.session_id, turn_idx - 1);
        if b < 0 {
            return Ok(None);
        }
        let latest = self
            .store
            .read(move |c| store::latest_completed(c, sid, turn_idx))
            .await?;
        if latest.is_some_and(|l| l.up_to_turn_index >= b) {
            return Ok(None);
        }
        match self
            .claim_and_finish(subject, b, Trigger::Auto, None, None, true)
            .await
        {
            Ok(row) if row.status == CompactionStatus::Completed => {
                crate::error::check_fault(&self.fault, FaultPoint::AfterCompactionComplete)?;
                Ok(Some(row))
            }
            Ok(_) | Err(Error::CompactionFailed { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A new compaction one turn after the previous one: said in an event.
    pub(super) fn say_if_often(
        &self,
        subject: &Subject,
        b: i64,
        measure: Option<i64>,
        latest: Option<&CompactionRow>,
    ) {
        // (Not after a background summary: it was read late, with the turns
        // that ran while it was made, which took the room.)
        if let Some(prev) = latest.filter(|l| b - l.up_to_turn_index <= 1 && !l.background) {
            if measure.is_some() {
                warn!(session_id = %subject.session_id, boundary = b, "compacting again one turn after the last compaction");
                self.events.emit(
                    subject,
                    EventKind::CompactingOften {
                        boundary: b,
                        previous_boundary: prev.up_to_turn_index,
                    },
                );
            }
        }
    }

    /// Manual compaction of every turn of the session (less `keep_last_turns`),
    /// from any process, while no turn is running. Uses the same unique index as
    /// automatic compaction, so the two can never double.
    ///
    /// Idempotent: when the session is already compacted up to the boundary this
    /// call would use, that completed row is returned (asked with no focus or
    /// the same one).
    ///
    /// Errors: [`Error::TurnRunning`] while a turn runs; [`Error::NothingToCompact`]
    /// when there is no turn to compact (an empty session, or fewer turns than
    /// `keep_last_turns + 1`) or the newest compaction already reaches further;
    /// [`Error::AlreadyCompacted`] when that row was made with another focus
    /// than the one asked for.
    pub async fn compact_now(
        &self,
        session_id: SessionId,
        focus: Option<String>,
    ) -> Result<CompactionRow> {
        let focus = focus.filter(|f| !f.trim().is_empty());
        let this = self.clone();
        let (plan, session) = self
            .store
            .call(move |c| {
                let plan = preview::manual_plan(&this.config, c, session_id)?;
                Ok((plan, store::get_session(c, session_id)?))
            })
            .await?;
        if let Some(row) = plan.existing {
            if row.status == CompactionStatus::Completed {
                let named = session.external_id.clone();
                // Already compacted up to exactly here: the same answer again
                // (asked with no focus, or the same one); another focus is
                // refused (G2: the summary cannot be redone).
                let other = focus
                    .as_deref()
                    .is_some_and(|f| row.focus.as_deref().map(str::trim) != Some(f.trim()));
                if other {
                    return Err(Error::AlreadyCompacted {
                        session_id,
                        session: named,
                        boundary: row.up_to_turn_index,
                        existing: row.focus,
                    });
                }
                return Ok(row);
            }
        }
        self.claim_and_finish(
            &Subject::of(&session, None),
            plan.boundary,
            Trigger::Manual,
            focus,
            None,
            true,
        )
        .await
    }

    /// Re-arms a failed boundary; the next ensure() or compact_now() claims it.
    pub async fn retry_failed(&self, session_id: SessionId, boundary: i64) -> Result<bool> {
        self.store
            .call(move |c| store::retry_compaction(c, session_id, boundary))
            .await
    }

    /// Claims the row at the boundary in a write transaction (see
    /// [`store::claim_compaction`] for the outcomes).
    pub(super) async fn claim(
        &self,
        subject: &Subject,
        boundary: i64,
        trigger: Trigger,
        focus: &Option<String>,
        measure: Option<i64>,
        holder: &str,
    ) -> Result<ClaimOutcome> {
        let session_id = subject.session_id;
        let thresholds = self.thresholds(&subject.model);
        let owner = holder.to_string();
        let ttl = self.config.lease_ttl.as_millis() as i64;
        let focus_c = focus.clone();
        let dead = self.gone_check();
        self.store
            .call(move |c| {
                store::claim_compaction(
                    c,
                    &store::Claim {
                        session_id,
                        boundary,
                        owner: &owner,
                        ttl_ms: ttl,
                        trigger: if trigger == Trigger::Manual {
                            "manual"
                        } else {
                            "auto"
                        },
                        background: trigger == Trigger::Background,
                        focus: focus_c.as_deref(),
                        trigger_tokens: measure,
                        thresholds,
                    },
                    &dead,
                )
            })
            .await
    }

    /// Claims the boundary and drives the row to completed (or failed).
    /// Without `wait`, a row a live other holds is left to it (its pending
    /// row is returned).
    pub(super) async fn claim_and_finish(
        &self,
        subject: &Subject,
        boundary: i64,
        trigger: Trigger,
        focus: Option<String>,
        measure: Option<i64>,
        wait: bool,
    ) -> Result<CompactionRow> {
        let session_id = subject.session_id;
        let deadline = tokio::time::Instant::now() + self.config.wait_timeout;
        let mut poll = Duration::from_millis(2);
        // The claim lives as long as this future: a task of this process that
        // drops it frees the row for its siblings at once (see crate::owner).
        let claim = ClaimGuard::new(&self.owner);
        let mut waiting_said = false;
        // A step that measured its context over the threshold (the only
        // caller with a measure) has just read no row at this boundary: it
        // claims at once (a row made since is found by the claim itself).
        let mut look = measure.is_none();
        loop {
            // A look first; only a missing or abandoned row is claimed, in a
            // write transaction.
            let peeked = match std::mem::replace(&mut look, true) {
                true => self.peek(session_id, boundary, claim.holder()).await?,
                false => None,
            };
            let outcome = match peeked {
                Some(outcome) => outcome,
                None => {
                    self.claim(subject, boundary, trigger, &focus, measure, claim.holder())
                        .await?
                }
            };
            info!(
                session_id = %session_id,
                boundary,
                attempt = outcome.row().attempts,
                outcome = outcome_name(&outcome),
                "compaction claim"
            );
            match outcome {
                ClaimOutcome::Claimed(row) | ClaimOutcome::TakenOver(row) => {
                    crate::error::check_fault(&self.fault, FaultPoint::AfterClaim)?;
                    return self.summarise_and_complete(row, &claim, subject).await;
                }
                ClaimOutcome::AlreadyCompleted(row) => return Ok(row),
                ClaimOutcome::Failed(row) => {
                    return Err(Error::CompactionFailed {
                        compaction_id: row.id,
                        session_id,
                        boundary,
                        message: row.error.unwrap_or_default(),
                    })
                }
                ClaimOutcome::HeldByLiveOther(row) if !wait => return Ok(row),
                ClaimOutcome::HeldByLiveOther(row) => {
                    if self.read_drafts {
                        // Deliberately wrong (Sabotage::read_drafts): read the draft instead of waiting.
                        return Ok(row);
                    }
                    if !waiting_said {
                        waiting_said = true;
                        self.events.emit(
                            subject,
                            EventKind::CompactionWaiting {
                                boundary,
                                compaction_id: row.id,
                                holder: crate::owner::owner_name(
                                    row.lease_owner.as_deref().unwrap_or_default(),
                                )
                                .to_string(),
                            },
                        );
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::CompactionWaitTimeout {
                            compaction_id: row.id,
                            owner: crate::owner::owner_name(
                                row.lease_owner.as_deref().unwrap_or_default(),
                            )
                            .to_string(),
                        });
                    }
                    self.wait_for_settlement(session_id, boundary, row.id, poll)
                        .await?;
                    poll = (poll * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    /// A look at the row, without a write: a completed, failed or live-held
    /// row needs none (after a wait, the common case); `None` means missing or
    /// abandoned, to be claimed.
    pub(super) async fn peek(
        &self,
        session_id: SessionId,
        boundary: i64,
        me: &str,
    ) -> Result<Option<ClaimOutcome>> {
        let (me, dead) = (me.to_string(), self.gone_check());
        self.store
            .read(move |c| {
                Ok(
                    store::compaction_at(c, session_id, boundary)?.and_then(|row| {
                        match row.status {
                            CompactionStatus::Completed => {
                                Some(ClaimOutcome::AlreadyCompleted(row))
                            }
                            CompactionStatus::Failed => Some(ClaimOutcome::Failed(row)),
                            CompactionStatus::Pending
                                if store::held_by_live_other(&row, &me, c.now_ms(), &dead) =>
                            {
                                Some(ClaimOutcome::HeldByLiveOther(row))
                            }
                            CompactionStatus::Pending => None,
                        }
                    }),
                )
            })
            .await
    }

    /// Waits, up to `poll`, for the pending row `id` to settle: woken at once
    /// by a holder in this process; a holder in another process is polled
    /// for (the caller doubles `poll`).
    pub(super) async fn wait_for_settlement(
        &self,
        session_id: SessionId,
        boundary: i64,
        id: CompactionId,
        poll: Duration,
    ) -> Result<()> {
        let looked = {
            let settled = self.store.compaction_settled(session_id, boundary);
            let woken = settled.notified();
            tokio::pin!(woken);
            // Registered first, then the row looked at again: a settlement
            // between the claim and here is not missed.
            woken.as_mut().enable();
            let still_pending = self
                .store
                .read(
                    move |c| Ok(store::get_compaction(c, id)?.status == CompactionStatus::Pending),
                )
                .await;
            if let Ok(true) = still_pending {
                tokio::select! {
                    _ = &mut woken => {}
                    _ = tokio::time::sleep(poll) => {}
                }
            }
            still_pending
        };
        self.store.forget_settled(session_id, boundary);
        looked.map(|_| ())
    }
}

pub(super) fn outcome_name(o: &ClaimOutcome) -> &'static str {
    match o {
        ClaimOutcome::Claimed(_) => "claimed",
        ClaimOutcome::AlreadyCompleted(_) => "already_completed",
        ClaimOutcome::TakenOver(_) => "taken_over",
        ClaimOutcome::HeldByLiveOther(_) => "held_by_live_other",
        ClaimOutcome::Failed(_) => "failed",
    }
}
