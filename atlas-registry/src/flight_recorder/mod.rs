//! The flight recorder: per device context, a small fixed ring of the most recent launches
//! (kernel, registry, stream, grid, block, shared memory, an argument summary, the launch's
//! number on its device), so that when a kernel faults and the context is lost, the error can say
//! which launches ran before it, without rerunning under a sanitizer.
//!
//! # How a launch is recorded
//!
//! Before the driver call, while what it reads is still in registers and in cache from the
//! launch's checks, the launch path checks the context's switch (one relaxed load), makes the
//! record's 15 words, takes the device's next launch number (one atomic increment), takes slot
//! `sequence % RING_SLOTS` of the context's [`ring`] (one compare-and-swap of its stamp) and writes
//! the words there, the stamp still saying "being written". After the call, one store of the stamp
//! is left: the record stands once the driver accepted the launch, and is withdrawn (never read,
//! its number unused) when the driver refused it. No lock, no allocation, no driver call, nothing
//! shared between two launches of one device but its counter, and nothing between devices. Names
//! are not copied: a kernel's `module::function` is interned once, when its handle is first made,
//! and the record holds its number. A launch that a capture Atlas began takes into a graph is
//! recorded as captured; a replay of an instantiated graph is one record naming the executable
//! graph.
//!
//! Each device numbers its own launches, so its ring holds its last [`RING_SLOTS`] launches
//! however many other devices launch at the same time.
//!
//! # How a fault is reported
//!
//! A kernel that faults loses its context, and the driver answers a later call with a sticky
//! status (`CUDA_ERROR_ILLEGAL_ADDRESS`, `CUDA_ERROR_LAUNCH_FAILED`, …). Where Atlas turns that
//! status into [`AtlasError::ContextLost`](crate::AtlasError::ContextLost), it gathers a
//! [`FaultReport`]: the records of the context current on the calling thread (of every device,
//! device by device, when it is not one of Atlas's), newest first, and the driver's own log
//! (`cuLogsDumpToMemory`, CUDA 12.9+). A call that took a stream (a synchronize, a launch, a
//! graph replay) marks the launches of that stream. The first report of each context also goes
//! to the `log` facade at the `error` level.
//!
//! # Switching it off
//!
//! The recorder is on unless the environment variable [`FLIGHT_RECORDER_VAR`]
//! (`ATLAS_FLIGHT_RECORDER`) is `0`, `off` or `false` when a device is first used; each device's
//! recorder is switched at run time by [`FlightRecorder::set_enabled`]
//! ([`CudaHost::flight_recorder`](crate::CudaHost::flight_recorder)).

pub(crate) mod record;
pub(crate) mod ring;
mod sync;

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use atlas_sys::{CUcontext, CUlogIterator, CUstream};

pub use record::{FaultReport, LaunchKind, LaunchRecord, RecordedArgument};
use ring::{Open, Ring, WORDS};

/// The environment variable that turns the flight recorder off for every device when it is `0`,
/// `off` or `false` (read once, when the first device is used).
pub const FLIGHT_RECORDER_VAR: &str = "ATLAS_FLIGHT_RECORDER";

/// How many launches each context's ring holds.
pub const RING_SLOTS: usize = 64;

/// How many arguments' sizes a record keeps.
pub(crate) const SIZES: usize = 8; // said in `LaunchRecord::arguments`' doc
/// How many arguments' values (of 1, 2, 4 or 8 bytes) a record keeps.
pub(crate) const VALUES: usize = 5; // said in `RecordedArgument::value`'s doc

/// Every context's recorder, in the order the devices were first used.
static RECORDERS: Mutex<Vec<Arc<FlightRecorder>>> = Mutex::new(Vec::new());

/// Where the driver's log stood when the first device was used (`None`: it keeps none).
static LOG_FROM: OnceLock<Option<CUlogIterator>> = OnceLock::new();

