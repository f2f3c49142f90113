//! The model call of a step: retried per the policy, a panic caught, a
//! context the model refuses as too long made smaller (the overflow
//! remedies), the response checked before it is stored.

use super::*;

impl Runner {
    /// A smaller context for a step the model refused as too long, by the
    /// first remedy not yet tried: every turn before this one compacted now
    /// (exactly once, as any compaction), then the tool results of this
    /// turn's steps before its newest one sent as placeholders (recorded on
    /// the step as `elided_steps`, so a rebuild gives the bytes sent). None
    /// when neither is left or makes a difference.
    pub(super) async fn shrink(
        &self,
        session: &SessionRow,
        turn: &TurnRow,
        step: &store::StepRow,
        compaction: &Option<CompactionRow>,
        remedies: &mut Remedies,
        message: &str,
    ) -> Result<Option<(Option<CompactionRow>, Context)>> {
        let subject = Subject::of(session, Some(turn.idx));
        let at = (turn.idx, step.idx);
        let mut elided = remedies.elided;
        let mut row = compaction.clone();
        let remedy = loop {
            if !remedies.compacted {
                remedies.compacted = true;
                let folded = self
                    .inner
                    .compactor
                    .compact_for_overflow(&subject, turn.idx)
                    .await?;
                if let Some(folded) = folded.filter(|f| Some(f.id) != row.as_ref().map(|r| r.id)) {
                    row = Some(folded);
                    break "compacted";
                }
            } else if !remedies.tried_elision {
                remedies.tried_elision = true;
                let newest = step.idx - 1;
                if newest > remedies.elided {
                    elided = newest;
                    break "elided";
                }
            } else {
                return Ok(None);
            }
        };
        warn!(step_id = %step.id, remedy, "the model refused the context as too long");
        self.tell(session, Some(turn.idx), || EventKind::ContextOverflow {
            step_id: step.id,
            remedy,
            elided_steps: elided,
            message: self.inner.events.shown(message),
        });
        remedies.elided = elided;
        let (s, r) = (session.clone(), row.clone());
        let ctx = self
            .inner
            .store
            .call(move |c| Context::build(c, &s, r.as_ref(), at, elided))
            .await?;
        Ok(Some((row, ctx)))
    }

    /// The step's model call, tried again per the policy. With
    /// `RunnerConfig::stream`, the answer streams and each piece goes to
    /// subscribers, numbered by attempt (a new attempt starts it over).
    pub(super) async fn call_model(
        &self,
        request: ModelRequest,
        session: &SessionRow,
        turn_idx: i64,
        (step_id, step_idx): (StepId, i64),
    ) -> Result<ModelResponse> {
        let cfg = &self.inner.cfg;
        let request = Arc::new(request);
        let mut last = String::new();
        let mut not_before = Duration::ZERO;
        for attempt in 1..=cfg.model_retry.max_attempts {
            if attempt > 1 {
                // A provider's Retry-After is honoured when longer.
                tokio::time::sleep(cfg.model_retry.delay(attempt - 1).max(not_before)).await;
            }
            not_before = Duration::ZERO;
            let model = &self.inner.model;
            let subject = Subject::of(session, Some(turn_idx));
            let events = &self.inner.events;
            let on_delta = move |delta: crate::model::Delta| {
                events.emit(
                    &subject,
                    EventKind::ModelDelta {
                        step_id,
                        step: step_idx,
                        attempt,
                        delta,
                    },
                )
            };
            let call = CatchUnwind(if cfg.stream {
                model.complete_streaming(&request, &on_delta)
            } else {
                model.complete(&request)
            });
            #[cfg(feature = "otel")]
            let span = self.inner.telemetry.as_ref().map(|t| {
                t.model_call(
                    &Subject::of(session, Some(turn_idx)),
                    step_idx,
                    attempt,
                    &request,
                )
            });
            let outcome = tokio::time::timeout(cfg.model_timeout, call).await;
            #[cfg(feature = "otel")]
            if let Some(span) = span {
                match &outcome {
                    Ok(Ok(Ok(resp))) => span.answered(resp),
                    Ok(Ok(Err(e))) => {
                        let kind = match e {
                            ModelError::Transient(_) => "transient",
                            ModelError::RateLimited { .. } => "rate_limited",
                            ModelError::ContextOverflow(_) => "context_overflow",
                            ModelError::Permanent(_) => "permanent",
                            _ => "model_error",
                        };
                        span.failed(kind, &self.inner.events.shown(&e.to_string()))
                    }
                    Ok(Err(_)) => span.failed("panic", "the model client panicked"),
                    Err(_) => span.failed("timeout", "the model call timed out"),
                }
            }
            match outcome {
                Ok(Ok(Ok(resp))) => return Ok(resp),
                Ok(Ok(Err(ModelError::Permanent(m)))) => {
                    return Err(Error::Model {
                        step_id,
                        message: m,
                    });
                }
                Ok(Ok(Err(ModelError::ContextOverflow(message)))) => {
                    return Err(Error::ContextOverflow { step_id, message });
                }
                Ok(Ok(Err(ModelError::RateLimited {
                    message,
                    retry_after: Some(wait),
                }))) if wait > cfg.model_retry.max_backoff => {
                    // Never waited past the policy: the host sees the demand
                    // and the turn stays resumable.
                    return Err(Error::RateLimited {
                        step_id,
                        retry_after: wait,
                        allowed: cfg.model_retry.max_backoff,
                        message,
                    });
                }
                Ok(Ok(Err(e @ ModelError::RateLimited { retry_after, .. }))) => {
                    not_before = retry_after.unwrap_or_default();
                    last = e.to_string();
                }
                Ok(Ok(Err(e @ ModelError::ResponseTooLarge { .. }))) => {
                    return Err(Error::Model {
                        step_id,
                        message: e.to_string(),
                    });
                }
                Ok(Ok(Err(e))) => last = e.to_string(),
                Ok(Err(p)) => last = format!("model client panicked: {}", panic_message(&p)),
                Err(_) => last = format!("model call timed out after {:?}", cfg.model_timeout),
            }
            warn!(step_id = %step_id, attempt, error = %self.inner.events.shown(&last), "model call failed");
        }
        Err(Error::Model {
            step_id,
            message: last,
        })
    }
}

/// A reported token count as stored: counts above `i64::MAX` (SQLite's
/// integer) are stored as `i64::MAX`, never wrapped negative (a negative
/// measure would keep the threshold from ever firing), and said in a warning.
pub(super) fn saturating_tokens(n: u64, what: &str, step_id: StepId) -> i64 {
    i64::try_from(n).unwrap_or_else(|_| {
        warn!(
            step_id = %step_id,
            reported = n,
            "{what} token count above i64::MAX stored as i64::MAX"
        );
        i64::MAX
    })
}

/// Tool call ids must be non-empty and unique within the response: they key the
/// exactly-once record of each call.
pub(super) fn validate_calls(response: &ModelResponse, step_id: StepId) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for (id, name, _) in response.tool_calls() {
        if id.is_empty() || name.is_empty() {
            return Err(Error::InvalidResponse {
                step_id,
                reason: "a tool call has an empty id or name".into(),
            });
        }
        if !seen.insert(id) {
            return Err(Error::InvalidResponse {
                step_id,
                reason: format!("tool call id {id:?} appears twice"),
            });
        }
    }
    Ok(())
}
