//! Libraries and their kernels (`cuLibrary*`, `cuKernel*`): a library is a module loaded without a
//! context, and a `CUkernel` is its module's `CUfunction`.

use super::*;

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    k: CUkernel,
    index: usize,
    offset: Option<&mut usize>,
    size: *mut usize,
) -> CUresult {
    crate::call("cuKernelGetParamInfo", || {
        param_info(k as CUfunction, index, offset, size)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    pl: Option<&mut CUlibrary>,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    crate::call("cuLibraryLoadData", || {
        let pl = crate::out(pl)?;
        if code.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        // Libraries are context-independent: no current context needed.
        // SAFETY: `code` is an image as the API requires.
        *pl = new_library(&unsafe { crate::image::from_pointer(code) })?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    pl: Option<&mut CUlibrary>,
    fname: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    crate::call("cuLibraryLoadFromFile", || {
        let pl = crate::out(pl)?;
        // SAFETY: `fname` is a C string per the API.
        *pl = new_library(&read_image(unsafe { c_str(fname) }?)?)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryUnload(h: CUlibrary) -> CUresult {
    crate::call("cuLibraryUnload", || {
        let lib = lock(&LIBRARIES)
            .remove(&(h as usize))
            .ok_or(CUerror::INVALID_HANDLE)?;
        unload_module(&lib.module);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    pk: Option<&mut CUkernel>,
    h: CUlibrary,
    name: *const c_char,
) -> CUresult {
    crate::call("cuLibraryGetKernel", || {
        let pk = crate::out(pk)?;
        let lib = library(h)?;
        // SAFETY: `name` is a C string per the API.
        let name = unsafe { c_str(name) }?;
        // Lazily: nothing is loaded until a function is needed for a context (`Function::load`);
        // eagerly, everything was loaded with the library.
        *pk = get_function(&lib.module, name, !lazy_loading()) as CUkernel;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(pm: Option<&mut CUmodule>, h: CUlibrary) -> CUresult {
    crate::call("cuLibraryGetModule", || {
        let pm = crate::out(pm)?;
        *pm = Arc::as_ptr(&library(h)?.module) as CUmodule;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(pf: Option<&mut CUfunction>, k: CUkernel) -> CUresult {
    crate::call("cuKernelGetFunction", || {
        let pf = crate::out(pf)?;
        let ctx = crate::context::current()?;
        let f = function(k as CUfunction)?;
        f.load(ctx.id, ctx.device)?;
        *pf = Arc::as_ptr(&f) as CUfunction;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetName(
    name: Option<&mut *const c_char>,
    k: CUkernel,
) -> CUresult {
    crate::call("cuKernelGetName", || {
        let name = crate::out(name)?;
        *name = name_ptr(&function(k as CUfunction)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: Option<&mut c_int>,
    attr: c_int,
    k: CUkernel,
    _dev: c_int,
) -> CUresult {
    crate::call("cuKernelGetAttribute", || {
        let pi = crate::out(pi)?;
        *pi = function(k as CUfunction)?.attribute(attr as u32)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelSetAttribute(
    attr: c_int,
    value: c_int,
    k: CUkernel,
    _dev: c_int,
) -> CUresult {
    crate::call("cuKernelSetAttribute", || {
        function(k as CUfunction)?.set_attribute(attr as u32, value)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelSetCacheConfig(
    k: CUkernel,
    config: c_int,
    _dev: c_int,
) -> CUresult {
    crate::call("cuKernelSetCacheConfig", || {
        function(k as CUfunction)?;
        if !(0..=3).contains(&config) {
            return Err(CUerror::INVALID_VALUE);
        }
        Ok(())
    })
}
