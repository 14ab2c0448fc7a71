//! A small CUDA program for `gpuslice demo`: it reaches the driver the way most runtimes do
//! (`dlopen("libcuda.so.1")` + `dlsym`), allocates device memory in chunks until the driver refuses,
//! and prints what it saw as `key=value` lines. It knows nothing of gpuslice.
//!
//! With `--spin-us U --seconds S` it instead launches a kernel that keeps the GPU busy for U
//! microseconds, back to back for S seconds, and prints how many completed (its GPU time is their
//! number times U). The kernel is PTX (a `%globaltimer` loop), so it runs on a real GPU too; simgpu
//! accepts any image and runs kernels named `spin*` for their first parameter in microseconds.
//!
//! usage: gpuslice-workload [--chunk MiB] [--max MiB] [--hold-ms MS] | --spin-us U --seconds S [--ready]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

type CuResult = c_int;

struct Driver {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult,
    set_current: unsafe extern "C" fn(*mut c_void) -> CuResult,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
    free: unsafe extern "C" fn(u64) -> CuResult,
    error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult,
    module_get_function:
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CuResult,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> CuResult,
}

/// `spin_kernel(u64 us)`: busy until `us` microseconds have passed on the GPU's global timer.
const SPIN_PTX: &CStr = c".version 7.0
.target sm_70
.address_size 64
.visible .entry spin_kernel(.param .u64 spin_kernel_param_0)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [spin_kernel_param_0];
    mul.lo.s64 %rd2, %rd1, 1000;
    mov.u64 %rd3, %globaltimer;
$L_spin:
    mov.u64 %rd4, %globaltimer;
    sub.s64 %rd5, %rd4, %rd3;
    setp.lt.u64 %p1, %rd5, %rd2;
    @%p1 bra $L_spin;
    ret;
}
";

fn sym<T: Copy>(lib: *mut c_void, name: &CStr) -> T {
    // SAFETY: dlsym with a handle from dlopen and a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        eprintln!("libcuda.so.1 has no {}", name.to_string_lossy());
        std::process::exit(3);
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `T` is the function pointer type of the named driver entry point (NVIDIA's signature).
    unsafe { std::mem::transmute_copy(&p) }
}

fn load() -> Driver {
    // SAFETY: plain dlopen of the driver library by its SONAME.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        eprintln!("cannot load libcuda.so.1 (no NVIDIA driver, and simgpu not on LD_LIBRARY_PATH)");
        std::process::exit(3);
    }
    Driver {
        init: sym(lib, c"cuInit"),
        device_get: sym(lib, c"cuDeviceGet"),
        retain: sym(lib, c"cuDevicePrimaryCtxRetain"),
        set_current: sym(lib, c"cuCtxSetCurrent"),
        mem_get_info: sym(lib, c"cuMemGetInfo_v2"),
        alloc: sym(lib, c"cuMemAlloc_v2"),
        free: sym(lib, c"cuMemFree_v2"),
        error_name: sym(lib, c"cuGetErrorName"),
        module_load_data: sym(lib, c"cuModuleLoadData"),
        module_get_function: sym(lib, c"cuModuleGetFunction"),
        stream_create: sym(lib, c"cuStreamCreate"),
        launch: sym(lib, c"cuLaunchKernel"),
        stream_synchronize: sym(lib, c"cuStreamSynchronize"),
    }
}

fn name(d: &Driver, r: CuResult) -> String {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: valid out-parameter; the driver returns a static string.
    if unsafe { (d.error_name)(r, &mut p) } != 0 || p.is_null() {
        return format!("CUresult {r}");
    }
    // SAFETY: NUL-terminated static string from the driver.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn check(d: &Driver, what: &str, r: CuResult) {
    if r != 0 {
        println!("error={what}:{}", name(d, r));
        std::process::exit(1);
    }
}

