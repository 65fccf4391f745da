//! The driver without Atlas: a context on device 0, plain `cuModuleLoadData` and the driver's own
//! view of a module's kernels, for comparing what Atlas decides with what the driver does.
//!
//! Every call goes through `atlas_sys`; nothing here is checked by Atlas first. Run it in child
//! processes: a blob can crash the driver.

use std::ffi::{CStr, c_char};

use atlas_registry::ParamSlot;
use atlas_sys::{CUcontext, CUdevice, CUfunction, CUmodule, CUresult, CudaDriver};

/// A driver status: 0 for success, else the `CUresult` code.
pub type Code = u32;

fn check(status: CUresult, call: &str) -> Result<(), String> {
    if status == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!(
            "{call} failed: {}",
            atlas_registry::cuda_error_text(status.0)
        ))
    }
}

/// Device 0's primary context, current to the thread that made it.
pub struct Raw {
    cuda: &'static CudaDriver,
    device: CUdevice,
}

impl Raw {
    /// Initialises the driver and makes device 0's primary context current.
    pub fn new() -> Result<Self, String> {
        let cuda = atlas_sys::driver().map_err(|e| e.to_string())?;
        let (mut device, mut ctx): (CUdevice, CUcontext) = (0, std::ptr::null_mut());
        // SAFETY: flags 0; `device` and `ctx` are live out-pointers; the context retained here is
        // released in `drop`.
        unsafe {
            check(cuda.cuInit(0), "cuInit")?;
            check(cuda.cuDeviceGet(&mut device, 0), "cuDeviceGet(0)")?;
            check(
                cuda.cuDevicePrimaryCtxRetain(&mut ctx, device),
                "cuDevicePrimaryCtxRetain",
            )?;
            check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
        }
        Ok(Self { cuda, device })
    }

    /// `cuModuleLoadData(image)`: the module, or the driver's status. PTX must end in a NUL.
    pub fn load(&self, image: &[u8]) -> Result<Module<'_>, Code> {
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: `module` is a live out-pointer; `image` is live for the call, and the driver
        // reads at most the image it describes (that is what is being tested, in a child).
        let status = unsafe {
            self.cuda
                .cuModuleLoadData(&mut module, image.as_ptr().cast())
        };
        if status == CUresult::CUDA_SUCCESS {
            Ok(Module { raw: self, module })
        } else {
            Err(status.0)
        }
    }

    /// Loads `image` and unloads it again: 0, or the status of the load.
    pub fn load_and_unload(&self, image: &[u8]) -> Code {
        self.load(image).map_or_else(|code| code, |_| 0)
    }

    /// The context still works (a failed load left no sticky error behind).
    pub fn usable(&self) -> bool {
        // SAFETY: no arguments; the context is current to this thread.
        unsafe { self.cuda.cuCtxSynchronize() == CUresult::CUDA_SUCCESS }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the context retained in `new`, released once.
        unsafe {
            self.cuda.cuDevicePrimaryCtxRelease_v2(self.device);
        }
    }
}

/// A module loaded by [`Raw::load`]; unloaded when dropped.
pub struct Module<'a> {
    raw: &'a Raw,
    module: CUmodule,
}

