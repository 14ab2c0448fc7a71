//! The host cost of driver calls: a real driver's calls take the calling thread some time, and a
//! library that adds driver calls to a program's hot path (a scheduler's events, queries, context
//! lookups) adds that time. simgpu's own calls are cheaper than a GPU driver's for some entry points
//! and dearer for others; each call therefore takes **at least** its class's cost of host time (the
//! calling thread spins until then, as a driver's thread spends its time on the CPU).
//!
//! Defaults, from published measurements of NVIDIA's driver on current hardware (one call, one
//! thread, no contention):
//! - a kernel launch (`cuLaunchKernel*`, `cuLaunchCooperativeKernel*`, `cuGraphLaunch*`): 2.5 µs.
//!   NVIDIA's CUDA C++ Best Practices Guide and its CUDA Graphs material put the CPU cost of a
//!   launch at "a few microseconds"; `cuLaunchKernel` measures 2-5 µs on recent drivers.
//! - `cuEventRecord*`: 0.8 µs; `cuEventQuery`: 0.4 µs (0.3-1.5 µs for event calls measured).
//! - `cuStreamQuery`: 0.4 µs.
//! - context and stream look-ups (`cuCtxGetCurrent`, `cuCtxSetCurrent`, `cuCtxPushCurrent*`,
//!   `cuCtxPopCurrent*`, `cuCtxGetDevice`, `cuStreamGetCtx*`, `cuStreamIsCapturing*`,
//!   `cuThreadExchangeStreamCaptureMode`): 0.1 µs (thread-local state in the driver).
//!
//! Settings (read once per process; nanoseconds, at most 1 s): `SIMGPU_COST_LAUNCH_NS`,
//! `SIMGPU_COST_EVENT_RECORD_NS`, `SIMGPU_COST_EVENT_QUERY_NS`, `SIMGPU_COST_STREAM_QUERY_NS`,
//! `SIMGPU_COST_CONTEXT_NS`; `0` leaves that class at simgpu's own cost.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The classes of calls that carry a cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Launch,
    EventRecord,
    EventQuery,
    StreamQuery,
    Context,
}

const CLASSES: usize = 5;

struct Costs([u64; CLASSES]);

/// Default cost of each class, in the order of [`Class`] (see the module docs for the sources).
pub(crate) const DEFAULTS: [u64; CLASSES] = [2_500, 800, 400, 400, 100];
const VARIABLES: [&str; CLASSES] = [
    "SIMGPU_COST_LAUNCH_NS",
    "SIMGPU_COST_EVENT_RECORD_NS",
    "SIMGPU_COST_EVENT_QUERY_NS",
    "SIMGPU_COST_STREAM_QUERY_NS",
    "SIMGPU_COST_CONTEXT_NS",
];

/// Parses the settings from `lookup`; a bad value is reported through `warn` and the default kept.
pub(crate) fn parse(
    lookup: impl Fn(&str) -> Option<String>,
    mut warn: impl FnMut(String),
) -> [u64; CLASSES] {
    let mut c = DEFAULTS;
    for (slot, name) in c.iter_mut().zip(VARIABLES) {
        if let Some(v) = lookup(name) {
            match v.trim().parse::<u64>() {
                Ok(n) if n <= 1_000_000_000 => *slot = n,
                _ => warn(format!(
                    "simgpu: ignoring {name}={v:?} (nanoseconds, at most 1 s); using {slot}"
                )),
            }
        }
    }
    c
}

fn costs() -> &'static Costs {
    static COSTS: OnceLock<Costs> = OnceLock::new();
    COSTS.get_or_init(|| Costs(parse(|k| std::env::var(k).ok(), |m| eprintln!("{m}"))))
}

