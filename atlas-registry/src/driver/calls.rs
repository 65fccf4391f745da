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
    CUDA_KERNEL_NODE_PARAMS, CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUfunction,
    CUfunction_attribute, CUgraph, CUgraphExec, CUgraphNode, CUgraphNodeType, CUjit_option,
    CUlibrary, CUmodule, CUresult, CUstream, CUstreamCaptureMode,
};

use super::{Error, Result, check, driver};

/// `call!(cuName(args...))`: resolves `cuName`, calls it and checks the status. Inside an `unsafe`
/// block: the arguments are the wrapper's to get right. For the wrappers of the driver tier only.
macro_rules! call {
    ($name:ident($($arg:expr),* $(,)?)) => {{
        let f = atlas_sys::resolve(&$crate::driver::driver()?.cuda.$name, stringify!($name))
            .map_err($crate::driver::Error::Missing)?;
        $crate::driver::check(f($($arg),*), stringify!($name))
    }};
}

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

/// `cuLaunchKernel` with a parameter array: the hot path, through the pointer resolved once.
///
/// # Safety
///
/// 1. `function` is live, and `stream` is a live stream of its context or null (then the
///    function's context is current).
/// 2. `params` points to one pointer per kernel parameter, each to a value of that parameter's
///    type, valid during the call (or is null for a kernel without parameters).
/// 3. What the kernel reads and writes through its arguments is valid memory of the function's
///    device that stays allocated until the kernel has run.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn launch_kernel(
    function: CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem_bytes: u32,
    stream: CUstream,
    params: *mut *mut c_void,
) -> Result<()> {
    let d = driver()?;
    // SAFETY: duties 1–3; no `extra` array.
    let status = unsafe {
        (d.launch_kernel)(
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
pub(crate) unsafe fn graph_instantiate(graph: CUgraph) -> Result<CUgraphExec> {
    let mut exec: CUgraphExec = std::ptr::null_mut();
    // SAFETY: duty 1; `exec` is a live out-pointer.
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
    // SAFETY: duties 1–4; no `extra` array.
    unsafe {
        call!(cuLaunchKernelEx(
            config,
            function,
            params,
            std::ptr::null_mut()
        ))
    }
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

/// `cuCtxGetStreamPriorityRange`: `(least, greatest)` priority of the current context's device
/// (numerically, greatest ≤ least: lower numbers run first). Without a current context the
/// driver refuses it with a status.
pub(crate) fn stream_priority_range() -> Result<(i32, i32)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: both out-pointers are live; the call only reads the current context's device.
    unsafe { call!(cuCtxGetStreamPriorityRange(&mut least, &mut greatest)) }?;
    Ok((least, greatest))
}
