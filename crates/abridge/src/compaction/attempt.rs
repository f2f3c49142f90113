//! Summarising a claimed row and completing it: the span loaded, the
//! attempts under the retry and failure policies, the guard (G7 shrinks,
//! G8 every live pin carried), completion or failure.

use super::*;

impl Compactor {
    /// Summarises the row's span (folding the previous summary), checks G7, and
    /// completes the row; the first completion wins (G2).
    pub(super) async fn summarise_and_complete(
        &self,
        row: CompactionRow,
        claim: &ClaimGuard,
        subject: &Subject,
    ) -> Result<CompactionRow> {
        // A redaction of the session while the summary was made changed its
        // source: made again from the redacted rows (a few times at most).
        for _ in 0..MAX_REDACTED_REDOS {
            if let Some(done) = self.summarise_once(&row, claim, subject).await? {
                return Ok(done);
            }
        }
        Err(Error::CompactionFailed {
            compaction_id: row.id,
            session_id: row.session_id,
            boundary: row.up_to_turn_index,
            message: "the session was redacted again while each summary was made".into(),
        })
    }

    /// One summary of the row's span, completed; None when a redaction of the
    /// session since the span was read kept it from completing.
    pub(super) async fn summarise_once(
        &self,
        row: &CompactionRow,
        claim: &ClaimGuard,
        subject: &Subject,
    ) -> Result<Option<CompactionRow>> {
        let row = row.clone();
        let span = self.load_span(&row, &subject.model).await?;
        self.events.emit(
            subject,
            EventKind::CompactionClaimed {
                boundary: row.up_to_turn_index,
                compaction_id: row.id,
                attempt: row.attempts,
                trigger_tokens: row.trigger_tokens,
            },
        );
        let tokens_before =
            preview::replaced_tokens(&self.config, span.prev.as_ref(), &span.turns)?;
        let rules = Rules {
            first: self.rules(&row, false),
            update: self.rules(&row, true),
            focus: row.focus.clone().filter(|f| !f.trim().is_empty()),
            summary_chars: if self.config.guard_pins {
                let block =
                    crate::pins::block_bound_chars(&span.pins, self.config.pins_budget_chars);
                let words = span.user_words_section().chars().count();
                self.config
                    .summary_chars_beside(&subject.model, block + words)
            } else {
                self.config.summary_chars(&subject.model)
            },
        };
        if self.config.guard_pins {
            self.say_if_over_share(&row, &span, subject);
        }
        // Heartbeat: keep the row's lease while this claim is alive and working.
        // Dropped with the future, so a dropped future renews nothing.
        let hb = self.keep_lease(&row, claim);
        let previous_present = span.prev.as_ref().is_some_and(|p| p.summary.is_some());
        let result = self
            .attempts(&row, &rules, &span, tokens_before, subject)
            .await;
        drop(hb);
        match result {
            Ok((summary, mut stats)) => {
                crate::error::check_fault(&self.fault, FaultPoint::MidSummary)?;
                let used = rules.for_request(previous_present);
                stats.prompt_sha256 = sha256_hex(used.as_bytes());
                self.complete(&row, summary, stats, span.redaction, subject)
                    .await
            }
            Err(Error::Injected(p)) => Err(Error::Injected(p)),
            Err(e) => self.fail(&row, claim, e, subject).await.map(Some),
        }
    }

    /// The previous completed compaction the row folds in, and the turns it
    /// summarises.
    pub(super) async fn load_span(&self, row: &CompactionRow, model: &str) -> Result<Span> {
        let (sid, b, prev_id) = (row.session_id, row.up_to_turn_index, row.previous_id);
        let window = self.config.pins_window;
        let share = self.config.pins_share_chars(model);
        let words = self
            .config
            .user_words_chars(model)
            .filter(|_| self.config.guard_pins);
        let mut span = self
            .store
            .call(move |c| {
                // One snapshot; on PostgreSQL two round trips: the redaction
                // mark and the live pins go with the previous summary's read,
                // then the span's history.
                c.in_read_tx(|c| {
                    store::prefetch_session_redaction(c, sid)?;
                    store::prefetch_live_pins(c, sid, b, window)?;
                    let prev = match prev_id {
                        Some(id) => Some(store::get_compaction(c, id)?),
                        None => None,
                    };
                    let redaction = store::session_redaction(c, sid)?;
                    let folded = preview::carried_pins(c, sid, b, window, share)?;
                    let after = prev.as_ref().map_or(-1, |p| p.up_to_turn_index);
                    let turns = store::load_history(c, sid, after, b, i64::MAX)?;
                    Ok(Span {
                        redaction,
                        prev,
                        turns,
                        pins: folded.pins,
                        window: folded.window,
                        folded: folded.folded,
                        over_share: folded.over_share,
                        previous: None,
                        user_words: None,
                    })
                })
            })
            .await?;
        let carried = super::user_words::carry(
            span.prev.as_ref().and_then(|p| p.summary.as_deref()),
            &span.turns,
            words,
        );
        span.previous = carried.previous;
        span.user_words = carried.lines;
        Ok(span)
    }

