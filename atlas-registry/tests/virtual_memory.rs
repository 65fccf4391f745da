//! Virtual memory: reservations, physical allocations and mappings checked before the driver is
//! called, a growable buffer whose address never moves, used by kernels, copies and graphs as a
//! `DeviceBuffer` is, and physical memory shared with a child process through a file descriptor.
//!
//! Stand-in (CI): `cargo test -p atlas-registry --test virtual_memory`; the stand-in maps memfds
//! into reserved host address space, so copies, kernels, graph replays and the child process all
//! reach real memory. GPU: `-- --include-ignored gpu_`.

mod support;

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use atlas_registry::sys::LIBCUDA_PATH_VAR;
use atlas_registry::{
    AddressReservation, AtlasError, AtlasRegistry, CaptureMisuse, CudaStream, DeviceBuffer,
    DeviceMemory, DeviceMemoryMut, FunctionCache, Granularity, GrowableBuffer, LaunchConfig,
    MemoryAccess, PhysicalAllocation, VirtualMemoryRefusal, host,
};
use support::blobs::load;
use support::child::{self, Ending};
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    standin_grows_and_shrinks_in_place,
    elements_that_straddle_chunks_round_trip,
    every_refusal_comes_before_the_driver,
    memory_of_another_device_is_refused,
    a_driver_without_the_entry_points_is_refused,
    a_device_without_virtual_memory_is_refused,
    a_device_without_file_descriptor_handles_is_refused,
    growth_costs_only_the_calls_it_needs,
    standin_graphs_keep_the_chunks_they_use,
    standin_a_graph_replays_after_its_growable_buffer_is_dropped,
    a_shrink_during_a_capture_unmaps_when_it_ends,
    a_mapping_keeps_its_reservation_and_memory,
    shares_memory_with_a_child_process,
    keeps_its_memory_when_the_child_aborts,
    importer_scales_the_shared_memory,
    importer_aborts_after_mapping,
);

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
static AXPY: FunctionCache = FunctionCache::new("elementwise", "axpy");

/// What memory holds before it is written: finite, so that kernels scale it exactly.
const POISON: f32 = -1234.5;
/// The stand-in's granularity (`standin.c`): minimum 64 KiB, recommended 2 MiB.
const STANDIN_GRANULARITY: Granularity = Granularity {
    minimum: 64 << 10,
    recommended: 2 << 20,
};
/// The child process's descriptor of the shared memory, and its size.
const FD_VAR: &str = "ATLAS_TEST_VMM_FD";
const BYTES_VAR: &str = "ATLAS_TEST_VMM_BYTES";
/// What the child scales the shared memory by.
const CHILD_FACTOR: f32 = -3.0;

/// The refusal inside `result`, which must be an [`AtlasError::VirtualMemory`].
#[track_caller]
fn refusal<T: std::fmt::Debug>(result: atlas_registry::Result<T>) -> VirtualMemoryRefusal {
    match result {
        Err(AtlasError::VirtualMemory(refusal)) => refusal,
        other => panic!("expected a virtual memory refusal, got {other:?}"),
    }
}

/// Asserts that `got` and `want` are the same bits, element by element.
#[track_caller]
fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} != {w}");
    }
}

fn config(n: usize) -> LaunchConfig {
    LaunchConfig::for_elements(n as u32, 256)
}

// ---------------------------------------------------------------------------------------------
// Bodies that run on the stand-in and on a GPU
// ---------------------------------------------------------------------------------------------

/// Grows a buffer from one chunk to `max_bytes` in steps (odd lengths among them), and at each
/// step poisons the new elements, writes fresh random data into most of them, scales the whole
/// buffer with a kernel and adds its old end into its new start with another: the old and new
/// parts, read back, match the CPU, and the address never moves. Then shrinks it to an odd length
/// in the middle and grows it to the end again.
fn grows_and_shrinks_in_place(registry: &AtlasRegistry, max_bytes: usize) {
    let mut rng = Rng::new();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let capacity = max_bytes / 4;
    let mut buf = GrowableBuffer::<f32>::new(ctx, capacity).unwrap();
    assert_eq!((buf.len(), buf.mapped_bytes()), (0, 0));
    assert_eq!(
        buf.capacity(),
        capacity,
        "{max_bytes} bytes are whole chunks"
    );
    let base = buf.device_ptr();
    let chunk = buf.chunk_bytes() / 4;
    let mut lens = vec![chunk, chunk + 5, 3 * chunk + 7];
    while lens.last() < Some(&capacity) {
        let next = (lens[lens.len() - 1] * 4 + 13).min(capacity);
        lens.push(next);
    }
    let mut want = Vec::new();
    for &len in &lens {
        grow_and_check(registry, &stream, &mut buf, &mut want, len, &mut rng);
        assert_eq!(
            buf.device_ptr(),
            base,
            "the address moved at {len} elements"
        );
    }

    let len = 3 * chunk + 4;
    buf.shrink_to(len).unwrap();
    want.truncate(len);
    assert_eq!((buf.len(), buf.mapped_bytes()), (len, 4 * chunk * 4));
    assert_eq!(buf.device_ptr(), base);
    assert_bits(&buf.to_vec(&stream).unwrap(), &want, "after the shrink");
    grow_and_check(registry, &stream, &mut buf, &mut want, capacity, &mut rng);
    assert_eq!(buf.device_ptr(), base);
}

