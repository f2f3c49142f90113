//! Turn leases: taking one (a new turn, a takeover), fencing every write of
//! a leased turn by its epoch, renewing it.

use crate::error::{Error, Result};
use crate::ids::TurnId;
use crate::store::db::{Connection, OptionalExtension, Transaction};
use crate::store::rows::*;
use rusqlite::params;

/// A held turn lease: the right to write one turn's steps while `epoch` is current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The turn.
    pub turn_id: TurnId,
    /// Who holds it.
    pub owner: String,
    /// Fencing epoch; a takeover increments it.
    pub epoch: i64,
    /// How long each renewal extends it, ms.
    pub ttl_ms: i64,
    /// The owner name of the holder this lease was taken over from (None: the
    /// turn is new, or its lease was free).
    pub taken_from: Option<String>,
}

impl Lease {
    /// The error of a write this lease no longer allows.
    pub(crate) fn lost(&self) -> impl Fn() -> Error + Send + 'static {
        let (turn_id, epoch) = (self.turn_id, self.epoch);
        move || Error::LeaseLost { turn_id, epoch }
    }
}

/// Checks the lease inside the caller's write transaction, and renews it when
/// less than half its time is left.
///
/// Transaction behaviour: must run inside an IMMEDIATE transaction, so the check
/// and the writes that follow are atomic; a taken-over lease matches no row and
/// the whole transaction is refused with [`Error::LeaseLost`]. A lease with
/// more than half its time left is only read: the heartbeat and the writes
/// that find it past half renew it, so it never runs out while its holder
/// works, and most steps leave the turn's row (and its page) untouched.
pub(crate) fn fence(tx: &Transaction<'_>, lease: &Lease) -> Result<()> {
    check_lease(tx, lease, lease.ttl_ms / 2)
}

/// Checks the lease; renews it when less than `renew_below` ms are left.
///
/// On PostgreSQL the check and the renewal are queued (see
/// [`Connection::execute_later_or`]): they go with the transaction's next
/// request, and a lease no longer held refuses that request and the whole
/// transaction ([`Error::LeaseLost`]; [`explain_lost`] tells a deleted turn
/// from a taken-over one afterwards). SQLite answers at once, so it reads.
pub(crate) fn check_lease(tx: &Transaction<'_>, lease: &Lease, renew_below: i64) -> Result<()> {
    if tx.kind() == crate::store::BackendKind::Postgres {
        tx.execute_later_or(
            "SELECT 1 FROM turns \
             WHERE id = ?1 AND lease_owner = ?2 AND lease_epoch = ?3 AND status = 'running'",
            params![lease.turn_id, lease.owner, lease.epoch],
            lease.lost(),
        )?;
        let now = tx.now_ms();
        return tx.execute_later(
            "UPDATE turns SET lease_expires_at = ?1 \
             WHERE id = ?2 AND lease_owner = ?3 AND lease_epoch = ?4 AND status = 'running' \
             AND (lease_expires_at IS NULL OR lease_expires_at < ?5)",
            params![
                now + lease.ttl_ms,
                lease.turn_id,
                lease.owner,
                lease.epoch,
                now.saturating_add(renew_below)
            ],
        );
    }
    let expires: Option<Option<i64>> = tx
        .prepare_cached(
            "SELECT lease_expires_at FROM turns \
             WHERE id = ?1 AND lease_owner = ?2 AND lease_epoch = ?3 AND status = 'running'",
        )?
        .query_row(params![lease.turn_id, lease.owner, lease.epoch], |r| {
            r.get(0)
        })
        .optional()?;
    let Some(expires) = expires else {
        // The turn itself gone: its session was deleted meanwhile.
        let exists = tx
            .prepare_cached("SELECT 1 FROM turns WHERE id = ?1")?
            .exists([lease.turn_id])?;
        if !exists {
            return Err(Error::TurnDeleted {
                turn_id: lease.turn_id,
            });
        }
        return Err(Error::LeaseLost {
            turn_id: lease.turn_id,
            epoch: lease.epoch,
        });
    };
    let now = tx.now_ms();
    if expires.is_none_or(|e| e - now < renew_below) {
        tx.prepare_cached("UPDATE turns SET lease_expires_at = ?1 WHERE id = ?2")?
            .execute(params![now + lease.ttl_ms, lease.turn_id])?;
    }
    Ok(())
}

pub(crate) fn take_lease(
    tx: &Transaction<'_>,
    turn: &TurnRow,
    owner: &str,
    ttl_ms: i64,
    owner_is_dead: &dyn Fn(&str) -> bool,
) -> Result<Lease> {
    let now = tx.now_ms();
    let (holder, expires_at) = (turn.lease_owner.as_deref(), turn.lease_expires_at);
    if crate::store::lease_held_by_live_other(holder, expires_at, owner, now, owner_is_dead) {
        return Err(Error::LeaseHeld {
            turn_id: turn.id,
            owner: crate::owner::owner_name(holder.unwrap_or_default()).to_string(),
            expires_at: expires_at.unwrap_or_default(),
        });
    }
    let epoch = turn.lease_epoch + 1;
    tx.execute(
        "UPDATE turns SET lease_owner = ?1, lease_epoch = ?2, lease_expires_at = ?3 \
         WHERE id = ?4 AND status = 'running' AND lease_epoch = ?5",
        params![owner, epoch, now + ttl_ms, turn.id, turn.lease_epoch],
    )?;
    Ok(Lease {
        turn_id: turn.id,
        owner: owner.into(),
        epoch,
        ttl_ms,
        taken_from: holder.map(|h| crate::owner::owner_name(h).to_string()),
    })
}

/// Renews the lease to its full time (heartbeat). Returns false when it was lost.
pub(crate) fn renew_lease(conn: &mut Connection, lease: &Lease) -> Result<bool> {
    let renewed = (|| {
        let tx = conn.write_tx_of(crate::store::db::Owner::Turn(lease.turn_id))?;
        check_lease(&tx, lease, i64::MAX)?;
        tx.commit()
    })();
    match renewed.map_err(|e| explain_lost(conn, e)) {
        Ok(()) => Ok(true),
        Err(Error::LeaseLost { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A lease lost on a turn that is gone is [`Error::TurnDeleted`]: its
/// session was deleted meanwhile. Called once the refused transaction has
/// ended; any other error is returned as it is.
pub(crate) fn explain_lost(conn: &Connection, e: Error) -> Error {
    let Error::LeaseLost { turn_id, .. } = e else {
        return e;
    };
    let exists = conn
        .prepare_cached("SELECT 1 FROM turns WHERE id = ?1")
        .and_then(|mut st| st.exists([turn_id]));
    match exists {
        Ok(false) => Error::TurnDeleted { turn_id },
        _ => e,
    }
}

/// Opens a fenced IMMEDIATE transaction: every write of a leased turn runs in
/// one. The caller commits it.
///
/// Its writes are the leased turn's own rows (its steps, tool calls and end,
/// its session's pins): on PostgreSQL it excludes the turn's other writers
/// and every store-wide one, not the turns of other sessions.
pub(crate) fn fenced_tx<'c>(conn: &'c mut Connection, lease: &Lease) -> Result<Transaction<'c>> {
    let tx = conn.write_tx_of(crate::store::db::Owner::Turn(lease.turn_id))?;
    fence(&tx, lease)?;
    Ok(tx)
}
