//! The `repr(C)` structs of gpuslice-api (src/api/types.rs, launch_types.rs, nvml.rs) against NVIDIA's
//! real headers: a C program compiled against cuda.h / nvml.h prints sizeof, alignment and the offset
//! of every field, and each must equal Rust's `size_of`/`align_of`/`offset_of!`. A struct or field
//! added to those files without an entry here fails the test (it names what to add).

use gpuslice_testkit as common;

use common::*;
use gpuslice_api::launch_types::*;
use gpuslice_api::nvml::*;
use gpuslice_api::types::*;
use std::collections::{BTreeMap, BTreeSet};
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

struct Layout {
    name: &'static str,
    size: usize,
    align: usize,
    /// (Rust field, C member designator, Rust offset)
    fields: Vec<(&'static str, &'static str, usize)>,
}

macro_rules! c_member {
    ($f:ident) => {
        stringify!($f)
    };
    ($f:ident, $c:literal) => {
        $c
    };
}

/// `Type { field, field as "c.member", ... }`: a struct whose C typedef has the same name.
/// `Type {}` for unions: size and alignment only.
macro_rules! layouts {
    ($($ty:ident { $($f:ident $(as $c:literal)?),* $(,)? })*) => {
        vec![$(Layout {
            name: stringify!($ty),
            size: size_of::<$ty>(),
            align: align_of::<$ty>(),
            fields: vec![$((stringify!($f), c_member!($f $(, $c)?), offset_of!($ty, $f))),*],
        }),*]
    };
}

/// Checked against CUDA 13's cuda.h (the layouts the API follows).
fn cuda13() -> Vec<Layout> {
    layouts! {
        CUuuid { bytes }
        CUipcMemHandle { reserved }
        CUDA_MEMCPY2D {
            srcXInBytes, srcY, srcMemoryType, srcHost, srcDevice, srcArray, srcPitch, dstXInBytes,
            dstY, dstMemoryType, dstHost, dstDevice, dstArray, dstPitch, WidthInBytes, Height,
        }
        CUDA_ARRAY_DESCRIPTOR { Width, Height, Format, NumChannels }
        CUDA_ARRAY3D_DESCRIPTOR { Width, Height, Depth, Format, NumChannels, Flags }
        CUDA_LAUNCH_PARAMS {
            function, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
            hStream, kernelParams,
        }
        CUmemLocation { type_ as "type", id }
        CUmemAllocationProp {
            type_ as "type", requestedHandleTypes, location, win32HandleMetaData,
            compressionType as "allocFlags.compressionType",
            gpuDirectRDMACapable as "allocFlags.gpuDirectRDMACapable",
            usage as "allocFlags.usage", reserved as "allocFlags.reserved",
        }
        CUmemAccessDesc { location, flags }
        CUexecAffinityParam { type_ as "type", smCount as "param.smCount" }
        CUctxCreateParams { execAffinityParams, numExecAffinityParams, cigParams }
        CUdevprop {
            maxThreadsPerBlock, maxThreadsDim, maxGridSize, sharedMemPerBlock, totalConstantMemory,
            SIMDWidth, memPitch, regsPerBlock, clockRate, textureAlign,
        }
        CUlaunchAttributeValue {}
        CUlaunchAttribute { id, pad, value }
        CUlaunchConfig {
            gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
            attrs, numAttrs,
        }
        CUDA_KERNEL_NODE_PARAMS_v1 {
            func, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
            kernelParams, extra,
        }
        CUDA_KERNEL_NODE_PARAMS_v2 {
            func, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
            kernelParams, extra, kern, ctx,
        }
        CUDA_GRAPH_INSTANTIATE_PARAMS { flags, hUploadStream, hErrNode_out, result_out }
        CUDA_MEM_ALLOC_NODE_PARAMS { poolProps, accessDescs, accessDescCount, bytesize, dptr }
    }
}

/// The 32-bit legacy structs of the entry points that predate `_v2` (`cuArrayCreate`): cuda.h declares
/// them only with `__CUDA_API_VERSION_INTERNAL` defined, and the real driver still exports those
/// entry points.
fn cuda13_legacy() -> Vec<Layout> {
    layouts! {
        CUDA_ARRAY_DESCRIPTOR_v1 { Width, Height, Format, NumChannels }
        CUDA_ARRAY3D_DESCRIPTOR_v1 { Width, Height, Depth, Format, NumChannels, Flags }
    }
}

/// Checked against CUDA 12's cuda.h: where the API keeps 12's member names (13 renamed the tail).
fn cuda12() -> Vec<Layout> {
    layouts! {
        CUmemPoolProps {
            allocType, handleTypes, location, win32SecurityAttributes, maxSize, usage, reserved,
        }
    }
}

fn nvml() -> Vec<Layout> {
    layouts! {
        nvmlMemory_t { total, free, used }
        nvmlMemory_v2_t { version, total, reserved, free, used }
        nvmlUtilization_t { gpu, memory }
        nvmlProcessInfo_v1_t { pid, usedGpuMemory }
        nvmlProcessInfo_t { pid, usedGpuMemory, gpuInstanceId, computeInstanceId }
        nvmlPciInfo_t { busIdLegacy, domain, bus, device, pciDeviceId, pciSubSystemId, busId }
        nvmlProcessUtilizationSample_t { pid, timeStamp, smUtil, memUtil, encUtil, decUtil }
        nvmlProcessDetail_v1_t { pid, usedGpuMemory, gpuInstanceId, computeInstanceId, usedGpuCcProtectedMemory }
        nvmlProcessDetailList_v1_t { version, mode, numProcArrayEntries, procArray }
        nvmlProcessUtilizationInfo_v1_t { timeStamp, pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil }
        nvmlProcessesUtilizationInfo_v1_t { version, processSamplesCount, lastSeenTimeStamp, procUtilArray }
        nvmlAccountingStats_t { gpuUtilization, memoryUtilization, maxMemoryUsage, time, startTime, isRunning, reserved }
    }
}