fn arg(args: &[String], flag: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let chunk = arg(&args, "--chunk", 256) << 20;
    let max = arg(&args, "--max", u64::MAX >> 20).saturating_mul(1 << 20);
    let hold_ms = arg(&args, "--hold-ms", 0);
    let spin_us = arg(&args, "--spin-us", 0);
    let seconds = arg(&args, "--seconds", 3);
    // Print `ready` once set up and wait for a line on stdin before launching: several tenants
    // started by one command then contend from the same instant, however long each took to start.
    let wait_for_go = args.iter().any(|a| a == "--ready");
    let d = load();
    // SAFETY: all calls below are driver entry points called with valid out-parameters, in the
    // documented order (init, context, then memory calls).
    unsafe {
        check(&d, "cuInit", (d.init)(0));
        let mut dev = 0;
        check(&d, "cuDeviceGet", (d.device_get)(&mut dev, 0));
        let mut ctx = std::ptr::null_mut();
        check(&d, "cuDevicePrimaryCtxRetain", (d.retain)(&mut ctx, dev));
        check(&d, "cuCtxSetCurrent", (d.set_current)(ctx));
        if spin_us > 0 {
            spin(&d, spin_us, seconds, wait_for_go);
            return;
        }
        let (mut free, mut total) = (0usize, 0usize);
        check(&d, "cuMemGetInfo", (d.mem_get_info)(&mut free, &mut total));
        println!("total={total}");
        println!("free={free}");
        let mut ptrs = Vec::new();
        let mut allocated: u64 = 0;
        let mut outcome = String::from("ok");
        while allocated + chunk <= max {
            let mut p = 0u64;
            let r = (d.alloc)(&mut p, chunk as usize);
            if r != 0 {
                outcome = name(&d, r);
                break;
            }
            ptrs.push(p);
            allocated += chunk;
        }
        println!("allocated={allocated}");
        println!("chunks={}", ptrs.len());
        println!("outcome={outcome}");
        check(&d, "cuMemGetInfo", (d.mem_get_info)(&mut free, &mut total));
        println!("free_after={free}");
        if hold_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(hold_ms));
        }
        for p in ptrs {
            check(&d, "cuMemFree", (d.free)(p));
        }
    }
}

/// Launches `spin_kernel(us)` back to back for `seconds`, then prints how many ran.
///
/// # Safety
/// A context is current on this thread.
unsafe fn spin(d: &Driver, us: u64, seconds: u64, wait_for_go: bool) {
    // SAFETY: driver entry points with valid out-parameters; the kernel parameter outlives each launch
    // call (the driver copies parameters at launch).
    unsafe {
        let mut module = std::ptr::null_mut();
        check(
            d,
            "cuModuleLoadData",
            (d.module_load_data)(&mut module, SPIN_PTX.as_ptr().cast()),
        );
        let mut function = std::ptr::null_mut();
        check(
            d,
            "cuModuleGetFunction",
            (d.module_get_function)(&mut function, module, c"spin_kernel".as_ptr()),
        );
        let mut stream = std::ptr::null_mut();
        check(d, "cuStreamCreate", (d.stream_create)(&mut stream, 0));
        if wait_for_go {
            use std::io::{BufRead, Write};
            println!("ready");
            let _ = std::io::stdout().flush();
            let mut go = String::new();
            let _ = std::io::stdin().lock().read_line(&mut go);
        }
        let start = std::time::Instant::now();
        let mut launched = 0u64;
        let mut param = us;
        while start.elapsed() < std::time::Duration::from_secs(seconds) {
            let mut params = [(&mut param as *mut u64).cast::<c_void>()];
            let r = (d.launch)(
                function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            );
            check(d, "cuLaunchKernel", r);
            launched += 1;
            // Keep the queue short: what a tenant launched is what it waits for.
            if launched % 16 == 0 {
                check(d, "cuStreamSynchronize", (d.stream_synchronize)(stream));
            }
        }
        check(d, "cuStreamSynchronize", (d.stream_synchronize)(stream));
        println!("kernels={launched}");
        println!("gpu_us={}", launched * us);
        println!("wall_us={}", start.elapsed().as_micros());
    }
}
