//! Sessions that branch: a fork of a session at one of its turns, which
//! reads the session's history where it is.

use crate::error::Result;

impl crate::Store {
    /// Makes `new_id` a fork of `session` at turn `at_turn`: a new session
    /// whose history is `session`'s turns up to and including `at_turn`,
    /// read where they are (never copied), then its own turns from
    /// `at_turn + 1`. It reads the compaction `session` had completed at or
    /// before `at_turn` until it completes its own; its own turns,
    /// compactions and pins are its own rows, and `session` is unchanged.
    /// The fork's effects are never re-run: its history's tool calls are
    /// history.
    ///
    /// Writes the session row, one lineage row per ancestor it reads (the
    /// depth of forks, not the length of the history) and a copy of each
    /// pin live at the fork point (facts in passing within
    /// [`crate::pins::DEFAULT_PINS_WINDOW`]; [`crate::Runner::fork`] uses
    /// its compactor's window). Idempotent: the same fork again returns it;
    /// another session named `new_id` is [`crate::Error::SessionConflict`]. Only a
    /// completed turn is a fork point ([`crate::Error::NotAForkPoint`]).
    pub async fn fork(
        &self,
        session: impl Into<crate::inspect::SessionKey>,
        at_turn: i64,
        new_id: &str,
    ) -> Result<crate::store::SessionRow> {
        self.fork_with_window(
            session.into(),
            at_turn,
            new_id,
            crate::pins::DEFAULT_PINS_WINDOW,
        )
        .await
    }

    pub(crate) async fn fork_with_window(
        &self,
        session: crate::inspect::SessionKey,
        at_turn: i64,
        new_id: &str,
        window: usize,
    ) -> Result<crate::store::SessionRow> {
        let new_id = new_id.to_string();
        self.call(move |c| {
            let parent = crate::inspect::session(c, &session)?;
            crate::store::fork_session(c, parent.id, at_turn, &new_id, window)
        })
        .await
    }

    /// The sessions that hang off `session`: its forks and its delegated
    /// children, oldest first.
    pub async fn children(
        &self,
        session: impl Into<crate::inspect::SessionKey>,
    ) -> Result<Vec<crate::store::SessionRow>> {
        let key = session.into();
        self.call(move |c| {
            let s = crate::inspect::session(c, &key)?;
            crate::store::children(c, s.id)
        })
        .await
    }
}
