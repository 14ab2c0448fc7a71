//! The `GPUSLICE_*` names gpuslice knows, and the closest known name to one it does not.
//!
//! Known ([`KNOWN`]): every variable of [`table::SETTINGS`] (the library's settings, the driver
//! layer's `GPUSLICE_REAL_*` and `GPUSLICE_NVIDIA_ROOT` included) and [`table::OTHER_VARIABLES`]
//! (read by the command line, the build and the scripts, never by the library). Tests
//! (`names_tests.rs`) check the list is the table's, and find every `"GPUSLICE_..."` literal in the
//! sources and check it is known, so the list cannot drift.
//!
//! The closest name: the names are compared as words (`GPUSLICE_COMPUTE_CAP` is `COMPUTE`, `CAP`),
//! case-insensitively, each word read through a few synonyms users reach for (`CAP`, `MAX`, `QUOTA`
//! for `LIMIT`; `MEM` for `MEMORY`; `SM` for `COMPUTE`...), then by edit distance (adjacent swaps
//! count one) on the words in order and on the words sorted (`LIMIT_MEMORY`), or as the known
//! name's words with one word more (`GPUSLICE_GPU_MEMORY_LIMIT`) or one fewer (`GPUSLICE_MEMORY`). Only the unknown names are compared:
//! this runs at start-up only for a variable that is not known.

/// The list of known names, and [`is_known`] as a `match` over it: at start-up every `GPUSLICE_*`
/// variable is checked, and a `match` compiles to a switch on the length and one comparison.
macro_rules! known_names {
    ($($name:literal),* $(,)?) => {
        /// Every known `GPUSLICE_*` name, in the table's order (`known_names_are_the_tables` checks
        /// it holds [`table::SETTINGS`]' variables and [`table::OTHER_VARIABLES`], no more).
        pub const KNOWN: &[&str] = &[$($name),*];

        /// Whether `name` is a `GPUSLICE_*` variable gpuslice knows (exact spelling).
        pub fn is_known(name: &str) -> bool {
            matches!(name, $($name)|*)
        }
    };
}

known_names!(
    "GPUSLICE_TENANT",
    "GPUSLICE_LEDGER",
    "GPUSLICE_LEDGER_DIR",
    "GPUSLICE_LEDGER_GROUP",
    "GPUSLICE_MEMORY_LIMIT",
    "GPUSLICE_COMPUTE_SHARE",
    "GPUSLICE_COMPUTE_LIMIT",
    "GPUSLICE_PRIORITY",
    "GPUSLICE_QUOTA_FILE",
    "GPUSLICE_CONTEXT_RESERVE",
    "GPUSLICE_LOG",
    "GPUSLICE_POLICY",
    "GPUSLICE_DEVICE_DIR",
    "GPUSLICE_REAL_LIBCUDA",
    "GPUSLICE_REAL_NVML",
    "GPUSLICE_NVIDIA_ROOT",
    "GPUSLICE_LIBRARY",
    "GPUSLICE_SIMGPU",
    "GPUSLICE_DEMO_SIMGPU",
    "GPUSLICE_COMMIT",
    "GPUSLICE_RELEASE_PACKAGES",
    "GPUSLICE_GLIBC_FLOOR",
    "GPUSLICE_DEBIAN_MIRROR",
    "GPUSLICE_OLD_SUITE",
);

/// Every known `GPUSLICE_*` name.
pub fn known() -> impl Iterator<Item = &'static str> {
    KNOWN.iter().copied()
}

/// Whether `name` starts with `GPUSLICE_` in any case (`gpuslice_memory_limit` is a near miss too).
#[inline]
pub fn is_gpuslice(name: &str) -> bool {
    // Every variable of the process is asked at start-up: most are told by their first byte.
    let b = name.as_bytes();
    matches!(b.first(), Some(b'G' | b'g'))
        && b.get(..PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(PREFIX.as_bytes()))
}

const PREFIX: &str = "GPUSLICE_";

