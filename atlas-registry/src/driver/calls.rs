//! One thin typed wrapper per driver call Atlas makes.
//!
//! Each wrapper resolves its entry point (a missing one is [`Error::Missing`] naming it), owns
//! the out-pointers, and turns the status into a [`Result`]. The wrappers that are `unsafe` say
//! what their caller vouches for; the duties that recur are these:
//!
//! - **live**: a handle (context, module, function, stream, graph, library) was made by the driver
//!   and has not been destroyed;
//! - **current**: the context the call acts in (for calls that act in "the current context") is
//!   current on the calling thread; streams and functions name their own context.
//!
//! Calls that cannot corrupt memory whatever their arguments (a bad ordinal, a null context) are
//! safe: the driver refuses them with a status.

use std::ffi::{CStr, c_char, c_void};

use atlas_sys::{
    CUDA_CONDITIONAL_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS, CUcontext, CUdevice, CUdevice_attribute,
    CUdeviceptr, CUfunction, CUfunction_attribute, CUgraph, CUgraphConditionalHandle,
    CUgraphConditionalNodeType, CUgraphDependencyType, CUgraphEdgeData, CUgraphExec,
    CUgraphExecUpdateResult, CUgraphExecUpdateResultInfo, CUgraphNode, CUgraphNodeParams,
    CUgraphNodeType, CUjit_option, CUlaunchAttributeID, CUlaunchAttributeValue, CUlibrary,
    CUmodule, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus,
    CUstreamUpdateCaptureDependencies_flags,
};

use super::{Error, LaunchKernelFn, Result, check, driver};

/// `call!(cuName(args...))`: resolves `cuName`, calls it and checks the status. Inside an `unsafe`
/// block: the arguments are the wrapper's to get right. For the wrappers of the driver tier only.
macro_rules! call {
    ($name:ident($($arg:expr),* $(,)?)) => {{
        let f = atlas_sys::resolve(&$crate::driver::driver()?.cuda.$name, stringify!($name))
            .map_err($crate::driver::Error::Missing)?;
        $crate::driver::check(f($($arg),*), stringify!($name))
    }};
}

mod batch;
mod copy;
mod event;
mod green_context;
mod host_memory;
mod info;
mod ipc;
mod logs;
mod peer;
mod pool;
mod tensor_map;
mod virtual_memory;

pub(crate) use batch::*;
pub(crate) use copy::*;
pub(crate) use event::*;
pub(crate) use green_context::*;
pub(crate) use host_memory::*;
pub use info::ContextLimit;
pub(crate) use info::*;
pub(crate) use ipc::*;
pub(crate) use logs::*;
pub(crate) use peer::*;
pub(crate) use pool::*;
pub(crate) use tensor_map::*;
pub use tensor_map::{
    TensorDataType, TensorInterleave, TensorL2Promotion, TensorOobFill, TensorSwizzle,
};
pub(crate) use virtual_memory::*;

// Devices and contexts.

/// `cuDeviceGetCount`.
pub(crate) fn device_count() -> Result<i32> {
    let mut count = 0;
    // SAFETY: `count` is a live out-pointer.
    unsafe { call!(cuDeviceGetCount(&mut count)) }?;
    Ok(count)
}

/// `cuDeviceGet`.
pub(crate) fn device_get(ordinal: i32) -> Result<CUdevice> {
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a live out-pointer; a bad ordinal is refused with a status.
    unsafe { call!(cuDeviceGet(&mut device, ordinal)) }?;
    Ok(device)
}

