//! Occupancy (`cuOccupancy*`): how many blocks of a function fit on one multiprocessor, by NVIDIA's
//! occupancy calculation, from the function's attributes (`cuFuncGetAttribute`: registers per
//! thread, static shared memory, its largest dynamic shared memory and block) and its device's
//! limits (`cuDeviceGetAttribute`: threads, blocks, registers and shared memory per multiprocessor,
//! shared memory the system reserves per block). The shared memory carveout is taken at its
//! largest; clusters are not modelled (`cuOccupancyMaxPotentialClusterSize`,
//! `cuOccupancyMaxActiveClusters` stay unsupported).

use crate::device;
use crate::module::{function, Function};
use gpuslice_api::launch_types::{
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_NUM_REGS,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
};
use gpuslice_api::types::CUfunction;
use gpuslice_api::{CUerror, CUresult};
use std::ffi::c_int;

/// Registers are allocated to a warp in units of 256; shared memory to a block in units of 128 bytes.
const REGISTER_UNIT: u32 = 256;
const SHARED_UNIT: u32 = 128;
const WARP: u32 = 32;

/// The `CUdevice_attribute`s the calculation reads.
const MULTIPROCESSOR_COUNT: c_int = 16;
const MAX_THREADS_PER_MULTIPROCESSOR: c_int = 39;
const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: c_int = 81;
const MAX_REGISTERS_PER_MULTIPROCESSOR: c_int = 82;
const MAX_BLOCKS_PER_MULTIPROCESSOR: c_int = 106;
const RESERVED_SHARED_MEMORY_PER_BLOCK: c_int = 111;

/// `CU_OCCUPANCY_DEFAULT`, `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE`: the only flags.
const FLAGS: u32 = 1;

/// `size_t (*CUoccupancyB2DSize)(int blockSize)`: a block size's dynamic shared memory.
type BlockToSharedBytes = Option<unsafe extern "C" fn(c_int) -> usize>;

fn attribute(f: &Function, attr: u32) -> u32 {
    f.attribute(attr).unwrap_or(0).max(0) as u32
}

fn device_attribute(physical: u32, attr: c_int) -> u32 {
    device::attribute(attr, physical).unwrap_or(0).max(0) as u32
}

