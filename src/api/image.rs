//! What loading a module image takes from the device, read from the image alone: both gpuslice
//! (to reserve a load's cost before the driver spends it) and simgpu (to spend it as a driver does)
//! read images through here.
//!
//! A driver loads one piece of an image: an ELF cubin as it is; from a fatbinary, the cubin built
//! for the device's compute capability (same major, the highest minor not above the device's), else
//! the newest PTX the device can compile. What a cubin puts on the device is its allocated sections
//! (`SHF_ALLOC`: code, constant banks, initialised and zeroed globals) except shared memory, which
//! lives on the SM. PTX is compiled first; its compiled size is taken to be the text's size (what
//! simgpu spends; a real compiler's output is usually smaller, so the estimate errs towards
//! refusing). A compressed fatbinary entry counts at its uncompressed size.
//!
//! Formats: the fatbinary header (magic `0xBA55ED50`, header size, payload size) and its entries
//! (kind 1 PTX / 2 ELF, entry header size, payload size, compute capability, flags, uncompressed
//! size) as NVIDIA's `nvFatbin` and `nvcc` write them; ELF64 section headers. Every field is
//! untrusted: reads are bounds-checked and sums saturate.

/// First word of a fatbinary.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// First word of the wrapper a compiler emits around a fatbinary:
/// `{ int magic; int version; const void *data; void *filename_or_fatbins }`.
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// Fatbinary entry kinds.
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
/// Entry flag: the payload is compressed.
const FLAG_COMPRESSED: u64 = 0x2000;
const SHF_ALLOC: u64 = 0x2;

/// Little-endian fields at `at`, 0 past the end.
pub fn u16_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at.saturating_add(2))
        .map_or(0, |s| u64::from(u16::from_le_bytes([s[0], s[1]])))
}
pub fn u32_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at.saturating_add(4))
        .and_then(|s| s.try_into().ok())
        .map_or(0, |s| u64::from(u32::from_le_bytes(s)))
}
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at.saturating_add(8))
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}
fn index(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// How far an image extends, as its headers say (an ELF file's section or program headers' end, a
/// fatbinary's header + payload), or `None` for text (PTX), which ends at its NUL. `head` is the
/// image's first 64 bytes (fewer when it is shorter).
pub fn extent(head: &[u8]) -> Option<u64> {
    if head.starts_with(b"\x7fELF") {
        let sections = u64_at(head, 0x28).saturating_add(u16_at(head, 0x3a) * u16_at(head, 0x3c));
        let programs = u64_at(head, 0x20).saturating_add(u16_at(head, 0x36) * u16_at(head, 0x38));
        return Some(sections.max(programs));
    }
    if u32_at(head, 0) == u64::from(FATBIN_MAGIC) {
        return Some(u16_at(head, 6).saturating_add(u64_at(head, 8)));
    }
    None
}

/// What the piece of an image a driver loads puts on the device, split as a driver that loads
/// lazily (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA 12.2) spends it: the module's data
/// (constant banks, globals) at the first use of the module, each kernel's code (its `.text` and
/// parameter bank) at the kernel's first lookup. Compiled PTX and compressed entries, whose
/// kernels cannot be told apart here, are all data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Code {
    pub data: u64,
    /// Kernel (mangled) name and its bytes.
    pub kernels: Vec<(Vec<u8>, u64)>,
}

impl Code {
    pub fn total(&self) -> u64 {
        self.kernels
            .iter()
            .fold(self.data, |sum, (_, b)| sum.saturating_add(*b))
    }

    /// Bytes of kernel `name` (0 for a name it does not list).
    pub fn kernel(&self, name: &[u8]) -> u64 {
        self.kernels
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, b)| *b)
    }
}

/// Device memory the code in `image` takes once loaded on a device of compute capability
/// `major.minor` (see the module's description). `image` is the whole image (a wrapper already
/// followed); 0 when nothing in it can run on the device.
pub fn device_bytes(image: &[u8], major: u32, minor: u32) -> u64 {
    device_code(image, major, minor).total()
}

/// [`device_bytes`], split into the module's data and each kernel's code ([`Code`]).
pub fn device_code(image: &[u8], major: u32, minor: u32) -> Code {
    if image.starts_with(b"\x7fELF") {
        return elf_code(image);
    }
    if u32_at(image, 0) == u64::from(FATBIN_MAGIC) {
        return fatbin_code(image, major, minor);
    }
    Code {
        data: text_len(image),
        kernels: Vec::new(),
    }
}

/// PTX text's length: up to its NUL, or the whole slice.
fn text_len(b: &[u8]) -> u64 {
    b.iter().position(|&c| c == 0).unwrap_or(b.len()) as u64
}