/// `cuDeviceGetName`.
pub(crate) fn device_name(device: CUdevice) -> Result<String> {
    let mut name = [0 as c_char; 256];
    // SAFETY: the buffer is live and its length is passed with it.
    unsafe {
        call!(cuDeviceGetName(
            name.as_mut_ptr(),
            name.len() as i32,
            device
        ))
    }?;
    // The driver writes a NUL-terminated name; should it not, the last byte ends it.
    name[name.len() - 1] = 0;
    // SAFETY: the buffer holds a NUL (set above) and lives through the call.
    Ok(unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// `cuDeviceGetAttribute`.
pub(crate) fn device_attribute(device: CUdevice, attribute: CUdevice_attribute) -> Result<i32> {
    let mut value = 0;
    // SAFETY: `value` is a live out-pointer; a bad device or attribute is refused with a status.
    unsafe { call!(cuDeviceGetAttribute(&mut value, attribute, device)) }?;
    Ok(value)
}

/// `cuDevicePrimaryCtxRetain`: the device's primary context, retained (Atlas never releases it).
pub(crate) fn primary_context(device: CUdevice) -> Result<CUcontext> {
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `context` is a live out-pointer; a bad device is refused with a status.
    unsafe { call!(cuDevicePrimaryCtxRetain(&mut context, device)) }?;
    Ok(context)
}

/// `cuCtxGetCurrent`: the calling thread's current context (null when none).
#[inline]
pub(crate) fn current_context() -> Result<CUcontext> {
    let d = driver()?;
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: `current` is a live out-pointer; the call only reads the thread's current context.
    let status = unsafe { (d.ctx_get_current)(&mut current) };
    check(status, "cuCtxGetCurrent")?;
    Ok(current)
}

/// `cuCtxSetCurrent`.
///
/// # Safety
///
/// 1. `context` is live (Atlas only binds primary contexts it retained and never releases).
#[inline]
pub(crate) unsafe fn set_current_context(context: CUcontext) -> Result<()> {
    let d = driver()?;
    // SAFETY: duty 1.
    let status = unsafe { (d.ctx_set_current)(context) };
    check(status, "cuCtxSetCurrent")
}

// Modules and libraries.

/// JIT options for a load: none, or an error log buffer that the driver fills on failure.
pub(crate) struct JitLog {
    buffer: Vec<u8>,
    options: [CUjit_option; 2],
    values: [*mut c_void; 2],
}

impl JitLog {
    /// Bytes of the error log buffer handed to the driver.
    const BYTES: usize = 16 * 1024;

    /// A zeroed log buffer: on early failures the driver may write neither the log nor its length.
    pub(crate) fn new() -> Self {
        let mut buffer = vec![0u8; Self::BYTES];
        let values = [buffer.as_mut_ptr().cast(), Self::BYTES as *mut c_void];
        Self {
            buffer,
            options: [
                CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
                CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            ],
            values,
        }
    }

    /// What the driver wrote: up to the length it reports, bounded by the buffer, cut at the
    /// first NUL.
    pub(crate) fn text(&self) -> String {
        let written = (self.values[1] as usize).min(Self::BYTES);
        let log = &self.buffer[..written];
        let log = log.split(|&b| b == 0).next().unwrap_or(log);
        String::from_utf8_lossy(log).into_owned()
    }

    /// The option count and arrays for a loader call, or none.
    fn arrays(log: Option<&mut Self>) -> (u32, *mut CUjit_option, *mut *mut c_void) {
        match log {
            Some(log) => (2, log.options.as_mut_ptr(), log.values.as_mut_ptr()),
            None => (0, std::ptr::null_mut(), std::ptr::null_mut()),
        }
    }
}

/// `cuModuleLoadData`, or `cuModuleLoadDataEx` with a JIT log: loads `image` in the current
/// context.
///
/// # Safety
///
/// 1. `image` is a blob that passed Atlas's validation (PTX NUL-terminated).
/// 2. The context to load into is current.
pub(crate) unsafe fn module_load(image: &[u8], log: Option<&mut JitLog>) -> Result<CUmodule> {
    let mut module: CUmodule = std::ptr::null_mut();
    let image: *const c_void = image.as_ptr().cast();
    match log {
        // SAFETY: duties 1 and 2; `module` is a live out-pointer.
        None => unsafe { call!(cuModuleLoadData(&mut module, image)) }?,
        Some(log) => {
            let (count, options, values) = JitLog::arrays(Some(log));
            // SAFETY: as above; the options and values are matching arrays of `count`, the log
            // buffer lives through the call.
            unsafe {
                call!(cuModuleLoadDataEx(
                    &mut module,
                    image,
                    count,
                    options,
                    values
                ))
            }?
        }
    }
    Ok(module)
}

/// `cuModuleUnload`.
///
/// # Safety
///
/// 1. `module` is live, was loaded by [`module_load`] (not a library's view), and is unloaded once.
/// 2. Its context is current.
pub(crate) unsafe fn module_unload(module: CUmodule) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuModuleUnload(module)) }
}

/// `cuModuleGetFunction`.
///
/// # Safety
///
/// 1. `module` is live; its context is current.
pub(crate) unsafe fn module_function(module: CUmodule, name: &CStr) -> Result<CUfunction> {
    let mut function: CUfunction = std::ptr::null_mut();
    // SAFETY: duty 1; `function` is a live out-pointer, `name` NUL-terminated.
    unsafe { call!(cuModuleGetFunction(&mut function, module, name.as_ptr())) }?;
    Ok(function)
}

