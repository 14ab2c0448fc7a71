//! Modules, libraries, functions and kernels. simgpu runs no code: a module accepts any image, and
//! yields a function for any name; the function remembers its name, which decides how the simulated
//! kernel behaves (see `launch.rs`). A `CUkernel` is the same object as the `CUfunction` of its
//! library's module, so either handle works wherever the real driver accepts both.
//!
//! A loaded module's code takes device memory as on a GPU: what the piece of the image a driver
//! loads on the device puts there (`gpuslice_api::image`: a cubin's allocated sections but shared
//! memory, the matching cubin of a fatbinary, else its PTX compiled, taken to be the text's size)
//! times `SIMGPU_MODULE_SCALE`, in 2 MiB pages, on the device of the context it was loaded in (a
//! library, which needs no context, on the current context's device, else device 0), until it is
//! unloaded or its context destroyed. A cubin's or fatbinary's architecture is not checked: an image
//! with nothing the device can run loads, costing nothing, where a driver answers
//! `CUDA_ERROR_NO_BINARY_FOR_GPU`.
//!
//! Loading is lazy as NVIDIA's driver makes it by default since CUDA 12.2 (`CUDA_MODULE_LOADING`:
//! `LAZY`, or `EAGER` to load everything at `cuModuleLoad*`/`cuLibraryLoad*`; the default follows
//! `SIMGPU_DRIVER_VERSION`): a load spends nothing; a module's kernel is loaded at its lookup
//! (`cuModuleGetFunction`), as the CUDA Programming Guide ("Lazy Loading") says: "loading a module
//! (cuModuleLoad*() family of functions) will not be loading kernels immediately, instead it will
//! delay loading of a kernel until cuModuleGetFunction() is called". A library's kernel is loaded
//! when a function is needed for a context, not at `cuLibraryGetKernel`: `cuLibraryLoadData`'s
//! documentation says a lazily loaded library "will only be loaded when a function is needed for
//! that context, such as a kernel launch", so at `cuKernelGetFunction` or at the first launch of
//! the `CUkernel` (or its function). Each loads the module's data on the module's first load and
//! the kernel's code (`gpuslice_api::image::Code`), or answers `CUDA_ERROR_OUT_OF_MEMORY` when the
//! device has no room (a launch then runs nothing). The module's pages are its loaded bytes rounded
//! up, so a load spends the pages it adds. A lazily loaded library's code is loaded per context
//! (the documentation's "when a function is needed for that context"): a second context launching
//! the same kernel loads it again, on that context's device, and the context's destruction frees
//! it. An eagerly loaded library's code is loaded once, at its load, on the library's device
//! (not modelled: the documentation has it "loaded eagerly into all contexts at the time of the
//! call and future contexts at the time of creation").

use crate::stream::lock;
use gpuslice_api::launch_types::*;
use gpuslice_api::types::{CUdeviceptr, CUfunction, CUkernel, CUlibrary, CUmodule};
use gpuslice_api::{CUerror, CUresult};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

mod library;
mod link;
pub use library::*;
pub use link::*;

/// Default dynamic shared memory limit per block, and the opt-in maximum of the simulated
/// compute capability 8.0 device.
pub const DEFAULT_MAX_DYNAMIC_SHARED: i32 = 48 * 1024;
pub const OPTIN_MAX_SHARED: i32 = 163 * 1024;

pub struct Module {
    functions: Mutex<HashMap<String, Arc<Function>>>,
    /// Parameter layouts by kernel name, from the image.
    params: crate::image::ParamLayouts,
    /// Local frames (bytes per thread) by kernel name, from the image.
    locals: HashMap<String, u64>,
    /// Physical device, what the image puts there, and what of it is loaded: by the id of the
    /// context it is loaded in (a module's own context; a library's: each context that needed one
    /// of its kernels, and 0 for an eager load), with that context's device.
    device: u32,
    code: gpuslice_api::image::Code,
    loaded: Mutex<HashMap<u64, (u32, Loaded)>>,
    /// The context it was loaded in (0: a library's, which outlives contexts).
    ctx_id: u64,
}

pub struct Function {
    name: CString,
    module: Weak<Module>,
    /// Its code is on the device wherever it is used (a module's function, an eagerly loaded
    /// library's kernel); a lazily loaded library's kernel loads in each context at its first use
    /// there ([`Function::load`]).
    loaded: AtomicBool,
    /// The context it was last found loaded in (0: none): one load on a launch's usual path.
    loaded_in: AtomicU64,
    /// Attributes set with cuFuncSetAttribute, by attribute number.
    attrs: Mutex<[Option<i32>; CU_FUNC_ATTRIBUTE_MAX as usize]>,
}