/// One growth step of [`grows_and_shrinks_in_place`].
fn grow_and_check(
    registry: &AtlasRegistry,
    stream: &CudaStream,
    buf: &mut GrowableBuffer<f32>,
    want: &mut Vec<f32>,
    len: usize,
    rng: &mut Rng,
) {
    let old = want.len();
    buf.grow_to(len).unwrap();
    assert_eq!(buf.len(), len);
    let chunk_bytes = buf.chunk_bytes();
    assert_eq!(
        buf.mapped_bytes(),
        (len * 4).div_ceil(chunk_bytes) * chunk_bytes
    );

    // The new elements poisoned, then random data in most of them: poison stays at both ends.
    buf.range_mut(old..).unwrap().fill(stream, POISON).unwrap();
    let (from, to) = (old + (len - old) / 7, len - (len - old) / 5);
    let data = rng.vec(to - from);
    buf.range_mut(from..to)
        .unwrap()
        .copy_from(stream, &data)
        .unwrap();
    want.resize(len, POISON);
    want[from..to].copy_from_slice(&data);

    // A kernel over the old and new parts at once.
    let scale = SCALE.get(registry).unwrap();
    let factor = rng.f32_in(0.5, 2.0);
    // SAFETY: `scale` touches the `len` floats of the buffer, which holds exactly `len`.
    unsafe { scale.launch(stream, &config(len), (&mut *buf, factor, len as u32)) }.unwrap();
    for v in want.iter_mut() {
        *v *= factor;
    }
    // The old part's end added into the new part's start: reads before the boundary, writes after.
    let m = old.min(len - old);
    if m > 0 {
        let axpy = AXPY.get(registry).unwrap();
        // A power of two: `a * x` is exact, so a fused multiply-add rounds as the CPU does.
        let a = [0.5f32, -2.0, 0.25, -0.5][rng.index(4)];
        let (low, high) = buf.split_at_mut(old).unwrap();
        let (x, y) = (low.range(old - m..).unwrap(), high.range_mut(..m).unwrap());
        // SAFETY: `axpy` reads `m` floats of `x` and updates `m` of `y`, disjoint views.
        unsafe { axpy.launch(stream, &config(m), (x, y, a, m as u32)) }.unwrap();
        for i in 0..m {
            want[old + i] += a * want[old - m + i];
        }
    }
    let got = buf.to_vec(stream).unwrap();
    assert_bits(&got, want, &format!("grown to {len} elements"));
}

/// A scale captured with the buffer at three chunks: growing past them and shrinking back to
/// them is allowed; shrinking into them is refused (naming the elements), while the graph's
/// replays stay right; once the graph goes, the shrink is made. A graph of the buffer as it is now
/// holds all of its chunks the same way.
fn graphs_keep_the_chunks_they_use(registry: &AtlasRegistry) {
    let mut rng = Rng::new();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let scale = SCALE.get(registry).unwrap();
    let mut buf = GrowableBuffer::<f32>::new(ctx, 8 << 20).unwrap();
    let chunk = buf.chunk_bytes() / 4;
    let len = 2 * chunk + 3;
    buf.grow_to(len).unwrap();
    let mut want = rng.vec(len);
    buf.copy_from(&stream, &want).unwrap();

    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: each replay scales the `len` floats the graph keeps mapped.
    unsafe { scale.launch(&capture, &config(len), (&mut buf, 2.0f32, len as u32)) }.unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();

    buf.grow_to(5 * chunk).unwrap();
    buf.shrink_to(len).unwrap(); // the chunks past the graph's: not held
    let e = refusal(buf.shrink_to(chunk - 1));
    assert_eq!(
        e,
        VirtualMemoryRefusal::HeldByGraph {
            start: chunk,
            end: len
        }
    );
    assert!(e.to_string().contains(&format!("{chunk}..{len}")), "{e}");
    assert_eq!((buf.len(), buf.mapped_bytes()), (len, 3 * chunk * 4));
    for replay in 0..2 {
        // SAFETY: the graph keeps the chunks its kernel touches.
        unsafe { exec.launch(&stream) }.unwrap();
        stream.synchronize().unwrap();
        for v in want.iter_mut() {
            *v *= 2.0;
        }
        let got = buf.to_vec(&stream).unwrap();
        assert_bits(&got, &want, &format!("replay {replay}"));
    }
    drop(exec);
    buf.shrink_to(chunk - 1).unwrap();
    want.truncate(chunk - 1);
    assert_eq!(buf.mapped_bytes(), chunk * 4);
    assert_bits(&buf.to_vec(&stream).unwrap(), &want, "after the shrink");

    // Captured with the buffer as it is now: its current chunks are the graph's.
    buf.grow_to(2 * chunk).unwrap();
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, never run.
    unsafe { scale.launch(&capture, &config(chunk), (&mut buf, 1.0f32, chunk as u32)) }.unwrap();
    let graph = capture.end().unwrap();
    let e = refusal(buf.shrink_to(1));
    assert_eq!(
        e,
        VirtualMemoryRefusal::HeldByGraph {
            start: chunk,
            end: 2 * chunk
        }
    );
    drop(graph);
    buf.shrink_to(1).unwrap();
}