/// `cuModuleGetGlobal`: the address and size of a `__device__` variable.
///
/// # Safety
///
/// 1. `module` is live; its context is current.
pub(crate) unsafe fn module_global(module: CUmodule, name: &CStr) -> Result<(CUdeviceptr, usize)> {
    let (mut ptr, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: duty 1; both out-pointers are live, `name` NUL-terminated.
    unsafe {
        call!(cuModuleGetGlobal_v2(
            &mut ptr,
            &mut size,
            module,
            name.as_ptr()
        ))
    }?;
    Ok((ptr, size))
}

/// Whether the driver can list a module's functions (`cuModuleGetFunctionCount`,
/// `cuModuleEnumerateFunctions` and `cuFuncGetName`: CUDA 12.4+; injection libraries may lack
/// them).
pub(crate) fn can_enumerate_functions() -> bool {
    driver().is_ok_and(|d| {
        d.cuda.cuModuleGetFunctionCount.is_ok()
            && d.cuda.cuModuleEnumerateFunctions.is_ok()
            && d.cuda.cuFuncGetName.is_ok()
    })
}

/// `cuModuleGetFunctionCount`, then `cuModuleEnumerateFunctions`: every function of `module`.
///
/// # Safety
///
/// 1. `module` is live; its context is current.
pub(crate) unsafe fn module_functions(module: CUmodule) -> Result<Vec<CUfunction>> {
    let mut count = 0u32;
    // SAFETY: duty 1; `count` is a live out-pointer.
    unsafe { call!(cuModuleGetFunctionCount(&mut count, module)) }?;
    let mut functions: Vec<CUfunction> = vec![std::ptr::null_mut(); count as usize];
    if count > 0 {
        // SAFETY: duty 1; `functions` has room for the `count` handles the call writes.
        unsafe {
            call!(cuModuleEnumerateFunctions(
                functions.as_mut_ptr(),
                count,
                module
            ))
        }?;
    }
    Ok(functions)
}

/// `cuFuncGetName`: the function's symbol name (mangled, for C++ kernels).
///
/// # Safety
///
/// 1. `function` is live.
pub(crate) unsafe fn function_name(function: CUfunction) -> Result<String> {
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: duty 1; `name` is a live out-pointer.
    unsafe { call!(cuFuncGetName(&mut name, function)) }?;
    if name.is_null() {
        return Ok(String::new());
    }
    // SAFETY: the driver returns a NUL-terminated name that lives as long as the function.
    Ok(unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned())
}

/// `cuFuncLoad`: loads a lazily loaded function's code now; `Ok` without a call on drivers that
/// lack it (older than CUDA 12.4, which load every function with its module).
///
/// # Safety
///
/// 1. `function` is live; its context is current.
pub(crate) unsafe fn function_load(function: CUfunction) -> Result<()> {
    if driver()?.cuda.cuFuncLoad.is_err() {
        return Ok(());
    }
    // SAFETY: duty 1.
    unsafe { call!(cuFuncLoad(function)) }
}

/// `cuDriverGetVersion`: the CUDA release of the driver as `(major, minor)` (it answers `1000 *
/// major + 10 * minor`), asked once per process: the driver is loaded once.
pub(crate) fn cuda_version() -> Result<(u32, u32)> {
    static VERSION: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    if let Some(&version) = VERSION.get() {
        return Ok(version);
    }
    let mut version = 0;
    // SAFETY: `version` is a live out-pointer.
    unsafe { call!(cuDriverGetVersion(&mut version)) }?;
    let version = u32::try_from(version).unwrap_or(0);
    Ok(*VERSION.get_or_init(|| (version / 1000, version % 1000 / 10)))
}

/// `cuLibraryLoadData`: loads `image` for every context, with no library options.
///
/// # Safety
///
/// 1. `image` is a blob that passed Atlas's validation (PTX NUL-terminated).
pub(crate) unsafe fn library_load(image: &[u8], log: Option<&mut JitLog>) -> Result<CUlibrary> {
    let mut library: CUlibrary = std::ptr::null_mut();
    let (count, options, values) = JitLog::arrays(log);
    // SAFETY: duty 1; `library` is a live out-pointer; the JIT options and values are matching
    // arrays of `count` (or none), no library options.
    unsafe {
        call!(cuLibraryLoadData(
            &mut library,
            image.as_ptr().cast(),
            options,
            values,
            count,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0
        ))
    }?;
    Ok(library)
}

/// `cuLibraryGetModule`: the library's module in the current context (compiling PTX for it on
/// first use).
///
/// # Safety
///
/// 1. `library` is live; the context to get the module for is current.
pub(crate) unsafe fn library_module(library: CUlibrary) -> Result<CUmodule> {
    let mut module: CUmodule = std::ptr::null_mut();
    // SAFETY: duty 1; `module` is a live out-pointer.
    unsafe { call!(cuLibraryGetModule(&mut module, library)) }?;
    Ok(module)
}

/// `cuLibraryUnload`.
///
/// # Safety
///
/// 1. `library` is live and unloaded once, after every use of its modules.
pub(crate) unsafe fn library_unload(library: CUlibrary) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuLibraryUnload(library)) }
}

// Functions.

/// Whether the driver has `cuFuncGetParamInfo` (CUDA 12.4+; injection libraries may lack it).
pub(crate) fn has_param_info() -> bool {
    driver().is_ok_and(|d| d.cuda.cuFuncGetParamInfo.is_ok())
}

/// `cuFuncGetParamInfo`: the offset and size of parameter `index`, or `None` past the last one.
///
/// # Safety
///
/// 1. `function` is live.
pub(crate) unsafe fn param_info(
    function: CUfunction,
    index: usize,
) -> Result<Option<(usize, usize)>> {
    let f = atlas_sys::resolve(&driver()?.cuda.cuFuncGetParamInfo, "cuFuncGetParamInfo")
        .map_err(Error::Missing)?;
    let (mut offset, mut size) = (0usize, 0usize);
    // SAFETY: duty 1; both out-pointers are live.
    let status = unsafe { f(function, index, &mut offset, &mut size) };
    if status == CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(None);
    }
    check(status, "cuFuncGetParamInfo")?;
    Ok(Some((offset, size)))
}

/// `cuFuncGetAttribute`.
///
/// # Safety
///
/// 1. `function` is live.
pub(crate) unsafe fn function_attribute(
    function: CUfunction,
    attribute: CUfunction_attribute,
) -> Result<i32> {
    let mut value = 0;
    // SAFETY: duty 1; `value` is a live out-pointer.
    unsafe { call!(cuFuncGetAttribute(&mut value, attribute, function)) }?;
    Ok(value)
}

/// `cuFuncSetAttribute`.
///
/// # Safety
///
/// 1. `function` is live.
pub(crate) unsafe fn set_function_attribute(
    function: CUfunction,
    attribute: CUfunction_attribute,
    value: i32,
) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuFuncSetAttribute(function, attribute, value)) }
}

