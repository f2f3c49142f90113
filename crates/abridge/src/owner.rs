//! Lease holders: who holds a turn or compaction lease, and when a holder may
//! be judged gone before its lease expires.
//!
//! A lease is held by a *claim*, not by a process name. Each claim gets a
//! holder string `{owner}|{instance}|{token}`: the owner name the host chose
//! (stable across restarts if the host wants its own dead claims back at once),
//! this process's instance (boot id, PID namespace, pid, start time and a
//! random nonce) and a token unique within the process. While the claim's
//! [`ClaimGuard`] lives, the token is in this process's set of live claims;
//! dropping the guard (the work finished, failed, or its future was dropped)
//! removes it.
//!
//! An unexpired lease may be taken over early only when its holder is
//! provably gone ([`holder_is_gone`]):
//! - a claim of this process whose guard is dropped;
//! - a claim of another instance with the same owner name (a restarted host),
//!   unless that instance is provably a live process on this machine;
//! - a claim of a process provably on this machine (same boot id and PID
//!   namespace) that no longer runs.
//!
//! Anything else (another machine, another container's PID namespace, a
//! platform without `/proc`) is freed only by the lease's expiry.

use crate::platform;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// This process, as written into every holder string.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Instance {
    /// Kernel boot id (Linux), empty where unknown.
    boot: String,
    /// PID namespace inode (Linux), empty where unknown.
    pid_ns: String,
    pid: u32,
    /// Process start time in clock ticks since boot (Linux), 0 where unknown.
    start: u64,
    /// Random: tells two instances apart where nothing else can.
    nonce: u64,
}

impl Instance {
    fn encode(&self) -> String {
        format!(
            "{}.{}.{}.{}.{:x}",
            self.boot, self.pid_ns, self.pid, self.start, self.nonce
        )
    }

    fn decode(s: &str) -> Option<Instance> {
        let mut it = s.split('.');
        let inst = Instance {
            boot: it.next()?.to_string(),
            pid_ns: it.next()?.to_string(),
            pid: it.next()?.parse().ok()?,
            start: it.next()?.parse().ok()?,
            nonce: u64::from_str_radix(it.next()?, 16).ok()?,
        };
        it.next().is_none().then_some(inst)
    }

    /// True when `other` is provably a process of this machine's kernel in our
    /// PID namespace, so that its pid means the same here.
    fn shares_pid_space_with(&self, other: &Instance) -> bool {
        !self.boot.is_empty()
            && !self.pid_ns.is_empty()
            && self.boot == other.boot
            && self.pid_ns == other.pid_ns
    }
}

fn this_instance() -> &'static Instance {
    static INSTANCE: OnceLock<Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        let pid = std::process::id();
        Instance {
            boot: platform::boot_id().unwrap_or_default(),
            pid_ns: platform::pid_namespace().unwrap_or_default(),
            pid,
            start: platform::start_time(pid).unwrap_or(0),
            nonce: random_nonce(),
        }
    })
}

fn random_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS per process; mixing in the time
    // separates instances even where that seed repeats.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

fn live_claims() -> &'static Mutex<HashSet<u64>> {
    static LIVE: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

fn token_is_live(token: u64) -> bool {
    live_claims()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&token)
}

/// A live claim of this process. While it exists, no task, runner or store of
/// this process takes over a lease written with [`ClaimGuard::holder`];
/// dropping it frees such leases for takeover by this process at once (other
/// processes wait for the lease's expiry, as its renewals stop).
#[derive(Debug)]
pub struct ClaimGuard {
    holder: String,
    token: u64,
}

impl ClaimGuard {
    /// A new claim for the owner name `owner`.
    pub fn new(owner: &str) -> ClaimGuard {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let token = NEXT.fetch_add(1, Ordering::Relaxed);
        live_claims()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token);
        ClaimGuard {
            holder: format!("{owner}|{}|{token}", this_instance().encode()),
            token,
        }
    }

    /// The holder string written into the lease columns.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        live_claims()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.token);
    }
}

/// A holder string, parsed.
struct Holder<'a> {
    owner: &'a str,
    instance: Instance,
    token: u64,
}

fn parse_holder(holder: &str) -> Option<Holder<'_>> {
    let mut it = holder.rsplitn(3, '|');
    let token = it.next()?.parse().ok()?;
    let instance = Instance::decode(it.next()?)?;
    let owner = it.next()?;
    Some(Holder {
        owner,
        instance,
        token,
    })
}

/// The owner name in a holder string (the whole string when it is not one).
pub fn owner_name(holder: &str) -> &str {
    parse_holder(holder).map_or(holder, |h| h.owner)
}

/// Whether the holder of an unexpired lease is provably gone, as seen by a
/// claim of owner name `owner`: see the module docs for the rule.
/// `check_processes` enables the process check on this machine
/// (`RunnerConfig::take_over_dead_local_owners`).
///
/// A holder string that is not one (written by an older version) is gone only
/// when it equals `owner` (that version's restarted-host rule).
pub fn holder_is_gone(holder: &str, owner: &str, check_processes: bool) -> bool {
    let Some(h) = parse_holder(holder) else {
        return holder == owner;
    };
    let me = this_instance();
    if h.instance == *me {
        return !token_is_live(h.token);
    }
    let local_and_dead = || {
        me.shares_pid_space_with(&h.instance)
            && platform::start_time(h.instance.pid) != Some(h.instance.start)
    };
    if h.owner == owner {
        // The same name from another instance: the host restarted, unless that
        // instance is provably still running here.
        let provably_alive =
            me.shares_pid_space_with(&h.instance) && !local_and_dead() && check_processes;
        return !provably_alive;
    }
    check_processes && local_and_dead()
}