impl Module<'_> {
    /// `cuModuleGetFunction(name)`.
    pub fn function(&self, name: &str) -> Result<CUfunction, String> {
        let name = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
        let mut function: CUfunction = std::ptr::null_mut();
        // SAFETY: a live module; `function` is a live out-pointer; `name` is NUL-terminated.
        let status = unsafe {
            self.raw
                .cuda
                .cuModuleGetFunction(&mut function, self.module, name.as_ptr())
        };
        check(status, "cuModuleGetFunction")?;
        Ok(function)
    }

    /// Every kernel of the module as the driver lists it (`cuModuleEnumerateFunctions`,
    /// `cuFuncGetName`) with its parameters as `cuFuncGetParamInfo` reports them, to the first
    /// index it refuses.
    pub fn kernels(&self) -> Result<Vec<(String, Vec<ParamSlot>)>, String> {
        let cuda = self.raw.cuda;
        let mut count = 0u32;
        // SAFETY: a live module; `count` is a live out-pointer.
        let status = unsafe { cuda.cuModuleGetFunctionCount(&mut count, self.module) };
        check(status, "cuModuleGetFunctionCount")?;
        let mut functions: Vec<CUfunction> = vec![std::ptr::null_mut(); count as usize];
        let room = functions.as_mut_ptr();
        // SAFETY: `functions` has room for the `count` handles asked for.
        let status = unsafe { cuda.cuModuleEnumerateFunctions(room, count, self.module) };
        check(status, "cuModuleEnumerateFunctions")?;
        let mut kernels = Vec::new();
        for function in functions {
            let mut name: *const c_char = std::ptr::null();
            // SAFETY: a function of the live module; `name` is a live out-pointer.
            let status = unsafe { cuda.cuFuncGetName(&mut name, function) };
            check(status, "cuFuncGetName")?;
            // SAFETY: on success the driver returns a NUL-terminated name it owns, live while
            // the module is.
            let name = unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            let mut slots = Vec::new();
            loop {
                let (mut offset, mut size) = (0usize, 0usize);
                // SAFETY: a function of the live module; both out-pointers are live locals.
                let status = unsafe {
                    cuda.cuFuncGetParamInfo(function, slots.len(), &mut offset, &mut size)
                };
                if status != CUresult::CUDA_SUCCESS {
                    break;
                }
                slots.push(ParamSlot { offset, size });
            }
            kernels.push((name, slots));
        }
        Ok(kernels)
    }
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        // SAFETY: a module this process loaded, unloaded once.
        unsafe {
            self.raw.cuda.cuModuleUnload(self.module);
        }
    }
}

/// The static shared memory of `function`, in bytes, as the driver reports it
/// (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`).
///
/// # Safety
///
/// 1. `function` is a function of a module that is loaded.
pub unsafe fn shared_bytes(function: CUfunction) -> Result<i32, String> {
    let cuda = atlas_sys::driver().map_err(|e| e.to_string())?;
    let mut bytes = 0;
    let attribute = atlas_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES;
    // SAFETY: `function` is live (duty 1); `bytes` is a live out-pointer.
    let status = unsafe { cuda.cuFuncGetAttribute(&mut bytes, attribute, function) };
    check(status, "cuFuncGetAttribute")?;
    Ok(bytes)
}

/// The driver's CUDA version (`cuDriverGetVersion`: 13000 for CUDA 13.0).
pub fn driver_version() -> Result<i32, String> {
    let cuda = atlas_sys::driver().map_err(|e| e.to_string())?;
    let mut version = 0;
    // SAFETY: `version` is a live out-pointer; the call needs no initialisation.
    let status = unsafe { cuda.cuDriverGetVersion(&mut version) };
    check(status, "cuDriverGetVersion")?;
    Ok(version)
}

/// `image` as `cuModuleLoadData` takes it: PTX text (neither ELF nor fatbin) ends in a NUL.
pub fn as_image(mut blob: Vec<u8>) -> Vec<u8> {
    let binary = blob.starts_with(b"\x7fELF") || blob.starts_with(&0xBA55_ED50u32.to_le_bytes());
    if !binary && blob.last() != Some(&0) {
        blob.push(0);
    }
    blob
}

/// The environment of child processes that load blobs: the driver loads every kernel of a module
/// as `cuModuleLoadData` loads it, not at its first use (`CUDA_MODULE_LOADING=EAGER`, unless
/// the caller chose otherwise), so that everything it reads of a blob is read while the child is
/// watched; and every blob is new to it, so its JIT cache would only be written to
/// (`CUDA_CACHE_DISABLE=1`).
pub fn child_env() -> Vec<(&'static str, String)> {
    let loading = std::env::var("CUDA_MODULE_LOADING").unwrap_or_else(|_| "EAGER".into());
    vec![
        ("CUDA_MODULE_LOADING", loading),
        ("CUDA_CACHE_DISABLE", "1".into()),
    ]
}
