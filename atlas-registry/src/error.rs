//! [`AtlasError`] and the typed reasons it carries: what was refused and why, as data.

use std::fmt;

use atlas_sys::{LoadError, MissingSymbol, NvrtcLoadError};

use crate::driver::nvrtc::{self, NvrtcFailure, nvrtc_error_text};

use crate::driver::calls::{ContextLimit, TensorDataType, TensorInterleave, TensorSwizzle};
use crate::driver::status::{cuda_error_text, is_teardown_noop};
use crate::driver::{self, DriverFailure};
use crate::flight_recorder::{FaultReport, report_lost_context};
use crate::report::{WithoutLogger, report};

/// Which kind of name was not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotFoundKind {
    /// A module name not in the registry.
    Module,
    /// A kernel (`__global__` function) not in its module.
    Function,
    /// A `__device__` variable not in its module.
    Symbol,
}

impl fmt::Display for NotFoundKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Module => "module",
            Self::Function => "function",
            Self::Symbol => "device symbol",
        })
    }
}

/// A launch configuration that breaks a limit of the device (see
/// [`DeviceLimits::check`](crate::DeviceLimits::check)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// The grid has a dimension of 0.
    #[error("grid {0:?} has a zero dimension")]
    ZeroGrid((u32, u32, u32)),
    /// The block has a dimension of 0.
    #[error("block {0:?} has a zero dimension")]
    ZeroBlock((u32, u32, u32)),
    /// A block dimension is larger than the device allows.
    #[error("block {block:?} exceeds the device's largest block dimensions {max:?}")]
    BlockDimensions {
        /// The block asked for.
        block: (u32, u32, u32),
        /// The device's largest block dimensions.
        max: (u32, u32, u32),
    },
    /// The block has more threads than the device allows.
    #[error(
        "block {block:?} has {threads} threads, more than the device's {max} threads per block"
    )]
    BlockThreads {
        /// The block asked for.
        block: (u32, u32, u32),
        /// Its thread count.
        threads: u64,
        /// The device's most threads per block.
        max: u32,
    },
    /// A grid dimension is larger than the device allows.
    #[error("grid {grid:?} exceeds the device's largest grid dimensions {max:?}")]
    GridDimensions {
        /// The grid asked for.
        grid: (u32, u32, u32),
        /// The device's largest grid dimensions.
        max: (u32, u32, u32),
    },
    /// More dynamic shared memory than a block can have, even with the opt-in.
    #[error(
        "{bytes} B of dynamic shared memory exceeds the device's maximum of {max} B per block (with opt-in)"
    )]
    SharedMemory {
        /// The bytes asked for.
        bytes: u32,
        /// The device's opt-in maximum per block.
        max: u32,
    },
}

/// Why a launch (or a graph's kernel-node update) was refused before the driver was called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchRefusal {
    /// The configuration breaks a device limit.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The typed arguments do not match the kernel's parameters.
    #[error(
        "{first}; the kernel takes {} parameter(s) of sizes {expected:?} bytes, the launch gives {} of sizes {given:?}",
        expected.len(),
        given.len()
    )]
    Arguments {
        /// The kernel's parameter sizes in bytes.
        expected: Box<[usize]>,
        /// The sizes of the arguments given.
        given: Box<[usize]>,
        /// The first position where they disagree, with what the kernel declares there and
        /// what would fit.
        first: Box<ArgumentMismatch>,
    },
    /// A raw launch gives another number of parameter pointers than the kernel has parameters.
    #[error("the kernel takes {expected} parameter(s); the raw launch gives {given} pointer(s)")]
    ParamCount {
        /// The kernel's parameter count.
        expected: usize,
        /// The pointers given.
        given: usize,
    },
    /// A launch attribute ([`LaunchAttributes`](crate::LaunchAttributes)) that the device, the
    /// kernel or the configuration cannot take.
    #[error(transparent)]
    Attribute(#[from] AttributeRefusal),
    /// An argument that must lie at an aligned address of the parameter space (a
    /// [`TensorMap`](crate::TensorMap): 64 bytes, where the TMA unit reads it) given for a
    /// parameter that the kernel does not align so: one of another type of the same size.
    #[error(
        "argument {index} needs a parameter aligned to {align} bytes (a `const __grid_constant__ \
         CUtensorMap`); the kernel's lies at byte {} of the constant bank ({offset} into its \
         parameters, which start at {bank_offset})",
        .bank_offset + .offset
    )]
    ParamAlignment {
        /// The argument's index.
        index: usize,
        /// The alignment it needs.
        align: usize,
        /// The parameter's offset from the start of the kernel's parameters.
        offset: usize,
        /// Where the parameters start in the constant bank on the device's architecture.
        bank_offset: usize,
    },
    /// Arguments past the 4,096 bytes of parameters kernels took before CUDA 12.1 that the
    /// driver, the device or the kernel cannot take, or past the 32,764 bytes none takes.
    #[error(transparent)]
    LargeParams(#[from] LargeParamsRefusal),
}

/// The first argument of a typed launch that does not fit the kernel's parameter at its place
/// ([`LaunchRefusal::Arguments`]): the two sizes, the argument's Rust type, what the kernel's PTX
/// declares there (where its code is PTX), and from these, what would fit.
///
/// ```
/// # use atlas_registry::{AtlasError, LaunchRefusal};
/// # fn f(e: AtlasError) {
/// if let AtlasError::InvalidLaunch { reason: LaunchRefusal::Arguments { first, .. }, .. } = &e {
///     // argument 2 is 8 byte(s) (`usize`), but parameter 2 (`n`, `.u32` in the PTX) takes 4:
///     // pass a `u32`
///     println!("{first}");
///     println!("{}", first.fits); // a `u32`
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArgumentMismatch {
    /// The position, from 0.
    pub index: usize,
    /// The parameter's size in bytes; `None` when the kernel has no parameter there.
    pub expected: Option<usize>,
    /// The argument's size in bytes; `None` when the launch gives no argument there.
    pub given: Option<usize>,
    /// The argument's Rust type as [`std::any::type_name`] writes it; `None` with `given`.
    pub given_type: Option<&'static str>,
    /// The parameter's name as the kernel's PTX declares it; `None` where the code is not PTX
    /// (a cubin says where parameters lie, not what they are) or the name is the one nvcc gives
    /// every parameter (`KERNEL_param_N`).
    pub ptx_name: Option<String>,
    /// The parameter's type as the kernel's PTX declares it (`.u32`, `.u64 .ptr`, `.b8[24]`);
    /// `None` where the code is not PTX.
    pub ptx_type: Option<String>,
    /// What would fit the parameter, in words: "a `u32`", "an `f32`", "a `u64`, or a buffer
    /// (`&buf`, `&mut buf`) or a view", "a `#[repr(C)]` value of 24 bytes"; from the PTX type
    /// where there is one, from the size otherwise; empty when the kernel has no parameter
    /// there.
    pub fits: String,
}

impl fmt::Display for ArgumentMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let index = self.index;
        let declared = match (&self.ptx_name, &self.ptx_type) {
            (Some(name), Some(ty)) => Some(format!("`{name}`, `{ty}` in the PTX")),
            (None, Some(ty)) => Some(format!("`{ty}` in the PTX")),
            (Some(name), None) => Some(format!("`{name}`")),
            (None, None) => None,
        };
        let given_type = self.given_type.map(short_type_name).unwrap_or_default();
        let fits = &self.fits;
        match (self.expected, self.given) {
            (Some(expected), Some(given)) => {
                write!(
                    f,
                    "argument {index} is {given} byte(s) (`{given_type}`), but parameter {index}"
                )?;
                if let Some(declared) = declared {
                    write!(f, " ({declared})")?;
                }
                write!(f, " takes {expected}: pass {fits}")
            }
            (Some(expected), None) => {
                let declared = declared.map(|d| d + ", ").unwrap_or_default();
                write!(
                    f,
                    "parameter {index} ({declared}{expected} byte(s)) has no argument: pass {fits}"
                )
            }
            (None, Some(given)) => write!(
                f,
                "argument {index} (`{given_type}`, {given} byte(s)) has no parameter"
            ),
            (None, None) => write!(f, "argument {index} agrees with its parameter"),
        }
    }
}

/// A type's name without the paths of the names in it: `&DeviceBuffer<f32>` for
/// `&atlas_registry::memory::buffer::DeviceBuffer<f32>`.
fn short_type_name(full: &str) -> String {
    let mut short = String::with_capacity(full.len());
    let mut rest = full;
    while let Some(at) = rest.find("::") {
        short.push_str(&rest[..at]);
        let kept = short
            .trim_end_matches(|c: char| c.is_alphanumeric() || c == '_')
            .len();
        short.truncate(kept);
        rest = &rest[at + 2..];
    }
    short.push_str(rest);
    short
}

/// Why a launch whose arguments take more than
/// [`CLASSIC_PARAM_BYTES`](crate::CLASSIC_PARAM_BYTES) (4,096) was refused before the driver was
/// called ([`LaunchRefusal::LargeParams`]): large parameters need a driver of CUDA 12.1 or newer,
/// a device of compute capability 7.0 or newer and a kernel built for them, and take at most
/// [`MAX_PARAM_BYTES`](crate::MAX_PARAM_BYTES) (32,764) in all.
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry, out: &mut atlas_registry::DeviceBuffer<u32>) {
/// use atlas_registry::{AtlasError, LargeParamsRefusal, LaunchConfig, LaunchRefusal};
/// let mix = registry.function_cached("large_params", "mix_8k").unwrap();
/// let words = [7u32; 2048]; // 8,192 bytes by value
/// // SAFETY: `mix_8k` writes 2,049 words of `out`, which holds as many.
/// match unsafe { mix.launch(registry.stream(), &LaunchConfig::for_elements(2048, 256), (words, &mut *out, 1u32)) } {
///     Ok(()) => {}
///     Err(AtlasError::InvalidLaunch { reason: LaunchRefusal::LargeParams(why), .. }) => match why {
///         LargeParamsRefusal::DriverTooOld { driver, .. } => println!("driver {driver:?}: update it"),
///         other => println!("{other}"),
///     },
///     Err(e) => panic!("{e}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LargeParamsRefusal {
    /// More bytes of arguments than any kernel takes.
    #[error(
        "the arguments take {bytes} bytes, more than the {max} bytes of parameters a kernel may \
         take; pass the rest through device memory"
    )]
    TooLarge {
        /// What the arguments take together.
        bytes: usize,
        /// The most a kernel takes ([`MAX_PARAM_BYTES`](crate::MAX_PARAM_BYTES)).
        max: usize,
    },
    /// Large parameters on a driver older than CUDA 12.1, which launches at most 4,096 bytes.
    #[error(
        "the arguments take {bytes} bytes, past the 4096 bytes this driver launches: parameters \
         of more than 4096 bytes need a driver of CUDA 12.1 or newer, and this driver is CUDA \
         {}.{}", .driver.0, .driver.1
    )]
    DriverTooOld {
        /// What the arguments take together.
        bytes: usize,
        /// The driver's CUDA release (`cuDriverGetVersion`).
        driver: (u32, u32),
    },
    /// Large parameters on a device older than compute capability 7.0 (Volta).
    #[error(
        "the arguments take {bytes} bytes: parameters of more than 4096 bytes need a device of \
         compute capability 7.0 or newer, and this one is {}.{}",
        .compute_capability.0, .compute_capability.1
    )]
    DeviceTooOld {
        /// What the arguments take together.
        bytes: usize,
        /// The device's compute capability.
        compute_capability: (u32, u32),
    },
    /// Large arguments for a kernel whose own parameters take no more than 4,096 bytes: it was
    /// built for the old limit (or takes small parameters), and takes nothing larger.
    #[error(
        "the arguments take {bytes} bytes, but the kernel's parameters take {kernel_bytes}, within \
         the 4096 bytes kernels took before CUDA 12.1: it was not built for large parameters"
    )]
    KernelLimit {
        /// What the arguments take together.
        bytes: usize,
        /// What the kernel's parameters take together, as its layout says.
        kernel_bytes: usize,
    },
}

