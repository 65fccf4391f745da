//! Green contexts: a device's multiprocessors split into groups ([`SmResource`],
//! [`SmResource::split`]), and a [`GreenContext`] that runs its streams' work on one group only,
//! as serving engines split a GPU between prefill and decode.
//!
//! A green context shares its device's primary context: its memory, and the modules loaded there.
//! The driver says so in the stream's contexts (`cuStreamGetCtx_v2` answers the primary context
//! and the green context for a stream of a green context), and Atlas follows it: a stream of a
//! green context ([`GreenContext::stream`]) is a stream of the primary context for every check,
//! so functions of registries on that device launch there, with buffers of that device, and
//! nothing of another device does. The stream keeps its green context alive.
//!
//! Green contexts came with CUDA 12.4 drivers; every entry point Atlas uses for them is in drivers
//! of CUDA 12.5 or newer, and a driver without one is refused naming them
//! ([`GreenContextRefusal::Unsupported`]).

use std::fmt;
use std::sync::Arc;

use atlas_sys::{CUcontext, CUdevResource, CUdevResourceType, CUdevice, CUgreenCtx};

use crate::device::context::CudaContext;
use crate::device::host::host;
use crate::device::stream::CudaStream;
use crate::driver::{About, calls};
use crate::error::{AtlasError, GreenContextRefusal, Result, report_cleanup};

/// `Ok` when the driver has every entry point green contexts need, else the refusal naming the
/// ones it lacks.
fn require_green_contexts() -> Result<()> {
    let missing = calls::missing_green_contexts()?;
    if missing.is_empty() {
        Ok(())
    } else {
        Err(refused(GreenContextRefusal::Unsupported { missing }))
    }
}

#[cold]
fn refused(reason: GreenContextRefusal) -> AtlasError {
    AtlasError::GreenContext(reason)
}

/// How the driver sizes the groups of a split on an architecture, as its documentation gives it
/// ("a guideline ... subject to change"): at least `min` multiprocessors, a multiple of
/// `multiple`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SmGranularity {
    /// The fewest multiprocessors a group has.
    pub min: u32,
    /// What a group's multiprocessor count is a multiple of.
    pub multiple: u32,
}

impl SmGranularity {
    /// The guideline for devices of `compute_capability`: 1 on 6.x; 2, by twos, on 7.x; 4, by
    /// twos, on 8.x; 8, by eights, from 9.0 on.
    pub fn of(compute_capability: (u32, u32)) -> Self {
        let (min, multiple) = match compute_capability.0 {
            0..=6 => (1, 1),
            7 => (2, 2),
            8 => (4, 2),
            _ => (8, 8),
        };
        Self { min, multiple }
    }

    /// The size of the groups a split asked for groups of at least `min_count` makes, by this
    /// guideline.
    pub fn group_size(self, min_count: u32) -> u32 {
        min_count.max(self.min).next_multiple_of(self.multiple)
    }
}

/// Multiprocessors of one device, as the driver describes them (`CUdevResource` of type SM): all
/// of the device's ([`of_device`](Self::of_device)), those of a green context
/// ([`GreenContext::sm_resource`]), or a group of a split ([`split`](Self::split)).
///
/// # Examples
///
/// Two groups of 64 multiprocessors (of an H200's 132), a green context on each, and a stream on
/// each that runs work only there:
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{GreenContext, SmResource};
/// let ctx = registry.ctx();
/// let all = SmResource::of_device(ctx)?;
/// let split = all.split(2, 64)?;
/// println!("{} groups, {} multiprocessors left over", split.groups.len(), split.remainder.sm_count());
/// let prefill = GreenContext::new(ctx, &split.groups[0])?;
/// let decode = GreenContext::new(ctx, &split.groups[1])?;
/// let (prefill_stream, decode_stream) = (prefill.stream()?, decode.stream()?);
/// assert_eq!(decode.sm_resource()?.sm_count(), split.groups[1].sm_count());
/// // Kernels of `registry` launch on either stream as on any stream of its device.
/// # drop((prefill_stream, decode_stream)); Ok(()) }
/// ```
#[derive(Clone, Copy)]
pub struct SmResource {
    raw: CUdevResource,
    device: CUdevice,
    ordinal: usize,
    /// Made by a split: the driver splits it again only once a green context runs on it.
    of_split: bool,
}

// SAFETY: a resource is plain data the driver wrote, which names no host memory.
unsafe impl Send for SmResource {}
// SAFETY: as for Send; shared references only read it.
unsafe impl Sync for SmResource {}

