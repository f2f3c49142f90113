//! The docs name tests that exist: every `file::test` in docs/design.md's
//! Invariants section is a function of that test file (or, for a path into the
//! library, of the source tree), so a renamed or deleted test cannot leave a
//! guarantee pointing at nothing.

use std::path::Path;

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `.rs` file under `dir`, read.
fn sources(dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(read(&p));
        }
    }
}

#[test]
fn every_test_the_invariants_table_names_exists() {
    let root = &crate::common::repo_root();
    let design = read(&root.join("docs/design.md"));
    let start = design.find("## Invariants").expect("an Invariants section");
    let section = &design[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut src = Vec::new();
    for krate in ["abridge", "abridge-testkit", "abridge-cli"] {
        sources(&root.join("crates").join(krate).join("src"), &mut src);
    }
    let mut named = 0;
    for (i, chunk) in section.split('`').enumerate() {
        // Odd chunks are inside backticks; a test path has `::` and no spaces.
        // (A type path such as `Blocking::InPlace` starts with a capital.)
        if i % 2 == 0
            || !chunk.contains("::")
            || chunk.contains(' ')
            || chunk.starts_with(|c: char| c.is_ascii_uppercase())
        {
            continue;
        }
        let parts: Vec<&str> = chunk.split("::").collect();
        let (file, name) = (parts[0], *parts.last().unwrap());
        // A module of the one test binary, or a binary of its own.
        let tests = root.join("crates/abridge-cli/tests");
        let test_file = [tests.join("it"), tests.clone()]
            .map(|d| d.join(format!("{file}.rs")))
            .into_iter()
            .find(|p| p.exists())
            .unwrap_or_default();
        // `file::test` is a test file's test; a longer path is the library's.
        if parts.len() == 2 && test_file.is_file() {
            let text = read(&test_file);
            if name != "*" {
                assert!(
                    text.contains(&format!("fn {name}(")),
                    "docs/design.md names {chunk}, which {} does not define",
                    test_file.display()
                );
            }
        } else {
            assert!(
                src.iter().any(|t| t.contains(&format!("fn {name}("))),
                "docs/design.md names {chunk}, which neither tests/ nor src/ defines"
            );
        }
        named += 1;
    }
    assert!(named >= 30, "only {named} tests named");
}