/// A use of stream capture that cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureMisuse {
    /// Capture on the legacy default stream, which the driver does not allow.
    #[error("the legacy default stream cannot be captured; use a created stream")]
    LegacyDefaultStream,
    /// Synchronizing a stream while Atlas captures it: the driver would invalidate the capture.
    #[error(
        "the stream is being captured, and synchronizing it would invalidate the capture; end the \
         capture first (the capture goes on)"
    )]
    SynchronizeWhileCapturing,
    /// A `cuMemAlloc` (`DeviceBuffer::alloc`, `from_slice`) from a thread that is capturing: the
    /// driver would refuse it and invalidate the capture.
    #[error(
        "this thread is capturing a stream, and `cuMemAlloc` cannot be captured; allocate before \
         the capture, or use `DeviceBuffer::alloc_async` on the capturing stream (the capture \
         goes on)"
    )]
    AllocateWhileCapturing,
    /// A copy that waits for its stream (`copy_from`, `copy_to`, `to_vec`, `DeviceSymbol::write`
    /// and `read`) on a stream being captured, or from a thread that is capturing.
    #[error(
        "a copy that waits for its stream cannot be captured; enqueue it with \
         `copy_from_async`/`copy_to_async` instead, or copy after the capture ends (the capture goes on)"
    )]
    WaitingCopyWhileCapturing,
    /// A conditional node asked of a capture that the driver no longer has: it was ended or
    /// invalidated outside Atlas (a raw `cuStreamEndCapture` on the stream).
    #[error(
        "the stream is no longer capturing (its capture was ended outside Atlas); conditional nodes \
         are added to a capture in progress"
    )]
    NotCapturing,
    /// The host asked about an event (`query`, `synchronize`, `elapsed_since`) whose last record
    /// was in a capture: the driver refuses it, and invalidates a capture in progress.
    #[error(
        "the event's last record was in a capture, which marks a point of the graph, not of running \
         work; record it outside a capture before the host waits for, queries or times it"
    )]
    EventOfCapture,
    /// A stream waited for an event recorded in a capture it is not part of: the wait would make
    /// it join that capture, out of reach of Atlas's checks (the driver crashes when a joined
    /// stream is enqueued into while the capture ends).
    #[error(
        "the event was recorded in a capture this stream is not part of; a stream joins a capture \
         only through `Capture::fork`"
    )]
    JoinOutsideFork,
    /// `Capture::fork` of a stream that is being captured already (this capture's own stream, or
    /// one of another capture).
    #[error("the stream to fork into is being captured already")]
    ForkOfCapturingStream,
    /// `CudaContext::set_limit` from a thread that is capturing: the driver refuses it
    /// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) and invalidates the capture.
    #[error(
        "this thread is capturing a stream, and setting a context limit would invalidate the \
         capture; set it before the capture (the capture goes on)"
    )]
    SetLimitWhileCapturing,
    /// A host function that runs once (`CudaStream::launch_host_func`) enqueued on a stream that
    /// is being captured, where it would run at every replay.
    #[error(
        "a host function enqueued on a stream being captured runs at every replay of the graph; \
         enqueue one that can run many times with `Capture::launch_host_func`"
    )]
    HostFunctionOnce,
    /// A conditional node given a handle made for another graph than the one the stream is
    /// capturing into.
    #[error(
        "the conditional handle belongs to another graph than the one the stream is capturing \
         into; make it with `conditional_handle` on this capture"
    )]
    ForeignConditionalHandle,
    /// `Capture::capture_switch` of no branches: the driver takes a SWITCH node of one or more.
    #[error("a SWITCH node has at least one branch")]
    EmptySwitch,
    /// A safe copy to or from page-locked host memory ([`PinnedBuffer`](crate::PinnedBuffer),
    /// [`HostRegistration`](crate::HostRegistration)) on a stream being captured: the graph would
    /// read or write the memory at every replay, long after the event that lets the host wait
    /// for the copy.
    #[error(
        "a copy to or from page-locked host memory on a stream being captured would run at every \
         replay of the graph, where Atlas cannot make the host wait for it; capture the raw \
         `copy_to_device_async`/`copy_to_host_async` (unsafe: the memory must outlive the graph \
         and be left alone while it runs), or copy outside the capture (the capture goes on)"
    )]
    PageLockedCopy,
    /// Page-locking host memory (`PinnedBuffer::alloc`, `HostRegistration::register`) from a
    /// thread that is capturing: the driver refuses it and invalidates the capture.
    #[error(
        "this thread is capturing a stream, and page-locking host memory (`cuMemHostAlloc`, \
         `cuMemHostRegister`) would invalidate the capture; allocate or register before the \
         capture (the capture goes on)"
    )]
    PageLockWhileCapturing,
    /// Host access to page-locked memory whose copies are still to be waited for, from a thread
    /// that is capturing: waiting for them (`cuEventSynchronize`) would invalidate the capture.
    #[error(
        "this thread is capturing a stream, and waiting for the copies of page-locked host \
         memory before handing it to the host would invalidate the capture; use the memory \
         after the capture ends, or from another thread (the capture goes on)"
    )]
    HostWaitWhileCapturing,
    /// A batch of copies ([`CopyBatch`](crate::CopyBatch)) on a stream being captured: the driver
    /// refuses `cuMemcpyBatchAsync` there (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), without
    /// invalidating the capture, so the copies would silently be missing from the graph.
    #[error(
        "the driver cannot capture a batch of copies (`cuMemcpyBatchAsync`) into a graph; enqueue \
         the batch outside the capture, or capture the copies one by one (the capture goes on)"
    )]
    BatchedCopy,
}

/// Page-locked host memory asked for, or used, in a way that cannot work
/// ([`AtlasError::HostMemory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostMemoryRefusal {
    /// Page-locked memory of no bytes (no elements, or elements of no size): nothing to lock.
    #[error(
        "page-locked host memory of {len} element(s) of {element_size} bytes is empty; ask for at \
         least one byte"
    )]
    Empty {
        /// Elements asked for.
        len: usize,
        /// Bytes per element.
        element_size: usize,
    },
    /// A registration of memory that overlaps memory already page-locked: registered (by Atlas
    /// or anyone else) or allocated page-locked (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`).
    #[error(
        "the {bytes} bytes at {address:#x} overlap host memory that is page-locked already \
         (registered, or allocated page-locked); copy through that memory, or unregister it first"
    )]
    AlreadyRegistered {
        /// Where the memory to register begins.
        address: usize,
        /// Its size in bytes.
        bytes: usize,
    },
    /// A copy from the device into memory registered read-only for the device.
    #[error(
        "the memory is registered read-only for the device (`RegisterFlags::read_only`): a copy \
         from the device cannot write it; register it without `read_only`"
    )]
    ReadOnly,
    /// The driver returned page-locked memory not aligned for the element type.
    #[error(
        "the driver returned page-locked memory at {address:#x}, not aligned to the {align} \
         bytes the element type needs; use an element type of smaller alignment"
    )]
    Misaligned {
        /// The address the driver returned.
        address: usize,
        /// The alignment the element type needs.
        align: usize,
    },
    /// A copy was enqueued, but neither the event that makes the host wait for it could be
    /// recorded after it nor its stream synchronized: the device may still use the memory.
    #[error(
        "a copy of this page-locked memory was enqueued, but neither recording the event after it \
         nor synchronizing its stream succeeded, so the device may still use the memory: the host \
         may not touch it, and it is leaked when dropped"
    )]
    Unfenced,
}

/// A use of an event that cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventMisuse {
    /// Elapsed time asked of an event made without timing.
    #[error("the event was made without timing; make it with `CudaEvent::timing` to measure time")]
    NotTiming,
    /// Elapsed time asked of an event never recorded.
    #[error("the event was never recorded; record both events before asking the time between them")]
    NeverRecorded,
}

/// Which side of a copy a refusal concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CopySide {
    /// Where the copy reads.
    Source,
    /// Where the copy writes.
    Destination,
}

impl fmt::Display for CopySide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Source => "source",
            Self::Destination => "destination",
        })
    }
}

/// Why a view, a copy or a fill of device memory was refused before the driver was called
/// ([`AtlasError::Memory`]). Lengths, ranges, widths and pitches are in elements of the memory's
/// type unless they say bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryRefusal {
    /// A range that does not lie in the memory (or ends before it starts).
    #[error(
        "elements {start}..{end} are not a range of device memory of {len} element(s){}",
        reversed(*.start, *.end)
    )]
    OutOfRange {
        /// The first element asked for.
        start: usize,
        /// One past the last element asked for.
        end: usize,
        /// The elements the memory holds.
        len: usize,
    },
    /// A copy between memory of different lengths.
    #[error(
        "the destination holds {dst_len} element(s) and the source {src_len}: a copy needs \
         equal lengths (copy a range of the longer)"
    )]
    LengthMismatch {
        /// The destination's elements.
        dst_len: usize,
        /// The source's elements.
        src_len: usize,
    },
    /// `chunks` or `chunks_mut` asked for chunks of no elements.
    #[error("chunks of 0 elements: the chunk size must be at least 1")]
    ZeroChunkSize,
    /// A fill of `width`-byte values on memory whose size is not a multiple of `width`.
    #[error(
        "a fill of {width}-byte values needs a size that is a multiple of {width} bytes; the \
         memory has {bytes} bytes (fill bytes, or a range of whole values)"
    )]
    FillSize {
        /// The fill's value width in bytes.
        width: usize,
        /// The memory's size in bytes.
        bytes: usize,
    },
    /// A fill of `width`-byte values on memory whose address is not a multiple of `width`.
    #[error(
        "a fill of {width}-byte values needs an address aligned to {width} bytes; the memory \
         starts at {address:#x}"
    )]
    FillAlignment {
        /// The fill's value width in bytes.
        width: usize,
        /// The memory's device address.
        address: u64,
    },
    /// A typed fill of elements whose bytes do not repeat every 1, 2 or 4 bytes: the driver
    /// fills only such patterns.
    #[error(
        "a value of {element_size} bytes whose bytes do not repeat every 1, 2 or 4 bytes cannot be \
         filled by the driver's memsets; write it with a kernel or a copy"
    )]
    FillPattern {
        /// The element's size in bytes.
        element_size: usize,
    },
    /// A 2D copy whose rows are wider than one side's pitch (its rows would overlap).
    #[error("rows of {width} element(s) do not fit the {side}'s pitch of {pitch}")]
    RowWiderThanPitch {
        /// The side whose pitch is too small.
        side: CopySide,
        /// The row width asked for.
        width: usize,
        /// That side's pitch.
        pitch: usize,
    },
    /// A 2D copy whose last row ends past one side's memory.
    #[error(
        "{height} row(s) of {width} element(s) at a pitch of {pitch} end at element {end}, past \
         the {side}'s {len}"
    )]
    RowsOutOfRange {
        /// The side that is too short.
        side: CopySide,
        /// The row width asked for.
        width: usize,
        /// The rows asked for.
        height: usize,
        /// That side's pitch.
        pitch: usize,
        /// One past the last element the rows reach (saturated at `usize::MAX`).
        end: usize,
        /// The elements that side holds.
        len: usize,
    },
}

