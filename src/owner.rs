//! Owner identities for leases, and a liveness check for owners on this machine.
//!
//! An owner string made by [`process_owner`] names the host, the process id and
//! the process's start time. On Linux, [`is_dead_local_owner`] can then tell that
//! such an owner's process is gone (or its pid reused), so a restarted host takes
//! over the leases of the process it replaces at once instead of waiting for them
//! to expire. A lease held by a live process is always respected.

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// Start time of a process in clock ticks since boot (Linux), None if it is gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// An owner identity for this process: `name@host#pid.start`.
pub fn process_owner(name: &str) -> String {
    let pid = std::process::id();
    let start = start_time(pid).unwrap_or(0);
    format!("{name}@{}#{pid}.{start}", hostname())
}

/// True when `owner` (made by [`process_owner`]) names a process on this
/// machine that no longer runs. False whenever it cannot be known.
pub fn is_dead_local_owner(owner: &str) -> bool {
    let Some((left, proc_part)) = owner.rsplit_once('#') else {
        return false;
    };
    let Some((_, host)) = left.rsplit_once('@') else {
        return false;
    };
    if host != hostname() || !std::path::Path::new("/proc/self/stat").exists() {
        return false;
    }
    let Some((pid, start)) = proc_part.split_once('.') else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    match start_time(pid) {
        None => true,
        Some(s) => s != start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_garbage_is_not_judged_dead() {
        let me = process_owner("t");
        assert!(!is_dead_local_owner(&me));
        assert!(!is_dead_local_owner("worker-1"));
        assert!(!is_dead_local_owner("x@other-host#1.1"));
    }

    #[test]
    fn a_reused_or_missing_pid_is_dead() {
        let me = process_owner("t");
        let (left, _) = me.rsplit_once('#').unwrap();
        let pid = std::process::id();
        assert!(is_dead_local_owner(&format!("{left}#{pid}.1")));
        assert!(is_dead_local_owner(&format!("{left}#4194303.5")));
    }
}
