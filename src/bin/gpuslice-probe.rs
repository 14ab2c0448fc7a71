//! `gpuslice doctor`'s probe: a plain program, started under the caller's environment, that reaches the
//! driver as CUDA programs do (`dlopen("libcuda.so.1")`, `dlopen("libnvidia-ml.so.1")`) and reports what
//! got loaded, as `key=value` lines. It does not link the gpuslice library, so what it sees is what any
//! CUDA program started in this environment would get (LD_PRELOAD, /etc/ld.so.preload, library path).

use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// Every loaded object's path, in load order (the main program excluded).
fn loaded_objects() -> Vec<String> {
    let mut list = Vec::new();
    gpuslice_loader::any_loaded_object(|name| {
        if !name.is_empty() {
            list.push(name.to_string_lossy().into_owned());
        }
        false
    });
    list
}

fn sym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

/// What gpuslice library an object is: None, or Some(drop-in kind; 0 for the preloadable library).
fn gpuslice_kind(path: &str) -> Option<u32> {
    let c = CString::new(path).ok()?;
    // SAFETY: RTLD_NOLOAD only looks the loaded object up.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return None;
    }
    let kind = (!sym(h, c"gpuslice_dlsym_hook").is_null()).then(|| {
        let p = sym(h, c"gpuslice_dropin_library") as *const u32;
        if p.is_null() {
            0
        } else {
            // SAFETY: a drop-in library exports this symbol as a u32.
            unsafe { p.read() }
        }
    });
    // SAFETY: drops the reference RTLD_NOLOAD took.
    unsafe { libc::dlclose(h) };
    kind
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return String::new();
    }
    // SAFETY: as above.
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// What [`probe`] calls in the library it opened: a harmless export, so that a drop-in loads its
/// real library, and how to call it (given its non-null address).
struct HarmlessCall {
    export: &'static CStr,
    call: fn(*mut c_void) -> String,
}

/// Opens `name`, makes one harmless call so a drop-in loads its real library, and reports.
fn probe(key: &str, name: &CStr, harmless: HarmlessCall, prefix: &str) {
    // SAFETY: a NUL-terminated name; failure is reported by NULL.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        println!("{key}_error={}", dlerror());
        return;
    }
    let path = gpuslice_loader::handle_path(h).unwrap_or_default();
    println!("{key}_path={path}");
    match gpuslice_kind(&path) {
        Some(kind) => println!("{key}_gpuslice={kind}"),
        None => println!("{key}_gpuslice=none"),
    }
    let f = sym(h, harmless.export);
    let called = if f.is_null() {
        "missing".to_string()
    } else {
        (harmless.call)(f)
    };
    println!("{key}_call={called}");
    for object in loaded_objects() {
        if basename(&object).starts_with(prefix) && gpuslice_kind(&object).is_none() {
            println!("{key}_real={object}");
        }
    }
}

fn main() {
    for object in loaded_objects() {
        if gpuslice_kind(&object) == Some(0) {
            println!("preloaded={object}");
        }
    }
    probe(
        "cuda",
        c"libcuda.so.1",
        HarmlessCall {
            export: c"cuDriverGetVersion",
            call: |f| {
                let mut v: c_int = 0;
                // SAFETY: cuDriverGetVersion(int *) from the library's export of that name.
                let rc = unsafe {
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_int) -> c_int>(f)(
                        &mut v,
                    )
                };
                format!("cuDriverGetVersion rc={rc} version={v}")
            },
        },
        "libcuda.so",
    );
    probe(
        "nvml",
        c"libnvidia-ml.so.1",
        HarmlessCall {
            export: c"nvmlErrorString",
            call: |f| {
                // SAFETY: `const char *nvmlErrorString(nvmlReturn_t)`; the result is a static string.
                let s = unsafe {
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> *const c_char>(
                        f,
                    )(0)
                };
                if s.is_null() {
                    return "nvmlErrorString=null".into();
                }
                // SAFETY: NVML returns a NUL-terminated static string.
                let text = unsafe { CStr::from_ptr(s) };
                format!("nvmlErrorString={}", text.to_string_lossy())
            },
        },
        "libnvidia-ml.so",
    );
    println!("done=1");
}