/// `cuLaunchKernel` with a parameter array: the hot path, through `launch`, the entry point
/// resolved once (a host keeps it where a launch reads the rest of what it needs).
///
/// # Safety
///
/// 1. `launch` is the loaded driver's `cuLaunchKernel`.
/// 2. `function` is live, and `stream` is a live stream of its context or null (then the
///    function's context is current).
/// 3. `params` points to one pointer per kernel parameter, each to a value of that parameter's
///    type, valid during the call (or is null for a kernel without parameters).
/// 4. What the kernel reads and writes through its arguments is valid memory of the function's
///    device that stays allocated until the kernel has run.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn launch_kernel(
    launch: LaunchKernelFn,
    function: CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem_bytes: u32,
    stream: CUstream,
    params: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: duties 1–4; no `extra` array.
    let status = unsafe {
        launch(
            function,
            grid.0,
            grid.1,
            grid.2,
            block.0,
            block.1,
            block.2,
            shared_mem_bytes,
            stream,
            params,
            std::ptr::null_mut(),
        )
    };
    check(status, "cuLaunchKernel")
}

// Memory.

/// `cuMemAlloc`: `bytes` (more than 0) of device memory in the current context.
pub(crate) fn mem_alloc(bytes: usize) -> Result<CUdeviceptr> {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a live out-pointer; without a current context the call fails cleanly.
    unsafe { call!(cuMemAlloc_v2(&mut ptr, bytes)) }?;
    Ok(ptr)
}

/// `cuMemFree`.
///
/// # Safety
///
/// 1. `ptr` was allocated by [`mem_alloc`], is freed once, and no enqueued work still uses it.
/// 2. Its context is current.
pub(crate) unsafe fn mem_free(ptr: CUdeviceptr) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuMemFree_v2(ptr)) }
}

/// `cuMemcpyHtoDAsync`.
///
/// # Safety
///
/// 1. `dst` is device memory with room for `bytes`, and `stream` a live stream of its context,
///    or null (then that context is current).
/// 2. `src` holds `bytes` readable bytes that stay valid and unmodified until the copy is done.
pub(crate) unsafe fn copy_to_device(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuMemcpyHtoDAsync_v2(dst, src, bytes, stream)) }
}

/// `cuMemcpyDtoHAsync`.
///
/// # Safety
///
/// 1. `src` is device memory holding `bytes`, and `stream` a live stream of its context, or null
///    (then that context is current).
/// 2. `dst` has room for `bytes` and stays valid, unread and unwritten, until the copy is done.
pub(crate) unsafe fn copy_to_host(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuMemcpyDtoHAsync_v2(dst, src, bytes, stream)) }
}

// Streams.

/// `cuStreamCreate` in the current context.
pub(crate) fn stream_create(flags: u32) -> Result<CUstream> {
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: `stream` is a live out-pointer; without a current context the call fails cleanly.
    unsafe { call!(cuStreamCreate(&mut stream, flags)) }?;
    Ok(stream)
}

/// `cuStreamDestroy`.
///
/// # Safety
///
/// 1. `stream` is live, was created by [`stream_create`], and is destroyed once; its context is
///    current.
pub(crate) unsafe fn stream_destroy(stream: CUstream) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuStreamDestroy_v2(stream)) }
}

/// `cuStreamGetCtx`: the context `stream` was created in (for a default stream handle, the
/// current context).
///
/// # Safety
///
/// 1. `stream` is live, or a default stream handle (null, `CU_STREAM_LEGACY`,
///    `CU_STREAM_PER_THREAD`).
pub(crate) unsafe fn stream_context(stream: CUstream) -> Result<CUcontext> {
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: duty 1; `context` is a live out-pointer.
    unsafe { call!(cuStreamGetCtx(stream, &mut context)) }?;
    Ok(context)
}

/// `cuCtxSynchronize`: waits for all work of the current context.
pub(crate) fn context_synchronize() -> Result<()> {
    // SAFETY: no arguments; without a current context the call fails cleanly.
    unsafe { call!(cuCtxSynchronize()) }
}

/// `cuStreamSynchronize`, through the pointer resolved once.
///
/// # Safety
///
/// 1. `stream` is live, or null (then its context is current).
#[inline]
pub(crate) unsafe fn stream_synchronize(stream: CUstream) -> Result<()> {
    let d = driver()?;
    // SAFETY: duty 1.
    let status = unsafe { (d.stream_synchronize)(stream) };
    check(status, "cuStreamSynchronize")
}

/// `cuStreamBeginCapture`.
///
/// # Safety
///
/// 1. `stream` is live and not null; its context is current.
pub(crate) unsafe fn begin_capture(stream: CUstream, mode: CUstreamCaptureMode) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuStreamBeginCapture_v2(stream, mode)) }
}

/// `cuStreamEndCapture`: the captured graph.
///
/// # Safety
///
/// 1. `stream` is live; its context is current.
pub(crate) unsafe fn end_capture(stream: CUstream) -> Result<CUgraph> {
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: duty 1; `graph` is a live out-pointer.
    unsafe { call!(cuStreamEndCapture(stream, &mut graph)) }?;
    Ok(graph)
}

// Graphs.

/// `cuGraphGetNodes` (twice: the count, then the nodes).
///
/// # Safety
///
/// 1. `graph` is live.
pub(crate) unsafe fn graph_nodes(graph: CUgraph) -> Result<Vec<CUgraphNode>> {
    let mut count = 0usize;
    // SAFETY: duty 1; a null node array asks for the count only.
    unsafe { call!(cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count)) }?;
    if count == 0 {
        // Asking for zero nodes is an error to the driver (`CUDA_ERROR_INVALID_VALUE`).
        return Ok(Vec::new());
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: duty 1; the array has room for `count` nodes.
    unsafe { call!(cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count)) }?;
    nodes.truncate(count);
    Ok(nodes)
}