/// What the C compiler says, as `name size align` and `name.field offset` lines.
fn c_layouts(
    header: &str,
    include: &str,
    defines: &str,
    layouts: &[Layout],
) -> BTreeMap<String, usize> {
    let mut c = format!(
        "{defines}#include <stddef.h>\n#include <stdio.h>\n#include <{header}>\nint main(void) {{\n"
    );
    for l in layouts {
        c.push_str(&format!(
            "  printf(\"{n}.sizeof %zu\\n{n}.alignof %zu\\n\", sizeof({n}), _Alignof({n}));\n",
            n = l.name
        ));
        for (f, member, _) in &l.fields {
            c.push_str(&format!(
                "  printf(\"{n}.{f} %zu\\n\", offsetof({n}, {member}));\n",
                n = l.name
            ));
        }
    }
    c.push_str("  return 0;\n}\n");
    // One directory per program: the tests run in parallel, and two of them read the same header.
    static PROGRAMS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = PROGRAMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("layout-{}-{include}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, &c).unwrap();
    let out = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
        .arg("-I")
        .arg(nvidia_include(include))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "layout program does not compile against {include}/{header} (a name differs?):\n{}\n{c}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

fn rust_layouts(layouts: &[Layout]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in layouts {
        m.insert(format!("{}.sizeof", l.name), l.size);
        m.insert(format!("{}.alignof", l.name), l.align);
        for (f, _, off) in &l.fields {
            m.insert(format!("{}.{f}", l.name), *off);
        }
    }
    m
}

fn check(header: &str, include: &str, layouts: Vec<Layout>) {
    check_with(header, include, "", layouts)
}

fn check_with(header: &str, include: &str, defines: &str, layouts: Vec<Layout>) {
    let c = c_layouts(header, include, defines, &layouts);
    let rust = rust_layouts(&layouts);
    let diffs: Vec<String> = rust
        .iter()
        .filter(|(k, v)| c.get(*k) != Some(v))
        .map(|(k, v)| format!("  {k}: Rust {v}, C {:?}", c.get(k)))
        .collect();
    assert!(
        diffs.is_empty(),
        "layouts differ from {include}/{header}:\n{}",
        diffs.join("\n")
    );
}

#[test]
fn cuda_structs_match_cuda13_header() {
    check("cuda.h", "cu13", cuda13());
}

#[test]
fn legacy_cuda_structs_match_cuda13_header() {
    check_with(
        "cuda.h",
        "cu13",
        "#define __CUDA_API_VERSION_INTERNAL 1\n",
        cuda13_legacy(),
    );
}

#[test]
fn cuda_structs_match_cuda12_header() {
    check("cuda.h", "cu12", cuda12());
}

#[test]
fn nvml_structs_match_nvml_header() {
    check("nvml.h", "nvml", nvml());
}

/// Every `#[repr(C)]` struct/union with public fields in the API's sources, with those fields.
fn declared(file: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("src/api").join(file)).unwrap();
    let mut out = BTreeSet::new();
    let mut repr_c = false;
    let mut current: Option<(String, bool)> = None;
    for line in text.lines().map(str::trim) {
        if let Some((name, is_union)) = &current {
            if line == "}" {
                current = None;
            } else if let Some(rest) = line.strip_prefix("pub ") {
                if let Some((field, _)) = rest.split_once(':') {
                    if !is_union {
                        out.insert(format!("{name}.{field}"));
                    }
                    out.insert(name.clone());
                }
            }
            continue;
        }
        if line.starts_with("#[repr(C") {
            repr_c = true;
        } else if line.starts_with("#[") || line.starts_with("///") {
        } else {
            for (kw, is_union) in [("pub struct ", false), ("pub union ", true)] {
                if let Some(rest) = line.strip_prefix(kw) {
                    if repr_c && line.ends_with('{') {
                        let name = rest.trim_end_matches('{').trim().to_string();
                        current = Some((name, is_union));
                    }
                }
            }
            repr_c = false;
        }
    }
    out
}

#[test]
fn every_api_struct_is_checked() {
    let mut covered = BTreeSet::new();
    for l in cuda13()
        .into_iter()
        .chain(cuda13_legacy())
        .chain(cuda12())
        .chain(nvml())
    {
        covered.insert(l.name.to_string());
        for (f, _, _) in l.fields {
            covered.insert(format!("{}.{f}", l.name));
        }
    }
    let declared: BTreeSet<String> = ["types.rs", "launch_types.rs", "nvml.rs"]
        .iter()
        .flat_map(|f| declared(f))
        .collect();
    // The parser itself must see the API's structs (it would otherwise pass vacuously).
    assert!(
        declared.contains("CUDA_MEMCPY2D.srcXInBytes") && declared.len() > 100,
        "{declared:?}"
    );
    let missing: Vec<&String> = declared.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "not checked against the headers (add to tests/simgpu_layout.rs): {missing:?}"
    );
}
