//! What simgpu reads from a module image without running it: its bytes (what the loaded code costs
//! on the device is `gpuslice_api::image::device_bytes` of them) and each kernel's parameter layout
//! (`cuFuncGetParamInfo`/`cuKernelGetParamInfo`).
//!
//! Images come as a real driver takes them: an ELF cubin or a fatbinary (as far as their headers
//! say, `gpuslice_api::image::extent`), the fatbinary wrapper a compiler emits (pointing at the
//! fatbinary), or NUL-terminated PTX text. Parameter layouts come from
//! PTX `.entry` declarations, and from a cubin's `.nv.info.<kernel>` `EIATTR_KPARAM_INFO` records.

use gpuslice_api::image::{u16_at, u32_at};
use std::collections::HashMap;
use std::ffi::c_void;

/// Most bytes simgpu believes an image header claims (a garbage header must not make it read GiBs).
const MAX_IMAGE: u64 = 1 << 32;

/// (offset, size) of each parameter of each kernel, by kernel name.
pub type ParamLayouts = HashMap<String, Vec<(usize, usize)>>;

/// A loaded image: its bytes (a copy) and its size.
pub struct Image {
    pub bytes: Vec<u8>,
}

/// # Safety
/// `p` points to at least `n` readable bytes.
unsafe fn read(p: *const u8, n: usize) -> Vec<u8> {
    // SAFETY: per the caller.
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
unsafe fn leading_nonzero(p: *const u8, max: usize) -> usize {
    let mut n = 0;
    // SAFETY: the bytes are read up to (not past) the first NUL.
    while n < max && unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    n
}

/// Reads the image at `p` as a real driver would find its extent.
///
/// # Safety
/// `p` points to an image in one of the formats above, as `cuModuleLoadData` requires.
pub unsafe fn from_pointer(p: *const c_void) -> Image {
    let p = p.cast::<u8>();
    // The first bytes of every format are non-zero: reading up to a NUL never passes the image.
    // SAFETY: per the caller.
    let lead = unsafe { leading_nonzero(p, 4) };
    if lead == 4 {
        // SAFETY: four non-zero bytes were just read.
        let head = unsafe { read(p, 4) };
        let magic = u32_at(&head, 0) as u32;
        if magic == gpuslice_api::image::FATBIN_WRAPPER_MAGIC {
            // SAFETY: the wrapper is { int magic; int version; const void *data; void *filename }.
            let data = unsafe { p.add(8).cast::<*const c_void>().read_unaligned() };
            // A wrapper wraps a fatbinary, never another wrapper (nor itself).
            // SAFETY: the wrapper points at an image.
            let nested = !data.is_null() && unsafe { data.cast::<u32>().read_unaligned() } == magic;
            if !data.is_null() && !nested {
                // SAFETY: the wrapper points at the fatbinary it wraps.
                return unsafe { from_pointer(data) };
            }
        } else if head == b"\x7fELF" || magic == gpuslice_api::image::FATBIN_MAGIC {
            // SAFETY: an ELF file starts with its 64-byte header; a fatbinary with its 16-byte
            // header and a 64-byte entry header.
            let h = unsafe { read(p, 64) };
            let size = gpuslice_api::image::extent(&h)
                .unwrap_or(64)
                .clamp(64, MAX_IMAGE) as usize;
            // SAFETY: the headers say the image extends this far.
            let bytes = unsafe { read(p, size) };
            return Image { bytes };
        }
    }
    // PTX (or anything else): text up to its NUL.
    // SAFETY: per the caller, a NUL-terminated string.
    let n = unsafe { leading_nonzero(p, MAX_IMAGE as usize) };
    // SAFETY: `n` bytes were just read.
    let bytes = unsafe { read(p, n) };
    Image { bytes }
}

/// The kernels' parameter layouts in `image`.
pub fn param_layouts(image: &[u8]) -> ParamLayouts {
    if image.starts_with(b"\x7fELF") {
        return cubin_layouts(image);
    }
    match std::str::from_utf8(image) {
        Ok(text) => ptx_layouts(text),
        Err(_) => ParamLayouts::new(),
    }
}

/// `.entry name ( .param .u64 a, .param .align 8 .b8 b[16], ... )`: each parameter at the next
/// offset aligned to its alignment (its size for scalars), as the PTX ISA lays kernel parameters out.
fn ptx_layouts(text: &str) -> ParamLayouts {
    let mut out = ParamLayouts::new();
    let mut rest = text;
    while let Some(at) = rest.find(".entry") {
        rest = &rest[at + ".entry".len()..];
        let Some(open) = rest.find('(') else { break };
        let name = rest[..open].trim().to_owned();
        let body_end = rest[open..].find(')').map_or(rest.len(), |c| open + c);
        let body = &rest[open + 1..body_end];
        let mut params = Vec::new();
        let mut offset = 0usize;
        for decl in body.split(',').filter(|d| d.contains(".param")) {
            let (size, align) = ptx_param_size(decl);
            offset = offset.div_ceil(align.max(1)) * align.max(1);
            params.push((offset, size));
            offset += size;
        }
        if !name.is_empty() {
            out.insert(name, params);
        }
        rest = &rest[body_end..];
    }
    out
}

/// Each PTX kernel's local frame in bytes per thread (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`): the
/// `__local_depot` arrays nvcc declares in the kernel's body (`.local .align 8 .b8
/// __local_depot0[4096];`). Kernels without one (and cubins, whose frames are not read) have none.
pub fn local_sizes(image: &[u8]) -> std::collections::HashMap<String, u64> {
    let mut out = std::collections::HashMap::new();
    let Ok(text) = std::str::from_utf8(image) else {
        return out;
    };
    let entries: Vec<usize> = text.match_indices(".entry").map(|(at, _)| at).collect();
    for (i, &at) in entries.iter().enumerate() {
        let rest = &text[at + ".entry".len()..entries.get(i + 1).copied().unwrap_or(text.len())];
        let Some(open) = rest.find('(') else { continue };
        let name = rest[..open].trim();
        let mut local = 0u64;
        for (d, _) in rest.match_indices("__local_depot") {
            let tail = &rest[d..];
            let size = tail
                .find('[')
                .zip(tail.find(']'))
                .filter(|(o, c)| o < c)
                .and_then(|(o, c)| tail[o + 1..c].trim().parse::<u64>().ok());
            local = local.saturating_add(size.unwrap_or(0));
        }
        if !name.is_empty() && local > 0 {
            out.insert(name.to_owned(), local);
        }
    }
    out
}

/// (size, alignment) of one `.param` declaration.
fn ptx_param_size(decl: &str) -> (usize, usize) {
    let words: Vec<&str> = decl.split_whitespace().collect();
    let mut scalar = 0usize;
    let mut align = 0usize;
    for (i, w) in words.iter().enumerate() {
        let bits = |t: &str| t[2..].parse::<usize>().ok().map(|b| b / 8);
        match *w {
            // An `.align` after the type belongs to `.ptr` (the pointee's alignment), not the parameter.
            ".align" if scalar == 0 => {
                align = words.get(i + 1).and_then(|a| a.parse().ok()).unwrap_or(0)
            }
            t if scalar == 0 && t.len() > 2 && matches!(&t[..2], ".u" | ".s" | ".b" | ".f") => {
                scalar = bits(t).unwrap_or(0);
            }
            _ => {}
        }
    }
    // `name[N]`: an array of N scalars (byte arrays for structs).
    let count = words
        .last()
        .and_then(|w| w.split_once('['))
        .and_then(|(_, n)| n.trim_end_matches(']').parse::<usize>().ok())
        .unwrap_or(1);
    let size = scalar.max(1) * count;
    let align = if align == 0 { scalar.max(1) } else { align };
    (size, align)
}

/// `EIATTR_KPARAM_INFO` (0x17) records of each `.nv.info.<kernel>` section: index, ordinal (u16),
/// offset (u16), and a word whose bits 18..32 hold the size.
fn cubin_layouts(elf: &[u8]) -> ParamLayouts {
    let mut out = ParamLayouts::new();
    for section in gpuslice_api::image::sections(elf) {
        let Some(kernel) = section
            .name
            .strip_prefix(b".nv.info.")
            .and_then(|n| std::str::from_utf8(n).ok())
        else {
            continue;
        };
        let Some(data) = section.data else {
            continue;
        };
        let mut params = Vec::new();
        let mut at = 0;
        while at + 4 <= data.len() {
            let (format, attr) = (data[at], data[at + 1]);
            let len = if format == 0x04 {
                4 + u16_at(data, at + 2) as usize
            } else {
                4
            };
            if format == 0x04 && attr == 0x17 {
                let rec = &data[(at + 4).min(data.len())..(at + len).min(data.len())];
                let ordinal = u16_at(rec, 4) as usize;
                let offset = u16_at(rec, 6) as usize;
                let psize = ((u32_at(rec, 8) >> 18) & 0x3fff) as usize;
                params.push((ordinal, offset, psize));
            }
            at += len;
        }
        params.sort_unstable();
        out.insert(
            kernel.to_owned(),
            params.into_iter().map(|(_, o, s)| (o, s)).collect(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ptx_kernels_local_frame_is_its_local_depot() {
        let ptx = b".version 7.0\n.target sm_80\n.address_size 64\n\
            .visible .entry big(.param .u64 p)\n{\n.local .align 8 .b8 __local_depot0[4096];\nret;\n}\n\
            .visible .entry small(.param .u64 p)\n{ ret; }\n";
        let sizes = local_sizes(ptx);
        assert_eq!(sizes.get("big"), Some(&4096));
        assert_eq!(sizes.get("small"), None);
    }

    #[test]
    fn ptx_parameters_are_laid_out_aligned() {
        let ptx = ".visible .entry spin(\n .param .u32 spin_param_0,\n .param .u64 .ptr .global .align 1 spin_param_1,\n .param .align 8 .b8 spin_param_2[24],\n .param .u8 p3\n)\n{ ret; }\n.entry empty()\n{ ret; }";
        let l = param_layouts(ptx.as_bytes());
        assert_eq!(l["spin"], vec![(0, 4), (8, 8), (16, 24), (40, 1)]);
        assert_eq!(l["empty"], vec![]);
    }
}
