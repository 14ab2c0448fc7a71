//! The stream entry points (`cuStream*`, `cuLaunchHostFunc`): each resolves its stream and calls
//! the queue model of `mod.rs`.

use super::*;

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: Option<&mut CUstream>, flags: c_uint) -> CUresult {
    crate::call("cuStreamCreate", || {
        let ph = crate::out(ph)?;
        *ph = create(flags, 0)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: Option<&mut CUstream>,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    crate::call("cuStreamCreateWithPriority", || {
        let ph = crate::out(ph)?;
        *ph = create(flags, priority)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy(h: CUstream) -> CUresult {
    crate::call("cuStreamDestroy", || destroy(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(h: CUstream) -> CUresult {
    crate::call("cuStreamDestroy_v2", || destroy(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(h: CUstream) -> CUresult {
    crate::call("cuStreamSynchronize", || sync_export(h, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(h: CUstream) -> CUresult {
    crate::call("cuStreamSynchronize_ptsz", || sync_export(h, true))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(h: CUstream) -> CUresult {
    crate::call("cuStreamQuery", || query_export(h, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery_ptsz(h: CUstream) -> CUresult {
    crate::call("cuStreamQuery_ptsz", || query_export(h, true))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(h: CUstream, flags: Option<&mut c_uint>) -> CUresult {
    crate::call("cuStreamGetFlags", || {
        *crate::out(flags)? = resolve(h, false)?.flags;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags_ptsz(
    h: CUstream,
    flags: Option<&mut c_uint>,
) -> CUresult {
    crate::call("cuStreamGetFlags_ptsz", || {
        *crate::out(flags)? = resolve(h, true)?.flags;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(
    h: CUstream,
    priority: Option<&mut c_int>,
) -> CUresult {
    crate::call("cuStreamGetPriority", || {
        *crate::out(priority)? = resolve(h, false)?.priority;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority_ptsz(
    h: CUstream,
    priority: Option<&mut c_int>,
) -> CUresult {
    crate::call("cuStreamGetPriority_ptsz", || {
        *crate::out(priority)? = resolve(h, true)?.priority;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId(h: CUstream, id: Option<&mut c_ulonglong>) -> CUresult {
    crate::call("cuStreamGetId", || {
        *crate::out(id)? = resolve(h, false)?.id;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId_ptsz(h: CUstream, id: Option<&mut c_ulonglong>) -> CUresult {
    crate::call("cuStreamGetId_ptsz", || {
        *crate::out(id)? = resolve(h, true)?.id;
        Ok(())
    })
}

/// The exported `cuStreamGetCtx` has the original two-parameter signature (`cuStreamGetCtx_v2` adds
/// the green context); the third parameter is never read.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(
    h: CUstream,
    pctx: Option<&mut CUcontext>,
    _green: *mut CUgreenCtx,
) -> CUresult {
    crate::call("cuStreamGetCtx", || {
        let pctx = crate::out(pctx)?;
        *pctx = context::handle_of(&*resolve(h, false)?.context()?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_ptsz(
    h: CUstream,
    pctx: Option<&mut CUcontext>,
    _green: *mut CUgreenCtx,
) -> CUresult {
    crate::call("cuStreamGetCtx_ptsz", || {
        let pctx = crate::out(pctx)?;
        *pctx = context::handle_of(&*resolve(h, true)?.context()?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(
    h: CUstream,
    ev: gpuslice_api::types::CUevent,
    flags: c_uint,
) -> CUresult {
    crate::call("cuStreamWaitEvent", || wait_event(h, false, ev, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent_ptsz(
    h: CUstream,
    ev: gpuslice_api::types::CUevent,
    flags: c_uint,
) -> CUresult {
    crate::call("cuStreamWaitEvent_ptsz", || wait_event(h, true, ev, flags))
}

/// The exported `cuLaunchHostFunc` has the three-parameter signature (`cuLaunchHostFunc_v2` adds a
/// sync mode); a fourth parameter is never read.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    h: CUstream,
    f: CUhostFn,
    user_data: *mut c_void,
    _sync_mode: c_uint,
) -> CUresult {
    crate::call("cuLaunchHostFunc", || {
        launch_host_func(h, false, f, user_data)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc_ptsz(
    h: CUstream,
    f: CUhostFn,
    user_data: *mut c_void,
    _sync_mode: c_uint,
) -> CUresult {
    crate::call("cuLaunchHostFunc_ptsz", || {
        launch_host_func(h, true, f, user_data)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamAddCallback(
    h: CUstream,
    cb: CUstreamCallback,
    user_data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    crate::call("cuStreamAddCallback", || {
        add_callback(h, false, cb, user_data, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamAddCallback_ptsz(
    h: CUstream,
    cb: CUstreamCallback,
    user_data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    crate::call("cuStreamAddCallback_ptsz", || {
        add_callback(h, true, cb, user_data, flags)
    })
}