/// `cuGraphNodeGetType`.
///
/// # Safety
///
/// 1. `node` is a node of a live graph.
pub(crate) unsafe fn graph_node_type(node: CUgraphNode) -> Result<CUgraphNodeType> {
    let mut kind = CUgraphNodeType(u32::MAX);
    // SAFETY: duty 1; `kind` is a live out-pointer.
    unsafe { call!(cuGraphNodeGetType(node, &mut kind)) }?;
    Ok(kind)
}

/// `cuGraphInstantiateWithFlags`, no flags.
///
/// # Safety
///
/// 1. `graph` is live; its context is current.
/// 2. Every module whose kernels the graph launches is loaded: the driver follows the functions
///    (it crashes on an unloaded one).
pub(crate) unsafe fn graph_instantiate(graph: CUgraph) -> Result<CUgraphExec> {
    let mut exec: CUgraphExec = std::ptr::null_mut();
    // SAFETY: duties 1 and 2; `exec` is a live out-pointer.
    unsafe { call!(cuGraphInstantiateWithFlags(&mut exec, graph, 0)) }?;
    Ok(exec)
}

/// `cuGraphLaunch`.
///
/// # Safety
///
/// 1. `exec` is live, and `stream` a live stream of its context or null (then that context is
///    current).
/// 2. What the graph's kernels read and write is valid, allocated memory of its device, and every
///    module whose kernels it launches is loaded.
pub(crate) unsafe fn graph_launch(exec: CUgraphExec, stream: CUstream) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuGraphLaunch(exec, stream)) }
}

/// `cuGraphExecKernelNodeSetParams`.
///
/// # Safety
///
/// 1. `exec` is live and `node` is a kernel node of the graph it was instantiated from.
/// 2. `params` names a live function of the graph's context, and its parameter array matches the
///    function (the driver copies it during the call).
pub(crate) unsafe fn graph_set_kernel_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: &CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuGraphExecKernelNodeSetParams_v2(exec, node, params)) }
}

/// The cluster dimensions and the cooperative flag of a kernel node
/// (`cuGraphKernelNodeGetAttribute` of `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION` and
/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`): `(0, 0, 0)` and `false` for a node launched without them.
///
/// # Safety
///
/// 1. `node` is a kernel node of a live graph.
pub(crate) unsafe fn kernel_node_attributes(node: CUgraphNode) -> Result<((u32, u32, u32), bool)> {
    let read = |id| {
        let mut value = CUlaunchAttributeValue { pad: [0; 64] };
        // SAFETY: duty 1; `value` is a live out-pointer of the attribute value type.
        unsafe { call!(cuGraphKernelNodeGetAttribute(node, id, &mut value)) }?;
        Ok(value)
    };
    let cluster = read(CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)?;
    let cooperative = read(CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE)?;
    // SAFETY: each union was written by the driver through the field its id names.
    let (dims, cooperative) = unsafe { (cluster.clusterDim, cooperative.cooperative) };
    Ok(((dims.x, dims.y, dims.z), cooperative != 0))
}

/// Whether graph node `node` depends on another through a programmatic edge (of type
/// `CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC`, what a captured programmatic dependent launch
/// becomes), by `cuGraphNodeGetDependencies_v2` (twice: the count, then the edges); `None` on a
/// driver without it (before CUDA 12.3).
///
/// # Safety
///
/// 1. `node` is a live node of a live graph; its context is current.
pub(crate) unsafe fn has_programmatic_dependency(node: CUgraphNode) -> Result<Option<bool>> {
    if driver()?.cuda.cuGraphNodeGetDependencies_v2.is_err() {
        return Ok(None);
    }
    let mut count = 0usize;
    // SAFETY: duty 1; null arrays ask for the count, written to a live out-pointer.
    unsafe {
        call!(cuGraphNodeGetDependencies_v2(
            node,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut count
        ))
    }?;
    if count == 0 {
        return Ok(Some(false));
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
    let no_edge = CUgraphEdgeData {
        from_port: 0,
        to_port: 0,
        type_: 0,
        reserved: [0; 5],
    };
    let mut edges = vec![no_edge; count];
    // SAFETY: duty 1; both arrays hold `count` entries, the most the driver writes.
    unsafe {
        call!(cuGraphNodeGetDependencies_v2(
            node,
            nodes.as_mut_ptr(),
            edges.as_mut_ptr(),
            &mut count
        ))
    }?;
    let programmatic = CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC.0;
    Ok(Some(
        edges
            .iter()
            .take(count)
            .any(|edge| u32::from(edge.type_) == programmatic),
    ))
}

/// `cuGraphKernelNodeGetParams_v2`: the function kernel node `node` launches.
///
/// # Safety
///
/// 1. `node` is a live kernel node of a live graph; its context is current.
pub(crate) unsafe fn kernel_node_function(node: CUgraphNode) -> Result<CUfunction> {
    // SAFETY: all-zero bytes are a valid value of this plain C struct (null pointers, zeros).
    let mut params: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: duty 1; `params` is a live out-pointer of the type the call writes.
    unsafe { call!(cuGraphKernelNodeGetParams_v2(node, &mut params)) }?;
    Ok(params.func)
}

/// `cuGraphExecDestroy`.
///
/// # Safety
///
/// 1. `exec` is live and destroyed once; its context is current.
pub(crate) unsafe fn graph_exec_destroy(exec: CUgraphExec) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuGraphExecDestroy(exec)) }
}

/// `cuGraphDestroy`.
///
/// # Safety
///
/// 1. `graph` is live and destroyed once, after the executable graphs made from it; its context
///    is current.
pub(crate) unsafe fn graph_destroy(graph: CUgraph) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuGraphDestroy(graph)) }
}

// Graph updates and conditional nodes.

/// The entry points of whole-graph update and upload that this driver lacks (all present from
/// CUDA 12.0 on).
pub(crate) fn missing_graph_update() -> Result<Vec<&'static str>> {
    let cuda = driver()?.cuda;
    Ok(missing(&[
        ("cuGraphExecUpdate_v2", cuda.cuGraphExecUpdate_v2.is_ok()),
        ("cuGraphUpload", cuda.cuGraphUpload.is_ok()),
    ]))
}

/// The entry points of conditional graph nodes that this driver lacks (all present from CUDA
/// 12.3 on).
pub(crate) fn missing_conditional() -> Result<Vec<&'static str>> {
    let cuda = driver()?.cuda;
    Ok(missing(&[
        (
            "cuGraphConditionalHandleCreate",
            cuda.cuGraphConditionalHandleCreate.is_ok(),
        ),
        ("cuGraphAddNode_v2", cuda.cuGraphAddNode_v2.is_ok()),
        (
            "cuStreamGetCaptureInfo_v3",
            cuda.cuStreamGetCaptureInfo_v3.is_ok(),
        ),
        (
            "cuStreamUpdateCaptureDependencies_v2",
            cuda.cuStreamUpdateCaptureDependencies_v2.is_ok(),
        ),
        (
            "cuStreamBeginCaptureToGraph",
            cuda.cuStreamBeginCaptureToGraph.is_ok(),
        ),
    ]))
}

fn missing(entries: &[(&'static str, bool)]) -> Vec<&'static str> {
    entries
        .iter()
        .filter(|(_, present)| !present)
        .map(|(name, _)| *name)
        .collect()
}

/// `cuGraphExecUpdate_v2`: `Ok(SUCCESS)` when `exec` now runs `graph`'s parameters, or the
/// driver's reason (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`) when it cannot be updated and was
/// left as it was; any other failure is an error.
///
/// # Safety
///
/// 1. `exec` and `graph` are live, of one context, which is current.
/// 2. Every module whose kernels either graph launches is loaded.
pub(crate) unsafe fn graph_exec_update(
    exec: CUgraphExec,
    graph: CUgraph,
) -> Result<CUgraphExecUpdateResult> {
    let f = atlas_sys::resolve(&driver()?.cuda.cuGraphExecUpdate_v2, "cuGraphExecUpdate_v2")
        .map_err(Error::Missing)?;
    let mut info = CUgraphExecUpdateResultInfo {
        result: CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
        errorNode: std::ptr::null_mut(),
        errorFromNode: std::ptr::null_mut(),
    };
    // SAFETY: duties 1 and 2; `info` is a live out-pointer.
    let status = unsafe { f(exec, graph, &mut info) };
    if status == CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE {
        return Ok(info.result);
    }
    check(status, "cuGraphExecUpdate_v2")?;
    Ok(CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS)
}