/// Where a [`DeviceBuffer`](crate::DeviceBuffer)'s memory comes from, as a refusal names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryOrigin {
    /// `DeviceBuffer::alloc` (`cuMemAlloc`).
    Allocated,
    /// A stream-ordered allocation: `DeviceBuffer::alloc_async` or `MemoryPool::alloc_async`.
    StreamOrdered,
    /// Memory something else owns: imported from another process, or mapped.
    Kept,
}

impl fmt::Display for MemoryOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Allocated => "allocated with `DeviceBuffer::alloc` (cuMemAlloc)",
            Self::StreamOrdered => {
                "allocated in stream order (`DeviceBuffer::alloc_async` or `MemoryPool::alloc_async`)"
            }
            Self::Kept => "owned by something else (imported from another process, or mapped)",
        })
    }
}

/// Why a memory pool could not be made as asked ([`AtlasError::Pool`]); nothing reached the
/// driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolRefusal {
    /// A maximum size asked of a driver whose pools have none (`CUmemPoolProps::maxSize` came
    /// with CUDA 12.2).
    #[error(
        "a memory pool with a maximum size needs a driver of CUDA 12.2 or newer; this one is of \
         CUDA {}.{}: leave the maximum size out, or update the driver",
        .driver.0,
        .driver.1
    )]
    MaxSizeUnsupported {
        /// The driver's CUDA release (`cuDriverGetVersion`).
        driver: (u32, u32),
    },
}

/// Why device memory could not be shared with another process, or imported from one, as asked
/// ([`AtlasError::Sharing`]); nothing reached the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SharingRefusal {
    /// The device cannot export memory pools as POSIX file descriptors
    /// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED` is 0, or
    /// `CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES` lacks them).
    #[error(
        "device {device} cannot share memory pools as POSIX file descriptors \
         (CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES); share `DeviceBuffer::alloc` \
         memory with `IpcMemHandle` instead"
    )]
    PosixFdUnsupported {
        /// The device's ordinal.
        device: usize,
    },
    /// An export asked of a pool made without `PoolProperties::exportable` (the device's default
    /// pool is never exportable).
    #[error(
        "the memory pool of device {device} was made without `PoolProperties::exportable(true)`, \
         so it cannot be shared; make the pool exportable"
    )]
    NotExportable {
        /// The pool's device.
        device: usize,
    },
    /// A buffer whose memory is not of the kind the way of sharing takes: a legacy handle
    /// (`IpcMemHandle`) takes `cuMemAlloc` memory, a pool's export takes its stream-ordered
    /// allocations.
    #[error("this way of sharing takes memory {needs}; the buffer's was {origin}")]
    WrongOrigin {
        /// What the way of sharing takes.
        needs: MemoryOrigin,
        /// What the buffer holds.
        origin: MemoryOrigin,
    },
    /// A buffer of no bytes: it has no memory to share.
    #[error("the buffer has no bytes, so there is no memory to share")]
    Empty,
    /// An import into a context of another device than the one the memory lives on.
    #[error(
        "the memory lives on {}, and device {device} is {}: import it in a context of the \
         device it lives on",
        uuid_text(.exporter),
        uuid_text(.importer)
    )]
    OtherDevice {
        /// The UUID of the device the memory lives on (the exporter's).
        exporter: [u8; 16],
        /// The device asked to import it.
        device: usize,
        /// Its UUID.
        importer: [u8; 16],
    },
    /// An import of more elements than the exported memory holds.
    #[error(
        "{len} element(s) of {element_size} bytes do not fit in the {bytes} bytes exported; \
         import at most {} element(s)",
        .bytes / (*.element_size).max(1) as u64
    )]
    TooLong {
        /// Elements asked for.
        len: usize,
        /// Bytes per element.
        element_size: usize,
        /// Bytes the exporter shared.
        bytes: u64,
    },
}

/// A device UUID as `nvidia-smi` writes it (`GPU-xxxxxxxx-xxxx-...`), as [`DeviceUuid`]
/// displays it.
///
/// [`DeviceUuid`]: crate::DeviceUuid
fn uuid_text(bytes: &[u8; 16]) -> String {
    let mut text = String::from("GPU");
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 0 | 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

/// Why a use of virtual memory (reservations, physical allocations, mappings, growable buffers)
/// was refused ([`AtlasError::VirtualMemory`]). Sizes and offsets are in bytes, lengths in
/// elements; nothing reached the driver unless a variant says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VirtualMemoryRefusal {
    /// The device cannot manage virtual memory
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` is 0).
    #[error(
        "device {device} does not support virtual memory management \
         (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0); use `DeviceBuffer::alloc`"
    )]
    ManagementUnsupported {
        /// The device's ordinal.
        device: usize,
    },
    /// The device cannot share memory through POSIX file descriptors
    /// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED` is 0).
    #[error(
        "device {device} cannot share memory through POSIX file descriptors \
         (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0)"
    )]
    FileDescriptorsUnsupported {
        /// The device's ordinal.
        device: usize,
    },
    /// A reservation, a physical allocation or a growable buffer of no bytes.
    #[error("virtual memory of 0 bytes: ask for at least one granule of the device's granularity")]
    Empty,
    /// A size that is not a multiple of the device's allocation granularity.
    #[error(
        "{bytes} bytes is not a multiple of the device's allocation granularity of {granularity} \
         bytes; round it up to {}",
        round_up(*.bytes, *.granularity)
    )]
    SizeNotGranular {
        /// The size asked for.
        bytes: usize,
        /// The device's minimum granularity.
        granularity: usize,
    },
    /// A mapping offset that is not a multiple of the device's allocation granularity.
    #[error(
        "offset {offset} is not a multiple of the device's allocation granularity of \
         {granularity} bytes"
    )]
    OffsetNotGranular {
        /// The offset asked for, from the reservation's start.
        offset: usize,
        /// The device's minimum granularity.
        granularity: usize,
    },
    /// A mapping that does not lie in its reservation.
    #[error(
        "a mapping of {bytes} bytes at offset {offset} does not fit the reservation of {reserved} \
         bytes"
    )]
    OutsideReservation {
        /// The offset asked for.
        offset: usize,
        /// The physical allocation's size.
        bytes: usize,
        /// The reservation's size.
        reserved: usize,
    },
    /// A mapping that overlaps one that exists (or whose unmap waits for a capture to end).
    #[error(
        "a mapping of {bytes} bytes at offset {offset} overlaps the mapping of {mapped_bytes} \
         bytes at offset {mapped_offset}; drop that mapping first (an unmap that a capture in \
         progress holds back is made when the capture ends)"
    )]
    Overlap {
        /// The offset asked for.
        offset: usize,
        /// The physical allocation's size.
        bytes: usize,
        /// Where the existing mapping begins.
        mapped_offset: usize,
        /// Its size.
        mapped_bytes: usize,
    },
    /// A physical allocation of another device than the context that maps it or imports it (an
    /// import was made, to ask the driver its device, and is released again).
    #[error(
        "the physical allocation is memory of device {allocation}, and cannot be mapped for \
         device {context}; import or create it with that device's context"
    )]
    OtherDevice {
        /// The allocation's device.
        allocation: usize,
        /// The device of the context that would map it.
        context: usize,
    },
    /// A buffer asked of a mapping whose device cannot read and write it yet.
    #[error(
        "the mapping does not grant device {device} read-write access: kernels and copies would \
         fault; call `Mapping::set_access` with `MemoryAccess::ReadWrite` first"
    )]
    NoAccess {
        /// The device of the mapping's context.
        device: usize,
    },
    /// An export of a physical allocation created without a shareable handle type.
    #[error(
        "the physical allocation was not created exportable; create it with \
         `PhysicalAllocation::exportable` to share it with another process"
    )]
    NotExportable,
    /// A growable buffer asked to grow past its reservation.
    #[error(
        "a growable buffer of capacity {capacity} element(s) cannot grow to {len}; reserve a \
         larger capacity"
    )]
    BeyondCapacity {
        /// The length asked for.
        len: usize,
        /// The buffer's capacity.
        capacity: usize,
    },
    /// `grow_to` a length below the current one, or `shrink_to` one above it.
    #[error(
        "cannot {} a growable buffer of {current} element(s) to {len}; use `{}`",
        if *.len < *.current { "grow" } else { "shrink" },
        if *.len < *.current { "shrink_to" } else { "grow_to" }
    )]
    WrongDirection {
        /// The length asked for.
        len: usize,
        /// The buffer's length.
        current: usize,
    },
    /// A shrink that would unmap memory that a graph (or an executable graph) still uses.
    #[error(
        "elements {start}..{end} of the growable buffer are used by a graph that still lives (it \
         captured work on them), so they stay mapped; drop that graph and its executable graphs \
         first, or shrink less"
    )]
    HeldByGraph {
        /// The first element a graph holds past the length asked for.
        start: usize,
        /// One past the last element it holds.
        end: usize,
    },
}

fn round_up(bytes: usize, granularity: usize) -> String {
    match bytes.div_ceil(granularity.max(1)).checked_mul(granularity) {
        Some(rounded) => rounded.to_string(),
        None => "a multiple of it".into(),
    }
}

fn reversed(start: usize, end: usize) -> &'static str {
    if start > end {
        " (it ends before it starts)"
    } else {
        ""
    }
}