impl SmResource {
    /// Every multiprocessor of `context`'s device (`cuDeviceGetDevResource`).
    #[doc(alias = "cuDeviceGetDevResource")]
    pub fn of_device(context: &CudaContext) -> Result<Self> {
        require_green_contexts()?;
        let raw = calls::device_sm_resource(context.device())
            .about(|| format!("device {}", context.ordinal()))?;
        Ok(Self {
            raw,
            device: context.device(),
            ordinal: context.ordinal(),
            of_split: false,
        })
    }

    /// How many multiprocessors it holds.
    pub fn sm_count(&self) -> u32 {
        if self.raw.type_ != CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM {
            return 0;
        }
        // SAFETY: the driver wrote an SM resource (its type says so), whose union member is `sm`;
        // every bit pattern is a valid u32 anyway.
        unsafe { self.raw.__bindgen_anon_1.sm.smCount }
    }

    /// The ordinal of the device the multiprocessors are of.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The raw resource, for driver calls Atlas does not wrap.
    pub fn raw(&self) -> &CUdevResource {
        &self.raw
    }

    /// Splits the multiprocessors into up to `groups` disjoint groups of at least `min_count`
    /// each (`cuDevSmResourceSplitByCount`, no flags), and what is left over. The driver rounds
    /// `min_count` up to its architecture's granularity ([`SmGranularity`]) and may make fewer
    /// groups than asked (thread block clusters need groups of whole GPC parts); each group's
    /// [`sm_count`](Self::sm_count) says what it made. What is left over has none of the groups'
    /// guarantees: the driver advises against running work there.
    ///
    /// Refused before the driver is called ([`AtlasError::GreenContext`]): 0 groups, a
    /// `min_count` above this resource's count, a split of a group of a split (which the driver
    /// splits only once a green context runs on it: split [`GreenContext::sm_resource`]).
    #[doc(alias = "cuDevSmResourceSplitByCount")]
    pub fn split(&self, groups: u32, min_count: u32) -> Result<SmSplit> {
        if groups == 0 {
            return Err(refused(GreenContextRefusal::NoGroups));
        }
        let sms = self.sm_count();
        if min_count > sms {
            return Err(refused(GreenContextRefusal::MinCountAboveSms {
                min_count,
                sms,
            }));
        }
        if self.of_split {
            return Err(refused(GreenContextRefusal::SplitOfGroup));
        }
        // SAFETY: the driver wrote this resource (of a device or a green context), which is not
        // a group of a split (checked above).
        let (made, remainder) = unsafe { calls::sm_resource_split(&self.raw, groups, min_count) }
            .about(|| {
            format!(
                "{groups} group(s) of at least {min_count} of device {}'s {sms} \
                     multiprocessors",
                self.ordinal
            )
        })?;
        let of_split = |raw| Self {
            raw,
            device: self.device,
            ordinal: self.ordinal,
            of_split: true,
        };
        Ok(SmSplit {
            groups: made.into_iter().map(of_split).collect(),
            remainder: of_split(remainder),
        })
    }
}

impl fmt::Debug for SmResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmResource")
            .field("device", &self.ordinal)
            .field("sm_count", &self.sm_count())
            .field("of_split", &self.of_split)
            .finish()
    }
}

/// The result of [`SmResource::split`]: the groups made, and the multiprocessors left over.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SmSplit {
    /// The groups, disjoint, each of at least the count asked for.
    pub groups: Vec<SmResource>,
    /// What is left over (a count of 0 when the groups took everything).
    pub remainder: SmResource,
}

/// A green context: a context of one device that runs its streams' work on a group of the
/// device's multiprocessors only (`cuGreenCtxCreate`), sharing the device's primary context
/// (memory, modules) with everything else Atlas does there. Destroyed when the last of it and
/// its streams goes.
///
/// See [`SmResource`] for an example.
pub struct GreenContext {
    green: Arc<Green>,
}

/// The green context itself, shared with its streams.
struct Green {
    raw: CUgreenCtx,
    /// `cuCtxFromGreenCtx`'s handle for it.
    context: CUcontext,
    /// The primary context of its device.
    primary: CUcontext,
    ordinal: usize,
}

// SAFETY: green contexts and contexts are driver handles usable from any thread; `raw` is
// destroyed once, when the last owner drops it.
unsafe impl Send for Green {}
// SAFETY: as for Send; shared references only read the handles or pass them to the driver, whose
// calls on a green context that Atlas makes (stream creation, resource query) are thread-safe.
unsafe impl Sync for Green {}

impl Drop for Green {
    fn drop(&mut self) {
        // SAFETY: the green context is live, destroyed only here, once; its streams, which keep
        // it, are destroyed already.
        let result = unsafe { calls::green_destroy(self.raw) }.map_err(AtlasError::from);
        report_cleanup("destroying a green context", result);
    }
}