/// Whether the environment leaves recorders on.
fn on_by_environment() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var(FLIGHT_RECORDER_VAR).map_or(true, |value| {
            !matches!(
                value.trim().to_ascii_lowercase().as_str(),
                "0" | "off" | "false"
            )
        });
        if !on {
            log::debug!("the flight recorder is off ({FLIGHT_RECORDER_VAR}=0)");
        }
        on
    })
}

/// Interned kernel names: a record holds a number, resolved only when a report is made.
#[derive(Default)]
struct Names {
    /// By number - 1: `module::function` and where the module part ends.
    list: Vec<(Arc<str>, usize)>,
    index: HashMap<Arc<str>, u32>,
}

static NAMES: Mutex<Option<Names>> = Mutex::new(None);

/// The number of `module::function` for records (made once per distinct name, never 0; 0 when
/// more than `u32::MAX` names were made).
pub(crate) fn name_number(module: &str, function: &str) -> u32 {
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let names = names.get_or_insert_with(Names::default);
    let name = format!("{module}::{function}");
    if let Some(&number) = names.index.get(name.as_str()) {
        return number;
    }
    let Ok(number) = u32::try_from(names.list.len() + 1) else {
        return 0;
    };
    let name: Arc<str> = name.into();
    names.list.push((Arc::clone(&name), module.len()));
    names.index.insert(name, number);
    number
}

fn name_of(names: &Option<Names>, number: u32) -> Option<(Arc<str>, usize)> {
    let (name, module_len) = names
        .as_ref()?
        .list
        .get((number as usize).checked_sub(1)?)?;
    Some((Arc::clone(name), *module_len))
}

/// What a record keeps of a launch's arguments: the first [`SIZES`] sizes, 16 bits each, and
/// the first [`VALUES`] values of 1, 2, 4 or 8 bytes (0 for other sizes). A typed launch, whose
/// argument types are known where it is compiled, makes them without a loop
/// (`KernelArgs`'s `argument_words`); a raw launch has them read from its parameter array.
///
/// Public in a private module: named by the sealed trait's method, reachable by nobody.
#[derive(Clone, Copy, Default)]
pub struct ArgumentWords {
    pub(crate) sizes: [u64; 2],
    pub(crate) values: [u64; VALUES],
}

impl ArgumentWords {
    /// `sizes` packed as a record keeps them (the first [`SIZES`], each capped at 65,535): at
    /// compile time for a typed launch, once per kernel layout for a raw one.
    pub(crate) const fn pack(sizes: &[usize]) -> [u64; 2] {
        let mut packed = [0u64; 2];
        let mut i = 0;
        while i < sizes.len() && i < SIZES {
            let size = if sizes[i] > 0xffff { 0xffff } else { sizes[i] };
            packed[i / 4] |= (size as u64) << (16 * (i % 4));
            i += 1;
        }
        packed
    }
}

/// The value a record keeps of a parameter of `size` bytes at `at`: the bytes of a 1-, 2-, 4- or
/// 8-byte one as a number, 0 for other sizes. Reads of fixed widths, not a copy of `size` bytes:
/// with `size` known where it is inlined, one load.
///
/// # Safety
///
/// 1. `at` points to `size` readable bytes (unaligned is fine).
#[inline(always)]
pub(crate) unsafe fn read_value(at: *mut c_void, size: usize) -> u64 {
    // SAFETY: duty 1: each arm reads exactly `size` bytes, unaligned (parameters are byte
    // copies to the driver).
    unsafe {
        match size {
            1 => u64::from(at.cast::<u8>().read()),
            2 => u64::from(at.cast::<u16>().read_unaligned()),
            4 => u64::from(at.cast::<u32>().read_unaligned()),
            8 => at.cast::<u64>().read_unaligned(),
            _ => 0,
        }
    }
}