/// A scale and a copy out of the buffer, captured; the buffer dropped; every replay still scales
/// its memory and copies it out (the graph keeps the chunks mapped).
fn a_graph_replays_after_its_buffer_is_dropped(registry: &AtlasRegistry) {
    let mut rng = Rng::new();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let scale = SCALE.get(registry).unwrap();
    let mut buf = GrowableBuffer::<f32>::new(ctx, 4 << 20).unwrap();
    let len = buf.chunk_bytes() / 4 + 9; // two chunks
    buf.grow_to(len).unwrap();
    let data = rng.vec(len);
    buf.copy_from(&stream, &data).unwrap();
    let mut out = DeviceBuffer::from_slice(ctx, &stream, &vec![POISON; len]).unwrap();

    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: each replay scales the `len` floats the graph keeps mapped.
    unsafe { scale.launch(&capture, &config(len), (&mut buf, 3.0f32, len as u32)) }.unwrap();
    out.copy_from_device(&capture, &buf).unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    drop(buf);

    let mut want = data;
    for replay in 0..2 {
        // SAFETY: the graph keeps the buffer's chunks and `out`.
        unsafe { exec.launch(&stream) }.unwrap();
        stream.synchronize().unwrap();
        for v in want.iter_mut() {
            *v *= 3.0;
        }
        assert_bits(
            &out.to_vec(&stream).unwrap(),
            &want,
            &format!("replay {replay}"),
        );
    }
}

/// The parent's side of sharing: exportable memory mapped and filled with random data, its
/// descriptor inherited by a child process that runs `importer`; returns the data, the parent's
/// buffer over the memory, and how the child ended.
fn share_with_child<F: Fn()>(
    importer: F,
    registry: &AtlasRegistry,
    stream: &CudaStream,
) -> (Vec<f32>, DeviceBuffer<f32>, child::Child) {
    let ctx = registry.ctx();
    let bytes = 2 * PhysicalAllocation::granularity(ctx).unwrap().minimum;
    let memory = PhysicalAllocation::exportable(ctx, bytes).unwrap();
    assert!(memory.is_exportable() && !memory.is_imported());
    let reservation = AddressReservation::new(ctx, bytes).unwrap();
    let mut mapping = reservation.map(0, &memory).unwrap();
    mapping.set_access(ctx, MemoryAccess::ReadWrite).unwrap();
    let mut buf = mapping.into_buffer::<f32>().unwrap();
    assert_eq!(buf.len(), bytes / 4);
    let data = Rng::new().vec(buf.len());
    buf.copy_from(stream, &data).unwrap();

    let fd = memory.export().unwrap();
    inherit(&fd);
    let library = std::env::var_os(LIBCUDA_PATH_VAR).map(PathBuf::from);
    let (fd_text, bytes_text) = (fd.as_raw_fd().to_string(), bytes.to_string());
    let env = [
        (FD_VAR, OsStr::new(&fd_text)),
        (BYTES_VAR, OsStr::new(&bytes_text)),
    ];
    let ended = child::run_with_env(importer, library.as_deref(), &env);
    drop(fd);
    (data, buf, ended)
}

/// Lets child processes inherit `fd` (clears `FD_CLOEXEC`).
fn inherit(fd: &OwnedFd) {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor this process owns (borrowed from `fd`), reading and setting
    // its flags only.
    let done = unsafe {
        let flags = libc::fcntl(raw, libc::F_GETFD);
        flags >= 0 && libc::fcntl(raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC) == 0
    };
    assert!(done, "clearing FD_CLOEXEC on {raw}");
}

/// In the child: the shared memory, imported from the inherited descriptor, mapped and made a
/// buffer (the registry, the stream and the buffer), checked to be borrowed.
fn import_shared() -> (AtlasRegistry, CudaStream, DeviceBuffer<f32>) {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let fd: RawFd = var(FD_VAR).parse().unwrap();
    let bytes: usize = var(BYTES_VAR).parse().unwrap();
    // SAFETY: the parent made this descriptor for this process, which inherited it open and uses
    // it only here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let registry = load("demo");
    let ctx = registry.ctx();
    let memory = PhysicalAllocation::import(ctx, fd.as_fd(), bytes).unwrap();
    assert!(memory.is_imported());
    assert_eq!(memory.bytes(), bytes);
    drop(fd); // the import does not need it
    let reservation = AddressReservation::new(ctx, bytes).unwrap();
    let mut mapping = reservation.map(0, &memory).unwrap();
    mapping.set_access(ctx, MemoryAccess::ReadWrite).unwrap();
    let buf = mapping.into_buffer::<f32>().unwrap();
    let stream = CudaStream::new(ctx).unwrap();
    (registry, stream, buf)
}

/// The child: scales the shared memory with a kernel, waits for it, and leaves (its import and
/// mapping released, the parent's memory not).
fn importer_scales_the_shared_memory() {
    let (registry, stream, mut buf) = import_shared();
    let scale = SCALE.get(&registry).unwrap();
    let n = buf.len();
    // SAFETY: `scale` touches the `n` floats of the buffer; the stream is synchronized after.
    unsafe { scale.launch(&stream, &config(n), (&mut buf, CHILD_FACTOR, n as u32)) }.unwrap();
    stream.synchronize().unwrap();
}

