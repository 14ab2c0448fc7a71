//! Module images as the driver API takes them (in memory, or a file's path), read without
//! trusting their headers: what their code will take on a device (`gpuslice_api::image`) is what a
//! module load reserves before the driver is asked.

use super::calls as driver;
use gpuslice_api::types::CUdevice;
use std::ffi::{c_char, c_int, c_void, CStr};

/// A module image as the driver API takes it: in memory, or a file's path.
#[derive(Clone, Copy)]
pub enum Image {
    Memory(*const c_void),
    File(*const c_char),
}

/// Most bytes of an in-memory image read to estimate its cost (headers claiming more are not
/// believed: the image is then only measured).
const MAX_IMAGE: u64 = 1 << 32;

impl Image {
    /// The image's size and what its code takes on device `ordinal` ([`gpuslice_api::image`]),
    /// 0 and nothing when it cannot be read.
    /// PTX in memory is measured where it lies (its length is what it takes: no copy, no device
    /// attributes); a cubin or fatbinary is copied as far as its headers say, then read.
    pub fn measure(self, ordinal: CUdevice) -> (u64, gpuslice_api::image::Code) {
        let bytes = match self {
            Image::File(path) => read_file(path),
            Image::Memory(p) => match read_image(p.cast(), true) {
                Some(Read::Text(len)) => {
                    let code = gpuslice_api::image::Code {
                        data: len,
                        kernels: Vec::new(),
                    };
                    return (len, code);
                }
                Some(Read::Copied(bytes)) => Some(bytes),
                None => None,
            },
        };
        let Some(bytes) = bytes else {
            return (0, gpuslice_api::image::Code::default());
        };
        let attribute = |a: c_int| {
            let mut v: c_int = 0;
            // SAFETY: `v` is a valid out-parameter.
            let ok = unsafe { driver::real::cuDeviceGetAttribute(&mut v, a, ordinal) }.is_ok();
            u32::try_from(v).ok().filter(|_| ok)
        };
        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR.
        let code = match (attribute(75), attribute(76)) {
            (Some(major), Some(minor)) => gpuslice_api::image::device_code(&bytes, major, minor),
            _ => gpuslice_api::image::Code::default(),
        };
        (bytes.len() as u64, code)
    }
}

fn read_file(fname: *const c_char) -> Option<Vec<u8>> {
    if fname.is_null() {
        return None;
    }
    // SAFETY: the driver API requires a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) };
    std::fs::read(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()))
        .ok()
}

/// An in-memory image as [`read_image`] reads it.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    /// A cubin or fatbinary, copied.
    Copied(Vec<u8>),
    /// NUL-terminated PTX of this many bytes (not copied: its length is all it takes).
    Text(u64),
}

/// The in-memory image at `p`: a copy as far as its headers say (an ELF cubin, a fatbinary, the
/// compiler's wrapper around one followed when `follow`: a wrapper wraps a fatbinary, never another
/// wrapper), else NUL-terminated PTX's length. Headers are copied with `process_vm_readv`, which
/// fails instead of faulting: a damaged header makes the driver refuse the image, never this
/// library crash the program.
fn read_image(p: *const u8, follow: bool) -> Option<Read> {
    if p.is_null() {
        return None;
    }
    let head = match leading_text(p) {
        Some(text) => text,
        None => copy_own_memory(p, 64).or_else(|| copy_own_memory(p, 16))?,
    };
    let word = u32::from_le_bytes(head.get(..4)?.try_into().ok()?);
    if word == gpuslice_api::image::FATBIN_WRAPPER_MAGIC {
        if !follow {
            return None;
        }
        let data = usize::from_le_bytes(head.get(8..16)?.try_into().ok()?);
        return read_image(data as *const u8, false);
    }
    match gpuslice_api::image::extent(&head) {
        // An ELF or fatbinary header must be there whole.
        Some(_) if head.len() < 64 => None,
        Some(n) if n <= MAX_IMAGE => copy_own_memory(p, usize::try_from(n).ok()?).map(Read::Copied),
        Some(_) => None,
        // SAFETY: anything else is PTX, which the driver API requires to be NUL-terminated.
        None => Some(Read::Text(unsafe { libc::strlen(p.cast()) } as u64)),
    }
}

/// The first 64 bytes at `p` when none of them is NUL (PTX text), read where they lie: no system
/// call for the common PTX load. `strnlen` stops at the first NUL, which a PTX image has at its end
/// (the driver API requires it NUL-terminated) and every binary image within its first 10 bytes
/// (an ELF's `e_ident` padding, a fatbinary's or the compiler's wrapper's 16- or 32-bit version),
/// and, reading aligned words, never crosses into a page before a NUL it has not passed: it reads
/// only what is mapped. `None` (a NUL among them: a binary image, or PTX under 64 bytes): the
/// header is copied with `process_vm_readv`.
fn leading_text(p: *const u8) -> Option<Vec<u8>> {
    // SAFETY: `p` is not null; see above for why `strnlen` reads only mapped bytes of an image.
    let n = unsafe { libc::strnlen(p.cast(), 64) };
    // SAFETY: `strnlen` read all 64 bytes (none was NUL).
    (n == 64).then(|| unsafe { std::slice::from_raw_parts(p, 64) }.to_vec())
}