/// One kernel launch as the launch path hands it to the recorder.
pub(crate) struct KernelLaunch {
    /// The kernel's [`name_number`], or 0 for a function Atlas has no entry for.
    pub(crate) name: u32,
    /// The registry's id, or 0.
    pub(crate) registry: u64,
    pub(crate) function: usize,
    pub(crate) stream: CUstream,
    pub(crate) grid: (u32, u32, u32),
    pub(crate) block: (u32, u32, u32),
    pub(crate) shared_mem_bytes: u32,
    pub(crate) with_attributes: bool,
    pub(crate) captured: bool,
    /// The launch's parameter array, and how many pointers it holds.
    pub(crate) params: *mut *mut c_void,
    pub(crate) count: usize,
    /// What the record keeps of the arguments.
    pub(crate) arguments: Arguments,
}

/// Where a record's argument words come from.
#[derive(Clone, Copy)]
pub(crate) enum Arguments {
    /// Made by a typed launch: every size known.
    Made(ArgumentWords),
    /// Read from the parameter array: the kernel's sizes as [`ArgumentWords::pack`] packs them,
    /// and how many sizes the kernel has.
    Read { sizes: [u64; 2], known: usize },
    /// A function whose sizes nobody knows: only the count is kept.
    Unknown,
}

const KIND_KERNEL: u64 = 1;
const KIND_KERNEL_EX: u64 = 2;
const KIND_GRAPH: u64 = 3;

/// One device context's flight recorder: its switch and its ring of recent launches.
///
/// Reached through [`CudaHost::flight_recorder`](crate::CudaHost::flight_recorder). After each
/// launch the driver accepts (typed, raw, with attributes, a graph replay), it writes the kernel,
/// registry, stream, grid, block, shared memory, the first 8 arguments' sizes and the first 5
/// small arguments' values, and the launch's number on this device into a slot of its ring of
/// [`RING_SLOTS`]: no lock, no allocation, no driver call. A lost context's error carries what
/// it holds ([`AtlasError::fault_report`](crate::AtlasError::fault_report)). On unless
/// [`FLIGHT_RECORDER_VAR`] says `0` when the device is first used.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> atlas_registry::Result<()> {
/// let host = atlas_registry::host(0)?;
/// let recorder = host.flight_recorder();
/// for launch in recorder.launches() {
///     println!("{launch}"); // newest first
/// }
/// recorder.set_enabled(false); // launches on device 0 are no longer recorded
/// # Ok(()) }
/// ```
pub struct FlightRecorder {
    ordinal: usize,
    /// The context, as an address (compared, never used).
    context: usize,
    enabled: AtomicBool,
    /// The number of this device's next launch (0 marks an empty slot, so numbers start at 1).
    /// The device's own, so that threads launching on different devices share no cache line.
    next: AtomicU64,
    ring: Ring<RING_SLOTS>,
    /// Whether a lost context was reported to the log facade already.
    reported: AtomicBool,
}