/// Why a batch of copies ([`CopyBatch`](crate::CopyBatch)) was refused before the driver was
/// called ([`AtlasError::Batch`]). Blocks are numbered from 0 in the order they were added to the
/// batch, empty ones included; ranges are in elements of the block's type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchRefusal {
    /// The driver lacks the entry point of batched copies: it is older than CUDA 12.8 (or an
    /// injection library that does not forward it).
    #[error(
        "batched copies need {missing}, which this driver lacks (drivers of CUDA 12.8 or newer \
         have it); update the driver, or enqueue the copies one by one"
    )]
    Unavailable {
        /// The entry point the driver lacks (`cuMemcpyBatchAsync`).
        missing: &'static str,
    },
    /// A batch on the legacy default stream, which the driver refuses for batches.
    #[error(
        "the driver takes no batch of copies on the legacy default stream; use a created stream \
         (or the per-thread default stream)"
    )]
    LegacyDefaultStream,
    /// A block given memory that was added to another batch (or to this one before its last
    /// `begin`): its handle names memory this batch does not hold.
    #[error(
        "block {block} names memory added to another batch; add the memory to this one (its \
         `read_*`/`write_*` methods) and use the handle they return"
    )]
    ForeignMemory {
        /// The block.
        block: usize,
    },
    /// A block whose range does not lie in its source's or destination's memory.
    #[error(
        "block {block}: elements {start}..{end} are not a range of the {side}'s {len} element(s)"
    )]
    OutOfRange {
        /// The block.
        block: usize,
        /// The side whose memory is too short.
        side: CopySide,
        /// The first element asked for.
        start: usize,
        /// One past the last element asked for (saturated at `usize::MAX`).
        end: usize,
        /// The elements that side's memory holds.
        len: usize,
    },
    /// Two blocks that write overlapping memory: the copies of a batch run in no set order, so
    /// what the memory would hold after it is undefined.
    #[error(
        "blocks {first} and {second} write overlapping memory; the copies of a batch run in no \
         set order, so give each element one writer"
    )]
    OverlappingDestinations {
        /// The block added first.
        first: usize,
        /// The block added later.
        second: usize,
    },
}

/// Everything that can go wrong in Atlas. Each variant says what was being done and names the
/// module, function, symbol or call involved. Refusals carry their reason as data; the text of a
/// driver status is looked up only when the error is displayed.
///
/// # Examples
///
/// Refusals are data: a caller matches on the variant and reads its fields.
///
/// ```no_run
/// use atlas_registry::{AtlasError, AtlasRegistry, Result};
///
/// /// Loads PTX a user wrote, showing the JIT compiler's log when it does not compile.
/// fn load_user_ptx(ptx: &[u8]) -> Result<Option<AtlasRegistry>> {
///     match AtlasRegistry::load(0, &[("user", ptx)]) {
///         Ok(registry) => Ok(Some(registry)),
///         Err(AtlasError::ModuleLoad { jit_log, .. }) => {
///             eprintln!("the kernel does not compile:\n{jit_log}");
///             Ok(None)
///         }
///         Err(e) => Err(e), // no driver, no device, a malformed blob...: `{e}` says which
///     }
/// }
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AtlasError {
    /// The CUDA driver library cannot be loaded (no NVIDIA driver, or a wrong `ATLAS_LIBCUDA_PATH`).
    #[error(transparent)]
    DriverUnavailable(#[from] LoadError),
    /// The driver library lacks an entry point that this operation needs (an older driver).
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A driver call failed.
    #[error("{0}")]
    Driver(DriverFailure),
    /// A kernel faulted, trapped or timed out earlier, and the device's context is lost for good:
    /// every later call on it fails. The process must exit and start again to use the device.
    ///
    /// The [`FaultReport`] holds what the flight recorder kept of the launches before (newest
    /// first, those of the failing call's stream marked) and the driver's own log; the text names
    /// the last launches, so the kernel that faulted is usually named in it (see
    /// [`fault_report`](Self::fault_report)).
    #[error(
        "{0}. The CUDA context of this device is lost (a kernel faulted, trapped or timed out); no \
         further work can run on it in this process: exit and restart the process{1}"
    )]
    ContextLost(DriverFailure, FaultReport),
    /// A module could not be loaded; for PTX, `jit_log` is the JIT compiler's error log.
    #[error("loading module `{module}` failed: {}{}", cuda_error_text(*.code), log(.jit_log))]
    ModuleLoad {
        /// The module's name in its model.
        module: String,
        /// The CUDA status code.
        code: u32,
        /// What the JIT compiler wrote to its error log (empty for binaries, or when it said nothing).
        jit_log: String,
    },
    /// A module holds no code the device can run: a cubin, fatbin or blob set for other
    /// architectures only. Refused before the driver is called when Atlas can tell from the blob,
    /// else from the driver's `CUDA_ERROR_NO_BINARY_FOR_GPU`.
    #[error(
        "module `{module}` has no code that device {device} ({arch}) can run: it holds {holds}; \
         load a cubin built for {arch}, or PTX"
    )]
    NoBinaryForDevice {
        /// The module's name in its model.
        module: String,
        /// What the blob holds (`sm_80 SASS`, `compute_75 PTX, sm_80 SASS`).
        holds: String,
        /// The device's ordinal.
        device: usize,
        /// The device's architecture (`sm_90`).
        arch: String,
    },
    /// PTX of a newer ISA version than the driver JIT-compiles: the toolkit that wrote it is newer
    /// than the driver (nvcc 13 writes PTX ISA 9.0, which needs a CUDA 13.0 driver), and the
    /// device can load nothing else of the module. Refused before the JIT when Atlas's table of
    /// ISA versions tells (`needs`), else from the driver's `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`
    /// after the fact, with the JIT log.
    #[error(
        "module `{module}` cannot be JIT-compiled on device {device} ({arch}): PTX ISA {}.{} {}; \
         this driver is CUDA {}.{}: build the PTX with {}, or ship a cubin for {arch}{}",
        .isa.0, .isa.1, needs_text(*.needs), .driver.0, .driver.1,
        older_toolkit(*.driver, *.driver_takes), log(.jit_log)
    )]
    PtxTooNew {
        /// The module's name in its model.
        module: String,
        /// The PTX's ISA version (its `.version`).
        isa: (u32, u32),
        /// The oldest CUDA release whose driver JIT-compiles it (for an ISA version newer than
        /// Atlas knows, at least this one); `None` when the driver refused PTX that Atlas cannot
        /// tell it would (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`).
        needs: Option<(u32, u32)>,
        /// The driver's CUDA release (`cuDriverGetVersion`).
        driver: (u32, u32),
        /// The newest PTX ISA version this driver JIT-compiles, as far as Atlas knows.
        driver_takes: Option<(u32, u32)>,
        /// The device's ordinal.
        device: usize,
        /// The device's architecture (`sm_90`).
        arch: String,
        /// What the JIT compiler wrote to its error log (empty when refused before the JIT).
        jit_log: String,
    },
    /// A blob or module name was rejected before reaching the driver.
    #[error("module `{module}`: {reason}")]
    InvalidModule {
        /// The module's name (escaped if it is not printable).
        module: String,
        /// What is wrong with it: the structure and the field.
        reason: String,
    },
    /// A blob was refused before reaching the driver because a compressed piece of it (a fatbin
    /// entry, a compressed offload bundle) declares more bytes uncompressed than Atlas
    /// decompresses to check one ([`UNCOMPRESSED_LIMIT`](crate::UNCOMPRESSED_LIMIT)): checking
    /// it would take that much memory. NVIDIA's own libraries stay far below the limit.
    #[error(
        "module `{module}`: {entry} declares {declared} bytes uncompressed, more than the {limit} \
         bytes Atlas decompresses to check one piece of code (UNCOMPRESSED_LIMIT; the largest in \
         NVIDIA's libraries is about a quarter of it): the blob is corrupt, or made to exhaust \
         memory"
    )]
    TooLargeToCheck {
        /// The module's name (escaped if it is not printable).
        module: String,
        /// The piece: `fatbin entry 2 (ELF sm_90 at offset 560, zstd-compressed)`, `the
        /// compressed offload bundle`.
        entry: String,
        /// The bytes it declares uncompressed.
        declared: u64,
        /// [`UNCOMPRESSED_LIMIT`](crate::UNCOMPRESSED_LIMIT).
        limit: u64,
    },
    /// A kernel launch failed in the driver.
    #[error(
        "launching `{function}` (grid {grid:?}, block {block:?}, {shared_mem} B dynamic shared memory) failed: {}",
        cuda_error_text(*.code)
    )]
    Launch {
        /// `module::function`, or the raw handle when Atlas does not know its name.
        function: String,
        /// Grid dimensions.
        grid: (u32, u32, u32),
        /// Block dimensions.
        block: (u32, u32, u32),
        /// Dynamic shared memory in bytes.
        shared_mem: u32,
        /// The CUDA status code.
        code: u32,
    },
    /// A launch was refused before reaching the driver: its configuration breaks a device limit, or
    /// its arguments do not match the kernel's parameters.
    #[error("cannot launch `{function}`: {reason}")]
    InvalidLaunch {
        /// `module::function`, or the raw handle when Atlas does not know its name.
        function: String,
        /// Which limit or parameters, with the expected and given values.
        reason: LaunchRefusal,
    },
    /// A launch was refused before reaching the driver because its stream or one of its buffers
    /// belongs to another device's context than the function: run there, the kernel would fault and
    /// take that device's context with it.
    #[error("cannot launch `{function}` on device {expected}: {what} belongs to {}", device(*.given))]
    WrongDevice {
        /// `module::function`.
        function: String,
        /// What is foreign: `the stream`, `argument N`, `the graph`.
        what: String,
        /// The device the function is loaded on.
        expected: usize,
        /// The device `what` belongs to, or `None` for a context Atlas does not manage.
        given: Option<usize>,
    },
    /// A typed launch was refused because nothing can tell the kernel's parameter layout: the driver
    /// lacks `cuFuncGetParamInfo` (older than CUDA 12.4, or a profiler's injection library) and the
    /// module's blob does not declare it in a form Atlas reads.
    #[error(
        "cannot check the arguments of `{function}`: {reason}; launch it through \
         `AtlasRegistry::launch_on_stream` (unchecked, `unsafe`) if you know its parameters"
    )]
    ParamsUnknown {
        /// `module::function`.
        function: String,
        /// Why neither the driver nor the blob can tell.
        reason: String,
    },
    /// Stream capture used in a way that cannot work; nothing reached the driver.
    #[error("cannot capture: {0}")]
    Capture(CaptureMisuse),
    /// An event used in a way the driver cannot take ([`EventMisuse`]); nothing reached it.
    #[error("{0}")]
    Event(EventMisuse),
    /// Page-locked host memory asked for or used in a way that cannot work
    /// ([`HostMemoryRefusal`]); nothing reached the driver, or the driver refused it so.
    #[error("{0}")]
    HostMemory(HostMemoryRefusal),
    /// A kernel node index past the instantiated graph's kernel nodes.
    #[error("the graph has {count} kernel node(s); there is no kernel node {index}")]
    NoSuchNode {
        /// The index asked for.
        index: usize,
        /// How many kernel nodes the graph has.
        count: usize,
    },
    /// An allocation whose size in bytes does not fit in `usize`.
    #[error("{len} elements of {element_size} bytes do not fit in the address space")]
    AllocationTooLarge {
        /// Elements asked for.
        len: usize,
        /// Bytes per element.
        element_size: usize,
    },
    /// A module, function or symbol name that does not exist.
    #[error("{kind} `{name}` not found{}{}", on(.detail), listed(*.kind, .closest))]
    NotFound {
        /// What kind of name.
        kind: NotFoundKind,
        /// The name, as `module` or `module::name`.
        name: String,
        /// Why, where it is not simply absent (a name with a NUL byte), or empty.
        detail: String,
        /// The names of that kind that exist there (the registry's modules, the module's kernels
        /// or `__device__` variables), the closest to `name` first, at most 10; empty where none
        /// exist or Atlas cannot list them.
        closest: Box<[String]>,
    },
    /// A device ordinal out of range.
    #[error("CUDA device {ordinal} does not exist: this machine has {count} device(s)")]
    InvalidDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// An explicit release while other handles still use the resource; nothing was released.
    #[error("cannot release {what}: {handles} other handle(s) still use it; nothing was unloaded")]
    InUse {
        /// What was to be released.
        what: String,
        /// How many other handles hold it.
        handles: usize,
    },
    /// Sizes that must agree do not (a host slice and a device buffer, a value and a symbol).
    #[error("{what}: expected {expected} bytes, got {given}")]
    SizeMismatch {
        /// What was being done.
        what: String,
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        given: usize,
    },
    /// A stream or graph of another context than the one a call works in (a registry's copies, a
    /// stream-ordered allocation, an executable graph's update or upload); nothing reached the
    /// driver.
    #[error("{what} belongs to {}, not to {}", device(*.given), device(*.expected))]
    WrongContext {
        /// What is foreign (`the stream`, `the new graph`).
        what: String,
        /// The device the call works on, or `None` for a context Atlas does not manage.
        expected: Option<usize>,
        /// The device `what` belongs to, or `None` for a context Atlas does not manage.
        given: Option<usize>,
    },
    /// Unloads that failed during an explicit release (each one listed).
    #[error("releasing the registry: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Release(Vec<AtlasError>),
    /// A stream priority outside the device's range; nothing was created.
    #[error(
        "stream priority {priority} is outside device {device}'s range {greatest} (highest) to \
         {least} (lowest); see `CudaContext::stream_priorities`"
    )]
    StreamPriority {
        /// The priority asked for.
        priority: i32,
        /// The device's ordinal.
        device: usize,
        /// The device's lowest priority (the default), numerically the largest.
        least: i32,
        /// The device's highest priority, numerically the smallest.
        greatest: i32,
    },
    /// Stream-ordered allocation asked of a device without memory pools
    /// (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED` is 0).
    #[error(
        "device {device} does not support memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED \
         is 0), so it has no stream-ordered allocation; use `DeviceBuffer::alloc`"
    )]
    MemoryPoolsUnsupported {
        /// The device's ordinal.
        device: usize,
    },
    /// A graph feature whose driver entry points this driver lacks (an older driver, or an
    /// injection library that does not forward them); nothing was changed.
    #[error(
        "{feature} need {}, which this driver lacks (drivers of CUDA {}.{} or newer have them)",
        .missing.join(", "),
        .feature.min_cuda().0,
        .feature.min_cuda().1
    )]
    GraphFeatureUnavailable {
        /// The feature asked for.
        feature: GraphFeature,
        /// The entry points the driver lacks.
        missing: Vec<&'static str>,
    },
    /// A graph feature of a newer CUDA release than the driver's: it has the entry points, but
    /// not what the feature asks of them (SWITCH and IF/ELSE conditional nodes need CUDA 12.8);
    /// nothing was changed.
    #[error(
        "{feature} need a driver of CUDA {}.{} or newer; this driver is CUDA {}.{}",
        .needs.0, .needs.1, .driver.0, .driver.1
    )]
    GraphFeatureTooOld {
        /// The feature asked for.
        feature: GraphFeature,
        /// The oldest CUDA release whose driver has it.
        needs: (u32, u32),
        /// The driver's CUDA release (`cuDriverGetVersion`).
        driver: (u32, u32),
    },
    /// A view, copy or fill of device memory refused before the driver was called: a range out
    /// of bounds, lengths that differ, a fill width the memory does not fit.
    #[error("{0}")]
    Memory(MemoryRefusal),
    /// Virtual memory (a reservation, a physical allocation, a mapping, a growable buffer, an
    /// export or an import) asked for or used in a way that cannot work ([`VirtualMemoryRefusal`]).
    #[error("{0}")]
    VirtualMemory(VirtualMemoryRefusal),
    /// Peer access asked between devices that cannot reach each other's memory directly
    /// (`cuDeviceCanAccessPeer` says no); nothing was changed.
    #[error(
        "device {device} cannot access device {peer}'s memory directly (cuDeviceCanAccessPeer), \
         so peer access between them cannot be enabled; copies between them still work, staged \
         through host memory by the driver"
    )]
    PeerAccessUnsupported {
        /// The device that would access the other's memory.
        device: usize,
        /// The device whose memory it would access.
        peer: usize,
    },
    /// A memory pool asked for in a way that cannot work ([`PoolRefusal`]); nothing reached the
    /// driver.
    #[error("{0}")]
    Pool(PoolRefusal),
    /// Device memory shared with, or imported from, another process in a way that cannot work
    /// ([`SharingRefusal`]); nothing reached the driver.
    #[error("{0}")]
    Sharing(SharingRefusal),
    /// NVRTC, the CUDA run-time compiler, cannot be loaded (not installed, or a wrong
    /// `ATLAS_NVRTC_PATH`): a model with sources cannot be compiled.
    #[error(transparent)]
    NvrtcUnavailable(#[from] NvrtcLoadError),
    /// An NVRTC call other than the compile itself failed.
    #[error("{0}")]
    Nvrtc(NvrtcFailure),
    /// NVRTC refused to compile a source: `log` is what it said (the errors, with their lines).
    #[error(
        "compiling `{module}` for {target} failed: {}{}",
        nvrtc_error_text(*.code),
        compile_log(.log)
    )]
    Compile {
        /// The source's name.
        module: String,
        /// What it was compiled for (`sm_90 SASS`, `compute_90 PTX`).
        target: String,
        /// The `nvrtcResult` status code.
        code: u32,
        /// NVRTC's log.
        log: String,
    },
    /// A source cannot be compiled for the device with this NVRTC and driver; nothing was
    /// compiled.
    #[error("cannot compile `{module}`: {reason}")]
    CannotCompile {
        /// The source's name.
        module: String,
        /// Why.
        reason: CompileRefusal,
    },
    /// A context limit that cannot be read or set as asked: refused by Atlas before the driver
    /// was called when it can tell, else as the driver refused it.
    #[error(
        "cannot {} {limit} of device {device}{}: {reason}{}",
        if .value.is_some() { "set" } else { "read" },
        to_value(*.value),
        limit_hint(*.limit, .reason)
    )]
    ContextLimit {
        /// The device's ordinal.
        device: usize,
        /// The limit.
        limit: ContextLimit,
        /// The value asked for, or `None` for a read.
        value: Option<usize>,
        /// Why.
        reason: ContextLimitRefusal,
    },
    /// An occupancy question about a block the device cannot run; nothing reached the driver.
    #[error("cannot compute the occupancy of `{function}`: {reason}")]
    Occupancy {
        /// `module::function`.
        function: String,
        /// Which limit the block breaks, with the asked and allowed values.
        reason: LimitError,
    },
    /// The driver answered something Atlas cannot read (a PCI address not of the form
    /// `domain:bus:device.function`).
    #[error(
        "{call} answered `{answer}` for device {device}, which Atlas cannot read as {expected}"
    )]
    DriverAnswer {
        /// The driver call.
        call: &'static str,
        /// The device's ordinal.
        device: usize,
        /// What it answered.
        answer: String,
        /// What Atlas expected (`domain:bus:device.function in hexadecimal`).
        expected: &'static str,
    },
    /// A batch of copies ([`CopyBatch`](crate::CopyBatch)) refused before the driver was called
    /// ([`BatchRefusal`]).
    #[error("cannot enqueue the batch of copies: {0}")]
    Batch(BatchRefusal),
    /// The driver refused a batch of copies at one block (`cuMemcpyBatchAsync`'s `failIdx`).
    /// A failure that concerns no one block is an [`AtlasError::Driver`] (or
    /// [`AtlasError::ContextLost`]).
    #[error("block {block} of the batch of copies: {failure}")]
    BatchBlockFailed {
        /// The block the driver named, numbered as the batch numbers its blocks.
        block: usize,
        /// The failed call.
        failure: DriverFailure,
    },
    /// A tensor map (TMA descriptor) refused before the driver was called: an argument that
    /// breaks a rule of `cuTensorMapEncodeTiled` or `cuTensorMapEncodeIm2col`, a device without
    /// the Tensor Memory Accelerator, or a tensor that reaches past its memory.
    #[error("cannot encode a tensor map: {0}")]
    TensorMap(TensorMapRefusal),
    /// A green context, a split of a device's multiprocessors or a stream of a green context that
    /// cannot be made as asked; nothing was created.
    #[error("{0}")]
    GreenContext(GreenContextRefusal),
}