impl Function {
    pub fn name(&self) -> &str {
        self.name.to_str().unwrap_or("")
    }
    /// The physical device its module was loaded on (`None` once the module is gone).
    pub fn device(&self) -> Option<u32> {
        self.module.upgrade().map(|m| m.device)
    }
    /// `cuFuncGetAttribute` (values plausible for a small kernel on a compute capability 8.0 device).
    pub fn attribute(&self, attr: u32) -> Result<i32, CUerror> {
        if let Some(Some(v)) = lock(&self.attrs).get(attr as usize) {
            return Ok(*v);
        }
        Ok(match attr {
            CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
            CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => {
                i32::try_from(self.local_size()).unwrap_or(i32::MAX)
            }
            CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES | CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES => 0,
            CU_FUNC_ATTRIBUTE_NUM_REGS => 16,
            CU_FUNC_ATTRIBUTE_PTX_VERSION | CU_FUNC_ATTRIBUTE_BINARY_VERSION => 80,
            CU_FUNC_ATTRIBUTE_CACHE_MODE_CA => 0,
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => DEFAULT_MAX_DYNAMIC_SHARED,
            CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
            CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET
                ..=CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE => 0,
            _ => return Err(CUerror::INVALID_VALUE),
        })
    }
    fn set_attribute(&self, attr: u32, value: i32) -> CUresult {
        let ok = match attr {
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
                (0..=OPTIN_MAX_SHARED).contains(&value)
            }
            CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => (-1..=100).contains(&value),
            CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH
                ..=CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE => value >= 0,
            _ => false,
        };
        if !ok {
            return Err(CUerror::INVALID_VALUE);
        }
        lock(&self.attrs)[attr as usize] = Some(value);
        Ok(())
    }
    /// Its local frame in bytes per thread (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`: a PTX kernel's
    /// `__local_depot`), which a launch makes the context's local memory hold for every resident
    /// thread (`context::grow_local_memory`).
    pub fn local_size(&self) -> u64 {
        self.module
            .upgrade()
            .and_then(|m| m.locals.get(self.name()).copied())
            .unwrap_or(0)
    }
    /// Loads its code in context `ctx_id` (on `device`) if it is not there yet (a lazily loaded library's kernel, at
    /// its first `cuKernelGetFunction` or launch in that context): `CUDA_ERROR_OUT_OF_MEMORY` when
    /// the context's device has no room.
    pub fn load(&self, ctx_id: u64, device: u32) -> CUresult {
        if self.loaded.load(Ordering::Acquire) || self.loaded_in.load(Ordering::Acquire) == ctx_id {
            return Ok(());
        }
        let m = self.module.upgrade().ok_or(CUerror::INVALID_HANDLE)?;
        m.load_in(ctx_id, device, Some(self.name()), false)?;
        self.loaded_in.store(ctx_id, Ordering::Release);
        Ok(())
    }
    /// The largest dynamic shared memory a launch of this function may ask for.
    pub fn max_dynamic_shared(&self) -> u32 {
        self.attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
            .unwrap_or(DEFAULT_MAX_DYNAMIC_SHARED) as u32
    }
}

pub struct Library {
    module: Arc<Module>,
}

static MODULES: Mutex<BTreeMap<usize, Arc<Module>>> = Mutex::new(BTreeMap::new());
static FUNCTIONS: Mutex<BTreeMap<usize, Arc<Function>>> = Mutex::new(BTreeMap::new());
static LIBRARIES: Mutex<BTreeMap<usize, Arc<Library>>> = Mutex::new(BTreeMap::new());

/// What of a module is on the device, and the pages it is charged.
#[derive(Default)]
struct Loaded {
    data: bool,
    /// By index into the module's `code.kernels`.
    kernels: Vec<bool>,
    bytes: u64,
    charge: u64,
}

/// Whether modules load lazily (see the module's description): `CUDA_MODULE_LOADING`, else the
/// driver's default (lazy from CUDA 12.2).
pub fn lazy_loading() -> bool {
    match std::env::var("CUDA_MODULE_LOADING").as_deref() {
        Ok("EAGER") => false,
        Ok("LAZY") => true,
        _ => simgpu_core::config().driver_version >= 12020,
    }
}