/// `cuGraphUpload`.
///
/// # Safety
///
/// 1. `exec` is live, and `stream` a live stream of its context or null (then that context is
///    current).
/// 2. Every module whose kernels the graph launches is loaded.
pub(crate) unsafe fn graph_upload(exec: CUgraphExec, stream: CUstream) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuGraphUpload(exec, stream)) }
}

/// What `cuStreamGetCaptureInfo_v3` says of a stream: `None` when it is not capturing, else
/// the graph being built and the nodes the next captured work will depend on (copied out, with
/// their edge data).
pub(crate) struct CaptureState {
    /// The driver's id of the capture, unique in the process.
    pub(crate) id: u64,
    /// The graph under construction.
    pub(crate) graph: CUgraph,
    /// The current dependency set.
    pub(crate) dependencies: Vec<CUgraphNode>,
    /// One edge record per dependency, or empty when the driver gave none (default edges).
    pub(crate) edges: Vec<CUgraphEdgeData>,
}

/// `cuStreamGetCaptureInfo_v3`: the capture `stream` is in, if any. An invalidated capture is an
/// error (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
///
/// # Safety
///
/// 1. `stream` is live and not null; its context is current.
pub(crate) unsafe fn capture_state(stream: CUstream) -> Result<Option<CaptureState>> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0u64;
    let mut graph: CUgraph = std::ptr::null_mut();
    let mut deps: *const CUgraphNode = std::ptr::null();
    let mut edges: *const CUgraphEdgeData = std::ptr::null();
    let mut count = 0usize;
    // SAFETY: duty 1; every out-pointer is live.
    unsafe {
        call!(cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            &mut id,
            &mut graph,
            &mut deps,
            &mut edges,
            &mut count
        ))
    }?;
    match status {
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => {}
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
            return Err(Error::Failed(super::DriverFailure {
                call: "cuStreamGetCaptureInfo_v3",
                subject: "the stream's capture".into(),
                code: CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.0,
            }));
        }
        _ => return Ok(None),
    }
    // SAFETY: the driver's arrays hold `count` entries (or are null) and stay valid until the next
    // call on the stream; they are copied out at once.
    let (dependencies, edges) = unsafe { (copy_out(deps, count), copy_out(edges, count)) };
    Ok(Some(CaptureState {
        id,
        graph,
        dependencies,
        edges,
    }))
}