/// The class of an entry point, by its exported name.
pub(crate) fn class(name: &str) -> Option<Class> {
    let b = name.as_bytes();
    if b.len() < 6 || &b[..2] != b"cu" {
        return None;
    }
    if name.starts_with("cuLaunchKernel")
        || name.starts_with("cuLaunchCooperativeKernel")
        || name.starts_with("cuGraphLaunch")
    {
        return Some(Class::Launch);
    }
    if name.starts_with("cuEventRecord") {
        return Some(Class::EventRecord);
    }
    if name == "cuEventQuery" {
        return Some(Class::EventQuery);
    }
    if name.starts_with("cuStreamQuery") {
        return Some(Class::StreamQuery);
    }
    match name {
        "cuCtxGetCurrent"
        | "cuCtxSetCurrent"
        | "cuCtxPushCurrent"
        | "cuCtxPushCurrent_v2"
        | "cuCtxPopCurrent"
        | "cuCtxPopCurrent_v2"
        | "cuCtxGetDevice"
        | "cuStreamGetCtx"
        | "cuStreamGetCtx_ptsz"
        | "cuStreamGetCtx_v2"
        | "cuStreamGetCtx_v2_ptsz"
        | "cuStreamIsCapturing"
        | "cuStreamIsCapturing_ptsz"
        | "cuThreadExchangeStreamCaptureMode" => Some(Class::Context),
        _ => None,
    }
}

/// A call of `name` under way: [`Paid::pay`] makes it take at least its class's cost.
pub(crate) struct Paid(Option<(Instant, u64)>);

/// Starts timing a call of `name`.
#[inline]
pub(crate) fn start(name: &str) -> Paid {
    Paid(class(name).and_then(|c| {
        let ns = costs().0[c as usize];
        (ns > 0).then(|| (Instant::now(), ns))
    }))
}

impl Paid {
    /// Spins until the call has taken its cost (a driver's host time is CPU time).
    #[inline]
    pub(crate) fn pay(self) {
        if let Some((t0, ns)) = self.0 {
            let d = Duration::from_nanos(ns);
            while t0.elapsed() < d {
                std::hint::spin_loop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_are_classed() {
        assert_eq!(class("cuLaunchKernel"), Some(Class::Launch));
        assert_eq!(class("cuLaunchKernel_ptsz"), Some(Class::Launch));
        assert_eq!(class("cuLaunchKernelEx"), Some(Class::Launch));
        assert_eq!(class("cuGraphLaunch_ptsz"), Some(Class::Launch));
        assert_eq!(class("cuEventRecord"), Some(Class::EventRecord));
        assert_eq!(
            class("cuEventRecordWithFlags_ptsz"),
            Some(Class::EventRecord)
        );
        assert_eq!(class("cuEventQuery"), Some(Class::EventQuery));
        assert_eq!(class("cuStreamQuery_ptsz"), Some(Class::StreamQuery));
        assert_eq!(class("cuCtxGetCurrent"), Some(Class::Context));
        assert_eq!(class("cuStreamGetCtx"), Some(Class::Context));
        assert_eq!(class("cuMemAlloc_v2"), None);
        assert_eq!(class("cuEventSynchronize"), None);
        assert_eq!(class("cu"), None);
    }

    #[test]
    fn settings_override_defaults_and_bad_values_are_reported() {
        let mut warned = Vec::new();
        let c = parse(
            |k| match k {
                "SIMGPU_COST_LAUNCH_NS" => Some("4000".into()),
                "SIMGPU_COST_EVENT_QUERY_NS" => Some("lots".into()),
                "SIMGPU_COST_CONTEXT_NS" => Some("0".into()),
                _ => None,
            },
            |m| warned.push(m),
        );
        assert_eq!(c, [4000, DEFAULTS[1], DEFAULTS[2], DEFAULTS[3], 0]);
        assert_eq!(warned.len(), 1);
        assert!(
            warned[0].contains("SIMGPU_COST_EVENT_QUERY_NS"),
            "{warned:?}"
        );
    }

    #[test]
    fn a_call_takes_at_least_its_cost() {
        let p = Paid(Some((Instant::now(), 200_000)));
        let t = Instant::now();
        p.pay();
        assert!(t.elapsed() >= Duration::from_micros(190));
    }
}
