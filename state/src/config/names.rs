//! The `GPUSLICE_*` names gpuslice knows, and the closest known name to one it does not.
//!
//! Known: every variable of [`table::SETTINGS`] (the library's settings, the driver layer's
//! `GPUSLICE_REAL_*` and `GPUSLICE_NVIDIA_ROOT` included) and [`table::OTHER_VARIABLES`] (read by the
//! command line, the build and the scripts, never by the library). A test (`names_tests.rs`) finds
//! every `"GPUSLICE_..."` literal in the sources and checks it is known, so the list cannot drift.
//!
//! The closest name: the names are compared as words (`GPUSLICE_COMPUTE_CAP` is `COMPUTE`, `CAP`),
//! case-insensitively, each word read through a few synonyms users reach for (`CAP`, `MAX`, `QUOTA`
//! for `LIMIT`; `MEM` for `MEMORY`; `SM` for `COMPUTE`...), then by edit distance (adjacent swaps
//! count one) on the words in order and on the words sorted (`LIMIT_MEMORY`), or as the known
//! name's words with one word more (`GPUSLICE_GPU_MEMORY_LIMIT`). Only the unknown names are compared:
//! this runs at start-up only for a variable that is not known.

use super::table::{self, Source};

/// Whether `name` is a `GPUSLICE_*` variable gpuslice knows (exact spelling).
pub fn is_known(name: &str) -> bool {
    known().any(|k| k == name)
}

/// Every known `GPUSLICE_*` name: the settings' variables, then the other parts' ones.
pub fn known() -> impl Iterator<Item = &'static str> {
    let settings = table::SETTINGS.iter().flat_map(|s| s.sources);
    let own = settings.filter_map(|src| match *src {
        Source::Env(v) => Some(v),
        _ => None,
    });
    own.chain(table::OTHER_VARIABLES.iter().map(|(name, _)| *name))
}

/// Whether `name` starts with `GPUSLICE_` in any case (`gpuslice_memory_limit` is a near miss too).
pub fn is_gpuslice(name: &str) -> bool {
    name.as_bytes()
        .get(..PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(PREFIX.as_bytes()))
}

const PREFIX: &str = "GPUSLICE_";

/// The known names closest to the unknown `name` (several when they are equally close), best
/// first in the table's order; empty when none is close enough to be a likely misspelling.
pub fn closest(name: &str) -> Vec<&'static str> {
    let mut best: Vec<&'static str> = Vec::new();
    let mut best_score = usize::MAX;
    for k in known() {
        // As spelt, and each word read through its synonyms (`QUOTAFILE` is near `QUOTA_FILE`,
        // `COMPUTE_CAP` is `COMPUTE_LIMIT`).
        let as_spelt = score(&words(name, false), &words(k, false));
        let Some(score) = as_spelt
            .into_iter()
            .chain(score(&words(name, true), &words(k, true)))
            .min()
        else {
            continue;
        };
        if score < best_score {
            best_score = score;
            best.clear();
        }
        if score == best_score && !best.contains(&k) {
            best.push(k);
        }
    }
    best
}

/// How far `typo` is from the known name `known` (0: the same words, maybe reordered or through
/// synonyms); `None` when it is too far to be a misspelling of it.
fn score(typo: &[String], known: &[String]) -> Option<usize> {
    if typo.is_empty() {
        return None;
    }
    let in_order = distance(&typo.join("_"), &known.join("_"));
    let sorted = |w: &[String]| {
        let mut w = w.to_vec();
        w.sort();
        w.join("_")
    };
    let reordered = distance(&sorted(typo), &sorted(known));
    let mut d = in_order.min(reordered);
    // The known name's words and one more (`GPU_MEMORY_LIMIT`, `QUOTA_FILE_PATH`).
    if typo.len() == known.len() + 1 && known.iter().all(|w| typo.contains(w)) {
        d = d.min(1);
    }
    let len = known.iter().map(String::len).sum::<usize>() + known.len().saturating_sub(1);
    let allowed = match len {
        0..=4 => 1,
        5..=10 => 2,
        _ => 3,
    };
    (d <= allowed).then_some(d)
}

/// The words of a name after `GPUSLICE_`, upper case, each through [`synonym`] when `synonyms`:
/// `-`, `.` and `_` separate words.
fn words(name: &str, synonyms: bool) -> Vec<String> {
    let rest = if is_gpuslice(name) {
        &name[PREFIX.len()..]
    } else {
        name
    };
    rest.split(['_', '-', '.'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let w = w.to_ascii_uppercase();
            match synonym(&w) {
                Some(s) if synonyms => s.to_owned(),
                _ => w,
            }
        })
        .collect()
}

/// The word of gpuslice's names a user may mean by `word`.
fn synonym(word: &str) -> Option<&'static str> {
    Some(match word {
        "CAP" | "CAPS" | "MAX" | "MAXIMUM" | "LIM" | "LIMITS" | "QUOTA" | "QUOTAS" => "LIMIT",
        "MEM" | "VRAM" | "RAM" => "MEMORY",
        "SM" | "SMS" | "CORE" | "CORES" | "UTIL" | "UTILIZATION" => "COMPUTE",
        "PRIO" => "PRIORITY",
        "LOGS" | "LOGGING" | "LOGLEVEL" | "VERBOSITY" => "LOG",
        "DIRECTORY" | "FOLDER" => "DIR",
        "SHARES" => "SHARE",
        _ => return None,
    })
}

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
/// adjacent characters each count one.
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let w = b.len() + 1;
    let mut d: Vec<usize> = vec![0; (a.len() + 1) * w];
    for (i, row) in d.chunks_mut(w).enumerate() {
        row[0] = i;
    }
    for (j, cell) in d.iter_mut().take(w).enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[(i - 1) * w + j] + 1)
                .min(d[i * w + j - 1] + 1)
                .min(d[(i - 1) * w + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[(i - 2) * w + j - 2] + 1);
            }
            d[i * w + j] = v;
        }
    }
    d[a.len() * w + b.len()]
}

#[cfg(test)]
#[path = "names_tests.rs"]
mod tests;
