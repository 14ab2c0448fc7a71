//! Slice IDs, tenant names, slice sizes, and how a request is packed onto GPUs.
use super::TWO_MIB;
use std::collections::BTreeMap;

/// `<uuid>::<i>`
pub fn device_id(uuid: &str, i: u32) -> String {
    format!("{uuid}::{i}")
}

pub(super) fn parse_id(id: &str) -> Option<(&str, u32)> {
    let (uuid, i) = id.rsplit_once("::")?;
    Some((uuid, i.parse().ok()?))
}

/// The tenant of an allocation: named by its GPU and first slice (slices are exclusive).
pub fn tenant_name(uuid: &str, first: u32) -> String {
    format!("k8s-{uuid}-{first}")
}

/// Memory of `k` of `n` slices of a GPU of `total` bytes, rounded down to 2 MiB.
pub fn slice_memory(total: u64, k: u32, n: u32) -> u64 {
    let bytes = (u128::from(total) * u128::from(k) / u128::from(n.max(1))) as u64;
    bytes / TWO_MIB * TWO_MIB
}

/// Picks `size` of `available`, `must` included, on as few GPUs as possible: the GPUs of `must`
/// first, then the GPU that fits the rest most tightly, else the fullest GPUs first.
pub fn preferred(available: &[String], must: &[String], size: usize) -> Vec<String> {
    let mut out: Vec<String> = must.to_vec();
    let mut by_gpu: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for id in available {
        if out.contains(id) {
            continue;
        }
        if let Some((uuid, i)) = parse_id(id) {
            by_gpu
                .entry(uuid.to_string())
                .or_default()
                .push((i, id.clone()));
        }
    }
    for v in by_gpu.values_mut() {
        v.sort();
    }
    let take =
        |uuid: &str, out: &mut Vec<String>, by_gpu: &mut BTreeMap<String, Vec<(u32, String)>>| {
            if let Some(v) = by_gpu.get_mut(uuid) {
                while out.len() < size && !v.is_empty() {
                    out.push(v.remove(0).1);
                }
            }
        };
    let must_gpus: Vec<String> = must
        .iter()
        .filter_map(|id| parse_id(id).map(|(u, _)| u.to_string()))
        .collect();
    for g in &must_gpus {
        take(g, &mut out, &mut by_gpu);
    }
    while out.len() < size {
        let need = size - out.len();
        let best = by_gpu
            .iter()
            .filter(|(_, v)| v.len() >= need)
            .min_by_key(|(_, v)| v.len())
            .or_else(|| {
                by_gpu
                    .iter()
                    .filter(|(_, v)| !v.is_empty())
                    .max_by_key(|(_, v)| v.len())
            })
            .map(|(u, _)| u.clone());
        match best {
            Some(g) => take(&g, &mut out, &mut by_gpu),
            None => break,
        }
    }
    out
}
