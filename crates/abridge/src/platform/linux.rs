//! Linux: this machine and its processes, read from `/proc`.

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

pub(crate) fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id: String = id
        .trim()
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .collect();
    (!id.is_empty()).then_some(id)
}

pub(crate) fn pid_namespace() -> Option<String> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let s = link.to_string_lossy();
    let ino: String = s.chars().filter(|c| c.is_ascii_digit()).collect();
    (!ino.is_empty()).then_some(ino)
}

/// Start time of a live process in clock ticks since boot, None if it is
/// gone. A zombie (state `Z`, killed or exited and not yet reaped by its
/// parent) or a dying process (`X`) is gone: it runs no code and holds no
/// lease, though its pid and start time are still listed.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields resume after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace();
    if matches!(fields.next()?, "Z" | "X" | "x") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_has_a_start_time_and_a_zombie_has_none() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        assert!(start_time(pid).is_some(), "a running child");
        // Killed, not yet reaped: a zombie until wait().
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while start_time(pid).is_some() && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        assert!(state.contains(") Z "), "not a zombie: {state}");
        assert_eq!(start_time(pid), None, "a zombie is gone");
        child.wait().unwrap();
        assert_eq!(start_time(pid), None);
        assert!(start_time(std::process::id()).is_some());
    }
}