/// The child: maps the shared memory, reads it, and aborts with it mapped.
fn importer_aborts_after_mapping() {
    let (_registry, stream, buf) = import_shared();
    let seen = buf.to_vec(&stream).unwrap();
    assert!(seen.iter().any(|&v| v != 0.0), "the parent's data is there");
    std::process::abort();
}

/// The parent: the child's kernel wrote the shared memory; the parent reads exactly its result.
fn shares_memory_with_a_child_process() {
    let registry = load("demo");
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let (data, buf, ended) =
        share_with_child(importer_scales_the_shared_memory, &registry, &stream);
    assert_eq!(ended.ending, Ending::Passed, "the importer: {ended}");
    let want: Vec<f32> = data.iter().map(|v| v * CHILD_FACTOR).collect();
    assert_bits(&buf.to_vec(&stream).unwrap(), &want, "written by the child");
}

/// The parent: a child that aborts with the memory mapped leaves it as it was, and usable.
fn keeps_its_memory_when_the_child_aborts() {
    let registry = load("demo");
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let (data, mut buf, ended) =
        share_with_child(importer_aborts_after_mapping, &registry, &stream);
    assert_eq!(
        ended.ending,
        Ending::Crashed(libc::SIGABRT),
        "the importer: {ended}"
    );
    assert_bits(
        &buf.to_vec(&stream).unwrap(),
        &data,
        "after the child aborted",
    );
    let scale = SCALE.get(&registry).unwrap();
    let n = buf.len();
    // SAFETY: `scale` touches the `n` floats of the buffer; `to_vec` waits for it.
    unsafe { scale.launch(&stream, &config(n), (&mut buf, 2.0f32, n as u32)) }.unwrap();
    let want: Vec<f32> = data.iter().map(|v| v * 2.0).collect();
    assert_bits(&buf.to_vec(&stream).unwrap(), &want, "still usable");
}

// ---------------------------------------------------------------------------------------------
// On the stand-in
// ---------------------------------------------------------------------------------------------

#[test]
fn a_growable_buffer_grows_and_shrinks_in_place_on_the_standin() {
    standin::run(standin_grows_and_shrinks_in_place, &[]);
    standin::run(elements_that_straddle_chunks_round_trip, &[]);
}

#[test]
fn virtual_memory_refuses_before_the_driver() {
    standin::run(every_refusal_comes_before_the_driver, &[]);
    standin::run(
        memory_of_another_device_is_refused,
        &["-DSTANDIN_DEVICES=2"],
    );
}

#[test]
fn drivers_and_devices_without_virtual_memory_are_refused() {
    standin::run(
        a_driver_without_the_entry_points_is_refused,
        &["-DSTANDIN_NO_VIRTUAL_MEMORY_API"],
    );
    standin::run(
        a_device_without_virtual_memory_is_refused,
        &["-DSTANDIN_NO_VIRTUAL_MEMORY"],
    );
    standin::run(
        a_device_without_file_descriptor_handles_is_refused,
        &["-DSTANDIN_NO_POSIX_FD"],
    );
}

#[test]
fn growth_and_launches_cost_only_their_driver_calls() {
    standin::run(growth_costs_only_the_calls_it_needs, &[]);
}

#[test]
fn graphs_keep_what_they_use_of_a_growable_buffer_on_the_standin() {
    standin::run(standin_graphs_keep_the_chunks_they_use, &[]);
    standin::run(
        standin_a_graph_replays_after_its_growable_buffer_is_dropped,
        &[],
    );
    standin::run(a_shrink_during_a_capture_unmaps_when_it_ends, &[]);
}

#[test]
fn mappings_keep_what_they_map_on_the_standin() {
    standin::run(a_mapping_keeps_its_reservation_and_memory, &[]);
}

#[test]
fn physical_memory_is_shared_with_a_child_process_on_the_standin() {
    standin::run(shares_memory_with_a_child_process, &[]);
    standin::run(keeps_its_memory_when_the_child_aborts, &[]);
}

/// The growth and shrinking on 16 MiB (eight chunks); everything mapped is unmapped, released
/// and freed once the buffer goes.
fn standin_grows_and_shrinks_in_place() {
    let p = probe();
    let registry = load("demo");
    assert_eq!(
        PhysicalAllocation::granularity(registry.ctx()).unwrap(),
        STANDIN_GRANULARITY
    );
    grows_and_shrinks_in_place(&registry, 16 << 20);
    assert_eq!(p.count("fault"), 0);
    assert_eq!(p.count("context_mismatch"), 0);
    assert_eq!(p.count("stale_handle"), 0);
    for live in ["live_mappings", "live_physical", "live_reservations"] {
        assert_eq!(p.count(live), 0, "{live} after the buffer went");
    }
    assert_eq!(p.count("cuMemCreate"), p.count("cuMemRelease"));
    assert_eq!(p.count("cuMemMap"), p.count("cuMemUnmap"));
}