/// The known names closest to the unknown `name` (several when they are equally close), best
/// first in the table's order; empty when none is close enough to be a likely misspelling.
pub fn closest(name: &str) -> Vec<&'static str> {
    // As spelt, and each word read through its synonyms (`COMPUTE_CAP` is `COMPUTE_LIMIT`).
    let typo = [Words::of(name, false), Words::of(name, true)];
    let mut best: Vec<&'static str> = Vec::new();
    let mut best_score = usize::MAX;
    for k in known() {
        // Known names as they are: `QUOTA_FILE` read as `LIMIT_FILE` would be near `GPUSLICE_CAP`.
        let known = Words::of(k, false);
        let mut score = score(&typo[0], &known);
        if typo[1] != typo[0] {
            score = score.into_iter().chain(self::score(&typo[1], &known)).min();
        }
        let Some(score) = score else {
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

/// A name's words after `GPUSLICE_`, upper case, each through [`synonym`] when asked: `-`, `.` and
/// `_` separate words. Joined with `_` as they come and sorted, for the distances.
#[derive(PartialEq, Eq)]
pub(super) struct Words {
    words: Vec<String>,
    in_order: String,
    sorted: String,
}

impl Words {
    pub(super) fn of(name: &str, synonyms: bool) -> Words {
        let rest = if is_gpuslice(name) {
            &name[PREFIX.len()..]
        } else {
            name
        };
        let words: Vec<String> = rest
            .split(['_', '-', '.'])
            .filter(|w| !w.is_empty())
            .map(|w| {
                let w = w.to_ascii_uppercase();
                match synonym(&w) {
                    Some(s) if synonyms => s.to_owned(),
                    _ => w,
                }
            })
            .collect();
        let mut sorted = words.clone();
        sorted.sort();
        Words {
            in_order: words.join("_"),
            sorted: sorted.join("_"),
            words,
        }
    }
}

/// How far `typo` is from the known name `known` (0: the same words, maybe reordered or through
/// synonyms); `None` when it is too far to be a misspelling of it.
pub(super) fn score(typo: &Words, known: &Words) -> Option<usize> {
    if typo.words.is_empty() {
        return None;
    }
    let allowed = match known.in_order.len() {
        0..=4 => 1,
        5..=10 => 2,
        _ => 3,
    };
    // The known name's words and one more (`GPU_MEMORY_LIMIT`, `QUOTA_FILE_PATH`), or one fewer
    // (`GPUSLICE_MEMORY`).
    let within = |a: &Words, b: &Words| {
        a.words.len() == b.words.len() + 1 && b.words.iter().all(|w| a.words.contains(w))
    };
    let mut d = if within(typo, known) || within(known, typo) {
        1
    } else {
        usize::MAX
    };
    // A length apart by more than is allowed is that many edits at least: not computed.
    if typo.in_order.len().abs_diff(known.in_order.len()) <= allowed {
        d = d.min(distance(&typo.in_order, &known.in_order));
        if typo.sorted != typo.in_order || known.sorted != known.in_order {
            d = d.min(distance(&typo.sorted, &known.sorted));
        }
    }
    (d <= allowed).then_some(d)
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
/// adjacent characters each count one. Three rows on the stack: names longer than [`MAX_NAME`]
/// are as far as can be.
pub(super) fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() > MAX_NAME || b.len() > MAX_NAME {
        return usize::MAX;
    }
    let mut before = [0usize; MAX_NAME + 1];
    let mut prev = [0usize; MAX_NAME + 1];
    let mut row = [0usize; MAX_NAME + 1];
    for (j, cell) in prev.iter_mut().enumerate() {
        *cell = j;
    }
    for (i, &ca) in a.iter().enumerate() {
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let mut v = (prev[j + 1] + 1)
                .min(row[j] + 1)
                .min(prev[j] + usize::from(ca != cb));
            if i > 0 && j > 0 && ca == b[j - 1] && a[i - 1] == cb {
                v = v.min(before[j - 1] + 1);
            }
            row[j + 1] = v;
        }
        before = prev;
        prev = row;
    }
    prev[b.len()]
}

/// The longest name compared by [`distance`].
const MAX_NAME: usize = 40;

#[cfg(test)]
#[path = "names_tests.rs"]
mod tests;