/// One section of an ELF64 file.
pub struct Section<'a> {
    pub name: &'a [u8],
    pub flags: u64,
    /// Its size (a `NOBITS` section's too, which has no bytes in the file).
    pub size: u64,
    /// Its bytes in the file, when they are all there.
    pub data: Option<&'a [u8]>,
}

/// The sections of a little-endian ELF64 file (none when it is not one, or its table is not all
/// there).
pub fn sections(elf: &[u8]) -> impl Iterator<Item = Section<'_>> {
    let is_elf64 = elf.starts_with(b"\x7fELF") && elf.get(4) == Some(&2) && elf.get(5) == Some(&1);
    let table = index(u64_at(elf, 0x28));
    let entry = index(u16_at(elf, 0x3a));
    let count = if is_elf64 && entry >= 64 {
        index(u16_at(elf, 0x3c))
    } else {
        0
    };
    let header = move |i: usize| {
        let at = table.saturating_add(i.saturating_mul(entry));
        elf.get(at..at.saturating_add(64))
    };
    let bytes = |h: &[u8]| {
        let at = index(u64_at(h, 24));
        elf.get(at..at.saturating_add(index(u64_at(h, 32))))
    };
    let names = header(index(u16_at(elf, 0x3e)))
        .and_then(bytes)
        .filter(|_| count > 0)
        .unwrap_or_default();
    (0..count).filter_map(header).map(move |h| {
        let name = names.get(index(u32_at(h, 0))..).unwrap_or_default();
        Section {
            name: &name[..text_len(name) as usize],
            flags: u64_at(h, 8),
            size: u64_at(h, 32),
            data: bytes(h),
        }
    })
}

/// An ELF64 cubin's allocated sections but shared memory's (`.nv.shared.*`, `.nv.reservedSmem*`):
/// a kernel's `.text.<name>` and `.nv.constant0.<name>` (its parameter bank) are its code, the rest
/// the module's data.
fn elf_code(elf: &[u8]) -> Code {
    let mut code = Code::default();
    let loaded = sections(elf)
        .filter(|s| s.flags & SHF_ALLOC != 0)
        .filter(|s| !s.name.starts_with(b".nv.shared") && !s.name.starts_with(b".nv.reservedSmem"));
    for s in loaded {
        let kernel = s
            .name
            .strip_prefix(b".text.")
            .or_else(|| s.name.strip_prefix(b".nv.constant0."));
        match kernel {
            Some(name) => match code.kernels.iter_mut().find(|(n, _)| n == name) {
                Some((_, bytes)) => *bytes = bytes.saturating_add(s.size),
                None => code.kernels.push((name.to_vec(), s.size)),
            },
            None => code.data = code.data.saturating_add(s.size),
        }
    }
    code
}

/// One fatbinary entry: kind, compute capability (major * 10 + minor), and what it takes once
/// loaded.
struct Entry {
    kind: u16,
    arch: u64,
    code: Code,
}

fn fatbin_entries(fatbin: &[u8]) -> impl Iterator<Item = Entry> + '_ {
    let end = index(u16_at(fatbin, 6).saturating_add(u64_at(fatbin, 8))).min(fatbin.len());
    let mut at = index(u16_at(fatbin, 6));
    std::iter::from_fn(move || {
        let h = fatbin.get(at..end)?;
        let header = index(u32_at(h, 4));
        let size = index(u64_at(h, 8));
        if header < 64 || h.len() < header {
            return None;
        }
        at = at.saturating_add(header).saturating_add(size);
        let payload = &h[header..h.len().min(header.saturating_add(size))];
        let compressed = u64_at(h, 40) & FLAG_COMPRESSED != 0;
        let kind = u16_at(h, 0) as u16;
        let code = match (kind, compressed) {
            (KIND_ELF, false) => elf_code(payload),
            (KIND_PTX, false) => Code {
                data: text_len(payload),
                kernels: Vec::new(),
            },
            _ => Code {
                data: u64_at(h, 56),
                kernels: Vec::new(),
            },
        };
        Some(Entry {
            kind,
            arch: u32_at(h, 28),
            code,
        })
    })
}

