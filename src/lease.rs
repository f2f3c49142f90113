//! The one heartbeat: keeps a lease (a turn's or a compaction row's) while its
//! holder works, for the runner and the compactor alike.

use crate::owner::AbortOnDrop;
use crate::store::Connection;
use crate::store::Store;
use std::time::Duration;
use tracing::debug;

/// Renews a lease every `ttl / 3` in the background, until `renew` reports
/// it lost (`Ok(false)`), the store's file is gone, or the returned guard is
/// dropped (so a dropped future renews nothing). A failed renewal (a busy
/// database) is tried again at the next tick: the lease's remaining two
/// thirds leave room for it.
pub(crate) fn heartbeat<F>(store: &Store, ttl: Duration, renew: F) -> AbortOnDrop
where
    F: Fn(&mut Connection) -> crate::error::Result<bool> + Clone + Send + Sync + 'static,
{
    let store = store.clone();
    AbortOnDrop(tokio::spawn(async move {
        let mut tick = tokio::time::interval(ttl / 3);
        tick.tick().await;
        loop {
            tick.tick().await;
            if store.check_file().is_err() {
                break; // every later store call fails with StoreFileGone
            }
            let renew = renew.clone();
            match store.call(move |c| renew(c)).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => debug!(error = %e, "lease renewal failed; retrying"),
            }
        }
    }))
}