impl FlightRecorder {
    /// The recorder of device `ordinal`'s `context`, switched as the environment says, and
    /// listed for reports; the first one notes where the driver's log stands (`log_position`,
    /// `cuLogsCurrent`), the start of what reports show of it.
    pub(crate) fn new(
        ordinal: usize,
        context: CUcontext,
        log_position: impl FnOnce() -> Option<CUlogIterator>,
    ) -> Arc<Self> {
        LOG_FROM.get_or_init(log_position);
        let recorder = Arc::new(Self {
            ordinal,
            context: context as usize,
            enabled: AtomicBool::new(on_by_environment()),
            next: AtomicU64::new(1),
            ring: Ring::new(),
            reported: AtomicBool::new(false),
        });
        RECORDERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&recorder));
        recorder
    }

    /// Whether launches on this device are recorded now.
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turns recording of this device's launches on or off (from any thread; launches already
    /// recorded stay).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// How many launches the ring holds at most ([`RING_SLOTS`]).
    pub fn capacity(&self) -> usize {
        self.ring.len()
    }

    /// How many launches were not recorded because a thread preempted while writing a record
    /// still held the slot (rare: it takes [`RING_SLOTS`] launches during one write).
    pub fn given_up(&self) -> u64 {
        self.ring.given_up()
    }

    /// The launches recorded on this device, newest first (at most [`capacity`](Self::capacity);
    /// none marked as on a failing stream).
    pub fn launches(&self) -> Vec<LaunchRecord> {
        let names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
        self.ring
            .records()
            .into_iter()
            .map(|(sequence, words)| decode(self.ordinal, sequence, &words, &names))
            .collect()
    }

    /// The record of a kernel launch, written into its slot before the driver is called (while
    /// what it is made of is still in registers and the cache the checks before the launch
    /// warmed), or `None` when the ring gave the record up. [`Note::keep`] makes it stand once the
    /// driver accepted the launch; dropped, it is withdrawn. Made whether the recorder is on or
    /// not: the launch path asks [`is_enabled`](Self::is_enabled) first, and only once.
    ///
    /// # Safety
    ///
    /// 1. For [`Arguments::Read`], for each `i < known`, `launch.params[i]` points to as many
    ///    readable bytes as the `i`-th packed size says (the kernel's parameters, as the launch
    ///    passes them; a size capped at 65,535 is never read).
    #[inline(always)]
    pub(crate) unsafe fn note(&self, launch: &KernelLaunch) -> Option<Note<'_>> {
        let kind = if launch.with_attributes {
            KIND_KERNEL_EX
        } else {
            KIND_KERNEL
        };
        let (known, arguments) = match launch.arguments {
            Arguments::Made(made) => (launch.count, made),
            Arguments::Read { sizes, known } => {
                let mut values = [0u64; VALUES];
                for (i, value) in values.iter_mut().enumerate().take(known) {
                    let size = (sizes[i / 4] >> (16 * (i % 4))) & 0xffff;
                    // SAFETY: duty 1: entry `i` of the array points to `size` readable bytes
                    // (`read_value` reads none for a size other than 1, 2, 4 or 8).
                    *value = unsafe { read_value(*launch.params.add(i), size as usize) };
                }
                (known, ArgumentWords { sizes, values })
            }
            Arguments::Unknown => (0, ArgumentWords::default()),
        };
        let mut words = [0u64; WORDS];
        words[0] = u64::from(launch.name)
            | kind << 32
            | u64::from(launch.captured) << 40
            | (launch.count.min(usize::from(u16::MAX)) as u64) << 48;
        words[1] = launch.registry;
        words[2] = launch.function as u64;
        words[3] = launch.stream as u64;
        words[4] = u64::from(launch.grid.0) | u64::from(launch.grid.1) << 32;
        words[5] = u64::from(launch.grid.2) | u64::from(launch.block.0) << 32;
        words[6] = u64::from(launch.block.1) | u64::from(launch.block.2) << 32;
        words[7] = u64::from(launch.shared_mem_bytes) | (known.min(SIZES) as u64) << 32;
        words[8..10].copy_from_slice(&arguments.sizes);
        words[10..].copy_from_slice(&arguments.values);
        let sequence = self.next.fetch_add(1, Ordering::Relaxed);
        self.ring.open(sequence, &words).map(Note)
    }

    /// Records a replay of executable graph `exec` on `stream`.
    pub(crate) fn graph(&self, exec: usize, stream: CUstream) {
        let sequence = self.next.fetch_add(1, Ordering::Relaxed);
        let mut words = [0u64; WORDS];
        words[0] = KIND_GRAPH << 32;
        words[2] = exec as u64;
        words[3] = stream as u64;
        self.ring.write(sequence, &words);
    }
}

/// A kernel launch's record, written by [`FlightRecorder::note`] before the driver call with the
/// launch's number on its device: after the call, what is left is one store of its slot's stamp,
/// [`keep`](Self::keep) when the driver accepted the launch, a drop (the record withdrawn, its
/// number unused) when it refused it.
pub(crate) struct Note<'a>(Open<'a, WORDS>);