/// Why a context limit could not be read or set ([`AtlasError::ContextLimit`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContextLimitRefusal {
    /// The limit can only be read (`CU_LIMIT_SHMEM_SIZE`, `CU_LIMIT_CIG_ENABLED`).
    #[error("it can only be read")]
    ReadOnly,
    /// More than the limit can be.
    #[error("it can be at most {max}")]
    TooLarge {
        /// The most it can be.
        max: usize,
    },
    /// The device (or its driver) does not have this limit: refused by Atlas where it knows
    /// (the device-runtime synchronization depth from compute capability 9.0 on), else the
    /// driver's `CUDA_ERROR_UNSUPPORTED_LIMIT`.
    #[error("the device (compute capability {}.{}) or its driver does not support it", .compute_capability.0, .compute_capability.1)]
    Unsupported {
        /// The device's compute capability.
        compute_capability: (u32, u32),
    },
    /// The driver refused it with another status (`CUDA_ERROR_INVALID_VALUE`,
    /// `CUDA_ERROR_OUT_OF_MEMORY`, ...).
    #[error("cuCtx{}Limit refused it: {}", if *.setting { "Set" } else { "Get" }, cuda_error_text(*.code))]
    Driver {
        /// Whether it was `cuCtxSetLimit` (else `cuCtxGetLimit`).
        setting: bool,
        /// The CUDA status code.
        code: u32,
    },
}

fn to_value(value: Option<usize>) -> String {
    value.map(|v| format!(" to {v}")).unwrap_or_default()
}

/// What to do about a refusal, when the limit says.
fn limit_hint(limit: ContextLimit, reason: &ContextLimitRefusal) -> &'static str {
    use ContextLimit::{DevRuntimeSyncDepth, MallocHeapSize, PrintfFifoSize};
    match (limit, reason) {
        (
            PrintfFifoSize | MallocHeapSize,
            ContextLimitRefusal::Driver {
                setting: true,
                code,
            },
        ) if *code == atlas_sys::CUresult::CUDA_ERROR_INVALID_VALUE.0 => {
            " (set it before the context's first launch of a kernel that uses device-side printf, \
             malloc or free)"
        }
        (DevRuntimeSyncDepth, ContextLimitRefusal::Unsupported { .. }) => {
            " (device-side cudaDeviceSynchronize, which it limits, is gone from compute \
             capability 9.0 on)"
        }
        _ => "",
    }
}

