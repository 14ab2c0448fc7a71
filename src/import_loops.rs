//! No import loops inside a folder (docs/ARCHITECTURE.md): in every crate of the product (the
//! library, the shared state, the node, the CLI, the exporter), no file of a folder uses a sibling
//! that uses it back, directly or round about. A file's parent (`mod.rs`) is not its sibling: a
//! folder's files may share what their `mod.rs` defines. Test modules are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file below `root` by its module path (`a/b.rs` and `a/b/mod.rs` are `[a, b]`).
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let Some(stem) = p.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if p.extension().is_none_or(|e| e != "rs")
                || stem == "tests"
                || stem.ends_with("_tests")
            {
                continue;
            }
            let rel = p.parent().unwrap().strip_prefix(root).unwrap();
            let mut m: Module = rel
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if !matches!(stem, "mod" | "lib" | "main") {
                m.push(stem.to_string());
            }
            found.insert(m, p);
        }
    }
    found
}

/// The paths a file's code names through `crate::`, `super::` or `self::` (groups expanded),
/// comments and the test module at its end left out.
fn named_paths(text: &str) -> Vec<String> {
    let code: String = text
        .split("#[cfg(test)]\nmod tests {")
        .next()
        .unwrap_or("")
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    for head in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(head) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            expand(&code[at..], &mut out);
        }
    }
    out
}

/// The path at the start of `s`, or each path of a `{...}` group it ends in.
fn expand(s: &str, out: &mut Vec<String>) {
    let prefix: String = s
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    let rest = &s[prefix.len()..];
    if !rest.starts_with('{') {
        out.push(prefix);
        return;
    }
    let mut depth = 0;
    let mut item = String::new();
    for c in rest.chars() {
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    expand(&format!("{prefix}{}", item.trim()), out);
                    return;
                }
            }
            ',' if depth == 1 => {
                expand(&format!("{prefix}{}", item.trim()), out);
                item.clear();
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
}

/// The module a path named in module `m` (a `mod.rs` or not) resolves to: the longest known prefix.
fn resolve(path: &str, m: &Module, known: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut parts = path.split("::").filter(|p| !p.is_empty());
    let mut base: Module = match parts.next()? {
        "crate" => Vec::new(),
        "self" => m.clone(),
        "super" => m[..m.len().saturating_sub(1)].to_vec(),
        _ => return None,
    };
    let mut rest: Vec<&str> = parts.collect();
    while rest.first() == Some(&"super") {
        base.pop();
        rest.remove(0);
    }
    base.extend(
        rest.iter()
            .map(|s| s.split(" as ").next().unwrap_or(s).trim().to_string()),
    );
    (1..=base.len())
        .rev()
        .map(|k| base[..k].to_vec())
        .find(|p| known.contains_key(p))
}

/// The import loops among the siblings of each folder below `root`, one line each.
fn loops(root: &Path) -> Vec<String> {
    let known = modules(root);
    let mut uses: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, file) in &known {
        let text = std::fs::read_to_string(file).unwrap();
        let to = named_paths(&text)
            .iter()
            .filter_map(|p| resolve(p, m, &known))
            .filter(|t| t != m)
            .collect();
        uses.insert(m.clone(), to);
    }
    let mut found = Vec::new();
    let folders: BTreeSet<Module> = known
        .keys()
        .filter(|m| !m.is_empty())
        .map(|m| m[..m.len() - 1].to_vec())
        .collect();
    for folder in folders {
        let siblings: Vec<&Module> = known
            .keys()
            .filter(|m| m.len() == folder.len() + 1 && m.starts_with(&folder))
            .collect();
        let sibling_of = |m: &Module| siblings.iter().position(|s| m.starts_with(s));
        let mut edges = vec![BTreeSet::new(); siblings.len()];
        for (m, to) in &uses {
            let Some(a) = sibling_of(m) else { continue };
            for t in to {
                if let Some(b) = sibling_of(t).filter(|&b| b != a) {
                    edges[a].insert(b);
                }
            }
        }
        // A sibling that reaches itself through others is in a loop.
        for start in 0..siblings.len() {
            let mut seen = BTreeSet::new();
            let mut stack: Vec<usize> = edges[start].iter().copied().collect();
            while let Some(n) = stack.pop() {
                if n == start {
                    found.push(format!(
                        "{}: {} imports a sibling that imports it back",
                        root.join(folder.join("/")).display(),
                        siblings[start].join("::")
                    ));
                    break;
                }
                if seen.insert(n) {
                    stack.extend(edges[n].iter().copied());
                }
            }
        }
    }
    found
}

#[test]
fn no_import_loop_inside_a_folder() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found: Vec<String> = ["src", "state/src", "node/src", "cli/src", "observe/src"]
        .iter()
        .flat_map(|dir| loops(&top.join(dir)))
        .collect();
    assert!(found.is_empty(), "import loops:\n{}", found.join("\n"));
}

#[test]
fn a_loop_between_siblings_is_found() {
    let dir = std::env::temp_dir().join(format!("gpuslice-import-loops-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("folder")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod folder;\n").unwrap();
    std::fs::write(
        dir.join("folder/mod.rs"),
        "mod a;\nmod b;\nmod c;\npub struct Shared;\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("folder/a.rs"),
        "use super::{b::B, Shared};\npub struct A;\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("folder/b.rs"),
        "use crate::folder::c::C;\npub struct B;\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("folder/c.rs"),
        "// use super::a::A;\npub struct C;\n",
    )
    .unwrap();
    assert!(loops(&dir).is_empty(), "{:?}", loops(&dir));
    std::fs::write(dir.join("folder/c.rs"), "use super::a::A;\npub struct C;\n").unwrap();
    let found = loops(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 3, "{found:?}");
}