/// Device memory `bytes` of code take: times `SIMGPU_MODULE_SCALE`, in the driver's pages.
fn pages(bytes: u64) -> u64 {
    bytes
        .saturating_mul(simgpu_core::config().module_scale)
        .div_ceil(crate::context::GRANULE)
        .saturating_mul(crate::context::GRANULE)
}

impl Module {
    /// Loads what a lookup of `kernel` in the module's own context (a library's: its eager load)
    /// needs that is not loaded yet.
    fn load_for(&self, kernel: Option<&str>, all: bool) -> Result<(), CUerror> {
        self.load_in(self.ctx_id, self.device, kernel, all)
    }

    /// Loads what a lookup of `kernel` in context `ctx_id` (on `device`) needs that is not loaded
    /// there yet: the module's data, the kernel's code (everything, for an eager load: `kernel`
    /// `None` and `all`).
    fn load_in(
        &self,
        ctx_id: u64,
        device: u32,
        kernel: Option<&str>,
        all: bool,
    ) -> Result<(), CUerror> {
        let mut all_loaded = lock(&self.loaded);
        let (device, loaded) = all_loaded
            .entry(ctx_id)
            .or_insert_with(|| (device, Loaded::default()));
        let device = *device;
        loaded.kernels.resize(self.code.kernels.len(), false);
        let mut bytes = loaded.bytes;
        if !loaded.data {
            bytes = bytes.saturating_add(self.code.data);
        }
        let wanted: Vec<usize> = (0..self.code.kernels.len())
            .filter(|&i| !loaded.kernels[i])
            .filter(|&i| all || kernel.is_some_and(|k| self.code.kernels[i].0 == k.as_bytes()))
            .collect();
        for &i in &wanted {
            bytes = bytes.saturating_add(self.code.kernels[i].1);
        }
        let charge = pages(bytes);
        if charge > loaded.charge {
            let shared = simgpu_core::shared().map_err(|_| CUerror::NOT_INITIALIZED)?;
            if !shared.try_reserve(device, charge - loaded.charge) {
                return Err(CUerror::OUT_OF_MEMORY);
            }
        }
        loaded.data = true;
        for i in wanted {
            loaded.kernels[i] = true;
        }
        loaded.bytes = bytes;
        loaded.charge = loaded.charge.max(charge);
        Ok(())
    }
}

/// The function (or kernel) a client handle names.
pub fn function(h: CUfunction) -> Result<Arc<Function>, CUerror> {
    lock(&FUNCTIONS)
        .get(&(h as usize))
        .cloned()
        .ok_or(CUerror::INVALID_HANDLE)
}

fn module(h: CUmodule) -> Result<Arc<Module>, CUerror> {
    lock(&MODULES)
        .get(&(h as usize))
        .cloned()
        .ok_or(CUerror::INVALID_HANDLE)
}

fn library(h: CUlibrary) -> Result<Arc<Library>, CUerror> {
    lock(&LIBRARIES)
        .get(&(h as usize))
        .cloned()
        .ok_or(CUerror::INVALID_HANDLE)
}

/// Loads `image` (its code reserved on the device): in the current context, or for a library
/// (`library`), on the current context's device or device 0.
fn new_module(image: &crate::image::Image, library: bool) -> Result<Arc<Module>, CUerror> {
    let ctx = crate::context::current();
    let (device, ctx_id) = match (&ctx, library) {
        (Ok(c), false) => (c.device, c.id),
        (Ok(c), true) => (c.device, 0),
        (Err(e), false) => return Err(*e),
        (Err(_), true) => (crate::device::physical(0)?, 0),
    };
    let (major, minor) = crate::device::info(device).compute_capability;
    let code = gpuslice_api::image::device_code(
        &image.bytes,
        u32::try_from(major).unwrap_or(0),
        u32::try_from(minor).unwrap_or(0),
    );
    let m = Arc::new(Module {
        functions: Mutex::new(HashMap::new()),
        params: crate::image::param_layouts(&image.bytes),
        locals: crate::image::local_sizes(&image.bytes),
        device,
        code,
        loaded: Mutex::new(HashMap::new()),
        ctx_id,
    });
    if !lazy_loading() {
        m.load_for(None, true)?;
    }
    lock(&MODULES).insert(Arc::as_ptr(&m) as usize, m.clone());
    Ok(m)
}