/// A graph feature that needs driver entry points older drivers lack
/// ([`AtlasError::GraphFeatureUnavailable`]), or a newer driver than the entry points tell
/// ([`AtlasError::GraphFeatureTooOld`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GraphFeature {
    /// Whole-graph update and upload of an executable graph (CUDA 12.0).
    Update,
    /// Conditional (IF / WHILE) nodes decided on the device (CUDA 12.3).
    Conditional,
    /// IF nodes with an ELSE branch (CUDA 12.8).
    IfElse,
    /// SWITCH nodes: one of n branches, chosen on the device (CUDA 12.8).
    Switch,
}

impl GraphFeature {
    fn what(self) -> &'static str {
        match self {
            Self::Update => "whole-graph update and upload",
            Self::Conditional => "conditional graph nodes",
            Self::IfElse => "IF/ELSE conditional nodes",
            Self::Switch => "SWITCH conditional nodes",
        }
    }

    /// The oldest CUDA release whose driver has the feature.
    pub(crate) fn min_cuda(self) -> (u32, u32) {
        match self {
            Self::Update => (12, 0),
            Self::Conditional => (12, 3),
            Self::IfElse | Self::Switch => (12, 8),
        }
    }
}

impl fmt::Display for GraphFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what())
    }
}

/// Why the driver could not update an executable graph in place from a new graph
/// (`CUgraphExecUpdateResult`): the graph was instantiated again instead
/// ([`GraphUpdate::Reinstantiated`](crate::GraphUpdate::Reinstantiated)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpdateRefusal {
    /// No reason given (`CU_GRAPH_EXEC_UPDATE_ERROR`), e.g. a graph with more than one root or
    /// leaf changed in a way the driver does not pair.
    #[error("the driver refused the update without a reason")]
    Unspecified,
    /// Nodes or edges were added or removed (`..._TOPOLOGY_CHANGED`).
    #[error("the graph's topology changed (nodes or edges added or removed)")]
    TopologyChanged,
    /// A node's type changed (`..._NODE_TYPE_CHANGED`).
    #[error("a node's type changed")]
    NodeTypeChanged,
    /// A kernel node's function changed in a way that cannot be updated, e.g. to another context
    /// (`..._FUNCTION_CHANGED`).
    #[error("a kernel node's function changed context")]
    FunctionChanged,
    /// Parameters changed in a way that cannot be updated (`..._PARAMETERS_CHANGED`), e.g. a copy
    /// between other kinds of memory.
    #[error("a node's parameters changed in a way that cannot be updated")]
    ParametersChanged,
    /// Something about the graph cannot be updated at all (`..._NOT_SUPPORTED`).
    #[error("the graph holds something the driver cannot update")]
    NotSupported,
    /// A kernel node's function changed to one with other requirements (`..._UNSUPPORTED_FUNCTION_CHANGE`).
    #[error("a kernel node's function changed in an unsupported way")]
    UnsupportedFunctionChange,
    /// A node's attributes changed in a way that cannot be updated (`..._ATTRIBUTES_CHANGED`).
    #[error("a node's attributes changed in a way that cannot be updated")]
    AttributesChanged,
    /// A result code this version of Atlas does not know.
    #[error("the driver refused the update (result {0})")]
    Other(u32),
}

impl UpdateRefusal {
    /// The refusal a `CUgraphExecUpdateResult` code stands for; `None` for
    /// `CU_GRAPH_EXEC_UPDATE_SUCCESS` (0).
    pub fn from_result(code: u32) -> Option<Self> {
        Some(match code {
            0 => return None,
            1 => Self::Unspecified,
            2 => Self::TopologyChanged,
            3 => Self::NodeTypeChanged,
            4 => Self::FunctionChanged,
            5 => Self::ParametersChanged,
            6 => Self::NotSupported,
            7 => Self::UnsupportedFunctionChange,
            8 => Self::AttributesChanged,
            other => Self::Other(other),
        })
    }
}

/// Why a launch's attributes ([`LaunchAttributes`](crate::LaunchAttributes)) were refused before
/// `cuLaunchKernelEx` was called: what the device, the kernel or the grid does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttributeRefusal {
    /// Programmatic dependent launch (stream serialization or event) on a device older than
    /// compute capability 9.0.
    #[error(
        "programmatic dependent launch needs compute capability 9.0 or newer; the device is {}.{}",
        .compute_capability.0, .compute_capability.1
    )]
    ProgrammaticUnsupported {
        /// The device's compute capability.
        compute_capability: (u32, u32),
    },
    /// Thread block clusters on a device that cannot launch them
    /// (`CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH` is 0).
    #[error(
        "the device does not support thread block clusters (compute capability {}.{}; clusters \
         need 9.0 or newer)",
        .compute_capability.0, .compute_capability.1
    )]
    ClustersUnsupported {
        /// The device's compute capability.
        compute_capability: (u32, u32),
    },
    /// A cluster dimension of 0.
    #[error("cluster {0:?} has a zero dimension")]
    ZeroCluster((u32, u32, u32)),
    /// A grid dimension that is not a multiple of the cluster's.
    #[error("grid {grid:?} is not a whole number of clusters {cluster:?} in every dimension")]
    GridNotDivisible {
        /// The grid asked for.
        grid: (u32, u32, u32),
        /// The cluster asked for.
        cluster: (u32, u32, u32),
    },
    /// More blocks in a cluster than the portable maximum, for a kernel that does not allow
    /// non-portable sizes.
    #[error(
        "cluster {cluster:?} has {blocks} blocks, more than the portable maximum of {max}; set \
         CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED on the kernel to go beyond it"
    )]
    ClusterTooLarge {
        /// The cluster asked for.
        cluster: (u32, u32, u32),
        /// Its block count.
        blocks: u64,
        /// The portable maximum.
        max: u32,
    },
    /// More blocks in a cluster than the device can run at once for this kernel and
    /// configuration (`cuOccupancyMaxPotentialClusterSize`), for a kernel that allows
    /// non-portable sizes.
    #[error(
        "cluster {cluster:?} has {blocks} blocks; the device runs at most {max} blocks in a cluster          of this kernel with this block size and shared memory"
    )]
    ClusterBeyondDevice {
        /// The cluster asked for.
        cluster: (u32, u32, u32),
        /// Its block count.
        blocks: u64,
        /// The most blocks per cluster the device runs for this kernel and configuration.
        max: u32,
    },
    /// A kernel compiled with `__cluster_dims__` launched with other cluster dimensions.
    #[error(
        "the kernel was compiled for clusters of {required:?} (__cluster_dims__); the launch asks \
         for {given:?}: give those dimensions or none"
    )]
    ClusterMismatch {
        /// The dimensions the kernel was compiled with.
        required: (u32, u32, u32),
        /// The dimensions the launch asks for.
        given: (u32, u32, u32),
    },
    /// A cooperative launch on a device that cannot make one
    /// (`CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH` is 0).
    #[error("the device does not support cooperative launches")]
    CooperativeUnsupported,
    /// A cooperative grid with more blocks than the device holds at once.
    #[error(
        "a cooperative launch needs every block resident at once: the grid has {blocks} blocks, \
         the device holds at most {max} of this kernel and configuration ({per_multiprocessor} \
         per multiprocessor × {multiprocessors} multiprocessors)"
    )]
    CooperativeGridTooLarge {
        /// Blocks in the grid.
        blocks: u64,
        /// The most blocks resident at once.
        max: u64,
        /// Blocks one multiprocessor holds (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
        per_multiprocessor: u32,
        /// The device's multiprocessors.
        multiprocessors: u32,
    },
    /// A priority outside the device's range (`cuCtxGetStreamPriorityRange`).
    #[error(
        "priority {priority} is outside the device's range {greatest} (runs first) ..= {least}"
    )]
    PriorityOutOfRange {
        /// The priority asked for.
        priority: i32,
        /// The numerically lowest priority, which runs first.
        greatest: i32,
        /// The numerically highest priority, the default.
        least: i32,
    },
    /// A programmatic dependent launch (stream serialization or event) of a kernel whose code
    /// never waits for the grid it depends on: it may start before that grid has finished and
    /// read what is not written yet.
    #[error(
        "programmatic dependent launch of a kernel whose code never waits for the grid it depends \
         on (no griddepcontrol.wait in it or in a function it calls): it would read that grid's \
         results before they are written. Call cudaGridDependencySynchronize() (PTX \
         griddepcontrol.wait) before the first read of them, or, if the kernel reads nothing its \
         predecessor writes, say so with LaunchAttributes::programmatic_without_wait(true)"
    )]
    ProgrammaticWithoutWait,
}

/// Why a source cannot be compiled for a device ([`AtlasError::CannotCompile`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompileRefusal {
    /// The device is older than every architecture the NVRTC compiles for.
    #[error(
        "NVRTC {}.{} compiles for sm_{} and newer only; the device is sm_{device}",
        .nvrtc.0, .nvrtc.1, .oldest
    )]
    DeviceTooOld {
        /// The NVRTC's version.
        nvrtc: (u32, u32),
        /// The oldest architecture it compiles for.
        oldest: u32,
        /// The device's architecture.
        device: u32,
    },
    /// The NVRTC is of a newer major CUDA version than the driver, whose loader cannot take what
    /// it makes.
    #[error(
        "NVRTC {}.{} makes code for CUDA {}.x drivers; this driver is CUDA {}.{}: use an NVRTC of \
         CUDA {} or older (ATLAS_NVRTC_PATH)",
        .nvrtc.0, .nvrtc.1, .nvrtc.0, .driver.0, .driver.1, .driver.0
    )]
    NewerThanDriver {
        /// The NVRTC's version.
        nvrtc: (u32, u32),
        /// The driver's CUDA version.
        driver: (u32, u32),
    },
}

/// The names a [`AtlasError::NotFound`] lists, as its message ends: `; the module has `a`,
/// `b` (closest first)`.
fn listed(kind: NotFoundKind, closest: &[String]) -> String {
    if closest.is_empty() {
        return String::new();
    }
    let whose = match kind {
        NotFoundKind::Module => "the registry has",
        NotFoundKind::Function => "the module has the kernels",
        NotFoundKind::Symbol => "the module has the variables",
    };
    let names: Vec<String> = closest
        .iter()
        .map(|n| format!("`{}`", n.escape_debug()))
        .collect();
    let order = if closest.len() > 1 {
        " (closest first)"
    } else {
        ""
    };
    format!("; {whose} {}{order}", names.join(", "))
}

fn on(subject: &str) -> String {
    if subject.is_empty() {
        String::new()
    } else {
        format!(" ({subject})")
    }
}

fn device(ordinal: Option<usize>) -> String {
    match ordinal {
        Some(ordinal) => format!("device {ordinal}"),
        None => "a context Atlas does not manage".into(),
    }
}

fn needs_text(needs: Option<(u32, u32)>) -> String {
    match needs {
        Some((major, minor)) => format!("needs a CUDA {major}.{minor} driver or newer"),
        None => {
            "is newer than this driver JIT-compiles (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)".into()
        }
    }
}