/// [`holder_is_gone`] for a store hosts on several machines share (a
/// PostgreSQL store): a holder is gone early only when that is provable from
/// here (a dropped claim of this very process, or, with `check_processes`,
/// a dead process of this machine and PID namespace). A holder anywhere
/// else is never presumed gone, whatever its name: a host of the same name
/// on another machine may be alive, so only its lease's expiry frees the
/// row.
pub fn holder_is_gone_shared(holder: &str, _owner: &str, check_processes: bool) -> bool {
    let Some(h) = parse_holder(holder) else {
        return false;
    };
    let me = this_instance();
    if h.instance == *me {
        return !token_is_live(h.token);
    }
    check_processes
        && me.shares_pid_space_with(&h.instance)
        && platform::start_time(h.instance.pid) != Some(h.instance.start)
}

/// An owner name unique to this process: `name@host#pid.start`. Two processes
/// never share it, so neither takes the other's live leases by name; a process
/// that restarts gets a new one (its dead claims are still taken over at once
/// on the same machine, by the process check).
pub fn process_owner(name: &str) -> String {
    let pid = std::process::id();
    let start = platform::start_time(pid).unwrap_or(0);
    format!("{name}@{}#{pid}.{start}", platform::hostname())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other(inst: Instance, owner: &str) -> String {
        format!("{owner}|{}|7", inst.encode())
    }

    #[test]
    fn a_live_claim_of_this_process_is_respected_and_a_dropped_one_is_gone() {
        let a = ClaimGuard::new("host");
        let holder = a.holder().to_string();
        assert!(!holder_is_gone(&holder, "host", true));
        assert!(!holder_is_gone(&holder, "someone-else", true));
        drop(a);
        assert!(holder_is_gone(&holder, "host", true));
        assert!(holder_is_gone(&holder, "someone-else", false));
        assert_eq!(owner_name(&holder), "host");
    }

    #[test]
    fn the_same_name_from_a_dead_or_unknown_instance_is_a_restarted_host() {
        let me = this_instance().clone();
        // Same machine, pid gone: a restarted host.
        let dead = Instance {
            pid: 4_194_303,
            nonce: me.nonce ^ 1,
            ..me.clone()
        };
        assert!(holder_is_gone(&other(dead.clone(), "w1"), "w1", true));
        // Another machine or namespace: the name is the host's promise.
        let elsewhere = Instance {
            boot: "ffff".into(),
            nonce: me.nonce ^ 2,
            ..me.clone()
        };
        assert!(holder_is_gone(&other(elsewhere.clone(), "w1"), "w1", true));
        // Another name elsewhere: only expiry frees it.
        assert!(!holder_is_gone(&other(elsewhere, "w2"), "w1", true));
    }

    #[test]
    fn on_a_shared_store_only_a_provably_gone_holder_is_gone_early() {
        let me = this_instance().clone();
        // The same name on another machine: a restarted host for a file of
        // one machine, a live peer for a store shared by several.
        let elsewhere = Instance {
            boot: "ffff".into(),
            nonce: me.nonce ^ 5,
            ..me.clone()
        };
        assert!(holder_is_gone(&other(elsewhere.clone(), "w1"), "w1", true));
        assert!(!holder_is_gone_shared(
            &other(elsewhere.clone(), "w1"),
            "w1",
            true
        ));
        assert!(!holder_is_gone_shared(&other(elsewhere, "w2"), "w1", true));
        assert!(!holder_is_gone_shared(
            "not a holder string",
            "not a holder string",
            true
        ));
        // A dropped claim of this very process is gone, on any store.
        let a = ClaimGuard::new("host");
        let holder = a.holder().to_string();
        assert!(!holder_is_gone_shared(&holder, "host", true));
        drop(a);
        assert!(holder_is_gone_shared(&holder, "host", false));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_live_local_process_is_respected_and_a_dead_one_is_gone() {
        let me = this_instance().clone();
        // This very process under another nonce: alive, whatever its name.
        let alive = Instance {
            nonce: me.nonce ^ 3,
            ..me.clone()
        };
        assert!(!holder_is_gone(&other(alive.clone(), "w1"), "w1", true));
        assert!(!holder_is_gone(&other(alive, "w2"), "w1", true));
        let dead = Instance {
            start: me.start + 1,
            nonce: me.nonce ^ 4,
            ..me.clone()
        };
        assert!(holder_is_gone(&other(dead.clone(), "w2"), "w1", true));
        assert!(!holder_is_gone(&other(dead, "w2"), "w1", false));
    }

    #[test]
    fn another_pid_namespace_is_never_judged_dead_early() {
        let me = this_instance().clone();
        let container = Instance {
            pid_ns: "1".into(),
            pid: 4_194_303,
            nonce: me.nonce ^ 5,
            ..me.clone()
        };
        assert!(!holder_is_gone(&other(container, "w2"), "w1", true));
    }

    #[test]
    fn older_holder_strings_are_gone_only_for_their_own_name() {
        assert!(holder_is_gone("worker-1", "worker-1", true));
        assert!(!holder_is_gone("worker-1", "worker-2", true));
        assert!(!holder_is_gone("x@host#1.1", "y", true));
    }
}