impl GreenContext {
    /// A green context on `context`'s device that runs on the multiprocessors of `group`
    /// (`cuDevResourceGenerateDesc`, `cuGreenCtxCreate` with its default stream, which the driver
    /// requires, then `cuCtxFromGreenCtx`): a group of a split, or a whole resource.
    ///
    /// Refused before the driver is called: a group of another device
    /// ([`GreenContextRefusal::OtherDevice`]), a driver without green contexts
    /// ([`GreenContextRefusal::Unsupported`]).
    #[doc(alias = "cuGreenCtxCreate")]
    pub fn new(context: &CudaContext, group: &SmResource) -> Result<Self> {
        require_green_contexts()?;
        if group.ordinal != context.ordinal() {
            return Err(refused(GreenContextRefusal::OtherDevice {
                resource: group.ordinal,
                device: context.ordinal(),
            }));
        }
        let subject = || {
            format!(
                "{} multiprocessors of device {}",
                group.sm_count(),
                group.ordinal
            )
        };
        // SAFETY: the driver wrote `group`.
        let desc = unsafe { calls::resource_desc(&group.raw) }.about(subject)?;
        // SAFETY: `desc` was made just now of a resource of this device (checked above).
        let raw = unsafe { calls::green_create(desc, context.device()) }.about(subject)?;
        let mut green = Green {
            raw,
            context: std::ptr::null_mut(),
            primary: context.raw(),
            ordinal: context.ordinal(),
        };
        // SAFETY: the green context is live (made above; `green` destroys it on an error).
        green.context = unsafe { calls::context_of_green(raw) }.about(subject)?;
        Ok(Self {
            green: Arc::new(green),
        })
    }

    /// The multiprocessors the green context runs on (`cuGreenCtxGetDevResource`): what the
    /// driver provisioned for it, which a split of its own may divide again.
    #[doc(alias = "cuGreenCtxGetDevResource")]
    pub fn sm_resource(&self) -> Result<SmResource> {
        let green = &self.green;
        // SAFETY: the green context is live (`self` keeps it).
        let raw = unsafe { calls::green_sm_resource(green.raw) }
            .about(|| format!("a green context of device {}", green.ordinal))?;
        let device = host(green.ordinal)?.context().device();
        Ok(SmResource {
            raw,
            device,
            ordinal: green.ordinal,
            of_split: false,
        })
    }

    /// A non-blocking stream whose work runs on the green context's multiprocessors
    /// (`cuGreenCtxStreamCreate`, the default priority): a stream of the device's primary
    /// context for every check Atlas makes (functions of registries on this device launch there,
    /// with buffers of this device). It keeps the green context alive and is destroyed on drop.
    #[doc(alias = "cuGreenCtxStreamCreate")]
    pub fn stream(&self) -> Result<CudaStream> {
        let least = host(self.green.ordinal)?.context().stream_priorities()?.0;
        self.stream_with_priority(least)
    }

    /// As [`stream`](Self::stream), with `priority` (between the two ends of
    /// [`CudaContext::stream_priorities`]; a priority outside them is refused with
    /// [`AtlasError::StreamPriority`], as [`CudaStream::with_priority`] refuses it).
    #[doc(alias = "cuGreenCtxStreamCreate")]
    pub fn stream_with_priority(&self, priority: i32) -> Result<CudaStream> {
        let green = &self.green;
        let (least, greatest) = host(green.ordinal)?.context().stream_priorities()?;
        if !(greatest..=least).contains(&priority) {
            return Err(AtlasError::StreamPriority {
                priority,
                device: green.ordinal,
                least,
                greatest,
            });
        }
        // SAFETY: the green context is live (`self` keeps it, and the stream keeps it after).
        let raw = unsafe { calls::green_stream_create(green.raw, priority) }
            .about(|| format!("a green context of device {}", green.ordinal))?;
        let keeper: Arc<dyn Send + Sync> = Arc::clone(&self.green) as _;
        Ok(CudaStream::owned_on(raw, green.primary, keeper))
    }

    /// The raw `CUgreenCtx`, for driver calls Atlas does not wrap; valid while `self` or one of
    /// its streams lives.
    pub fn raw(&self) -> CUgreenCtx {
        self.green.raw
    }

    /// The context handle of the green context (`cuCtxFromGreenCtx`), for driver calls that take
    /// a `CUcontext`; valid as [`raw`](Self::raw) is.
    #[doc(alias = "cuCtxFromGreenCtx")]
    pub fn raw_context(&self) -> CUcontext {
        self.green.context
    }

    /// The ordinal of its device.
    pub fn ordinal(&self) -> usize {
        self.green.ordinal
    }
}

impl fmt::Debug for GreenContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GreenContext")
            .field("raw", &self.green.raw)
            .field("device", &self.green.ordinal)
            .finish()
    }
}