/// `n` bytes at `p` in this process's memory, or `None` where they are not all mapped (or memory
/// for the copy is short). Where a seccomp profile forbids `process_vm_readv`, the bytes are read
/// directly, as the driver itself will: the driver API requires `p` to be a valid image.
fn copy_own_memory(p: *const u8, n: usize) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    out.try_reserve_exact(n).ok()?;
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: n,
    };
    let remote = libc::iovec {
        iov_base: p as *mut c_void,
        iov_len: n,
    };
    // SAFETY: `local` is `n` bytes of `out`'s reserved capacity; the kernel checks `remote`.
    let copied = unsafe {
        libc::process_vm_readv(
            crate::slotfile::sys::own_pid() as libc::pid_t,
            &local,
            1,
            &remote,
            1,
            0,
        )
    };
    if copied < 0 {
        let errno = std::io::Error::last_os_error().raw_os_error();
        if errno == Some(libc::EPERM) || errno == Some(libc::ENOSYS) {
            // SAFETY: per the driver API, the image's headers say how far it extends.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
            return Some(out);
        }
    }
    if usize::try_from(copied).ok()? != n {
        return None;
    }
    // SAFETY: the kernel wrote all `n` bytes.
    unsafe { out.set_len(n) };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One readable page followed by an unmapped one: what a header claiming more than is mapped
    /// would make a direct read fault on.
    fn page_before_a_hole() -> *mut u8 {
        // SAFETY: anonymous private mappings; the second page is unmapped again at once.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p.cast::<u8>().add(4096).cast(), 4096);
            p.cast()
        }
    }

    #[test]
    fn a_damaged_image_is_not_read_past_what_is_mapped() {
        let page = page_before_a_hole();
        // SAFETY: the page is 4096 writable bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(page, 4096) };
        // An ELF header whose section table would end 1 MiB in: past the mapping.
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[0x28..0x30].copy_from_slice(&(1u64 << 20).to_le_bytes());
        assert!(read_image(page, true).is_none());
        // A fatbinary header claiming more than 4 GiB: not believed, nothing read.
        bytes[..4].copy_from_slice(&gpuslice_api::image::FATBIN_MAGIC.to_le_bytes());
        bytes[6..8].copy_from_slice(&16u16.to_le_bytes());
        bytes[8..16].copy_from_slice(&(8u64 << 30).to_le_bytes());
        assert!(read_image(page, true).is_none());
        // A compiler's wrapper pointing at itself: followed once, not for ever.
        bytes[..4].copy_from_slice(&gpuslice_api::image::FATBIN_WRAPPER_MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&(page as usize).to_le_bytes());
        assert!(read_image(page, true).is_none());
        // A header at the very end of the mapping: its 64 bytes are not all there.
        let end = bytes.len() - 16;
        bytes[end..end + 4].copy_from_slice(b"\x7fELF");
        // SAFETY: `end` is within the page.
        assert!(read_image(unsafe { page.add(end) }, true).is_none());
    }

    #[test]
    fn an_image_is_read_as_far_as_its_headers_say() {
        let cubin = include_bytes!("../../tests/fixtures/modules/kernel.sm_80.cubin");
        let fatbin = include_bytes!("../../tests/fixtures/modules/kernel.fatbin");
        assert_eq!(
            read_image(cubin.as_ptr(), true),
            Some(Read::Copied(cubin.to_vec()))
        );
        assert_eq!(
            read_image(fatbin.as_ptr(), true),
            Some(Read::Copied(fatbin.to_vec()))
        );
        let wrapper: [u64; 3] = [
            u64::from(gpuslice_api::image::FATBIN_WRAPPER_MAGIC) | (1 << 32),
            fatbin.as_ptr() as u64,
            0,
        ];
        let wrapped = read_image(wrapper.as_ptr().cast(), true);
        assert_eq!(wrapped, Some(Read::Copied(fatbin.to_vec())));
        assert_eq!(
            read_image(b"ptx text\0more".as_ptr(), true),
            Some(Read::Text(8))
        );
        let long = [b"// a PTX text longer than its header's 64 bytes: ".as_slice(); 4].concat();
        let ptx = [long.as_slice(), b"\0"].concat();
        assert_eq!(
            read_image(ptx.as_ptr(), true),
            Some(Read::Text(long.len() as u64))
        );
        // Text up to the end of the mapping, NUL-terminated there: read no further.
        let page = page_before_a_hole();
        // SAFETY: the page is 4096 writable bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(page, 4096) };
        bytes[..4095].fill(b'x');
        assert_eq!(read_image(page, true), Some(Read::Text(4095)));
        // SAFETY: 100 bytes before the end, within the page.
        let near_end = unsafe { page.add(4096 - 100) };
        assert_eq!(read_image(near_end, true), Some(Read::Text(99)));
        // SAFETY: 20 bytes before the end, within the page.
        let at_end = unsafe { page.add(4096 - 20) };
        assert_eq!(read_image(at_end, true), Some(Read::Text(19)));
    }
}
