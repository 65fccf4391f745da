//! [`DeviceLimits`]: what one launch may ask of a device, read once per device. A launch is checked
//! against them in `launch::config`, its attributes in `launch::attributes`. And what Atlas knows
//! the driver refuses of a context limit ([`ContextLimit`]) before it is set.

use atlas_sys::{CUdevice, CUdevice_attribute as Attr};

use crate::driver::calls::ContextLimit;
use crate::driver::{About, calls};
use crate::error::{ContextLimitRefusal, Result};

/// The launch limits of one device, read once per [`CudaHost`](crate::CudaHost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Largest block dimension in x, y, z.
    pub max_block: (u32, u32, u32),
    /// Largest grid dimension in x, y, z.
    pub max_grid: (u32, u32, u32),
    /// Most dynamic shared memory one block can get with the opt-in, in bytes.
    pub max_shared_mem_optin: u32,
    /// Streaming multiprocessors (SMs) of the device.
    pub multiprocessors: u32,
    /// Whether the device launches thread block clusters (`CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`).
    pub cluster_launch: bool,
    /// Whether the device makes cooperative launches (`CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH`).
    pub cooperative_launch: bool,
}

/// One device attribute, as a count (a negative answer reads as 0).
pub(crate) fn attribute(device: CUdevice, attribute: Attr, ordinal: usize) -> Result<u32> {
    let value = calls::device_attribute(device, attribute)
        .about(|| format!("device {ordinal}, attribute {}", attribute.0))?;
    Ok(u32::try_from(value).unwrap_or(0))
}

/// The compute capability of `device` (ordinal `ordinal`), read from the driver.
pub(crate) fn compute_capability_of(device: CUdevice, ordinal: usize) -> Result<(u32, u32)> {
    let capability = |a| attribute(device, a, ordinal);
    Ok((
        capability(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        capability(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// The deepest device-runtime synchronization depth the driver takes.
const MAX_SYNC_DEPTH: usize = 24;
/// The largest L2 fetch granularity, in bytes.
const MAX_L2_FETCH_GRANULARITY: usize = 128;

/// Why the driver would refuse setting `limit` to `value`, when its documentation says so
/// beforehand; `compute_capability` is asked only for a limit that depends on it.
pub(crate) fn refuse_setting(
    limit: ContextLimit,
    value: usize,
    compute_capability: impl FnOnce() -> Result<(u32, u32)>,
) -> Result<Option<ContextLimitRefusal>> {
    Ok(match limit {
        ContextLimit::ShmemSize | ContextLimit::CigEnabled => Some(ContextLimitRefusal::ReadOnly),
        ContextLimit::DevRuntimeSyncDepth => match compute_capability()? {
            cc @ (9.., _) => Some(ContextLimitRefusal::Unsupported {
                compute_capability: cc,
            }),
            _ if value > MAX_SYNC_DEPTH => Some(ContextLimitRefusal::TooLarge {
                max: MAX_SYNC_DEPTH,
            }),
            _ => None,
        },
        ContextLimit::MaxL2FetchGranularity if value > MAX_L2_FETCH_GRANULARITY => {
            Some(ContextLimitRefusal::TooLarge {
                max: MAX_L2_FETCH_GRANULARITY,
            })
        }
        _ => None,
    })
}

impl DeviceLimits {
    /// Reads the limits of `device` (ordinal `ordinal`). Its stream and launch priorities are its
    /// context's: [`CudaContext::stream_priorities`](crate::CudaContext::stream_priorities).
    pub(crate) fn read(device: CUdevice, ordinal: usize) -> Result<Self> {
        let get = |a| attribute(device, a, ordinal);
        Ok(Self {
            max_threads_per_block: get(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_block: (
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
            ),
            max_grid: (
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ),
            max_shared_mem_optin: get(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            multiprocessors: get(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            cluster_launch: get(Attr::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)? == 1,
            cooperative_launch: get(Attr::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? == 1,
        })
    }
}