    /// The summariser's rules: the style's (its first or its update variant),
    /// and a manual compaction's focus.
    pub(super) fn rules(&self, row: &CompactionRow, update: bool) -> String {
        let mut rules = rules_for(&self.config.style, update).to_string();
        if let Some(focus) = row.focus.as_deref().filter(|f| !f.trim().is_empty()) {
            rules.push_str("\n\nFocus of this compaction (give it priority): ");
            rules.push_str(&truncate_chars(focus, MAX_FOCUS_CHARS));
        }
        rules
    }

    /// Completes the row with `summary`; the first completion wins (G2), a
    /// later one gets the winner's row back. None: the session was redacted
    /// after `redaction` (the summary's source read), the row is left pending.
    pub(super) async fn complete(
        &self,
        row: &CompactionRow,
        summary: String,
        stats: CompactionStats,
        redaction: i64,
        subject: &Subject,
    ) -> Result<Option<CompactionRow>> {
        let (sid, b, id) = (row.session_id, row.up_to_turn_index, row.id);
        let (done, won) = {
            let stats = stats.clone();
            self.store
                .call(move |c| store::complete_compaction(c, id, &summary, &stats, redaction))
                .await?
        };
        if done.status == CompactionStatus::Pending {
            info!(session_id = %sid, boundary = b, "the session was redacted while its summary was made: making it again");
            return Ok(None);
        }
        self.store.compaction_has_settled(sid, b);
        if done.status != CompactionStatus::Completed {
            // Failed by another holder after a takeover; report it as failed.
            return Err(Error::CompactionFailed {
                compaction_id: done.id,
                session_id: sid,
                boundary: b,
                message: done.error.clone().unwrap_or_default(),
            });
        }
        info!(
            session_id = %sid,
            boundary = b,
            won,
            tokens_before = done.tokens_before,
            tokens_after = done.tokens_after,
            "compaction completed"
        );
        if won {
            self.events.emit(
                subject,
                EventKind::Compacted {
                    boundary: b,
                    compaction_id: done.id,
                    trigger_tokens: done.trigger_tokens,
                    tokens_before: stats.tokens_before,
                    tokens_after: stats.tokens_after,
                    summariser_model: stats.model.clone(),
                    input_tokens: stats.input_tokens,
                    output_tokens: stats.output_tokens,
                    summary_calls: stats.summary_calls,
                    pins_live: stats.pins_live.unwrap_or(0),
                    pins_added: stats.pins_added.unwrap_or(0),
                },
            );
        }
        Ok(Some(done))
    }

    /// Fails the row after its last attempt (unless another holder completed
    /// it meanwhile: their summary stands).
    pub(super) async fn fail(
        &self,
        row: &CompactionRow,
        claim: &ClaimGuard,
        err: Error,
        subject: &Subject,
    ) -> Result<CompactionRow> {
        let (sid, b, id) = (row.session_id, row.up_to_turn_index, row.id);
        let msg = err.to_string();
        let owner = claim.holder().to_string();
        let m = msg.clone();
        let failed = self
            .store
            .call(move |c| store::fail_compaction(c, id, &owner, &m))
            .await?;
        self.store.compaction_has_settled(sid, b);
        warn!(session_id = %sid, boundary = b, error = %self.events.shown(&msg), "compaction failed");
        self.events.emit(
            subject,
            EventKind::CompactionFailed {
                boundary: b,
                compaction_id: id,
                error: self.events.shown(&msg),
                last: true,
            },
        );
        if failed.status == CompactionStatus::Completed {
            return Ok(failed);
        }
        Err(Error::CompactionFailed {
            compaction_id: id,
            session_id: sid,
            boundary: b,
            message: msg,
        })
    }