/// The `n` values at `p`, or none when `p` is null.
///
/// # Safety
///
/// 1. `p` is null or points to `n` initialised values, valid during the call.
unsafe fn copy_out<T: Copy>(p: *const T, n: usize) -> Vec<T> {
    if p.is_null() || n == 0 {
        Vec::new()
    } else {
        // SAFETY: duty 1.
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    }
}

/// `cuGraphConditionalHandleCreate`: a handle of `graph` whose value is set to `default` at the
/// start of every launch of a graph instantiated from it (`CU_GRAPH_COND_ASSIGN_DEFAULT`).
///
/// # Safety
///
/// 1. `graph` is live; `context` is live and the graph's.
pub(crate) unsafe fn conditional_handle_create(
    graph: CUgraph,
    context: CUcontext,
    default: u32,
) -> Result<CUgraphConditionalHandle> {
    let mut handle: CUgraphConditionalHandle = 0;
    // SAFETY: duty 1; `handle` is a live out-pointer.
    unsafe {
        call!(cuGraphConditionalHandleCreate(
            &mut handle,
            graph,
            context,
            default,
            atlas_sys::CU_GRAPH_COND_ASSIGN_DEFAULT
        ))
    }?;
    Ok(handle)
}

/// `cuGraphAddNode_v2` of a conditional node of `kind` with `size` body graphs: the node and its
/// bodies, in branch order, which the node owns (the driver destroys them with the node's graph;
/// they must never be destroyed on their own).
///
/// # Safety
///
/// 1. `graph` is live and `context` its context; `handle` was created for `graph`.
/// 2. `dependencies` are nodes of `graph`; `edges` is empty or holds one record per dependency.
/// 3. `size` is one the driver takes for `kind` (1 for WHILE, 1 or 2 for IF, at least 1 for
///    SWITCH) and the driver's release has nodes of that kind and size.
pub(crate) unsafe fn add_conditional_node(
    graph: CUgraph,
    dependencies: &[CUgraphNode],
    edges: &[CUgraphEdgeData],
    handle: CUgraphConditionalHandle,
    (kind, size): (CUgraphConditionalNodeType, u32),
    context: CUcontext,
) -> Result<(CUgraphNode, Vec<CUgraph>)> {
    // SAFETY: CUgraphNodeParams is plain C data (integers, pointers, unions of them), for which all
    // zero bytes are a valid value: null pointers and zero counts, as the driver asks for unused
    // fields.
    let mut params: CUgraphNodeParams = unsafe { std::mem::zeroed() };
    params.type_ = CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
    params.__bindgen_anon_1.conditional = CUDA_CONDITIONAL_NODE_PARAMS {
        handle,
        type_: kind,
        size,
        phGraph_out: std::ptr::null_mut(),
        ctx: context,
    };
    let edge_data = if edges.len() == dependencies.len() && !edges.is_empty() {
        edges.as_ptr()
    } else {
        std::ptr::null()
    };
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: duties 1 to 3; `node` and `params` are live; the driver fills `phGraph_out` with an
    // array it owns.
    unsafe {
        call!(cuGraphAddNode_v2(
            &mut node,
            graph,
            dependencies.as_ptr(),
            edge_data,
            dependencies.len(),
            &mut params
        ))
    }?;
    // SAFETY: the union holds the conditional parameters written above, which the call filled.
    let bodies = unsafe { params.__bindgen_anon_1.conditional.phGraph_out };
    if bodies.is_null() {
        return Err(Error::Failed(super::DriverFailure {
            call: "cuGraphAddNode_v2",
            subject: "a conditional node without body graphs".into(),
            code: CUresult::CUDA_ERROR_UNKNOWN.0,
        }));
    }
    // SAFETY: a node of `size` branches has `size` body graphs in the driver's array, valid for
    // the node's life; they are copied out at once.
    Ok((node, unsafe { copy_out(bodies, size as usize) }))
}

/// `cuStreamUpdateCaptureDependencies_v2` with `CU_STREAM_SET_CAPTURE_DEPENDENCIES`: the next
/// work captured on `stream` depends on `node` alone.
///
/// # Safety
///
/// 1. `stream` is live and capturing into the graph `node` belongs to; its context is current.
pub(crate) unsafe fn set_capture_dependency(stream: CUstream, node: CUgraphNode) -> Result<()> {
    let mut nodes = [node];
    let flags = CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES.0;
    // SAFETY: duty 1; one node, default edge.
    unsafe {
        call!(cuStreamUpdateCaptureDependencies_v2(
            stream,
            nodes.as_mut_ptr(),
            std::ptr::null(),
            1,
            flags
        ))
    }
}

/// `cuStreamBeginCaptureToGraph`: captures `stream`'s work into the existing `graph`, from its
/// roots.
///
/// # Safety
///
/// 1. `stream` is live, not null and not capturing; `graph` is live, of the stream's context,
///    which is current.
pub(crate) unsafe fn begin_capture_to_graph(
    stream: CUstream,
    graph: CUgraph,
    mode: CUstreamCaptureMode,
) -> Result<()> {
    // SAFETY: duty 1; no dependencies.
    unsafe {
        call!(cuStreamBeginCaptureToGraph(
            stream,
            graph,
            std::ptr::null(),
            std::ptr::null(),
            0,
            mode
        ))
    }
}

// Stream priorities and capture state.

/// `cuCtxGetStreamPriorityRange` in the current context: `(least, greatest)`. Numerically
/// `greatest <= least`: a lower number is a higher priority.
pub(crate) fn stream_priority_range() -> Result<(i32, i32)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: both out-pointers are live; without a current context the call fails cleanly.
    unsafe { call!(cuCtxGetStreamPriorityRange(&mut least, &mut greatest)) }?;
    Ok((least, greatest))
}

