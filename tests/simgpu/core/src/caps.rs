//! MIG capabilities: what the NVIDIA kernel driver puts in `/proc` and `/dev` for MIG instances,
//! and the access a CUDA process needs to use one. Modelled under a directory that stands for the
//! machine's root (`SIMGPU_NVIDIA_ROOT`; unset: not modelled, every instance is usable).
//!
//! What NVIDIA documents, and simgpu follows (MIG user guide, "Device Nodes and Capabilities",
//! <https://docs.nvidia.com/datacenter/tesla/mig-user-guide/device-nodes-and-capabilities.html>):
//! - Since CUDA 11/R450 the driver grants actions through "nvidia-capabilities": "If a user does not
//!   have access to the capability, the action will fail". Each GPU and compute instance is one,
//!   listed as `/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/access` and
//!   `.../gi<G>/ci<C>/access`, each naming its `DeviceFileMinor`; through the default `/dev` based
//!   interface access is read access to `/dev/nvidia-caps/nvidia-cap<minor>`. Running CUDA on a
//!   compute instance takes access to both its GPU instance's and its compute instance's
//!   capability (the guide's example grants both), which is how a container runtime hands one MIG
//!   device to a container.
//! - Nothing of the kind exists without MIG instances: the capabilities of instances appear with
//!   the instances.
//!
//! Not modelled: the `/proc` based interface (`nv_cap_enable_devfs=0`), the `config`/`monitor`
//! capabilities, the driver's own minor numbering (`/proc/driver/nvidia-caps/mig-minors`; simgpu
//! numbers its own, [`minor`]), and CAP_SYS_ADMIN's implicit access to every capability.

use crate::mig::Placement;
use std::path::{Path, PathBuf};

/// simgpu's device minor of a capability: GPU instance `gi` of GPU `gpu` (`ci` `None`), or its
/// compute instance `ci`. Unique per capability; the driver's own numbers differ.
pub fn minor(gpu: u32, gi: u32, ci: Option<u32>) -> u32 {
    3 + (gpu * 8 + gi) * 9 + ci.map_or(0, |c| c + 1)
}

/// `proc/driver/nvidia` under `root`: what the NVIDIA kernel module shows in `/proc`.
pub fn proc_dir(root: &Path) -> PathBuf {
    root.join("proc/driver/nvidia")
}

/// The device node of capability `minor` under `root`.
pub fn node(root: &Path, minor: u32) -> PathBuf {
    root.join(format!("dev/nvidia-caps/nvidia-cap{minor}"))
}

/// The ids a placement's instance has: (GPU, GPU instance id, compute instance id), as NVML gives
/// them (GPU instance ids from 1, one compute instance, 0).
fn ids(p: &Placement) -> Option<(u32, u32, u32)> {
    p.instance.map(|i| (p.gpu, i + 1, 0))
}

/// Makes what the driver shows under `root` for these devices: `proc/driver/nvidia/` always, and
/// for each MIG instance its two capabilities' `access` files and device nodes (readable by
/// everyone, as a runtime hands them to a container).
pub fn populate(root: &Path, placements: &[Placement]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(proc_dir(root))?;
    for (gpu, gi, ci) in placements.iter().filter_map(ids) {
        let gi_dir = proc_dir(root).join(format!("capabilities/gpu{gpu}/mig/gi{gi}"));
        let ci_dir = gi_dir.join(format!("ci{ci}"));
        std::fs::create_dir_all(&ci_dir)?;
        std::fs::create_dir_all(root.join("dev/nvidia-caps"))?;
        for (dir, m) in [
            (&gi_dir, minor(gpu, gi, None)),
            (&ci_dir, minor(gpu, gi, Some(ci))),
        ] {
            std::fs::write(
                dir.join("access"),
                format!("DeviceFileMinor: {m}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            )?;
            let n = node(root, m);
            std::fs::write(&n, b"")?;
            std::fs::set_permissions(&n, std::fs::Permissions::from_mode(0o444))?;
        }
    }
    Ok(())
}

/// Whether this process may run CUDA on instance `instance` (an index, as in [`Placement`]) of GPU
/// `gpu`, or on the whole GPU (`None`: always): it can open both the instance's capabilities'
/// device nodes under `root` for reading.
pub fn usable(root: &Path, gpu: u32, instance: Option<u32>) -> bool {
    let Some(i) = instance else {
        return true;
    };
    let gi = i + 1;
    [minor(gpu, gi, None), minor(gpu, gi, Some(0))]
        .iter()
        .all(|&m| std::fs::File::open(node(root, m)).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_need_both_capabilities() {
        let root = std::env::temp_dir().join(format!("simgpu-caps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let p = crate::mig::placements(2, 80, &[(0, vec![10, 20])]);
        populate(&root, &p).unwrap();
        assert!(proc_dir(&root).is_dir());
        let access = proc_dir(&root).join("capabilities/gpu0/mig/gi2/ci0/access");
        let text = std::fs::read_to_string(access).unwrap();
        assert!(text.contains(&format!("DeviceFileMinor: {}", minor(0, 2, Some(0)))));
        assert!(p.iter().all(|p| usable(&root, p.gpu, p.instance)), "{p:?}");
        // Without its compute instance's node, instance 1 is not usable; instance 0 still is.
        std::fs::remove_file(node(&root, minor(0, 2, Some(0)))).unwrap();
        assert!(usable(&root, 0, Some(0)) && !usable(&root, 0, Some(1)));
        // A whole GPU needs no capability.
        assert!(usable(Path::new("/nonexistent"), 1, None));
        // Minors are distinct.
        let mut all: Vec<u32> = (0..2)
            .flat_map(|g| (1..=7).flat_map(move |gi| [minor(g, gi, None), minor(g, gi, Some(0))]))
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 28);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn no_capabilities_without_mig() {
        let root = std::env::temp_dir().join(format!("simgpu-nocaps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        populate(&root, &crate::mig::placements(1, 80, &[])).unwrap();
        assert!(proc_dir(&root).is_dir());
        assert!(!proc_dir(&root).join("capabilities").exists());
        assert!(!root.join("dev/nvidia-caps").exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