    /// Up to `retry.max_attempts` runs of the whole (possibly chunked) summary, with
    /// backoff; an empty or not-smaller summary is a failed attempt (G7).
    pub(super) async fn attempts(
        &self,
        row: &CompactionRow,
        rules: &Rules,
        span: &Span,
        tokens_before: u64,
        subject: &Subject,
    ) -> Result<(String, CompactionStats)> {
        let cfg = &self.config;
        let counter = &*cfg.token_counter;
        let previous = span.previous.clone();
        let pins = &span.pins;
        let entries = transcript_entries(&span.turns, cfg.text_cap, cfg.tool_result_cap);
        // The budget left for the transcript once the rules, the running summary
        // (at most max_summary_chars) and the framing are in.
        let fixed = cfg.fixed_request_tokens(&rules.update);
        let chunk_budget = cfg.input_budget_tokens.saturating_sub(fixed).max(64);
        let chunks = chunk_entries(entries, chunk_budget, counter);
        // A span no larger than the summary message's own framing cannot be
        // replaced by anything smaller (G7): failed at once, without spending
        // the summariser's attempts on it.
        let framing = message_tokens(
            counter,
            &[crate::render::summary_message(SummaryView {
                up_to_turn_index: row.up_to_turn_index,
                summary: "",
            })],
        );
        if framing >= tokens_before {
            return Err(Error::Summary(format!(
                "what would be replaced ({tokens_before} tokens) is no larger than an empty \
                 summary message ({framing} tokens): no summary can be smaller; not summarised"
            )));
        }
        let mut last_err = String::from("no attempt made");
        for attempt in 1..=cfg.retry.max_attempts {
            if attempt > 1 {
                tokio::time::sleep(cfg.retry.delay(attempt - 1)).await;
            }
            match self.one_attempt(rules, previous.clone(), &chunks).await {
                Ok((text, input, output, calls)) => {
                    let text = clean_summary(&text, rules.summary_chars);
                    let (text, pins_added, calls) = if text.is_empty() || !cfg.guard_pins {
                        (text, 0, calls)
                    } else {
                        let (text, added, more) = self
                            .guard(row, rules, text, span, tokens_before, subject)
                            .await?;
                        (text, added, calls + more)
                    };
                    let after = message_tokens(
                        counter,
                        &[crate::render::summary_message(SummaryView {
                            up_to_turn_index: row.up_to_turn_index,
                            summary: &text,
                        })],
                    );
                    if text.is_empty() {
                        last_err = "summariser returned an empty summary".into();
                    } else if after >= tokens_before {
                        last_err = format!(
                            "summary ({after} tokens) is not smaller than what it replaces ({tokens_before} tokens)"
                        );
                    } else {
                        return Ok((
                            text,
                            CompactionStats {
                                model: self.summariser.model(),
                                prompt_sha256: String::new(),
                                tokens_before: tokens_before as i64,
                                tokens_after: after as i64,
                                input_tokens: input,
                                output_tokens: output,
                                summary_calls: calls,
                                pins_live: cfg.guard_pins.then_some(pins.len() as i64),
                                pins_added: cfg.guard_pins.then_some(pins_added as i64),
                                pins_window: cfg
                                    .guard_pins
                                    .then(|| i64::try_from(span.window).unwrap_or(i64::MAX)),
                            },
                        ));
                    }
                }
                Err(Error::Injected(p)) => return Err(Error::Injected(p)),
                Err(e) => last_err = e.to_string(),
            }
            let last = attempt == cfg.retry.max_attempts;
            self.events.emit(
                subject,
                EventKind::CompactionFailed {
                    boundary: row.up_to_turn_index,
                    compaction_id: row.id,
                    error: self.events.shown(&last_err),
                    last: false,
                },
            );
            if !last {
                let id = row.id;
                let m = last_err.clone();
                self.store
                    .call(move |c| store::note_compaction_error(c, id, &m))
                    .await?;
            }
        }
        Err(Error::Summary(last_err))
    }