/// Blocks of `block` threads, each with `dynamic` bytes of dynamic shared memory, that one
/// multiprocessor of `f`'s device holds at once (0 when such a block cannot be launched).
fn active_blocks(f: &Function, block: u32, dynamic: usize) -> u32 {
    let physical = f.device().unwrap_or(0);
    if block == 0
        || block > attribute(f, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        || dynamic > f.max_dynamic_shared() as usize
    {
        return 0;
    }
    let warps = block.div_ceil(WARP);
    let by_threads = device_attribute(physical, MAX_THREADS_PER_MULTIPROCESSOR) / (warps * WARP);
    let by_blocks = device_attribute(physical, MAX_BLOCKS_PER_MULTIPROCESSOR);
    let registers_per_warp = (attribute(f, CU_FUNC_ATTRIBUTE_NUM_REGS) * WARP)
        .div_ceil(REGISTER_UNIT)
        .saturating_mul(REGISTER_UNIT)
        .max(REGISTER_UNIT);
    let by_registers =
        (device_attribute(physical, MAX_REGISTERS_PER_MULTIPROCESSOR) / registers_per_warp) / warps;
    let shared = (attribute(f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES) as usize)
        .saturating_add(dynamic)
        .saturating_add(device_attribute(physical, RESERVED_SHARED_MEMORY_PER_BLOCK) as usize)
        .div_ceil(SHARED_UNIT as usize)
        .saturating_mul(SHARED_UNIT as usize);
    let by_shared = (device_attribute(physical, MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) as usize
        / shared.max(1)) as u32;
    by_threads.min(by_blocks).min(by_registers).min(by_shared)
}

fn max_active_blocks(
    blocks: Option<&mut c_int>,
    f: CUfunction,
    block: c_int,
    dynamic: usize,
    flags: u32,
) -> CUresult {
    let blocks = crate::out(blocks)?;
    if flags & !FLAGS != 0 || block <= 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    *blocks = active_blocks(&*function(f)?, block as u32, dynamic) as c_int;
    Ok(())
}

/// The block size (a multiple of the warp, up to `limit`) that keeps the most warps of `f` resident
/// on a multiprocessor, the largest among equals; and the grid that fills the device at it.
fn max_potential_block_size(
    grid: Option<&mut c_int>,
    block: Option<&mut c_int>,
    f: CUfunction,
    shared_of: BlockToSharedBytes,
    dynamic: usize,
    limit: c_int,
    flags: u32,
) -> CUresult {
    let (grid, block) = (crate::out(grid)?, crate::out(block)?);
    if flags & !FLAGS != 0 || limit < 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let f = function(f)?;
    let most = attribute(&f, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    let most = if limit > 0 {
        most.min(limit as u32)
    } else {
        most
    };
    let mut best = (0u32, 0u32, 0u32); // (resident warps, block size, blocks)
    let mut size = most / WARP * WARP;
    while size >= WARP {
        // SAFETY: the caller's function, called with a block size as NVIDIA documents.
        let shared = shared_of.map_or(dynamic, |s| unsafe { s(size as c_int) });
        let blocks = active_blocks(&f, size, shared);
        let warps = blocks * size.div_ceil(WARP);
        if warps > best.0 {
            best = (warps, size, blocks);
        }
        size -= WARP;
    }
    let multiprocessors = device_attribute(f.device().unwrap_or(0), MULTIPROCESSOR_COUNT);
    *block = best.1 as c_int;
    *grid = best.2.saturating_mul(multiprocessors) as c_int;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: Option<&mut c_int>,
    f: CUfunction,
    block: c_int,
    dynamic: usize,
) -> CUresult {
    crate::call("cuOccupancyMaxActiveBlocksPerMultiprocessor", || {
        max_active_blocks(blocks, f, block, dynamic, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    blocks: Option<&mut c_int>,
    f: CUfunction,
    block: c_int,
    dynamic: usize,
    flags: u32,
) -> CUresult {
    crate::call(
        "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
        || max_active_blocks(blocks, f, block, dynamic, flags),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    grid: Option<&mut c_int>,
    block: Option<&mut c_int>,
    f: CUfunction,
    shared_of: BlockToSharedBytes,
    dynamic: usize,
    limit: c_int,
) -> CUresult {
    crate::call("cuOccupancyMaxPotentialBlockSize", || {
        max_potential_block_size(grid, block, f, shared_of, dynamic, limit, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    grid: Option<&mut c_int>,
    block: Option<&mut c_int>,
    f: CUfunction,
    shared_of: BlockToSharedBytes,
    dynamic: usize,
    limit: c_int,
    flags: u32,
) -> CUresult {
    crate::call("cuOccupancyMaxPotentialBlockSizeWithFlags", || {
        max_potential_block_size(grid, block, f, shared_of, dynamic, limit, flags)
    })
}

/// The dynamic shared memory each of `blocks` blocks of `block` threads can have with all of them
/// resident on one multiprocessor.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    bytes: Option<&mut usize>,
    f: CUfunction,
    blocks: c_int,
    block: c_int,
) -> CUresult {
    crate::call("cuOccupancyAvailableDynamicSMemPerBlock", || {
        let bytes = crate::out(bytes)?;
        if blocks <= 0 || block <= 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        let f = function(f)?;
        *bytes = if active_blocks(&f, block as u32, 0) < blocks as u32 {
            0
        } else {
            let physical = f.device().unwrap_or(0);
            let per_block = (device_attribute(physical, MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
                / blocks as u32)
                / SHARED_UNIT
                * SHARED_UNIT;
            let taken = attribute(&f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                + device_attribute(physical, RESERVED_SHARED_MEMORY_PER_BLOCK);
            (per_block.saturating_sub(taken) as usize).min(f.max_dynamic_shared() as usize)
        };
        Ok(())
    })
}
