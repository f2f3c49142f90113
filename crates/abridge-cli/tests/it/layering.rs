//! The engine's modules import downward only: every `crate::` path in a
//! module of `src/` names a module on its own floor or one below, by the
//! floors docs/design.md's Layout lists (read from the doc, so the doc and
//! the code cannot drift apart), and no two modules import each other,
//! however indirectly. The test kit and the command line are crates above
//! the engine (the engine cannot name them: it does not depend on them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The floors, bottom first: each a set of top-level module names, from
/// the `<!-- floors:begin -->` list of docs/design.md.
fn floors(root: &Path) -> Vec<BTreeSet<String>> {
    let design = std::fs::read_to_string(root.join("docs/design.md")).unwrap();
    let start = design.find("<!-- floors:begin -->").expect("a floors list");
    let end = design
        .find("<!-- floors:end -->")
        .expect("a floors list's end");
    design[start..end]
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            l.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        })
        .collect()
}

/// The top-level module a file of `src/` belongs to (None: the crate root).
fn module_of(rel: &Path) -> Option<String> {
    let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy());
    let first = parts.next()?.to_string();
    if first == "lib.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// The names `lib.rs` re-exports at the crate root, and their modules
/// (`crate::Store` is `store`'s).
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let mut text = lib.replace('\n', " ");
    while let Some(i) = text.find("pub use ") {
        text = text[i + 8..].to_string();
        let stmt = &text[..text.find(';').unwrap()];
        let module = stmt.split("::").next().unwrap().trim().to_string();
        let list = stmt.split_once("::").map_or("", |(_, r)| r);
        for name in list
            .trim_matches(|c| c == '{' || c == '}' || c == ' ')
            .split(',')
        {
            let name = name.trim().rsplit("::").next().unwrap().to_string();
            if !name.is_empty() {
                names.insert(name, module.clone());
            }
        }
    }
    names
}

/// Every `crate::name` a file's code (comments left out) refers to.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + 7..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
            rest = after;
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The engine's import graph (`root`: the engine crate): module -> the
/// modules it names.
fn graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let src = root.join("src");
    let names = root_names(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let Some(module) = module_of(rel) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        // A file's unit tests (a `#[cfg(test)]` module, at its end) may use
        // the test hooks of `testing`: they are not the module's imports.
        let text = match text.find("#[cfg(test)]\nmod ") {
            Some(i) => &text[..i],
            None => &text[..],
        };
        let entry = graph.entry(module.clone()).or_default();
        for name in crate_paths(text) {
            let target = match names.get(&name) {
                Some(m) => m.clone(),
                None => name,
            };
            if target != module {
                entry.insert(target);
            }
        }
    }
    graph
}

#[test]
fn no_engine_module_imports_one_above_it() {
    let root = &crate::common::repo_root();
    let floors = floors(root);
    assert!(
        floors.len() >= 5,
        "docs/design.md lists {} floors",
        floors.len()
    );
    let floor_of = |m: &str| floors.iter().position(|f| f.contains(m));
    let graph = graph(&root.join("crates/abridge"));
    let mut wrong = Vec::new();
    for (module, imports) in &graph {
        let Some(own) = floor_of(module) else {
            wrong.push(format!(
                "{module} is on no floor of docs/design.md's Layout"
            ));
            continue;
        };
        for target in imports {
            match floor_of(target) {
                Some(t) if t > own => wrong.push(format!(
                    "{module} (floor {}) imports {target} (floor {})",
                    own + 1,
                    t + 1
                )),
                Some(_) => {}
                None if graph.contains_key(target) => wrong.push(format!(
                    "{target} is on no floor of docs/design.md's Layout"
                )),
                None => {} // a macro or a re-exported crate, not a module
            }
        }
    }
    // Every floor's module exists.
    for m in floors.iter().flatten() {
        if !graph.contains_key(m) {
            wrong.push(format!(
                "docs/design.md lists {m}, which src/ does not have"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_module_graph_has_no_circle() {
    let graph = graph(&crate::common::repo_root().join("crates/abridge"));
    // Depth-first, with the path so far: a module met again on it closes a
    // circle.
    fn visit<'g>(
        m: &'g str,
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'g str>,
        done: &mut BTreeSet<&'g str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| *p == m) {
            let mut circle: Vec<String> = path[i..].iter().map(|s| s.to_string()).collect();
            circle.push(m.to_string());
            return Some(circle);
        }
        if !done.insert(m) {
            return None;
        }
        path.push(m);
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        if let Some(circle) = visit(m, &graph, &mut Vec::new(), &mut done) {
            panic!("an import circle: {}", circle.join(" -> "));
        }
    }
}

#[test]
fn a_module_importing_upward_is_caught() {
    // The check itself can fail: a store file naming the runner is flagged.
    let paths = crate_paths("use crate::runner::Runner; // crate::text in a comment\n");
    assert_eq!(paths.into_iter().collect::<Vec<_>>(), ["runner"]);
    let names = root_names("pub use store::{Blocking, Store};\npub use error::Result;\n");
    assert_eq!(names["Store"], "store");
    assert_eq!(names["Result"], "error");
}