impl Note<'_> {
    /// Makes the record of a launch the driver accepted stand (see `ring`).
    #[inline(always)]
    pub(crate) fn keep(self) {
        self.0.stand();
    }
}

/// The recorder of `context`, when it is the context of a device Atlas uses.
pub(crate) fn recorder_of(context: CUcontext) -> Option<Arc<FlightRecorder>> {
    RECORDERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|r| r.context == context as usize)
        .cloned()
}

/// The record of `words`, made on device `ordinal`.
fn decode(
    ordinal: usize,
    sequence: u64,
    words: &[u64; WORDS],
    names: &Option<Names>,
) -> LaunchRecord {
    let low = |word: u64| word as u32;
    let high = |word: u64| (word >> 32) as u32;
    let kind = match (words[0] >> 32) & 0xff {
        KIND_GRAPH => LaunchKind::Graph,
        KIND_KERNEL_EX => LaunchKind::KernelWithAttributes,
        _ => LaunchKind::Kernel,
    };
    let name = name_of(names, low(words[0]));
    let known_sizes = (high(words[7]) as usize).min(SIZES);
    let arguments = (0..known_sizes)
        .map(|i| {
            let size = ((words[8 + i / 4] >> (16 * (i % 4))) & 0xffff) as usize;
            RecordedArgument {
                size,
                value: (i < VALUES && matches!(size, 1 | 2 | 4 | 8)).then(|| words[10 + i]),
            }
        })
        .collect();
    LaunchRecord {
        sequence,
        device: ordinal,
        kind,
        registry: (words[1] != 0 && name.is_some()).then_some(words[1]),
        name,
        handle: words[2] as usize,
        stream: words[3] as usize,
        grid: (low(words[4]), high(words[4]), low(words[5])),
        block: (high(words[5]), low(words[6]), high(words[6])),
        shared_mem_bytes: low(words[7]),
        captured: (words[0] >> 40) & 1 != 0,
        argument_count: (words[0] >> 48) as usize,
        arguments,
        on_failing_stream: true,
    }
}

/// The report for a lost context, gathered where the sticky status became an error: the records
/// of `current` (the context current on the calling thread), or of every device when that is
/// none of Atlas's, and the driver's log as `log_since` reads it from where it stood when the
/// first device was used (`cuLogsDumpToMemory`). The first report of each context goes to the
/// log facade too.
#[cold]
pub(crate) fn report_lost_context(
    current: Option<CUcontext>,
    log_since: impl FnOnce(Option<CUlogIterator>) -> Option<String>,
) -> FaultReport {
    let recorders = RECORDERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let current = current.map(|c| c as usize);
    let mine: Vec<_> = recorders
        .iter()
        .filter(|r| Some(r.context) == current)
        .collect();
    let chosen = if mine.is_empty() {
        recorders.iter().collect()
    } else {
        mine
    };
    let mut launches: Vec<LaunchRecord> = chosen.iter().flat_map(|r| r.launches()).collect();
    // Each device numbers its own launches: by device, then newest first.
    launches.sort_unstable_by_key(|launch| (launch.device, std::cmp::Reverse(launch.sequence)));
    let recording = chosen.iter().any(|r| r.is_enabled());
    let driver_log = log_since(LOG_FROM.get().copied().flatten());
    let report = FaultReport::new(launches, driver_log, recording);
    let first = chosen
        .iter()
        .filter(|r| !r.reported.swap(true, Ordering::Relaxed))
        .map(|r| r.ordinal)
        .collect::<Vec<_>>();
    if !first.is_empty() {
        // Straight to the facade (silent without a logger, as `report` would have it): the
        // recorder stands below every other concept and imports none.
        log::error!("the CUDA context of device(s) {first:?} is lost{report}");
    }
    report
}

impl fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("device", &self.ordinal)
            .field("enabled", &self.is_enabled())
            .field("capacity", &self.capacity())
            .finish()
    }
}