/// Unloads the modules of a destroyed context (their code goes with it), and frees the code
/// libraries loaded in it.
pub fn on_context_destroyed(ctx_id: u64) {
    if ctx_id == 0 {
        return;
    }
    let modules: Vec<Arc<Module>> = lock(&MODULES).values().cloned().collect();
    for m in modules {
        if m.ctx_id == ctx_id {
            unload_module(&m);
            continue;
        }
        let freed = lock(&m.loaded).remove(&ctx_id);
        if let (Some((device, loaded)), Ok(s)) = (freed, simgpu_core::shared()) {
            s.release(device, loaded.charge);
        }
        // A primary context keeps its id across a reset: its kernels load again.
        for f in lock(&m.functions).values() {
            let _ = f
                .loaded_in
                .compare_exchange(ctx_id, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

fn unload_module(m: &Arc<Module>) {
    if lock(&MODULES).remove(&(Arc::as_ptr(m) as usize)).is_some() {
        if let Ok(s) = simgpu_core::shared() {
            for (_, (device, loaded)) in lock(&m.loaded).drain() {
                s.release(device, loaded.charge);
            }
        }
    }
    let mut fns = lock(&FUNCTIONS);
    for f in lock(&m.functions).values() {
        fns.remove(&(Arc::as_ptr(f) as usize));
    }
}

/// The module's function `name`: the same handle every time it is asked for. `loaded`: its code is
/// on the device already (a module's lookup loads it; a library's kernel loads at first use).
fn get_function(m: &Arc<Module>, name: &str, loaded: bool) -> CUfunction {
    let mut fns = lock(&m.functions);
    let f = fns.entry(name.to_owned()).or_insert_with(|| {
        let f = Arc::new(Function {
            name: CString::new(name).unwrap_or_default(),
            module: Arc::downgrade(m),
            loaded: AtomicBool::new(loaded),
            loaded_in: AtomicU64::new(0),
            attrs: Mutex::new([None; CU_FUNC_ATTRIBUTE_MAX as usize]),
        });
        lock(&FUNCTIONS).insert(Arc::as_ptr(&f) as usize, f.clone());
        f
    });
    Arc::as_ptr(f) as CUfunction
}

/// A C string argument (NULL is `CUDA_ERROR_INVALID_VALUE`).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn c_str<'a>(p: *const c_char) -> Result<&'a str, CUerror> {
    if p.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    // SAFETY: non-NULL, and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| CUerror::INVALID_VALUE)
}

/// Every module load needs a current context, like the real driver.
///
/// # Safety
/// `image` is NULL or an image as `cuModuleLoadData` takes it.
unsafe fn load(image: *const c_void) -> Result<CUmodule, CUerror> {
    crate::context::current()?;
    if image.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    // SAFETY: per the caller.
    let image = unsafe { crate::image::from_pointer(image) };
    Ok(Arc::as_ptr(&new_module(&image, false)?) as CUmodule)
}

/// The image in a file (cubin, fatbinary or PTX).
fn read_image(path: &str) -> Result<crate::image::Image, CUerror> {
    match std::fs::File::open(path) {
        Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut &f, &mut bytes).map_err(|_| CUerror::FILE_NOT_FOUND)?;
            Ok(crate::image::Image { bytes })
        }
        _ => Err(CUerror::FILE_NOT_FOUND),
    }
}

fn new_library(image: &crate::image::Image) -> Result<CUlibrary, CUerror> {
    let lib = Arc::new(Library {
        module: new_module(image, true)?,
    });
    let h = Arc::as_ptr(&lib) as usize;
    lock(&LIBRARIES).insert(h, lib);
    Ok(h as CUlibrary)
}

/// `cuFuncGetParamInfo` / `cuKernelGetParamInfo`: the parameter's offset and size in the
/// device-side parameter layout; `INVALID_VALUE` for an index past the last parameter (or a kernel
/// whose image did not declare its parameters).
fn param_info(
    f: CUfunction,
    index: usize,
    offset: Option<&mut usize>,
    size: *mut usize,
) -> CUresult {
    let f = function(f)?;
    let offset = crate::out(offset)?;
    let m = f.module.upgrade().ok_or(CUerror::INVALID_HANDLE)?;
    let (o, s) = *m
        .params
        .get(f.name())
        .and_then(|p| p.get(index))
        .ok_or(CUerror::INVALID_VALUE)?;
    *offset = o;
    if !size.is_null() {
        // SAFETY: a non-NULL size pointer is the caller's storage for a size_t.
        unsafe { size.write_unaligned(s) };
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: CUfunction,
    index: usize,
    offset: Option<&mut usize>,
    size: *mut usize,
) -> CUresult {
    crate::call("cuFuncGetParamInfo", || param_info(f, index, offset, size))
}

/// A `const char*` that stays valid as long as the function: the name the client gave.
fn name_ptr(f: &Arc<Function>) -> *const c_char {
    f.name.as_ptr()
}

// ---- exports ----

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(pm: Option<&mut CUmodule>, fname: *const c_char) -> CUresult {
    crate::call("cuModuleLoad", || {
        let pm = crate::out(pm)?;
        crate::context::current()?;
        // SAFETY: `fname` is a C string per the API.
        let image = read_image(unsafe { c_str(fname) }?)?;
        *pm = Arc::as_ptr(&new_module(&image, false)?) as CUmodule;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(
    pm: Option<&mut CUmodule>,
    image: *const c_void,
) -> CUresult {
    crate::call("cuModuleLoadData", || {
        let pm = crate::out(pm)?;
        // SAFETY: `image` is an image as the API requires.
        *pm = unsafe { load(image) }?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    pm: Option<&mut CUmodule>,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    crate::call("cuModuleLoadDataEx", || {
        let pm = crate::out(pm)?;
        // SAFETY: `image` is an image as the API requires.
        *pm = unsafe { load(image) }?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    pm: Option<&mut CUmodule>,
    image: *const c_void,
) -> CUresult {
    crate::call("cuModuleLoadFatBinary", || {
        let pm = crate::out(pm)?;
        // SAFETY: `image` is an image as the API requires.
        *pm = unsafe { load(image) }?;
        Ok(())
    })
}

/// `CU_MODULE_EAGER_LOADING` (1) or `CU_MODULE_LAZY_LOADING` (2).
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: Option<&mut c_int>) -> CUresult {
    crate::call("cuModuleGetLoadingMode", || {
        *crate::out(mode)? = if lazy_loading() { 2 } else { 1 };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(h: CUmodule) -> CUresult {
    crate::call("cuModuleUnload", || {
        let m = module(h)?;
        unload_module(&m);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    pf: Option<&mut CUfunction>,
    h: CUmodule,
    name: *const c_char,
) -> CUresult {
    crate::call("cuModuleGetFunction", || {
        let pf = crate::out(pf)?;
        let m = module(h)?;
        // SAFETY: `name` is a C string per the API.
        let name = unsafe { c_str(name) }?;
        m.load_for(Some(name), false)?;
        *pf = get_function(&m, name, true);
        Ok(())
    })
}

/// simgpu has no module globals: every name is "not found", which the real driver answers for a
/// name the module does not define.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    _dptr: *mut CUdeviceptr,
    _bytes: *mut usize,
    h: CUmodule,
    name: *const c_char,
) -> CUresult {
    crate::call("cuModuleGetGlobal_v2", || {
        module(h)?;
        // SAFETY: `name` is a C string per the API.
        unsafe { c_str(name) }?;
        Err(CUerror::NOT_FOUND)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetModule(pm: Option<&mut CUmodule>, f: CUfunction) -> CUresult {
    crate::call("cuFuncGetModule", || {
        let pm = crate::out(pm)?;
        let m = function(f)?
            .module
            .upgrade()
            .ok_or(CUerror::INVALID_HANDLE)?;
        *pm = Arc::as_ptr(&m) as CUmodule;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(
    name: Option<&mut *const c_char>,
    f: CUfunction,
) -> CUresult {
    crate::call("cuFuncGetName", || {
        let name = crate::out(name)?;
        *name = name_ptr(&function(f)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: Option<&mut c_int>,
    attr: c_int,
    f: CUfunction,
) -> CUresult {
    crate::call("cuFuncGetAttribute", || {
        let pi = crate::out(pi)?;
        *pi = function(f)?.attribute(attr as u32)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(f: CUfunction, attr: c_int, value: c_int) -> CUresult {
    crate::call("cuFuncSetAttribute", || {
        function(f)?.set_attribute(attr as u32, value)
    })
}

/// The cache preference (`CUfunc_cache`: 0..=3) is only a hint: validated, not stored.
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetCacheConfig(f: CUfunction, config: c_int) -> CUresult {
    crate::call("cuFuncSetCacheConfig", || {
        function(f)?;
        if !(0..=3).contains(&config) {
            return Err(CUerror::INVALID_VALUE);
        }
        Ok(())
    })
}