fn older_toolkit((major, minor): (u32, u32), takes: Option<(u32, u32)>) -> String {
    match takes {
        Some(isa) => format!(
            "the toolkit of CUDA {major}.{minor} or an older one (PTX ISA {}.{} or older)",
            isa.0, isa.1
        ),
        None => "an older toolkit".into(),
    }
}

fn log(jit_log: &str) -> String {
    if jit_log.is_empty() {
        String::new()
    } else {
        format!("\nJIT log:\n{}", jit_log.trim_end())
    }
}

fn compile_log(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!("\nNVRTC log:\n{}", log.trim_end())
    }
}

impl From<nvrtc::Error> for AtlasError {
    #[cold]
    fn from(e: nvrtc::Error) -> Self {
        match e {
            nvrtc::Error::Unavailable(e) => Self::NvrtcUnavailable(e),
            nvrtc::Error::Missing(e) => Self::MissingSymbol(e),
            nvrtc::Error::Failed(failure) => Self::Nvrtc(failure),
        }
    }
}

impl From<driver::Error> for AtlasError {
    #[cold]
    fn from(e: driver::Error) -> Self {
        match e {
            driver::Error::Unavailable(e) => Self::DriverUnavailable(e),
            driver::Error::Missing(e) => Self::MissingSymbol(e),
            driver::Error::Failed(failure) if failure.is_sticky() => {
                let current = driver::calls::current_context().ok();
                Self::ContextLost(
                    failure,
                    report_lost_context(current, driver::calls::log_since),
                )
            }
            driver::Error::Failed(failure) => Self::Driver(failure),
        }
    }
}

impl AtlasError {
    /// The CUDA status code when the error came from the driver.
    pub fn cuda_code(&self) -> Option<u32> {
        match self {
            Self::Driver(failure)
            | Self::ContextLost(failure, _)
            | Self::BatchBlockFailed { failure, .. } => Some(failure.code),
            Self::ModuleLoad { code, .. } | Self::Launch { code, .. } => Some(*code),
            Self::ContextLimit {
                reason: ContextLimitRefusal::Driver { code, .. },
                ..
            } => Some(*code),
            Self::PtxTooNew { needs: None, .. } => {
                Some(atlas_sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION.0)
            }
            _ => None,
        }
    }

    /// True when the device's context is lost and the process must restart to use it again.
    pub fn is_context_lost(&self) -> bool {
        matches!(self, Self::ContextLost(..))
    }

    /// For a lost context, what the flight recorder kept of the launches before the fault and
    /// what the driver logged ([`FaultReport`]); `None` for every other error.
    ///
    /// ```no_run
    /// # fn f(stream: &atlas_registry::CudaStream) {
    /// if let Err(e) = stream.synchronize()
    ///     && let Some(report) = e.fault_report()
    /// {
    ///     for launch in report.failing_stream_launches() {
    ///         eprintln!("{launch}"); // newest first: the kernel that faulted is usually first
    ///     }
    /// }
    /// # }
    /// ```
    pub fn fault_report(&self) -> Option<&FaultReport> {
        match self {
            Self::ContextLost(_, report) => Some(report),
            _ => None,
        }
    }

    /// The same error; a lost context's report marks the launches on `stream`, the stream of the
    /// call that found the context lost.
    #[cold]
    pub(crate) fn on_stream(self, stream: atlas_sys::CUstream) -> Self {
        match self {
            Self::ContextLost(failure, report) => {
                Self::ContextLost(failure, report.on_stream(stream))
            }
            other => other,
        }
    }
}

/// Reports a failed cleanup from a `Drop`, where there is no caller to return it to: teardown
/// no-ops (the driver or context is already gone) and cleanups in a lost context (already reported
/// to the calls that found it) are silent; anything else is an error record of the `log` facade,
/// or without a logger one line on stderr ([`report`](crate::report)).
pub(crate) fn report_cleanup(what: &str, result: Result<()>) {
    if let Err(e) = result
        && !e.cuda_code().is_some_and(is_teardown_noop)
        && !e.is_context_lost()
    {
        report(
            log::Level::Error,
            module_path!(),
            format_args!("{what}: {e}"),
            WithoutLogger::Stderr,
        );
    }
}

/// An array argument of `cuTensorMapEncodeTiled` or `cuTensorMapEncodeIm2col`, by the driver's
/// name for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TensorArgument {
    /// `globalDim`: the elements of each dimension.
    GlobalDim,
    /// `globalStrides`: the bytes between elements of each dimension but the innermost.
    GlobalStrides,
    /// `boxDim`: the elements of each dimension of the box a load takes.
    BoxDim,
    /// `elementStrides`: the step in each dimension.
    ElementStrides,
    /// `pixelBoxLowerCorner` of an im2col tensor.
    PixelBoxLowerCorner,
    /// `pixelBoxUpperCorner` of an im2col tensor.
    PixelBoxUpperCorner,
}

impl fmt::Display for TensorArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::GlobalDim => "globalDim",
            Self::GlobalStrides => "globalStrides",
            Self::BoxDim => "boxDim",
            Self::ElementStrides => "elementStrides",
            Self::PixelBoxLowerCorner => "pixelBoxLowerCorner",
            Self::PixelBoxUpperCorner => "pixelBoxUpperCorner",
        })
    }
}

/// Why a tensor map was refused before the driver was called ([`AtlasError::TensorMap`]): each
/// variant names the argument of `cuTensorMapEncodeTiled` / `cuTensorMapEncodeIm2col` and the
/// rule of the driver's documentation it breaks, or says that the tensor reaches past its memory.
/// Dimensions are numbered from the innermost (0).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorMapRefusal {
    /// The memory is on a device without the Tensor Memory Accelerator (compute capability below
    /// 9.0).
    #[error(
        "tensor maps need a device of compute capability 9.0 or newer; device {device} is {}.{}",
        .compute_capability.0, .compute_capability.1
    )]
    DeviceUnsupported {
        /// The device's ordinal.
        device: usize,
        /// Its compute capability.
        compute_capability: (u32, u32),
    },
    /// `tensorRank` out of range: 1 to 5 for a tiled tensor, 3 to 5 for an interleaved or an
    /// im2col one.
    #[error("tensorRank {rank} is outside {min} to {max} for this tensor")]
    Rank {
        /// The dimensions given.
        rank: usize,
        /// The fewest this tensor may have.
        min: usize,
        /// The most.
        max: usize,
    },
    /// An array argument whose length does not follow from the rank (`globalStrides` has one
    /// value fewer, the pixel box corners two fewer).
    #[error("{argument} has {len} value(s); a tensor of rank {rank} needs {expected}")]
    ArgumentLength {
        /// The argument.
        argument: TensorArgument,
        /// Its length.
        len: usize,
        /// The tensor's rank.
        rank: usize,
        /// The length it needs.
        expected: usize,
    },
    /// `globalAddress` not aligned: to 16 bytes, 32 with interleave 32B or a 16-byte-aligned
    /// packed data type.
    #[error("globalAddress {address:#x} is not a multiple of {align} bytes")]
    GlobalAddress {
        /// The memory's device address.
        address: u64,
        /// The alignment it needs.
        align: u64,
    },
    /// A `globalDim` of 0 or above 2^32.
    #[error("globalDim[{dim}] is {value}; it must be 1 to 2^32")]
    GlobalDim {
        /// The dimension.
        dim: usize,
        /// Its value.
        value: u64,
    },
    /// `globalDim[0]` of a packed data type that is not a multiple of what the type needs (128
    /// for the 16-byte-aligned types, 2 for `U4x16Align8`).
    #[error("globalDim[0] is {value}; a tensor of {data_type} needs a multiple of {multiple}")]
    PackedGlobalDim {
        /// Its value.
        value: u64,
        /// The data type.
        data_type: TensorDataType,
        /// What it must be a multiple of.
        multiple: u64,
    },
    /// A `globalStrides` value that is not a multiple of 16 bytes (32 with interleave 32B or a
    /// 16-byte-aligned packed data type).
    #[error("globalStrides[{dim}] is {stride} bytes, not a multiple of {multiple}")]
    GlobalStride {
        /// The dimension (its stride is `globalStrides[dim]`, the step of dimension `dim + 1`).
        dim: usize,
        /// Its value in bytes.
        stride: u64,
        /// What it must be a multiple of.
        multiple: u64,
    },
    /// A `globalStrides` value of 2^40 bytes or more.
    #[error("globalStrides[{dim}] is {stride} bytes; it must be below 2^40")]
    GlobalStrideTooLarge {
        /// The dimension.
        dim: usize,
        /// Its value in bytes.
        stride: u64,
    },
    /// A `boxDim` of 0 or above 256.
    #[error("boxDim[{dim}] is {value}; it must be 1 to 256")]
    BoxDim {
        /// The dimension.
        dim: usize,
        /// Its value.
        value: u32,
    },
    /// `boxDim[0]` of a 16-byte-aligned packed data type that is not 128.
    #[error("boxDim[0] is {value}; a tensor of {data_type} needs 128")]
    PackedBoxDim {
        /// Its value.
        value: u32,
        /// The data type.
        data_type: TensorDataType,
    },
    /// The box's inner dimension in bytes is not a multiple of 16 (a tensor without
    /// interleave).
    #[error(
        "the box's inner dimension (boxDim[0] of {data_type}) is {bytes} bytes, not a multiple of \
         16"
    )]
    BoxInnerBytes {
        /// Its size in bytes (a fraction is rounded up).
        bytes: u64,
        /// The data type.
        data_type: TensorDataType,
    },
    /// The box's inner dimension in bytes (`boxDim[0]`, or `channelsPerPixel` for im2col) is
    /// wider than the swizzle's span (a tensor without interleave).
    #[error(
        "the box's inner dimension is {bytes} bytes, wider than the {span}-byte span of swizzle \
         {swizzle}"
    )]
    SwizzleSpan {
        /// Its size in bytes.
        bytes: u64,
        /// The swizzle.
        swizzle: TensorSwizzle,
        /// The swizzle's span in bytes.
        span: u64,
    },
    /// An `elementStrides` value of 0 or above 8.
    #[error("elementStrides[{dim}] is {value}; it must be 1 to 8")]
    ElementStride {
        /// The dimension.
        dim: usize,
        /// Its value.
        value: u32,
    },
    /// Interleave 32B with another swizzle than 32B.
    #[error("interleave 32B needs swizzle 32B, not {swizzle}")]
    InterleaveSwizzle {
        /// The swizzle given.
        swizzle: TensorSwizzle,
    },
    /// A packed data type with an interleave it does not take (`U6x16Align16` takes none).
    #[error("a tensor of {data_type} takes no interleave, not {interleave}")]
    PackedInterleave {
        /// The data type.
        data_type: TensorDataType,
        /// The interleave given.
        interleave: TensorInterleave,
    },
    /// A 16-byte-aligned packed data type with a swizzle it does not take (none, 128B and 128B
    /// with 32-byte atoms; 128B with 64-byte atoms too for `U6x16Align16`, for stores).
    #[error("a tensor of {data_type} cannot be swizzled {swizzle}")]
    PackedSwizzle {
        /// The data type.
        data_type: TensorDataType,
        /// The swizzle given.
        swizzle: TensorSwizzle,
    },
    /// NaN fill of out-of-bounds elements (`oobFill`) for a data type that is not a floating-point
    /// one.
    #[error("oobFill NaN needs a floating-point data type; {data_type} is not one")]
    NanFillNotFloat {
        /// The data type.
        data_type: TensorDataType,
    },
    /// A pixel box corner offset outside the range the rank allows ([-32768, 32767] for rank 3,
    /// [-128, 127] for rank 4, [-16, 15] for rank 5).
    #[error("{argument}[{index}] is {value}; a tensor of rank {rank} takes {min} to {max}")]
    PixelBoxCorner {
        /// Which corner.
        argument: TensorArgument,
        /// The offset's index.
        index: usize,
        /// Its value.
        value: i32,
        /// The tensor's rank.
        rank: usize,
        /// The least it may be.
        min: i32,
        /// The most it may be.
        max: i32,
    },
    /// `channelsPerPixel` above 256, or other than 128 for a 16-byte-aligned packed type.
    #[error("channelsPerPixel is {value}; it must be {allowed}")]
    ChannelsPerPixel {
        /// Its value.
        value: u32,
        /// What it may be (`at most 256`, `128 for ...`).
        allowed: &'static str,
    },
    /// `pixelsPerColumn` above 1024.
    #[error("pixelsPerColumn is {value}; it must be at most 1024")]
    PixelsPerColumn {
        /// Its value.
        value: u32,
    },
    /// The tensor reaches past the end of the memory it describes.
    #[error(
        "the tensor reaches {reach} bytes from its first element; the memory it describes holds \
         {bytes}"
    )]
    BeyondMemory {
        /// Bytes from the tensor's address to one past its last element (saturated at
        /// `u64::MAX`).
        reach: u64,
        /// The memory's size in bytes.
        bytes: u64,
    },
}

