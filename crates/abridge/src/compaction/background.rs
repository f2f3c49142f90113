//! Background compaction: a row claimed at the soft threshold and summarised
//! by a task of this compactor, or queued for another process to serve.

use super::*;

impl Compactor {
    /// Starts the background compaction of `boundary`: a task of this
    /// compactor claims and summarises it ([`BackgroundWorker::Task`]; at most
    /// one task per session in this process), or the pending row is recorded
    /// for another process to serve ([`BackgroundWorker::Elsewhere`]). A new
    /// row records `soft`, the soft threshold it was claimed under (the
    /// configured one, or lower for the session's pace), when given.
    pub(super) async fn background(
        &self,
        subject: &Subject,
        boundary: i64,
        measure: Option<i64>,
        soft: Option<i64>,
        latest: Option<&CompactionRow>,
    ) -> Result<()> {
        let (this, sid) = (self.clone(), subject.session_id);
        let mut thresholds = self.thresholds(&subject.model);
        thresholds.soft = soft.or(thresholds.soft);
        // A short write transaction, as a step's: on the calling worker
        // when the store allows it (no thread hand-off before the summary's
        // task is spawned).
        let claimed = self
            .store
            .call_inline(move |c| this.claim_background(c, sid, boundary, measure, thresholds))
            .await?;
        self.say_if_often(subject, boundary, measure, latest);
        if let Some(claimed) = claimed {
            self.spawn_background(subject, claimed);
        }
        Ok(())
    }

    /// The synchronous half of [`Compactor::background`], run on a store
    /// connection: claims the row for a task of this compactor, or queues it
    /// for another process (then None).
    pub(super) fn claim_background(
        &self,
        c: &mut crate::store::Connection,
        sid: SessionId,
        boundary: i64,
        measure: Option<i64>,
        thresholds: store::Thresholds,
    ) -> Result<Option<BackgroundClaim>> {
        if self.config.background.unwrap_or_default().worker == BackgroundWorker::Elsewhere {
            if store::enqueue_compaction(c, sid, boundary, measure, thresholds)? {
                info!(session_id = %sid, boundary, "compaction queued for a background server");
            }
            return Ok(None);
        }
        // One background summary of a session at a time.
        if self.background_running_for(sid) {
            return Ok(None);
        }
        // Claimed before the step goes on: the boundary is fixed now, and the
        // next decide() sees the pending row. The task summarises under this
        // claim (and its lease's heartbeat).
        let claim = ClaimGuard::new(&self.owner);
        let outcome = store::claim_compaction(
            c,
            &store::Claim {
                session_id: sid,
                boundary,
                owner: claim.holder(),
                ttl_ms: self.config.lease_ttl.as_millis() as i64,
                trigger: "auto",
                focus: None,
                trigger_tokens: measure,
                background: true,
                thresholds,
            },
            &self.gone_check(),
        )?;
        info!(session_id = %sid, boundary, outcome = outcome_name(&outcome), "background compaction claim");
        Ok(match outcome {
            ClaimOutcome::Claimed(row) | ClaimOutcome::TakenOver(row) => {
                Some(BackgroundClaim { row, claim })
            }
            // Completed, failed, or someone else's: nothing to do here.
            _ => None,
        })
    }

    /// Summarises a claimed row in a task of this compactor (on the caller's
    /// tokio runtime).
    pub(super) fn spawn_background(&self, subject: &Subject, claimed: BackgroundClaim) {
        let BackgroundClaim { row, claim } = claimed;
        let (sid, boundary) = (row.session_id, row.up_to_turn_index);
        let (this, subject) = (self.clone(), subject.clone());
        let task = tokio::spawn(async move {
            let done = BACKGROUND
                .scope((), async {
                    // A worker of the pool, in claim order (the semaphore is
                    // fair); the row's lease is kept while it waits for one.
                    let _worker = match this.workers.clone().try_acquire_owned() {
                        Ok(w) => w,
                        Err(_) => {
                            let _hb = this.keep_lease(&row, &claim);
                            this.workers
                                .clone()
                                .acquire_owned()
                                .await
                                .map_err(|e| Error::Task(e.to_string()))?
                        }
                    };
                    crate::error::check_fault(&this.fault, FaultPoint::AfterClaim)?;
                    this.summarise_and_complete(row, &claim, &subject).await?;
                    crate::error::check_fault(&this.fault, FaultPoint::AfterCompactionComplete)
                })
                .await;
            if let Err(e) = done {
                warn!(session_id = %sid, boundary, error = %this.events.error(&e), "background compaction did not finish");
            }
        });
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.insert((sid, boundary), task);
    }

    /// Waits for every background compaction task of this compactor (and of
    /// the runners that share it) to end: what a host awaits before it
    /// exits, so that no summary it started is left to the next runner.
    /// Returns how many it waited for.
    pub async fn finish_background(&self) -> usize {
        let mut n = 0;
        loop {
            let tasks: Vec<_> = {
                let mut t = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
                t.drain().map(|(_, task)| task).collect()
            };
            if tasks.is_empty() {
                return n;
            }
            for task in tasks {
                n += 1;
                let _ = task.await;
            }
        }
    }

    pub(super) fn background_running_for(&self, sid: SessionId) -> bool {
        let mut t = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|_, task| !task.is_finished());
        t.keys().any(|(s, _)| *s == sid)
    }

    /// Background compactions of this compactor still running.
    pub fn background_running(&self) -> usize {
        let mut t = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|_, task| !task.is_finished());
        t.len()
    }

    /// Finishes every pending compaction of the store that no live other
    /// holds: a row queued for a background server
    /// ([`BackgroundWorker::Elsewhere`]), or one left by a summariser that
    /// died. Each is claimed under its lease and summarised by this
    /// compactor's summariser, exactly once as ever (a row another server
    /// claims first is left to it). Returns the rows completed by this call,
    /// and the boundaries that failed.
    pub async fn serve_pending(&self) -> Result<Served> {
        let (owner, dead) = (self.owner.clone(), self.gone_check());
        let rows = self
            .store
            .read(move |c| {
                let now = c.now_ms();
                let mut out = Vec::new();
                for row in store::pending_compactions(c)? {
                    if !store::held_by_live_other(&row, &owner, now, &dead) {
                        let session = store::get_session(c, row.session_id)?;
                        out.push((row, session));
                    }
                }
                Ok(out)
            })
            .await?;
        let mut served = Served::default();
        for (row, session) in rows {
            let subject = Subject::of(&session, None);
            match self
                .claim_and_finish(
                    &subject,
                    row.up_to_turn_index,
                    Trigger::Background,
                    None,
                    None,
                    false,
                )
                .await
            {
                Ok(done) if done.status == CompactionStatus::Completed => {
                    served.completed.push(done)
                }
                Ok(_) => {}
                Err(Error::CompactionFailed {
                    compaction_id,
                    message,
                    ..
                }) => served.failed.push((compaction_id, message)),
                Err(e) => return Err(e),
            }
        }
        Ok(served)
    }
}