/// The entry a driver loads on a `major.minor` device: the cubin of the same major with the highest
/// minor not above the device's; else the newest PTX not above the device's capability.
fn fatbin_code(fatbin: &[u8], major: u32, minor: u32) -> Code {
    let device = u64::from(major) * 10 + u64::from(minor);
    let cubin = fatbin_entries(fatbin)
        .filter(|e| e.kind == KIND_ELF && e.arch / 10 == u64::from(major) && e.arch <= device)
        .max_by_key(|e| e.arch);
    let ptx = || {
        fatbin_entries(fatbin)
            .filter(|e| e.kind == KIND_PTX && e.arch <= device)
            .max_by_key(|e| e.arch)
    };
    cubin.or_else(ptx).map(|e| e.code).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Built by NVIDIA's compiler from `tests/fixtures/modules/kernel.cu` (see its README): real
    // images, not hand-made ones.
    const CUBIN_80: &[u8] = include_bytes!("../../tests/fixtures/modules/kernel.sm_80.cubin");
    const FATBIN: &[u8] = include_bytes!("../../tests/fixtures/modules/kernel.fatbin");
    const FATBIN_COMPRESSED: &[u8] =
        include_bytes!("../../tests/fixtures/modules/kernel.compressed.fatbin");
    const PTX_90: &[u8] = include_bytes!("../../tests/fixtures/modules/kernel.compute_90.ptx");

    /// What `readelf -S` lists as allocated for the sm_80 cubin: `.nv.constant4` 0x8,
    /// `.nv.constant3` 0x1000, `.nv.constant0.saxpy` 0x17c, `.text.saxpy` 0x280, `.nv.global`
    /// 0x40000 (its 256 KiB `table`); `.nv.shared.saxpy` (0x400) is on the SM.
    const CUBIN_80_ALLOCATED: u64 = 0x8 + 0x1000 + 0x17c + 0x280 + 0x40000;

    #[test]
    fn a_cubin_takes_its_allocated_sections_but_shared_memory() {
        assert_eq!(device_bytes(CUBIN_80, 8, 0), CUBIN_80_ALLOCATED);
        // Lazily: saxpy's code and parameter bank at its lookup, the rest with the module.
        let code = device_code(CUBIN_80, 8, 0);
        assert_eq!(code.kernel(b"saxpy"), 0x280 + 0x17c);
        assert_eq!(code.data, 0x8 + 0x1000 + 0x40000);
        assert_eq!(code.kernel(b"other"), 0);
        assert_eq!(extent(&CUBIN_80[..64]), Some(CUBIN_80.len() as u64));
    }

    #[test]
    fn a_fatbinary_loads_the_cubin_for_the_device_else_its_ptx() {
        assert_eq!(extent(&FATBIN[..64]), Some(FATBIN.len() as u64));
        // sm_80 and sm_86 run the sm_80 cubin; sm_90 its own; sm_100 compiles the compute_90 PTX;
        // sm_75 can run nothing in it.
        assert_eq!(device_bytes(FATBIN, 8, 0), CUBIN_80_ALLOCATED);
        assert_eq!(device_bytes(FATBIN, 8, 6), CUBIN_80_ALLOCATED);
        let sm90 = device_bytes(FATBIN, 9, 0);
        assert!(sm90 > 0x40000 && sm90 != CUBIN_80_ALLOCATED, "{sm90:#x}");
        // nvFatbin compresses PTX even unasked: its entry gives 0x57d bytes uncompressed.
        assert_eq!(device_bytes(FATBIN, 10, 0), 0x57d);
        assert_eq!(device_bytes(FATBIN, 7, 5), 0);
    }

    #[test]
    fn a_compressed_entry_counts_at_its_uncompressed_size() {
        assert_eq!(
            extent(&FATBIN_COMPRESSED[..64]),
            Some(FATBIN_COMPRESSED.len() as u64)
        );
        let sm80 = device_bytes(FATBIN_COMPRESSED, 8, 0);
        assert_eq!(sm80, CUBIN_80.len() as u64);
        assert_eq!(device_bytes(FATBIN_COMPRESSED, 10, 0), 0x57d);
    }

    #[test]
    fn ptx_takes_its_text() {
        assert_eq!(device_bytes(PTX_90, 8, 0), text_len(PTX_90));
        assert_eq!(device_bytes(b"abc\0def", 8, 0), 3);
        assert_eq!(extent(PTX_90), None);
    }

    #[test]
    fn damaged_headers_never_read_out_of_bounds() {
        for cut in [0, 4, 16, 63, 64, 100, 1000] {
            for image in [CUBIN_80, FATBIN, FATBIN_COMPRESSED] {
                let _ = device_bytes(&image[..cut.min(image.len())], 8, 0);
            }
        }
        let mut garbage = FATBIN.to_vec();
        garbage[16 + 8..16 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        garbage[16 + 4..16 + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        let _ = device_bytes(&garbage, 8, 0);
        let mut elf = CUBIN_80.to_vec();
        elf[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(device_bytes(&elf, 8, 0), 0);
    }
}
