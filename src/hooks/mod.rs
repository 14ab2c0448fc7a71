//! The hooks: thin `extern "C"` exports, expanded by [`hooks!`] from one declaration per entry point,
//! that call ordinary safe Rust functions in the group modules (memory, context, first_launch, info,
//! nvml, nvml_stats, entry, launch, graph, vmm, capture).
//!
//! Every export runs inside [`enter`]: a per-thread re-entrancy token (a nested call passes straight
//! through to the real function) and `catch_unwind` (a panic never crosses the C ABI; the call answers
//! with the driver's "unknown" error instead). Which entry points are hooked is the `hook` column of the
//! API table; `build.rs` turns it into the registry in `crate::driver`.

use std::cell::Cell;

pub mod capture;
pub mod context;
pub mod entry;
pub mod first_launch;
pub mod graph;
pub mod info;
pub mod ipc;
pub mod launch;
pub mod memory;
pub mod nvml;
pub mod nvml_stats;
pub mod vmm;

thread_local! {
    /// Set while this thread runs a hook body.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// What a hook body returns when it panicked.
pub trait PanicResult {
    fn from_panic() -> Self;
}

impl PanicResult for gpuslice_api::CUresult {
    fn from_panic() -> Self {
        Err(gpuslice_api::CUerror::UNKNOWN)
    }
}

impl PanicResult for gpuslice_api::NvmlReturn {
    fn from_panic() -> Self {
        Err(gpuslice_api::NvmlError::UNKNOWN)
    }
}

/// Runs a hook body, or `pass` (the real function) when this thread is already inside a hook.
#[inline(always)]
pub fn enter<R: PanicResult>(pass: impl FnOnce() -> R, body: impl FnOnce() -> R) -> R {
    // One thread-local access per call: the token is set, the body runs (a panic is caught, so the
    // token is always reset here), the token is cleared.
    IN_HOOK.with(|token| {
        if token.replace(true) {
            return pass();
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        token.set(false);
        result.unwrap_or_else(|_| {
            crate::log::error(format_args!(
                "internal error (panic) in a hook; the call reports an unknown error"
            ));
            R::from_panic()
        })
    })
}

/// An output pointer received from the C caller: read or written only through these methods, and read
/// only after the real driver reported success (it has then written it).
pub struct Out<T>(*mut T);

impl<T: Copy> Out<T> {
    /// # Safety
    /// `ptr` is NULL or valid for reads and writes of a `T`, as the driver API requires of its caller.
    pub unsafe fn new(ptr: *mut T) -> Self {
        Out(ptr)
    }
    pub fn get(&self) -> Option<T> {
        // SAFETY: non-null pointers are valid for reads (constructor contract).
        (!self.0.is_null()).then(|| unsafe { self.0.read_unaligned() })
    }
    pub fn set(&self, value: T) -> bool {
        if self.0.is_null() {
            return false;
        }
        // SAFETY: non-null pointers are valid for writes (constructor contract).
        unsafe { self.0.write_unaligned(value) };
        true
    }
    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }
}

/// An integer as an entry point passes it: sizes and device pointers in the current (64-bit) and
/// legacy (32-bit) ABIs. Values that do not fit the legacy width saturate.
pub trait Word: Copy {
    fn to_u64(self) -> u64;
    fn from_u64(v: u64) -> Self;
}
impl Word for u64 {
    fn to_u64(self) -> u64 {
        self
    }
    fn from_u64(v: u64) -> Self {
        v
    }
}
impl Word for usize {
    fn to_u64(self) -> u64 {
        self as u64
    }
    fn from_u64(v: u64) -> Self {
        usize::try_from(v).unwrap_or(usize::MAX)
    }
}
impl Word for u32 {
    fn to_u64(self) -> u64 {
        u64::from(self)
    }
    fn from_u64(v: u64) -> Self {
        u32::try_from(v).unwrap_or(u32::MAX)
    }
}

/// An input pointer to a struct received from the C caller.
pub struct In<T>(*const T);

impl<T: Copy> In<T> {
    /// # Safety
    /// `ptr` is NULL or valid for reads of a `T`, as the driver API requires of its caller.
    pub unsafe fn new(ptr: *const T) -> Self {
        In(ptr)
    }
    pub fn get(&self) -> Option<T> {
        // SAFETY: non-null pointers are valid for reads (constructor contract).
        (!self.0.is_null()).then(|| unsafe { self.0.read_unaligned() })
    }
}

/// Declares hooks: for each `fn name(args) -> ret => body;` it exports `name` (the C ABI entry point);
/// the body reaches the real function as `real::name` ([`crate::driver::real`], generated from the
/// table). A hook's parameters must be the table's (NVIDIA's prototype): one declared otherwise does
/// not compile. An optional `fast = predicate;` is checked before anything else: when it holds, the
/// export calls the real function directly (the launch fast path).
///
/// The export reaches its body by a direct jump, or, for hooks with a fast predicate, through the
/// body's address read from a static (one load more off the fast path): LLVM makes no jump of a
/// direct call whose arguments lie on the stack (`cuLaunchKernel`'s last 5), so the export would
/// save 6 registers and copy those 5 arguments at every call, fast path included (+16
/// instructions a launch, docs/BENCHMARKS.md); through a function pointer, as the real function is
/// reached, both ways out of the export are jumps and it has no frame.
macro_rules! hooks {
    (ret = $ret:ty;
     $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $body:expr ; )*) => {
        $crate::hooks::hooks! {
            @emit ret = $ret, fast = false, direct;
            $( fn $name ( $($arg : $ty),* ) => $body ; )*
        }
    };
    (ret = $ret:ty, fast = $fast:expr;
     $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $body:expr ; )*) => {
        $crate::hooks::hooks! {
            @emit ret = $ret, fast = $fast, through_address;
            $( fn $name ( $($arg : $ty),* ) => $body ; )*
        }
    };
    (@body direct $name:ident ($($arg:ident),*)) => {
        // SAFETY: the caller's arguments, as received.
        unsafe { slow::$name($($arg),*) }
    };
    (@body through_address $name:ident ($($arg:ident),*)) => {{
        // A volatile read: the compiler cannot turn it back into a direct call.
        // SAFETY: a read of an initialised static.
        let body = unsafe { std::ptr::read_volatile(&raw const slow_address::$name) };
        // SAFETY: the caller's arguments, as received.
        unsafe { body($($arg),*) }
    }};
    (@emit ret = $ret:ty, fast = $fast:expr, $via:ident;
     $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $body:expr ; )*) => {
        use $crate::driver::real;
        // Each export's signature is the table's: the generated declaration coerces to it only then.
        const _: () = {
            $( let _: unsafe extern "C" fn($($ty),*) -> $ret = real::$name; )*
        };
        /// The hook bodies, out of line so that an export's fast path stays a few instructions.
        /// They have the export's C ABI, so the export's call to one is a jump (a sibling call):
        /// the application's call reaches the real function one frame deeper, not two. Every frame
        /// between the caller and a deep driver call costs a mispredicted return per call
        /// (docs/BENCHMARKS.md, "Frames around the driver call").
        #[allow(non_snake_case)]
        mod slow {
            use super::*;
            $(
                /// Runs the hook body inside [`crate::hooks::enter`].
                ///
                /// # Safety
                /// Called from the export with the C caller's arguments.
                #[inline(never)]
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                    $crate::hooks::enter(
                        // SAFETY: the caller's arguments, passed through untouched.
                        || unsafe { real::$name($($arg),*) },
                        // SAFETY: the body passes the caller's pointers only to the real function, or
                        // reads them through `Out`/`In` under the driver API's contract.
                        || unsafe { $body },
                    )
                }
            )*
        }
        /// The hook bodies' addresses, for the exports that reach their body through one.
        #[allow(non_upper_case_globals, dead_code)]
        mod slow_address {
            use super::*;
            $(
                pub static $name: unsafe extern "C" fn($($ty),*) -> $ret = super::slow::$name;
            )*
        }
        $(
            #[doc = concat!("The `", stringify!($name), "` hook.")]
            ///
            /// # Safety
            /// Called from C with the driver API's contract for this entry point.
            #[cfg_attr(not(test), no_mangle)]
            #[allow(non_snake_case)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // The real function when the fast predicate holds and it is resolved already, else
                // the body (which resolves it, and does the rest): both are jumps, so the fast
                // path is a few instructions and the export has no frame (docs/BENCHMARKS.md).
                if $fast {
                    if let Some(f) = $crate::driver::resolved($crate::driver::Real::$name) {
                        // SAFETY: the slot holds the address the real library exports under this
                        // exact name, whose C signature is the one declared here (as `real::`).
                        let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(f) };
                        // SAFETY: the caller's arguments, passed through untouched.
                        return unsafe { f($($arg),*) };
                    }
                }
                $crate::hooks::hooks!(@body $via $name ($($arg),*))
            }
        )*
    };
}
pub(crate) use hooks;