/// `cuStreamCreateWithPriority` in the current context.
pub(crate) fn stream_create_with_priority(flags: u32, priority: i32) -> Result<CUstream> {
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: `stream` is a live out-pointer; without a current context the call fails cleanly,
    // and the driver clamps a priority outside the range (Atlas refuses those before).
    unsafe { call!(cuStreamCreateWithPriority(&mut stream, flags, priority)) }?;
    Ok(stream)
}

/// `cuStreamGetPriority`.
///
/// # Safety
///
/// 1. `stream` is live, or null (then its context is current).
pub(crate) unsafe fn stream_priority(stream: CUstream) -> Result<i32> {
    let mut priority = 0;
    // SAFETY: duty 1; `priority` is a live out-pointer.
    unsafe { call!(cuStreamGetPriority(stream, &mut priority)) }?;
    Ok(priority)
}

/// `cuStreamGetCaptureInfo_v2`: the driver's id of the capture `stream` takes part in (the one
/// begun on it, or one it joined by waiting for an event of a capturing stream), active or
/// invalidated; `None` when it takes part in none.
///
/// # Safety
///
/// 1. `stream` is live and not null.
pub(crate) unsafe fn capture_id(stream: CUstream) -> Result<Option<u64>> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0u64;
    // SAFETY: duty 1; `status` and `id` are live out-pointers, the others null (not asked for).
    unsafe {
        call!(cuStreamGetCaptureInfo_v2(
            stream,
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut()
        ))
    }?;
    Ok((status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id))
}

/// `cuStreamIsCapturing`: whether a capture is in progress on `stream` (active, or invalidated and
/// not yet ended).
///
/// # Safety
///
/// 1. `stream` is live, or null (then its context is current).
pub(crate) unsafe fn stream_is_capturing(stream: CUstream) -> Result<bool> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: duty 1; `status` is a live out-pointer.
    unsafe { call!(cuStreamIsCapturing(stream, &mut status)) }?;
    Ok(status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

// Launch attributes.

/// `cuLaunchKernelEx`: a launch with attributes (CUDA 12.0+; a missing entry point is
/// [`Error::Missing`] naming it). `config` carries grid, block, shared memory, stream and the
/// attribute array.
///
/// # Safety
///
/// 1. `function` is live, and `config.hStream` is a live stream of its context or null (then the
///    function's context is current).
/// 2. `config.attrs` points to `config.numAttrs` initialised attributes (or is null with 0), valid
///    during the call; an event an attribute names is live and of the function's context.
/// 3. `params` points to one pointer per kernel parameter, each to a value of that parameter's
///    type, valid during the call (or is null for a kernel without parameters).
/// 4. What the kernel reads and writes through its arguments is valid memory of the function's
///    device that stays allocated until the kernel has run.
#[inline]
pub(crate) unsafe fn launch_kernel_ex(
    config: &atlas_sys::CUlaunchConfig,
    function: CUfunction,
    params: *mut *mut c_void,
) -> Result<()> {
    let d = driver()?;
    let Some(launch) = d.launch_kernel_ex else {
        return Err(missing_launch_ex(d));
    };
    // SAFETY: duties 1–4; no `extra` array.
    let status = unsafe { launch(config, function, params, std::ptr::null_mut()) };
    check(status, "cuLaunchKernelEx")
}

/// The error for a driver without `cuLaunchKernelEx`, naming it.
#[cold]
fn missing_launch_ex(d: &super::Driver) -> Error {
    match atlas_sys::resolve(&d.cuda.cuLaunchKernelEx, "cuLaunchKernelEx") {
        Err(missing) => Error::Missing(missing),
        Ok(_) => Error::Failed(super::DriverFailure {
            call: "cuLaunchKernelEx",
            subject: "the entry point resolved late".into(),
            code: atlas_sys::CUresult::CUDA_ERROR_NOT_FOUND.0,
        }),
    }
}

/// `cuOccupancyMaxPotentialClusterSize`: the most blocks in a cluster of `function` that the
/// device runs at once with `config`'s block size and dynamic shared memory (its cluster
/// dimensions are not read).
///
/// # Safety
///
/// 1. `function` is live; `config.hStream` is a live stream of its context, or null and its
///    context is current; `config.attrs` points to `config.numAttrs` initialised attributes (or
///    is null with 0).
pub(crate) unsafe fn max_potential_cluster_size(
    function: CUfunction,
    config: &atlas_sys::CUlaunchConfig,
) -> Result<i32> {
    let mut size = 0;
    // SAFETY: duty 1; `size` is a live out-pointer.
    unsafe {
        call!(cuOccupancyMaxPotentialClusterSize(
            &mut size, function, config
        ))
    }?;
    Ok(size)
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`: how many blocks of `block_threads` threads
/// and `shared_mem_bytes` of dynamic shared memory one multiprocessor holds at once.
///
/// # Safety
///
/// 1. `function` is live; its context is current.
pub(crate) unsafe fn max_active_blocks_per_multiprocessor(
    function: CUfunction,
    block_threads: i32,
    shared_mem_bytes: usize,
) -> Result<i32> {
    let mut blocks = 0;
    // SAFETY: duty 1; `blocks` is a live out-pointer.
    unsafe {
        call!(cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut blocks,
            function,
            block_threads,
            shared_mem_bytes
        ))
    }?;
    Ok(blocks)
}