/// Elements of 12 bytes, which the 2 MiB chunks do not divide: the ones across a chunk boundary
/// round trip, through copies, fills and views.
fn elements_that_straddle_chunks_round_trip() {
    let registry = load("demo");
    let ctx = registry.ctx();
    let stream = registry.stream();
    let mut buf = GrowableBuffer::<[f32; 3]>::new(ctx, 1 << 20).unwrap();
    let per_chunk = buf.chunk_bytes() / 12; // 174762 whole elements, then one across the boundary
    let len = 2 * per_chunk + 5;
    buf.grow_to(len).unwrap();
    assert_eq!(buf.mapped_bytes(), 3 * buf.chunk_bytes());
    let data: Vec<[f32; 3]> = Rng::new()
        .vec(3 * len)
        .chunks(3)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    buf.copy_from(stream, &data).unwrap();
    let across = buf.range(per_chunk - 2..per_chunk + 3).unwrap();
    assert_eq!(
        across.to_vec(stream).unwrap(),
        &data[per_chunk - 2..per_chunk + 3]
    );
    buf.range_mut(per_chunk..per_chunk + 1)
        .unwrap()
        .fill(stream, [7.0; 3])
        .unwrap();
    let mut want = data;
    want[per_chunk] = [7.0; 3];
    assert_eq!(buf.to_vec(stream).unwrap(), want);
}

/// Every refusal of a size, an offset, a range, a length, an access or an export, each before
/// the driver call it would have made.
fn every_refusal_comes_before_the_driver() {
    let p = probe();
    let registry = load("demo");
    let ctx = registry.ctx();
    let g = STANDIN_GRANULARITY.minimum;
    let acting = [
        "cuMemAddressReserve",
        "cuMemCreate",
        "cuMemMap",
        "cuMemSetAccess",
        "cuMemUnmap",
        "cuMemExportToShareableHandle",
    ];
    let counts = || acting.map(|entry| p.count(entry));

    // Sizes off the granularity, and empty ones.
    let before = counts();
    let e = refusal(PhysicalAllocation::new(ctx, 100 << 10));
    assert_eq!(
        e,
        VirtualMemoryRefusal::SizeNotGranular {
            bytes: 100 << 10,
            granularity: g
        }
    );
    assert!(
        e.to_string().contains("102400") && e.to_string().contains("65536"),
        "{e}"
    );
    assert_eq!(
        refusal(PhysicalAllocation::exportable(ctx, g + 1)),
        VirtualMemoryRefusal::SizeNotGranular {
            bytes: g + 1,
            granularity: g
        }
    );
    assert_eq!(
        refusal(PhysicalAllocation::new(ctx, 0)),
        VirtualMemoryRefusal::Empty
    );
    assert_eq!(
        refusal(AddressReservation::new(ctx, 3 << 10)),
        VirtualMemoryRefusal::SizeNotGranular {
            bytes: 3 << 10,
            granularity: g
        }
    );
    assert_eq!(
        refusal(GrowableBuffer::<f32>::new(ctx, 0)),
        VirtualMemoryRefusal::Empty
    );
    assert!(matches!(
        GrowableBuffer::<f32>::new(ctx, usize::MAX),
        Err(AtlasError::AllocationTooLarge { .. })
    ));
    assert_eq!(counts(), before, "sizes are refused before the driver");

    // Maps at an offset off the granularity, past the end, overlapping.
    let reservation = AddressReservation::new(ctx, 4 * g).unwrap();
    assert_eq!(reservation.granularity(), g);
    let (two, one) = (
        PhysicalAllocation::new(ctx, 2 * g).unwrap(),
        PhysicalAllocation::new(ctx, g).unwrap(),
    );
    let before = counts();
    assert_eq!(
        refusal(reservation.map(4096, &one)),
        VirtualMemoryRefusal::OffsetNotGranular {
            offset: 4096,
            granularity: g
        }
    );
    assert_eq!(
        refusal(reservation.map(3 * g, &two)),
        VirtualMemoryRefusal::OutsideReservation {
            offset: 3 * g,
            bytes: 2 * g,
            reserved: 4 * g
        }
    );
    let far = usize::MAX / g * g;
    assert!(matches!(
        refusal(reservation.map(far, &one)),
        VirtualMemoryRefusal::OutsideReservation { .. }
    ));
    assert_eq!(counts(), before, "maps are refused before the driver");
    let middle = reservation.map(g, &two).unwrap(); // [g, 3g)
    let before = counts();
    for offset in [0, 2 * g] {
        assert_eq!(
            refusal(reservation.map(offset, &two)),
            VirtualMemoryRefusal::Overlap {
                offset,
                bytes: 2 * g,
                mapped_offset: g,
                mapped_bytes: 2 * g
            }
        );
    }
    assert_eq!(
        refusal(reservation.map(2 * g, &one)),
        VirtualMemoryRefusal::Overlap {
            offset: 2 * g,
            bytes: g,
            mapped_offset: g,
            mapped_bytes: 2 * g
        }
    );
    assert_eq!(counts(), before, "overlaps are refused before the driver");
    let beside = reservation.map(3 * g, &one).unwrap(); // the same memory may be mapped twice
    let _first = reservation.map(0, &one).unwrap();

    // A buffer of a mapping without read-write access; an export of memory not exportable.
    let before = counts();
    assert_eq!(
        refusal(middle.into_buffer::<f32>()),
        VirtualMemoryRefusal::NoAccess { device: 0 }
    );
    let mut beside = beside;
    beside.set_access(ctx, MemoryAccess::ReadOnly).unwrap();
    assert_eq!(
        refusal(beside.into_buffer::<f32>()),
        VirtualMemoryRefusal::NoAccess { device: 0 }
    );
    assert_eq!(refusal(two.export()), VirtualMemoryRefusal::NotExportable);
    let after = counts();
    assert_eq!(
        (after[3] - before[3], after[5] - before[5]),
        (1, 0),
        "the read-only grant, and no export"
    );

    // Lengths past the capacity, and the wrong way.
    let mut buf = GrowableBuffer::<f32>::new(ctx, 1000).unwrap();
    let capacity = (2 << 20) / 4;
    assert_eq!(buf.capacity(), capacity, "rounded up to a whole chunk");
    buf.grow_to(100).unwrap();
    let before = counts();
    let e = refusal(buf.grow_to(capacity + 1));
    assert_eq!(
        e,
        VirtualMemoryRefusal::BeyondCapacity {
            len: capacity + 1,
            capacity
        }
    );
    assert!(e.to_string().contains("524288"), "{e}");
    assert_eq!(
        refusal(buf.grow_to(50)),
        VirtualMemoryRefusal::WrongDirection {
            len: 50,
            current: 100
        }
    );
    assert_eq!(
        refusal(buf.shrink_to(200)),
        VirtualMemoryRefusal::WrongDirection {
            len: 200,
            current: 100
        }
    );
    assert_eq!(counts(), before, "lengths are refused before the driver");
    assert_eq!(buf.len(), 100);
}

