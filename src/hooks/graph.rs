//! Graph hooks: a graph launch passes through the compute-share gate like a kernel launch, and
//! allocates the graph's memory nodes, charged to the quota first ([`crate::accounting::graphs`]);
//! what a graph's launches allocate is read when it is instantiated (`instantiate.rs`).

use super::hooks;
use crate::accounting::graphs;
use crate::scheduling::gate;
use gpuslice_api::types::{CUgraphExec, CUstream};
use gpuslice_api::CUresult;

pub mod instantiate;
pub use instantiate::*;
pub mod trim;
pub use trim::*;

hooks! {
    // A graph launch also allocates the graph's memory nodes (accounting::graphs): straight to the
    // driver only when, besides, no executable graph of this process has any.
    ret = CUresult,
    fast = crate::scheduling::launch_passes() && !graphs::any();
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream)
        => gate(&[stream], false, || graphs::launch(exec as usize, stream, false, || real::cuGraphLaunch(exec, stream)));
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream)
        => gate(&[stream], true, || graphs::launch(exec as usize, stream, true, || real::cuGraphLaunch_ptsz(exec, stream)));
}