    /// G8: the summary as stored is the summariser's `text` plus a block of
    /// every live pin it lacks (after asking the summariser once more, when
    /// configured). Returns the text, the pins appended and the calls made.
    pub(super) async fn guard(
        &self,
        row: &CompactionRow,
        rules: &Rules,
        text: String,
        span: &Span,
        tokens_before: u64,
        subject: &Subject,
    ) -> Result<(String, usize, i64)> {
        let cfg = &self.config;
        let pins = &span.pins;
        let mut text = text;
        let mut calls = 0i64;
        // The user's own words go between the summariser's text and the
        // block. They do not count as carrying a pin: a message may hold a
        // value since replaced, and the block says which is current.
        let words = span.user_words.as_deref().unwrap_or_default();
        let body = |text: &str, keep: usize| {
            let section = super::user_words::render(&words[..keep]);
            if section.is_empty() {
                text.to_string()
            } else {
                format!(
                    "{text}

{section}"
                )
            }
        };
        let mut missing = crate::pins::missing(pins, &text);
        if cfg.reask_missing_pins && !missing.is_empty() {
            let list: Vec<String> = missing.iter().map(|p| p.line(false)).collect();
            let req = SummaryRequest {
                rules: format!(
                    "{}\n\nThe summary below leaves out facts that must survive. Rewrite it \
                     so that it contains each of these values verbatim, on a line that names \
                     it as the list does (its label: order number, size, budget...), changing \
                     nothing else:\n{}",
                    rules.update,
                    list.join("\n")
                ),
                previous: Some(text.clone()),
                transcript: String::new(),
                max_chars: rules.summary_chars,
                focus: None,
            };
            let again = tokio::time::timeout(
                cfg.attempt_timeout,
                CatchUnwind(self.summariser.summarise(&req)),
            );
            if let Ok(Ok(Ok(resp))) = again.await {
                calls += 1;
                let better = clean_summary(&resp.text, rules.summary_chars);
                let still = crate::pins::missing(pins, &better);
                if !better.is_empty() && still.len() < missing.len() {
                    text = better;
                    missing = still;
                }
            }
        }
        // Where they would leave the summary no smaller than what it
        // replaces (G7), measured as sent (escaping included), the user's
        // words are halved first (the oldest leave), then the pins'
        // sentences, down to the values alone, so a short span's summary
        // keeps its values rather than fail.
        let mut budget = cfg.pins_budget_chars;
        let mut keep = words.len();
        let mut with_words = body(&text, keep);
        let mut block = self.block(&missing, budget, span.folded);
        loop {
            let with = message_tokens(
                &*cfg.token_counter,
                &[crate::render::summary_message(SummaryView {
                    up_to_turn_index: row.up_to_turn_index,
                    summary: &format!("{with_words}\n\n{block}"),
                })],
            );
            if with < tokens_before {
                break;
            }
            if keep > 0 {
                keep /= 2;
                with_words = body(&text, keep);
            } else if budget > 0 {
                budget /= 2;
            } else {
                break;
            }
            block = self.block(&missing, budget, span.folded);
        }
        // Over the configured budget, even without sentences (the room G7
        // leaves is not the host's budget).
        let over = block.chars().count() > cfg.pins_budget_chars;
        if over {
            let chars = block.chars().count();
            warn!(
                compaction_id = %row.id,
                pins = missing.len(),
                chars,
                budget = cfg.pins_budget_chars,
                "pinned facts exceed their budget; all kept"
            );
            self.events.emit(
                subject,
                EventKind::PinsOverBudget {
                    compaction_id: row.id,
                    pins: missing.len(),
                    chars,
                    budget: cfg.pins_budget_chars,
                },
            );
        }
        let added = missing.len();
        let mut text = with_words;
        if !block.is_empty() {
            text.push_str("\n\n");
            text.push_str(&block);
        }
        Ok((text, added, calls))
    }

    /// The pinned block for `missing` within `budget` chars, with the line
    /// saying how many facts were folded.
    fn block(&self, missing: &[&Pin], budget: usize, folded: usize) -> String {
        crate::pins::with_folded_line(crate::pins::render_block(missing, budget).0, folded)
    }

    /// [`EventKind::PinsOverShare`] when the pins live for good alone fill
    /// the pinned facts' share (every fact mentioned in passing folded).
    fn say_if_over_share(&self, row: &CompactionRow, span: &Span, subject: &Subject) {
        let Some(share) = self.config.pins_share_chars(&subject.model) else {
            return;
        };
        if span.over_share {
            let chars = crate::pins::bare_block_chars(&span.pins);
            warn!(
                compaction_id = %row.id,
                pins = span.pins.len(),
                chars,
                share,
                "the pins live for good fill the pinned facts' share; all kept"
            );
            self.events.emit(
                subject,
                EventKind::PinsOverShare {
                    compaction_id: row.id,
                    pins: span.pins.len(),
                    chars,
                    share,
                },
            );
        }
    }