/// Memory of device 1, created or imported, mapped for device 0: refused, and the import
/// released again.
fn memory_of_another_device_is_refused() {
    let p = probe();
    let (h0, h1) = (host(0).unwrap(), host(1).unwrap());
    let (c0, c1) = (h0.context(), h1.context());
    let g = STANDIN_GRANULARITY.minimum;
    let on_1 = PhysicalAllocation::exportable(c1, g).unwrap();
    let reservation = AddressReservation::new(c0, g).unwrap();
    let maps = p.count("cuMemMap");
    assert_eq!(
        refusal(reservation.map(0, &on_1)),
        VirtualMemoryRefusal::OtherDevice {
            allocation: 1,
            context: 0
        }
    );
    assert_eq!(p.count("cuMemMap"), maps, "refused before the driver");

    let fd = on_1.export().unwrap();
    let live = p.count("live_physical");
    let e = refusal(PhysicalAllocation::import(c0, fd.as_fd(), g));
    assert_eq!(
        e,
        VirtualMemoryRefusal::OtherDevice {
            allocation: 1,
            context: 0
        }
    );
    assert!(e.to_string().contains("device 1"), "{e}");
    assert_eq!(
        p.count("live_physical"),
        live,
        "the refused import is released"
    );
    let imported = PhysicalAllocation::import(c1, fd.as_fd(), g).unwrap();
    assert!(imported.is_imported());
    assert_eq!(p.count("live_physical"), live + 1);
}

/// Every door of virtual memory on a driver without its entry points: the first one missing.
fn a_driver_without_the_entry_points_is_refused() {
    let registry = load("demo");
    let ctx = registry.ctx();
    let missing = |e: AtlasError| match e {
        AtlasError::MissingSymbol(missing) => missing.name,
        other => panic!("expected a missing entry point, got {other:?}"),
    };
    let first = "cuMemAddressReserve";
    assert_eq!(
        missing(PhysicalAllocation::granularity(ctx).unwrap_err()),
        first
    );
    assert_eq!(
        missing(PhysicalAllocation::new(ctx, 1 << 16).unwrap_err()),
        first
    );
    assert_eq!(
        missing(AddressReservation::new(ctx, 1 << 16).unwrap_err()),
        first
    );
    assert_eq!(
        missing(GrowableBuffer::<f32>::new(ctx, 1 << 20).unwrap_err()),
        first
    );
}

/// A device that cannot manage virtual memory, at every door.
fn a_device_without_virtual_memory_is_refused() {
    let registry = load("demo");
    let ctx = registry.ctx();
    let unsupported = VirtualMemoryRefusal::ManagementUnsupported { device: 0 };
    assert_eq!(refusal(PhysicalAllocation::granularity(ctx)), unsupported);
    assert_eq!(refusal(PhysicalAllocation::new(ctx, 1 << 16)), unsupported);
    assert_eq!(refusal(AddressReservation::new(ctx, 1 << 16)), unsupported);
    let e = refusal(GrowableBuffer::<f32>::new(ctx, 1 << 20));
    assert_eq!(e, unsupported);
    assert!(e.to_string().contains("DeviceBuffer::alloc"), "{e}");
    assert_eq!(probe().count("cuMemCreate"), 0);
}

/// A device that cannot share memory through file descriptors: exportable memory and imports are
/// refused; memory of its own works.
fn a_device_without_file_descriptor_handles_is_refused() {
    let registry = load("demo");
    let ctx = registry.ctx();
    let unsupported = VirtualMemoryRefusal::FileDescriptorsUnsupported { device: 0 };
    assert_eq!(
        refusal(PhysicalAllocation::exportable(ctx, 1 << 16)),
        unsupported
    );
    let null = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(
        refusal(PhysicalAllocation::import(ctx, null.as_fd(), 1 << 16)),
        unsupported
    );
    assert_eq!(probe().count("cuMemCreate"), 0);
    PhysicalAllocation::new(ctx, 1 << 16).unwrap();
}

