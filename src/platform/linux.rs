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

/// Start time of a process in clock ticks since boot, None if it is gone.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}
