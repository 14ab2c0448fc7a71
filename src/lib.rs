//! gpuslice: device-memory quotas and compute shares for unmodified CUDA programs, enforced by a
//! library preloaded into them. See docs/ARCHITECTURE.md.

// The shared state (the tools link it too): named here as the library's own modules.
pub use gpuslice_state::{config, ledger, log, slotfile};

pub mod scheduling;

pub mod process;

pub mod accounting;
pub mod driver;
pub mod hooks;

#[cfg(test)]
mod import_loops;

/// The layers, bottom first: a module uses only modules of lower layers (docs/ARCHITECTURE.md).
/// Below them all, the shared-state crate (`log`, `slotfile`, `config`, `ledger`, the device
/// ledger), which has its own.
#[cfg(test)]
const LAYERS: &[&[&str]] = &[
    &["driver"],
    &["process"],
    &["accounting", "scheduling"],
    &["hooks"],
];

/// Imports run one way: no module of `src/` names a module of its own layer or of a layer above.
#[test]
fn imports_run_one_way() {
    let layer_of = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for (i, layer) in LAYERS.iter().enumerate() {
        for module in *layer {
            let mut files = vec![src.join(format!("{module}.rs"))];
            let mut dirs = vec![src.join(module)];
            while let Some(dir) = dirs.pop() {
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let p = entry.path();
                    if p.is_dir() {
                        dirs.push(p);
                    } else if p.extension().is_some_and(|e| e == "rs") {
                        files.push(p);
                    }
                }
            }
            for file in files.iter().filter(|f| f.exists()) {
                let text = std::fs::read_to_string(file).unwrap();
                for (at, _) in text.match_indices("crate::") {
                    let name: String = text[at + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if name != *module && layer_of(&name).is_some_and(|l| l >= i) {
                        wrong.push(format!("{} uses crate::{name}", file.display()));
                    }
                }
            }
        }
    }
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}