/// Growth by N chunks is N `cuMemCreate`, N `cuMemMap`, one `cuMemSetAccess` and the context
/// check; growth within the last chunk is no call; a typed launch with the buffer is one
/// `cuLaunchKernel`, a copy one `cuMemcpyDtoDAsync_v2`; a shrink by K chunks is K synchronizes,
/// unmaps and releases.
fn growth_costs_only_the_calls_it_needs() {
    let p = probe();
    let registry = load("demo");
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let mut buf = GrowableBuffer::<f32>::new(ctx, 16 << 20).unwrap();
    let chunk = buf.chunk_bytes() / 4;
    let entries = [
        "calls",
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",
        "cuMemCreate",
        "cuMemMap",
        "cuMemSetAccess",
    ];
    let cost = |op: &mut dyn FnMut()| {
        let before = entries.map(|e| p.count(e));
        op();
        let after = entries.map(|e| p.count(e));
        std::array::from_fn::<u64, 6, _>(|i| after[i] - before[i])
    };
    for chunks in [1, 3, 2] {
        let len = buf.len() + chunks * chunk;
        assert_eq!(
            cost(&mut || buf.grow_to(len).unwrap()),
            [2 * chunks as u64 + 2, 1, 0, chunks as u64, chunks as u64, 1],
            "growth by {chunks} chunk(s): calls, get/set current, create, map, access"
        );
    }
    let len = buf.len();
    buf.shrink_to(len - 10).unwrap();
    assert_eq!(
        cost(&mut || buf.grow_to(len).unwrap()),
        [0; 6],
        "growth within the last chunk"
    );
    p.foreign_context(0); // another library's context is current: made Atlas's again, once
    assert_eq!(
        cost(&mut || buf.grow_to(len + 1).unwrap()),
        [5, 1, 1, 1, 1, 1],
        "growth by one chunk with another context current"
    );

    let n = buf.len();
    let data = Rng::new().vec(n);
    buf.copy_from(&stream, &data).unwrap();
    let scale = SCALE.get(&registry).unwrap();
    let axpy = AXPY.get(&registry).unwrap();
    let mut y = DeviceBuffer::<f32>::zeroed(ctx, &stream, n).unwrap();
    let mut w = DeviceBuffer::<f32>::zeroed(ctx, &stream, n).unwrap();
    // SAFETY: the kernels touch `n` floats of each buffer (zeros, left zero); the first launch
    // of a function reads its parameter layout, and these are not counted.
    unsafe {
        scale
            .launch(&stream, &config(n), (&mut y, 1.0f32, n as u32))
            .unwrap();
        axpy.launch(&stream, &config(n), (&y, &mut w, 1.0f32, n as u32))
            .unwrap();
    }
    let one_call = |entry: &str, op: &mut dyn FnMut()| {
        let (calls, entries) = (p.count("calls"), p.count(entry));
        op();
        assert_eq!(
            (p.count("calls") - calls, p.count(entry) - entries),
            (1, 1),
            "{entry}: one call of it, and no other"
        );
    };
    // SAFETY: `scale` touches the `n` floats of `buf`; `axpy` reads `n` of `buf` and updates `n`
    // of `y`; `to_vec` waits for them.
    one_call("cuLaunchKernel", &mut || unsafe {
        scale
            .launch(&stream, &config(n), (&mut buf, 2.0f32, n as u32))
            .unwrap()
    });
    // SAFETY: as above.
    one_call("cuLaunchKernel", &mut || unsafe {
        axpy.launch(&stream, &config(n), (&buf, &mut y, 1.0f32, n as u32))
            .unwrap()
    });
    one_call("cuMemcpyDtoDAsync_v2", &mut || {
        buf.copy_from_device(&stream, &y).unwrap()
    });
    let want: Vec<f32> = data.iter().map(|v| v * 2.0).collect();
    assert_bits(&buf.to_vec(&stream).unwrap(), &want, "launched and copied");

    let (syncs, unmaps, releases) = (
        p.count("cuCtxSynchronize"),
        p.count("cuMemUnmap"),
        p.count("cuMemRelease"),
    );
    buf.shrink_to(chunk).unwrap(); // 7 chunks to 1
    assert_eq!(
        (
            p.count("cuCtxSynchronize") - syncs,
            p.count("cuMemUnmap") - unmaps,
            p.count("cuMemRelease") - releases
        ),
        (6, 6, 6),
        "a shrink by 6 chunks"
    );
    assert_eq!(p.count("live_mappings"), 1);
}

fn standin_graphs_keep_the_chunks_they_use() {
    let p = probe();
    graphs_keep_the_chunks_they_use(&load("demo"));
    assert_eq!(p.count("fault"), 0, "a replay touched unmapped memory");
    assert_eq!(p.count("live_mappings"), 0);
}

