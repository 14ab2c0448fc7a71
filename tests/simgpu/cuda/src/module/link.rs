//! The JIT linker (`cuLinkCreate` ... `cuLinkDestroy`), as numba and cuda.core's driver-backed
//! linker use it: inputs are collected, and `cuLinkComplete` hands back an image that
//! `cuModuleLoadData` accepts. simgpu compiles nothing: PTX inputs are joined into one PTX text (its
//! `.entry` declarations give the kernels and their parameters, its length the code's size), and a
//! single input of any kind is passed through. Linking a cubin, fatbinary, object or library with
//! other inputs is not modelled (`CUDA_ERROR_NOT_SUPPORTED`). JIT options are accepted and ignored
//! (log buffers stay as the caller left them).

use super::*;

/// `CUjitInputType`: `CU_JIT_INPUT_PTX`.
const CU_JIT_INPUT_PTX: c_uint = 1;
/// `CU_JIT_INPUT_NVVM` (the last input type).
const CU_JIT_INPUT_NVVM: c_uint = 5;

/// A pending link: its inputs, and the image once completed (owned until destroyed).
struct LinkState {
    inputs: Vec<(c_uint, Vec<u8>)>,
    output: Vec<u8>,
}

static LINKS: Mutex<BTreeMap<usize, Box<LinkState>>> = Mutex::new(BTreeMap::new());

fn create_link(state_out: Option<&mut *mut c_void>) -> CUresult {
    let out = crate::out(state_out)?;
    crate::context::current()?;
    let state = Box::new(LinkState {
        inputs: Vec::new(),
        output: Vec::new(),
    });
    let h = &*state as *const LinkState as usize;
    lock(&LINKS).insert(h, state);
    *out = h as *mut c_void;
    Ok(())
}

fn add_link_input(state: *mut c_void, kind: c_uint, bytes: Vec<u8>) -> CUresult {
    if kind > CU_JIT_INPUT_NVVM {
        return Err(CUerror::INVALID_VALUE);
    }
    let mut links = lock(&LINKS);
    let link = links
        .get_mut(&(state as usize))
        .ok_or(CUerror::INVALID_HANDLE)?;
    link.inputs.push((kind, bytes));
    Ok(())
}

/// # Safety
/// `data` points to `size` readable bytes (PTX may end at a NUL before them).
unsafe fn link_add_data(
    state: *mut c_void,
    kind: c_uint,
    data: *const c_void,
    size: usize,
) -> CUresult {
    if data.is_null() || size == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    // SAFETY: per the caller.
    let mut bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) }.to_vec();
    if kind == CU_JIT_INPUT_PTX {
        bytes.truncate(bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len()));
    }
    add_link_input(state, kind, bytes)
}

/// # Safety
/// `path` is NULL or a NUL-terminated string.
unsafe fn link_add_file(state: *mut c_void, kind: c_uint, path: *const c_char) -> CUresult {
    // SAFETY: per the caller.
    let mut bytes = read_image(unsafe { c_str(path) }?)?.bytes;
    if kind == CU_JIT_INPUT_PTX {
        bytes.truncate(bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len()));
    }
    add_link_input(state, kind, bytes)
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate_v2(
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
    state_out: Option<&mut *mut c_void>,
) -> CUresult {
    crate::call("cuLinkCreate_v2", || create_link(state_out))
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate(
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
    state_out: Option<&mut *mut c_void>,
) -> CUresult {
    crate::call("cuLinkCreate", || create_link(state_out))
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddData_v2(
    state: *mut c_void,
    kind: c_uint,
    data: *const c_void,
    size: usize,
    _name: *const c_char,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's contract (`data` holds `size` bytes).
    crate::call("cuLinkAddData_v2", || unsafe {
        link_add_data(state, kind, data, size)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddData(
    state: *mut c_void,
    kind: c_uint,
    data: *const c_void,
    size: usize,
    _name: *const c_char,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's contract (`data` holds `size` bytes).
    crate::call("cuLinkAddData", || unsafe {
        link_add_data(state, kind, data, size)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    state: *mut c_void,
    kind: c_uint,
    path: *const c_char,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's contract (`path` is a C string).
    crate::call("cuLinkAddFile_v2", || unsafe {
        link_add_file(state, kind, path)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile(
    state: *mut c_void,
    kind: c_uint,
    path: *const c_char,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's contract (`path` is a C string).
    crate::call("cuLinkAddFile", || unsafe {
        link_add_file(state, kind, path)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkComplete(
    state: *mut c_void,
    image_out: Option<&mut *mut c_void>,
    size_out: Option<&mut usize>,
) -> CUresult {
    crate::call("cuLinkComplete", || {
        let (image_out, size_out) = (crate::out(image_out)?, crate::out(size_out)?);
        let mut links = lock(&LINKS);
        let link = links
            .get_mut(&(state as usize))
            .ok_or(CUerror::INVALID_HANDLE)?;
        let output = match link.inputs.as_slice() {
            [] => return Err(CUerror::INVALID_VALUE),
            [(_, only)] => only.clone(),
            all if all.iter().all(|(kind, _)| *kind == CU_JIT_INPUT_PTX) => all
                .iter()
                .flat_map(|(_, text)| text.iter().copied().chain([b'\n']))
                .collect(),
            _ => return Err(CUerror::NOT_SUPPORTED),
        };
        link.output = output;
        let text = link
            .inputs
            .iter()
            .all(|(kind, _)| *kind == CU_JIT_INPUT_PTX);
        if text {
            // PTX is handed to cuModuleLoadData as a NUL-terminated string.
            link.output.push(0);
        }
        *image_out = link.output.as_mut_ptr().cast();
        *size_out = link.output.len();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkDestroy(state: *mut c_void) -> CUresult {
    crate::call("cuLinkDestroy", || {
        lock(&LINKS)
            .remove(&(state as usize))
            .map(drop)
            .ok_or(CUerror::INVALID_HANDLE)
    })
}