/// Why a green context, a split of a device's multiprocessors or a stream of a green context was
/// refused before the driver was called ([`AtlasError::GreenContext`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GreenContextRefusal {
    /// The driver lacks entry points green contexts need (an older driver, or an injection
    /// library that does not forward them).
    #[error(
        "green contexts need {}, which this driver lacks (drivers of CUDA 12.5 or newer have \
         them)",
        .missing.join(", ")
    )]
    Unsupported {
        /// The entry points the driver lacks.
        missing: Vec<&'static str>,
    },
    /// A split into no group.
    #[error("a split into 0 groups makes nothing: ask for at least one group")]
    NoGroups,
    /// A split whose groups would each need more multiprocessors than the resource has.
    #[error(
        "groups of at least {min_count} multiprocessors cannot be taken from {sms}; ask for at \
         most {sms}"
    )]
    MinCountAboveSms {
        /// The least each group was to have.
        min_count: u32,
        /// The multiprocessors of the resource split.
        sms: u32,
    },
    /// A split of a group made by a split: the driver splits a group again only once a green
    /// context runs on it (split the green context's own resource).
    #[error(
        "a group of a split cannot be split again; make a green context of it and split its \
         resource (`GreenContext::sm_resource`)"
    )]
    SplitOfGroup,
    /// Multiprocessors of one device given for a green context of another.
    #[error("multiprocessors of device {resource} cannot make a green context on device {device}")]
    OtherDevice {
        /// The device the resource is of.
        resource: usize,
        /// The device of the context given.
        device: usize,
    },
}

/// `Result` with [`AtlasError`].
pub type Result<T, E = AtlasError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(call: &'static str, subject: &str, code: u32) -> AtlasError {
        driver::Error::Failed(DriverFailure {
            call,
            subject: subject.into(),
            code,
        })
        .into()
    }

    #[test]
    fn sticky_codes_make_context_lost_errors() {
        let lost = failure("cuStreamSynchronize", "", 700);
        assert!(matches!(&lost, AtlasError::ContextLost(f, _) if f.code == 700));
        assert!(lost.is_context_lost());
        assert!(failure("cuStreamSynchronize", "", 710).is_context_lost());
        let text = lost.to_string();
        assert!(
            text.contains("cuStreamSynchronize failed") && text.contains("restart"),
            "{text}"
        );
        let plain = failure("cuMemAlloc_v2", "4096 bytes", 2);
        assert!(matches!(&plain, AtlasError::Driver(f) if f.code == 2));
        assert!(
            plain
                .to_string()
                .starts_with("cuMemAlloc_v2 failed (4096 bytes): "),
            "{plain}"
        );
        assert!(!plain.is_context_lost());
        assert_eq!(plain.cuda_code(), Some(2));
    }

    #[test]
    fn module_load_error_shows_the_jit_log() {
        let e = AtlasError::ModuleLoad {
            module: "bad".into(),
            code: 218,
            jit_log: "ptxas application ptx input, line 7; error   : syntax error\n".into(),
        };
        let text = e.to_string();
        assert!(
            text.contains("module `bad`")
                && text.contains("(218)")
                && text.contains("line 7; error"),
            "{text}"
        );
    }

    #[test]
    fn update_results_map_to_refusals() {
        use atlas_sys::CUgraphExecUpdateResult as R;
        assert_eq!(
            UpdateRefusal::from_result(R::CU_GRAPH_EXEC_UPDATE_SUCCESS.0),
            None
        );
        let named = [
            (R::CU_GRAPH_EXEC_UPDATE_ERROR, UpdateRefusal::Unspecified),
            (
                R::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
                UpdateRefusal::TopologyChanged,
            ),
            (
                R::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED,
                UpdateRefusal::NodeTypeChanged,
            ),
            (
                R::CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED,
                UpdateRefusal::FunctionChanged,
            ),
            (
                R::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED,
                UpdateRefusal::ParametersChanged,
            ),
            (
                R::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED,
                UpdateRefusal::NotSupported,
            ),
            (
                R::CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE,
                UpdateRefusal::UnsupportedFunctionChange,
            ),
            (
                R::CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED,
                UpdateRefusal::AttributesChanged,
            ),
        ];
        for (code, refusal) in named {
            assert_eq!(
                UpdateRefusal::from_result(code.0),
                Some(refusal),
                "{code:?}"
            );
        }
        assert_eq!(
            UpdateRefusal::from_result(77),
            Some(UpdateRefusal::Other(77))
        );
        assert!(
            UpdateRefusal::TopologyChanged
                .to_string()
                .contains("topology")
        );
    }

    #[test]
    fn missing_graph_features_name_every_entry_point() {
        let e = AtlasError::GraphFeatureUnavailable {
            feature: GraphFeature::Conditional,
            missing: vec![
                "cuGraphConditionalHandleCreate",
                "cuStreamBeginCaptureToGraph",
            ],
        };
        assert_eq!(
            e.to_string(),
            "conditional graph nodes need cuGraphConditionalHandleCreate, \
             cuStreamBeginCaptureToGraph, which this driver lacks (drivers of CUDA 12.3 or newer \
             have them)"
        );
    }

    #[test]
    fn virtual_memory_refusals_say_what_to_do() {
        let size = VirtualMemoryRefusal::SizeNotGranular {
            bytes: 3 << 20,
            granularity: 2 << 20,
        };
        assert_eq!(
            size.to_string(),
            "3145728 bytes is not a multiple of the device's allocation granularity of 2097152 \
             bytes; round it up to 4194304"
        );
        let grow = VirtualMemoryRefusal::WrongDirection { len: 5, current: 9 };
        assert_eq!(
            grow.to_string(),
            "cannot grow a growable buffer of 9 element(s) to 5; use `shrink_to`"
        );
        let shrink = VirtualMemoryRefusal::WrongDirection { len: 9, current: 5 };
        assert!(shrink.to_string().contains("use `grow_to`"), "{shrink}");
        let held =
            AtlasError::VirtualMemory(VirtualMemoryRefusal::HeldByGraph { start: 4, end: 8 });
        assert!(
            held.to_string()
                .starts_with("elements 4..8 of the growable buffer"),
            "{held}"
        );
    }

    #[test]
    fn argument_refusals_carry_both_layouts() {
        let e = AtlasError::InvalidLaunch {
            function: "m::k".into(),
            reason: LaunchRefusal::Arguments {
                expected: vec![8, 4].into(),
                given: vec![8].into(),
                first: Box::new(ArgumentMismatch {
                    index: 1,
                    expected: Some(4),
                    given: None,
                    given_type: None,
                    ptx_name: None,
                    ptx_type: None,
                    fits: "a `u32`, `i32` or `f32`".into(),
                }),
            },
        };
        assert_eq!(
            e.to_string(),
            "cannot launch `m::k`: parameter 1 (4 byte(s)) has no argument: pass a `u32`, `i32` \
             or `f32`; the kernel takes 2 parameter(s) of sizes [8, 4] bytes, the launch gives 1 \
             of sizes [8]"
        );
    }

    #[test]
    fn a_wrong_argument_is_named_with_its_ptx_declaration_and_the_type_that_fits() {
        let wrong =
            |index, given: Option<usize>, name: Option<&str>, ty: Option<&str>| ArgumentMismatch {
                index,
                expected: Some(4),
                given,
                given_type: given.map(|_| "&atlas_registry::memory::buffer::DeviceBuffer<f32>"),
                ptx_name: name.map(str::to_owned),
                ptx_type: ty.map(str::to_owned),
                fits: "a `u32`".into(),
            };
        assert_eq!(
            wrong(2, Some(8), Some("n"), Some(".u32")).to_string(),
            "argument 2 is 8 byte(s) (`&DeviceBuffer<f32>`), but parameter 2 (`n`, `.u32` in the \
             PTX) takes 4: pass a `u32`"
        );
        assert_eq!(
            wrong(2, Some(8), None, None).to_string(),
            "argument 2 is 8 byte(s) (`&DeviceBuffer<f32>`), but parameter 2 takes 4: pass a `u32`"
        );
        assert_eq!(
            wrong(3, None, None, Some(".u32")).to_string(),
            "parameter 3 (`.u32` in the PTX, 4 byte(s)) has no argument: pass a `u32`"
        );
        let extra = ArgumentMismatch {
            index: 4,
            expected: None,
            given: Some(4),
            given_type: Some("u32"),
            ptx_name: None,
            ptx_type: None,
            fits: String::new(),
        };
        assert_eq!(
            extra.to_string(),
            "argument 4 (`u32`, 4 byte(s)) has no parameter"
        );
    }

    #[test]
    fn type_names_lose_their_paths_but_not_their_shape() {
        for (full, short) in [
            ("u32", "u32"),
            (
                "&mut atlas_registry::memory::buffer::DeviceBuffer<f32>",
                "&mut DeviceBuffer<f32>",
            ),
            (
                "atlas_registry::memory::view::DeviceSlice<'_, core::num::NonZeroU32>",
                "DeviceSlice<'_, NonZeroU32>",
            ),
            ("[u8; 24]", "[u8; 24]"),
            ("(a::B, c::d::E<f::G>)", "(B, E<G>)"),
        ] {
            assert_eq!(short_type_name(full), short, "{full}");
        }
    }
}