/// On the stand-in, a replay of unmapped memory faults: none does; the chunks are unmapped once
/// the graph goes.
fn standin_a_graph_replays_after_its_growable_buffer_is_dropped() {
    let p = probe();
    let registry = load("demo");
    let live = p.count("live_mappings");
    a_graph_replays_after_its_buffer_is_dropped(&registry);
    assert_eq!(p.count("fault"), 0, "a replay touched unmapped memory");
    assert_eq!(
        p.count("live_mappings"),
        live,
        "unmapped when the graph went"
    );
    assert_eq!(p.count("live_reservations"), 0);
}

/// A shrink while the thread captures another stream of the context: the unmaps (whose
/// synchronize would invalidate the capture) wait for the capture's end, growth is refused
/// meanwhile, and the capture ends intact.
fn a_shrink_during_a_capture_unmaps_when_it_ends() {
    let p = probe();
    let registry = load("demo");
    let ctx = registry.ctx();
    let mut buf = GrowableBuffer::<f32>::new(ctx, 8 << 20).unwrap();
    let chunk = buf.chunk_bytes() / 4;
    buf.grow_to(3 * chunk).unwrap();
    let data = Rng::new().vec(chunk);
    buf.range_mut(..chunk)
        .unwrap()
        .copy_from(registry.stream(), &data)
        .unwrap();
    let mut other = CudaStream::new(ctx).unwrap();
    let capture = other.begin_capture().unwrap();
    let (syncs, unmaps) = (p.count("cuCtxSynchronize"), p.count("cuMemUnmap"));
    buf.shrink_to(chunk).unwrap();
    assert_eq!(
        (p.count("cuCtxSynchronize"), p.count("cuMemUnmap")),
        (syncs, unmaps),
        "the unmaps wait for the capture"
    );
    assert_eq!(p.count("live_mappings"), 3);
    assert!(matches!(
        buf.grow_to(2 * chunk),
        Err(AtlasError::Capture(CaptureMisuse::AllocateWhileCapturing))
    ));
    assert!(capture.is_capturing().unwrap(), "the capture is intact");
    let graph = capture.end().unwrap();
    assert_eq!(p.count("cuMemUnmap") - unmaps, 2, "unmapped when it ended");
    assert_eq!(p.count("live_mappings"), 1);
    buf.grow_to(3 * chunk).unwrap();
    assert_bits(
        &buf.range(..chunk)
            .unwrap()
            .to_vec(registry.stream())
            .unwrap(),
        &data,
        "the first chunk",
    );
    drop(graph);
}

/// A mapping whose physical allocation and reservation were dropped first still works: it keeps
/// both, and lets them go only after its unmap (the stand-in refuses to free a reservation that
/// is still mapped).
fn a_mapping_keeps_its_reservation_and_memory() {
    let p = probe();
    let registry = load("demo");
    let (ctx, stream) = (registry.ctx(), registry.stream());
    let g = STANDIN_GRANULARITY.minimum;
    let reservation = AddressReservation::new(ctx, 2 * g).unwrap();
    let memory = PhysicalAllocation::new(ctx, g).unwrap();
    let mut mapping = reservation.map(g, &memory).unwrap();
    assert_eq!(mapping.device_ptr(), reservation.device_ptr() + g as u64);
    drop((reservation, memory));
    assert_eq!(
        (p.count("live_reservations"), p.count("live_physical")),
        (1, 1)
    );
    mapping.set_access(ctx, MemoryAccess::ReadWrite).unwrap();
    let mut buf = mapping.into_buffer::<u32>().unwrap();
    let data: Vec<u32> = (0..buf.len() as u32)
        .map(|i| i.wrapping_mul(2654435761))
        .collect();
    buf.copy_from(stream, &data).unwrap();
    assert_eq!(buf.to_vec(stream).unwrap(), data);
    drop(buf);
    assert_eq!(
        (
            p.count("live_reservations"),
            p.count("live_physical"),
            p.count("live_mappings")
        ),
        (0, 0, 0)
    );
    assert_eq!(
        (p.count("cuMemUnmap"), p.count("cuMemAddressFree")),
        (1, 1),
        "unmapped, then freed: once each, and the free succeeded"
    );
}

// ---------------------------------------------------------------------------------------------
// On a GPU
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_growable_buffer_grows_from_2_mib_to_1_gib_in_place() {
    let registry = load("demo");
    let chunk = GrowableBuffer::<f32>::new(registry.ctx(), 1)
        .unwrap()
        .chunk_bytes();
    assert_eq!(chunk, 2 << 20, "the first step is one chunk of 2 MiB");
    grows_and_shrinks_in_place(&registry, 1 << 30);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_graphs_keep_the_chunks_of_a_growable_buffer() {
    graphs_keep_the_chunks_they_use(&load("demo"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_graph_replays_after_its_growable_buffer_is_dropped() {
    a_graph_replays_after_its_buffer_is_dropped(&load("demo"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_physical_memory_is_shared_with_a_child_process() {
    let parent = child::run_on(shares_memory_with_a_child_process, None);
    assert_eq!(parent.ending, Ending::Passed, "{parent}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_child_that_aborts_leaves_the_shared_memory_intact() {
    let parent = child::run_on(keeps_its_memory_when_the_child_aborts, None);
    assert_eq!(parent.ending, Ending::Passed, "{parent}");
}