    /// One pass over the chunks, each folded into the running summary.
    pub(super) async fn one_attempt(
        &self,
        rules: &Rules,
        previous: Option<String>,
        chunks: &[String],
    ) -> Result<(String, Option<i64>, Option<i64>, i64)> {
        let mut running = previous;
        let (mut input, mut output) = (None::<i64>, None::<i64>);
        let mut calls = 0i64;
        let chunks: Vec<&str> = if chunks.is_empty() {
            vec![""]
        } else {
            chunks.iter().map(String::as_str).collect()
        };
        for chunk in chunks {
            let previous = running.take();
            let req = SummaryRequest {
                rules: rules.for_request(previous.is_some()).to_string(),
                focus: rules.focus.clone(),
                previous,
                transcript: chunk.to_string(),
                max_chars: rules.summary_chars,
            };
            // A summariser that panics (a provider client's bug, a host's) fails
            // this attempt; the row is retried and failed under the policy.
            let fut = CatchUnwind(self.summariser.summarise(&req));
            let resp = match tokio::time::timeout(self.config.attempt_timeout, fut).await {
                Ok(Ok(Ok(r))) => r,
                Ok(Ok(Err(e))) => return Err(Error::Summary(e.to_string())),
                Ok(Err(p)) => {
                    return Err(Error::Summary(format!(
                        "summariser panicked: {}",
                        panic_message(&p)
                    )))
                }
                Err(_) => {
                    return Err(Error::Summary(format!(
                        "summariser timed out after {:?}",
                        self.config.attempt_timeout
                    )))
                }
            };
            calls += 1;
            let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            if let Some(n) = resp.usage.input_tokens {
                input = Some(input.unwrap_or(0).saturating_add(clamp(n)));
            }
            if let Some(n) = resp.usage.output_tokens {
                output = Some(output.unwrap_or(0).saturating_add(clamp(n)));
            }
            running = Some(truncate_chars(resp.text.trim(), rules.summary_chars));
        }
        Ok((running.unwrap_or_default(), input, output, calls))
    }
}

/// What a compaction summarises: the previous completed row it folds in, the
/// turns after it up to the boundary, and the live pins it must carry.
/// The rules of one compaction: the first and the update variant (a request
/// with a running summary to fold in gets the update one), and its focus.
pub(super) struct Rules {
    pub(super) first: String,
    pub(super) update: String,
    pub(super) focus: Option<String>,
    /// The summary's cap, chars ([`CompactionConfig::summary_chars`]).
    pub(super) summary_chars: usize,
}

impl Rules {
    pub(super) fn for_request(&self, has_previous: bool) -> &str {
        if has_previous {
            &self.update
        } else {
            &self.first
        }
    }
}

pub(super) struct Span {
    /// The session's newest redaction when the span was read: a summary
    /// made from text a newer one changed is not completed (made again).
    pub(super) redaction: i64,
    pub(super) prev: Option<CompactionRow>,
    pub(super) turns: Vec<crate::store::HistoryTurn>,
    /// The live pins to carry, within their share.
    pub(super) pins: Vec<Pin>,
    /// The window they were kept with (recorded on the row).
    pub(super) window: usize,
    /// Live pins mentioned in passing left out to stay within the share.
    pub(super) folded: usize,
    /// Whether the pins live for good alone exceed the share.
    pub(super) over_share: bool,
    /// The previous summary as the summariser is given it: without its
    /// user's-words section, which the guard carries instead.
    pub(super) previous: Option<String>,
    /// The user's own words the summary carries (the guard writes them;
    /// [`CompactionConfig::user_words_max_share`]); None: no section.
    pub(super) user_words: Option<Vec<String>>,
}

impl Span {
    /// The user's-words section as the summary holds it, or empty.
    pub(super) fn user_words_section(&self) -> String {
        self.user_words
            .as_deref()
            .map(super::user_words::render)
            .unwrap_or_default()
    }
}

/// Tokens of messages as a step sends them (their JSON bytes).
pub(super) fn message_tokens(
    counter: &dyn TokenCounter,
    messages: &[crate::message::Message],
) -> u64 {
    counter.count(&String::from_utf8_lossy(&crate::message::to_bytes(
        messages,
    )))
}

/// A summary as stored: NUL characters removed (SQLite's `length()` stops at
/// the first one), trimmed, cut to `max_chars`; empty when nothing visible is
/// left (only whitespace, control characters, byte-order marks or zero-width
/// characters), which is a failed attempt (G7).
pub(crate) fn clean_summary(text: &str, max_chars: usize) -> String {
    let text: String = text.chars().filter(|&c| c != '\0').collect();
    let text = truncate_chars(text.trim(), max_chars);
    let invisible = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(
                c,
                '\u{00AD}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}'
            )
    };
    if text.chars().all(invisible) {
        String::new()
    } else {
        text
    }
}
