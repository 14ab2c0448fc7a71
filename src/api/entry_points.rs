//! The entry-point tables and lookups over them.

use std::collections::HashMap;
use std::sync::OnceLock;

pub use crate::result::{CUDA_CODES, NVML_CODES};

/// Which default-stream semantics a variant has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The legacy default stream (the plain export).
    Legacy,
    /// `_ptds`: per-thread default stream (copies, memsets, synchronous calls).
    PerThreadDs,
    /// `_ptsz`: per-thread default stream (stream-taking calls).
    PerThreadSz,
}

impl Stream {
    pub fn is_per_thread(self) -> bool {
        self != Stream::Legacy
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolKind {
    Function,
    /// An exported variable (the debugger's `cudbg*` words).
    Data,
}

/// A name in [`DRIVER_NAMES`]: its start and length. The driver table holds no pointer, so the
/// dynamic loader has nothing of it to relocate (and no page of it to copy) in each process that
/// loads the library; two `&'static str` a row were 1,520 relocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Name(u32, u16);

impl Name {
    fn text(self) -> &'static str {
        let start = self.0 as usize;
        DRIVER_NAMES
            .get(start..start + usize::from(self.1))
            .unwrap_or_default()
    }
}

/// One exported CUDA driver symbol.
#[derive(Debug, PartialEq, Eq)]
pub struct DriverEntryPoint {
    symbol: Name,
    base: Name,
    /// CUDA version (1000*major + 10*minor) from which `cuGetProcAddress` returns this symbol for
    /// `base`; 0 when it is exported but never handed out by `cuGetProcAddress`.
    pub version: u32,
    pub stream: Stream,
    pub kind: SymbolKind,
    /// Exported by NVIDIA's 535 driver (the oracle we can run).
    pub in_535: bool,
}

impl DriverEntryPoint {
    /// The exported name (`cuMemAlloc_v2`).
    pub fn symbol(&self) -> &'static str {
        self.symbol.text()
    }

    /// The name `cuGetProcAddress` is asked for (`cuMemAlloc`).
    pub fn base(&self) -> &'static str {
        self.base.text()
    }
}

/// One exported NVML symbol.
#[derive(Debug)]
pub struct NvmlEntryPoint {
    pub symbol: &'static str,
    pub kind: SymbolKind,
    pub in_535: bool,
}

include!(concat!(env!("OUT_DIR"), "/entry_points.rs"));

fn by_symbol() -> &'static HashMap<&'static str, usize> {
    static MAP: OnceLock<HashMap<&'static str, usize>> = OnceLock::new();
    MAP.get_or_init(|| {
        DRIVER_ENTRY_POINTS
            .iter()
            .enumerate()
            .map(|(i, e)| (e.symbol(), i))
            .collect()
    })
}

/// The driver entry point exported as `symbol`.
pub fn driver_entry_point(symbol: &str) -> Option<&'static DriverEntryPoint> {
    by_symbol().get(symbol).map(|&i| &DRIVER_ENTRY_POINTS[i])
}

/// All variants `cuGetProcAddress` can return for `base`, oldest first: a run of the table, which is
/// sorted by base, found by binary search. Nothing is built at the first lookup (a CUDA runtime makes
/// hundreds of them at its start-up) and nothing is allocated.
pub fn variants_of(base: &str) -> impl Iterator<Item = &'static DriverEntryPoint> {
    let start = DRIVER_ENTRY_POINTS.partition_point(|e| e.base() < base);
    let len = DRIVER_ENTRY_POINTS[start..].partition_point(|e| e.base() == base);
    DRIVER_ENTRY_POINTS[start..start + len]
        .iter()
        .filter(|e| e.version != 0)
}

/// The NVML entry point exported as `symbol`.
pub fn nvml_entry_point(symbol: &str) -> Option<&'static NvmlEntryPoint> {
    NVML_ENTRY_POINTS
        .binary_search_by(|e| e.symbol.cmp(symbol))
        .ok()
        .map(|i| &NVML_ENTRY_POINTS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_consistent() {
        assert!(DRIVER_ENTRY_POINTS.len() > 600);
        let e = driver_entry_point("cuMemAlloc_v2").unwrap();
        assert_eq!(
            (e.base(), e.version, e.stream),
            ("cuMemAlloc", 3020, Stream::Legacy)
        );
        let names: Vec<_> = variants_of("cuLaunchKernel").map(|e| e.symbol()).collect();
        assert_eq!(names, ["cuLaunchKernel", "cuLaunchKernel_ptsz"]);
        assert!(NVML_ENTRY_POINTS
            .windows(2)
            .all(|w| w[0].symbol < w[1].symbol));
        assert!(nvml_entry_point("nvmlDeviceGetMemoryInfo_v2").is_some());
        // `variants_of` finds a base's run by binary search: the table is sorted by base, and the
        // run holds what a walk of the whole table finds, in its order.
        assert!(DRIVER_ENTRY_POINTS
            .windows(2)
            .all(|w| w[0].base() <= w[1].base()));
        for e in DRIVER_ENTRY_POINTS {
            let walked = DRIVER_ENTRY_POINTS
                .iter()
                .filter(|v| v.base() == e.base() && v.version != 0);
            assert!(variants_of(e.base()).eq(walked), "{}", e.base());
        }
        assert_eq!(variants_of("cuNoSuchCall").count(), 0);
        // Every row's names, read back from the one string, are the table's.
        let tsv = include_str!("driver_entry_points.tsv");
        let header: Vec<&str> = tsv
            .lines()
            .rfind(|l| l.starts_with('#') && l.contains('\t'))
            .unwrap()
            .trim_start_matches('#')
            .trim_start()
            .split('\t')
            .collect();
        let lines = tsv.lines().filter(|l| !l.starts_with('#') && !l.is_empty());
        let col = |name| header.iter().position(|h| *h == name).unwrap();
        let (symbol, base) = (col("symbol"), col("base"));
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
        assert_eq!(rows.len(), DRIVER_ENTRY_POINTS.len());
        for (row, e) in rows.iter().zip(DRIVER_ENTRY_POINTS) {
            assert_eq!((e.symbol(), e.base()), (row[symbol], row[base]));
        }
        let mut seen = std::collections::HashSet::new();
        assert!(
            DRIVER_ENTRY_POINTS.iter().all(|e| seen.insert(e.symbol())),
            "duplicate symbol"
        );
    }
}
