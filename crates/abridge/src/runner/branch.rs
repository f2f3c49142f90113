//! Sessions that branch: a fork continues a session's history from one of
//! its turns, and a rewind is a fork at the turn before plus a new turn.

use super::{Runner, TurnOutcome};
use crate::error::{Error, Result};
use crate::ids::SessionId;
use crate::store::SessionRow;

impl Runner {
    /// Makes `new_id` a fork of `session_id` at turn `at_turn` (see
    /// [`crate::Store::fork`]), copying the pins live there within this
    /// runner's compactor window. Its next turn is `at_turn + 1`, run with
    /// [`Runner::run_turn`] as any session's; it compacts on its own.
    pub async fn fork(
        &self,
        session_id: SessionId,
        at_turn: i64,
        new_id: &str,
    ) -> Result<SessionRow> {
        let window = self
            .inner
            .cfg
            .compaction
            .pins_window
            .max(crate::pins::DEFAULT_PINS_WINDOW);
        self.inner
            .store
            .fork_with_window(session_id.into(), at_turn, new_id, window)
            .await
    }

    /// Goes back to turn `turn` of `session_id` and says something else,
    /// keeping the original: forks it at `turn - 1` as `new_id` and runs
    /// `input` as the fork's turn `turn`. Returns the fork and the turn's
    /// outcome. The session itself is unchanged.
    ///
    /// Idempotent, as [`Runner::run_turn_at`]: after a crash the same call
    /// finds the fork and resumes (or returns) its turn, never a second
    /// fork. Rewinding turn 0 makes a new session of the same model and
    /// system prompt, with no parent (there is no history to share).
    pub async fn rewind(
        &self,
        session_id: SessionId,
        turn: i64,
        new_id: &str,
        input: &str,
    ) -> Result<(SessionRow, TurnOutcome)> {
        let fork = if turn == 0 {
            let parent = self.session(session_id).await?;
            self.create_session(new_id, &parent.model, &parent.system_prompt)
                .await?
        } else if turn > 0 {
            self.fork(session_id, turn - 1, new_id).await?
        } else {
            return Err(Error::NotAForkPoint {
                session_id,
                turn,
                reason: "a turn index is not negative".into(),
            });
        };
        let outcome = self.run_turn_at(fork.id, turn, input).await?;
        Ok((fork, outcome))
    }
}
