//! The engine builds off Unix: every Unix-only API sits in a gated file of
//! its `crates/abridge/src/platform/` (or in the test kit's Unix-only chaos harness, the
//! command line, and the PostgreSQL connection's I/O on the waiting thread),
//! and the fallbacks used elsewhere compile and behave (they are compiled here
//! too, by path).

use std::path::{Path, PathBuf};

#[path = "../../../abridge/src/platform/other.rs"]
#[allow(dead_code)]
mod other;

#[path = "../../../abridge/src/platform/not_unix.rs"]
#[allow(dead_code)]
mod not_unix;

/// APIs that exist only on Unix (or only on Linux).
const UNIX_ONLY: &[&str] = &[
    "std::os::unix",
    "std::os::linux",
    "std::os::fd",
    "libc::",
    "\"/proc",
    "/dev/shm",
];

/// Files allowed to use them, each gated where it is declared.
/// (A file, relative to the repository's root; how the file that declares
/// it declares it.)
const GATED: &[(&str, &str)] = &[
    (
        "crates/abridge/src/platform/linux.rs",
        "#[cfg(target_os = \"linux\")]\nmod linux;",
    ),
    (
        "crates/abridge/src/platform/unix.rs",
        "#[cfg(unix)]\nmod unix;",
    ),
    (
        "crates/abridge-testkit/src/chaos.rs",
        "#[cfg(unix)]\npub mod chaos;",
    ),
    (
        "crates/abridge-cli/src/verbs/chaos.rs",
        "#[cfg(unix)]\npub(crate) mod chaos;",
    ),
    (
        "crates/abridge/src/store/backend/pg_io.rs",
        "#[cfg(all(feature = \"postgres\", unix))]\npub(crate) mod pg_io;",
    ),
    ("crates/abridge-cli/src/main.rs", ""),
];

/// The files that declare the gated ones.
const DECLARERS: &[&str] = &[
    "crates/abridge/src/platform/mod.rs",
    "crates/abridge-testkit/src/lib.rs",
    "crates/abridge-cli/src/verbs/mod.rs",
    "crates/abridge/src/store/backend/mod.rs",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn unix_only_apis_appear_only_in_gated_files() {
    let root = &crate::common::repo_root();
    let mut files = Vec::new();
    for krate in ["abridge", "abridge-testkit", "abridge-cli"] {
        rust_files(&root.join("crates").join(krate).join("src"), &mut files);
    }
    let mut found = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if GATED.iter().any(|(g, _)| *g == rel) {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for api in UNIX_ONLY {
                if code.contains(api) {
                    found.push(format!("{rel}:{}: {api}", n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "Unix-only APIs outside the gated files:\n{}",
        found.join("\n")
    );
    // And the gated files are declared under their cfg.
    let declarers: Vec<String> = DECLARERS
        .iter()
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
        .collect();
    let main = std::fs::read_to_string(root.join("crates/abridge-cli/src/main.rs")).unwrap();
    for (file, decl) in GATED.iter().filter(|(_, d)| !d.is_empty()) {
        assert!(
            declarers.iter().any(|d| d.contains(decl)),
            "{file} is not declared as `{decl}`"
        );
    }
    // main.rs of the command line: its Unix-only lines (and the chaos verbs,
    // Unix-only) are gated one by one.
    let lines: Vec<&str> = main.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        if UNIX_ONLY
            .iter()
            .chain(&["chaos::", "Cmd::Chaos"])
            .any(|api| line.contains(api))
        {
            // Back to the end of the previous item (a line ending in `,`, `;`
            // or `}`): a #[cfg(unix)] on the way gates this line.
            let mut gated = false;
            for l in lines[..n].iter().rev() {
                let t = l.trim();
                if t.contains("#[cfg(unix)]") {
                    gated = true;
                    break;
                }
                let ends_item = t.ends_with(',') || t.ends_with(';') || t.ends_with('}');
                if ends_item && !t.starts_with('#') && !t.starts_with("//") {
                    break;
                }
            }
            assert!(
                gated,
                "crates/abridge-cli/src/main.rs:{}: {line} is not under #[cfg(unix)]",
                n + 1
            );
        }
    }
}

#[test]
fn the_fallbacks_free_leases_by_expiry_only() {
    assert_eq!(other::boot_id(), None);
    assert_eq!(other::pid_namespace(), None);
    assert_eq!(other::start_time(std::process::id()), None);
    assert!(!other::hostname().is_empty());
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x");
    assert_eq!(not_unix::file_identity(&f), None);
    std::fs::write(&f, "x").unwrap();
    assert_eq!(not_unix::file_identity(&f), Some((0, 0)));
}
