//! Views of device buffers, copies between device memory (of one device and of two), 2D copies and
//! fills: checked before the driver is called, one driver call each when enqueued, captured into
//! graphs that keep the memory they touch, and freed only after the device's work.
//!
//! Stand-in (CI): `cargo test -p atlas-registry --test device_memory`; the stand-in does the copies
//! and fills on host memory, so the CPU comparisons run there too. GPU: `-- --include-ignored gpu_`
//! (one GPU), `-- --include-ignored gpu2_` (two GPUs).

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::CUgraphNodeType;
use atlas_registry::{
    AtlasError, AtlasRegistry, Copy2d, CopySide, CudaStream, DeviceBuffer, DeviceMemory,
    DeviceMemoryMut, FunctionCache, LaunchConfig, MemoryRefusal, device_count, host,
};
use support::blobs::load;
use support::child;
use support::graphs::{assert_wrong_context, node_types};
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    views_are_bounds_checked_and_reach_no_driver_call,
    standin_copies_between_views_match_the_cpu,
    standin_fills_match_the_cpu,
    standin_copies_2d_match_the_cpu,
    standin_views_as_kernel_arguments_match_the_cpu,
    standin_captured_copies_and_fills_replay_after_their_buffers_are_dropped,
    each_copy_and_fill_is_one_driver_call,
    copies_and_fills_refuse_what_does_not_fit_before_the_driver,
    a_view_of_another_devices_buffer_is_refused_as_a_kernel_argument,
    standin_peer_access_and_peer_copies,
    peer_access_that_cannot_be_enabled_is_refused_and_copies_still_work,
    a_buffer_touched_by_enqueued_work_is_freed_after_the_device,
);

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
static AXPY: FunctionCache = FunctionCache::new("elementwise", "axpy");

/// What output memory holds before a copy or fill: any element left so was not written.
const POISON: f32 = f32::NAN;

/// The demo model on device 0.
fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

/// Asserts that `got` and `want` are the same bits, element by element (NaN poison included).
fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} != {w}");
    }
}

/// The refusal inside `result`, which must be an [`AtlasError::Memory`].
fn refusal<T: std::fmt::Debug>(result: atlas_registry::Result<T>) -> MemoryRefusal {
    match result {
        Err(AtlasError::Memory(refusal)) => refusal,
        other => panic!("expected a memory refusal, got {other:?}"),
    }
}

/// Ranges `(from, to, len)` for copies between memory of `n` elements: the ends of both sides,
/// then `random` ranges of random lengths (mostly odd) at random offsets.
fn copy_ranges(rng: &mut Rng, n: usize, random: usize) -> Vec<(usize, usize, usize)> {
    let mut ranges = vec![(0, 0, 1), (n - 1, n - 1, 1), (0, n - 7, 7), (n - 13, 0, 13)];
    ranges.extend((0..random).map(|_| {
        let len = 1 + rng.index(n / 4);
        (rng.index(n - len + 1), rng.index(n - len + 1), len)
    }));
    ranges
}

// ---------------------------------------------------------------------------------------------
// Bodies that run on the stand-in and on a GPU
// ---------------------------------------------------------------------------------------------

/// Copies between views at random offsets, of odd lengths, at the ends of buffers, between the
/// halves of one buffer, whole buffers, and of elements of an odd size, into poisoned memory.
fn copies_between_views_match_the_cpu(registry: &AtlasRegistry) {
    let mut rng = Rng::new();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let n = 4099 + rng.index(2048);
    let data = rng.vec(n);
    let x = DeviceBuffer::from_slice(ctx, &stream, &data).unwrap();
    let mut y = DeviceBuffer::from_slice(ctx, &stream, &vec![POISON; n]).unwrap();
    let mut want = vec![POISON; n];
    for (from, to, len) in copy_ranges(&mut rng, n, 32) {
        let src = x.range(from..from + len).unwrap();
        let mut dst = y.range_mut(to..to + len).unwrap();
        dst.copy_from_device(&stream, &src).unwrap();
        want[to..to + len].copy_from_slice(&data[from..from + len]);
    }
    assert_bits(&y.to_vec(&stream).unwrap(), &want, "copies between views");

    // Between the two halves of one buffer, both ways; the split leaves halves of odd length.
    let mid = (n / 2) | 1;
    let len = mid.min(n - mid) - 3;
    let (mut low, high) = y.split_at_mut(mid).unwrap();
    let src = high.range(2..2 + len).unwrap();
    low.as_slice_mut()
        .range_mut(1..1 + len)
        .unwrap()
        .copy_from_device(&stream, &src)
        .unwrap();
    want.copy_within(mid + 2..mid + 2 + len, 1);
    let (low, high) = y.split_at_mut(mid).unwrap();
    let src = low.range(mid - len..).unwrap();
    high.range_mut(..len)
        .unwrap()
        .copy_from_device(&stream, &src)
        .unwrap();
    want.copy_within(mid - len..mid, mid);
    assert_bits(&y.to_vec(&stream).unwrap(), &want, "copies between halves");

    // A whole buffer into another; an empty copy.
    let mut z = DeviceBuffer::from_slice(ctx, &stream, &vec![POISON; n]).unwrap();
    z.copy_from_device(&stream, &y).unwrap();
    z.range_mut(5..5)
        .unwrap()
        .copy_from_device(&stream, &x.range(n..).unwrap())
        .unwrap();
    assert_bits(&z.to_vec(&stream).unwrap(), &want, "a whole buffer");

    // Elements of 3 bytes: unaligned addresses and lengths.
    let bytes: Vec<[u8; 3]> = (0..1001)
        .map(|_| rng.bytes(3).try_into().unwrap())
        .collect();
    let b = DeviceBuffer::from_slice(ctx, &stream, &bytes).unwrap();
    let mut c = DeviceBuffer::from_slice(ctx, &stream, &vec![[0xEE; 3]; 1001]).unwrap();
    let mut want = vec![[0xEE; 3]; 1001];
    for (from, to, len) in copy_ranges(&mut rng, 1001, 8) {
        c.range_mut(to..to + len)
            .unwrap()
            .copy_from_device(&stream, &b.range(from..from + len).unwrap())
            .unwrap();
        want[to..to + len].copy_from_slice(&bytes[from..from + len]);
    }
    assert_eq!(c.to_vec(&stream).unwrap(), want, "3-byte elements");
}

/// Fills of every width at random offsets and lengths (the ends included) over random data, and
/// zeroed buffers in memory that held something else.
fn fills_match_the_cpu(registry: &AtlasRegistry) {
    let mut rng = Rng::new();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();

    // Bytes, anywhere.
    let n = 4097 + rng.index(1024);
    let mut want = rng.bytes(n);
    let mut b = DeviceBuffer::from_slice(ctx, &stream, &want).unwrap();
    for (_, at, len) in copy_ranges(&mut rng, n, 16) {
        let value = rng.next_u64() as u8;
        b.range_mut(at..at + len)
            .unwrap()
            .fill_bytes(&stream, value)
            .unwrap();
        want[at..at + len].fill(value);
    }
    // 2 and 4 bytes over bytes, at aligned offsets of whole values.
    for width in [2usize, 4] {
        for _ in 0..8 {
            let values = 1 + rng.index(n / width / 4);
            let at = width * rng.index((n - values * width) / width + 1);
            let value = rng.next_u64() as u32;
            let mut range = b.range_mut(at..at + values * width).unwrap();
            if width == 2 {
                range.fill_u16(&stream, value as u16).unwrap();
            } else {
                range.fill_u32(&stream, value).unwrap();
            }
            let pattern = &value.to_le_bytes()[..width];
            for chunk in want[at..at + values * width].chunks_exact_mut(width) {
                chunk.copy_from_slice(pattern);
            }
        }
    }
    assert_eq!(b.to_vec(&stream).unwrap(), want, "fills of bytes");

    // Typed fills: 2-, 4- and 8-byte elements, the last through the 4-byte memset.
    let mut h_want: Vec<u16> = (0..n).map(|_| rng.next_u64() as u16).collect();
    let mut h = DeviceBuffer::from_slice(ctx, &stream, &h_want).unwrap();
    let mut f_want = rng.vec(n);
    let mut f = DeviceBuffer::from_slice(ctx, &stream, &f_want).unwrap();
    let mut d_want: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
    let mut d = DeviceBuffer::from_slice(ctx, &stream, &d_want).unwrap();
    for (_, at, len) in copy_ranges(&mut rng, n, 8) {
        let v16 = rng.next_u64() as u16;
        h.range_mut(at..at + len)
            .unwrap()
            .fill(&stream, v16)
            .unwrap();
        h_want[at..at + len].fill(v16);
        let v32 = rng.f32_in(-100.0, 100.0);
        f.range_mut(at..at + len)
            .unwrap()
            .fill(&stream, v32)
            .unwrap();
        f_want[at..at + len].fill(v32);
        let v64 = if rng.chance(50) {
            0.0
        } else {
            f64::from_bits(u64::MAX)
        };
        d.range_mut(at..at + len)
            .unwrap()
            .fill(&stream, v64)
            .unwrap();
        d_want[at..at + len].fill(v64);
    }
    let bits = f32::to_bits(rng.f32());
    f.range_mut(..3).unwrap().fill_u32(&stream, bits).unwrap();
    f_want[..3].fill(f32::from_bits(bits));
    assert_eq!(h.to_vec(&stream).unwrap(), h_want, "typed fills of u16");
    assert_bits(&f.to_vec(&stream).unwrap(), &f_want, "typed fills of f32");
    let d_got: Vec<u64> = d
        .to_vec(&stream)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    let d_want: Vec<u64> = d_want.iter().map(|v| v.to_bits()).collect();
    assert_eq!(d_got, d_want, "typed fills of f64");

    // Zeroed, in memory that held something else (freed just before, likely the same addresses).
    let len = 1001 + rng.index(100);
    drop(DeviceBuffer::from_slice(ctx, &stream, &vec![POISON; len]).unwrap());
    let zeroed = DeviceBuffer::<f32>::zeroed(ctx, &stream, len).unwrap();
    assert!(
        zeroed
            .to_vec(&stream)
            .unwrap()
            .iter()
            .all(|v| v.to_bits() == 0),
        "a zeroed buffer holds zeros"
    );
    assert!(
        DeviceBuffer::<f32>::zeroed(ctx, &stream, 0)
            .unwrap()
            .is_empty()
    );
}

/// A block of a row-major matrix copied out packed, into a padded layout (the padding stays
/// poisoned), from and to pitched host memory.
fn copies_2d_match_the_cpu(registry: &AtlasRegistry) {
    let mut rng = Rng::new();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let (rows, cols) = (37 + rng.index(20), 53 + rng.index(20));
    let matrix = rng.vec(rows * cols);
    let m = DeviceBuffer::from_slice(ctx, &stream, &matrix).unwrap();
    let (h, w) = (2 + rng.index(rows - 1), 1 + rng.index(cols));
    let (r0, c0) = (rng.index(rows - h + 1), rng.index(cols - w + 1));
    let block_want: Vec<f32> = (0..h)
        .flat_map(|r| matrix[(r0 + r) * cols + c0..][..w].to_vec())
        .collect();
    let corner = r0 * cols + c0;

    let mut block = DeviceBuffer::from_slice(ctx, &stream, &vec![POISON; h * w]).unwrap();
    let out_of_matrix = Copy2d {
        width: w,
        height: h,
        src_pitch: cols,
        dst_pitch: w,
    };
    block
        .copy_2d_from_device(&stream, &m.range(corner..).unwrap(), out_of_matrix)
        .unwrap();
    assert_bits(
        &block.to_vec(&stream).unwrap(),
        &block_want,
        "a block, packed",
    );

    // Into rows `pitch` apart: exactly `(h - 1) * pitch + w` elements, the gaps untouched.
    let pitch = w + 1 + rng.index(5);
    let padded_len = (h - 1) * pitch + w;
    let mut padded = DeviceBuffer::from_slice(ctx, &stream, &vec![POISON; padded_len]).unwrap();
    let into_padded = Copy2d {
        width: w,
        height: h,
        src_pitch: w,
        dst_pitch: pitch,
    };
    padded
        .copy_2d_from_device(&stream, &block, into_padded)
        .unwrap();
    let mut padded_want = vec![POISON; padded_len];
    for r in 0..h {
        padded_want[r * pitch..][..w].copy_from_slice(&block_want[r * w..][..w]);
    }
    assert_bits(
        &padded.to_vec(&stream).unwrap(),
        &padded_want,
        "a padded layout",
    );

    // From pitched host memory, and back out to it.
    let host_pitch = w + 3;
    let mut host_src = vec![POISON; (h - 1) * host_pitch + w];
    for r in 0..h {
        host_src[r * host_pitch..][..w].copy_from_slice(&block_want[r * w..][..w]);
    }
    let mut from_host = DeviceBuffer::from_slice(ctx, &stream, &vec![POISON; h * w]).unwrap();
    let host_rows = Copy2d {
        width: w,
        height: h,
        src_pitch: host_pitch,
        dst_pitch: w,
    };
    from_host
        .copy_2d_from_host(&stream, &host_src, host_rows)
        .unwrap();
    assert_bits(
        &from_host.to_vec(&stream).unwrap(),
        &block_want,
        "from the host",
    );
    let mut back = vec![POISON; (h - 1) * host_pitch + w];
    let to_host_rows = Copy2d {
        width: w,
        height: h,
        src_pitch: cols,
        dst_pitch: host_pitch,
    };
    m.range(corner..)
        .unwrap()
        .copy_2d_to_host(&stream, &mut back, to_host_rows)
        .unwrap();
    assert_bits(&back, &host_src, "to the host");
}

/// Views as kernel arguments: `scale` on a range (the rest untouched), `axpy` reading a
/// read-only view and writing the other half of the same buffer through `&mut view`.
fn views_as_kernel_arguments_match_the_cpu(registry: &AtlasRegistry) {
    let mut rng = Rng::new();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let n = 3001 + rng.index(1000);
    let data = rng.vec(2 * n);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &data).unwrap();
    let (scale, axpy) = (SCALE.get(registry).unwrap(), AXPY.get(registry).unwrap());
    let (at, len) = (1 + rng.index(n / 2), (n / 3) | 1);
    let factor = rng.f32_in(-4.0, 4.0);
    let cfg = LaunchConfig::for_elements(len as u32, 256);
    let view = x.range_mut(at..at + len).unwrap();
    // SAFETY: `scale` touches the `len` floats of the view; `to_vec` waits for it on the stream.
    unsafe { scale.launch(&stream, &cfg, (view, factor, len as u32)) }.unwrap();
    let mut want = data.clone();
    for v in &mut want[at..at + len] {
        *v *= factor;
    }
    assert_bits(&x.to_vec(&stream).unwrap(), &want, "scale of a view");

    let a = rng.f32_in(-2.0, 2.0);
    let (low, mut high) = x.split_at_mut(n).unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    // SAFETY: `axpy` reads `n` floats of `low` and updates `n` of `high`, the two halves of `x`.
    unsafe { axpy.launch(&stream, &cfg, (low.into_slice(), &mut high, a, n as u32)) }.unwrap();
    for i in 0..n {
        want[n + i] += a * want[i];
    }
    let got = x.to_vec(&stream).unwrap();
    support::reference::assert_close(&got, &want, 1e-6, "axpy between two views");
}

/// A capture of a fill, copies between views, a 2D copy and a kernel on a view, whose sources
/// are dropped before the graph is replayed: the graph keeps their memory, and the replays
/// match the CPU.
fn captured_copies_and_fills_replay_after_their_buffers_are_dropped(registry: &AtlasRegistry) {
    let mut rng = Rng::new();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let n = 257 + rng.index(300);
    let data = rng.vec(n);
    let x = DeviceBuffer::from_slice(ctx, &stream, &data).unwrap();
    let matrix = rng.vec(16 * 16);
    let m = DeviceBuffer::from_slice(ctx, &stream, &matrix).unwrap();
    let mut y = DeviceBuffer::from_slice(ctx, &stream, &vec![POISON; 2 * n]).unwrap();
    let mut block = DeviceBuffer::from_slice(ctx, &stream, &[POISON; 12]).unwrap();
    let scale = SCALE.get(registry).unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let shape = Copy2d {
        width: 4,
        height: 3,
        src_pitch: 16,
        dst_pitch: 4,
    };

    let capture = stream.begin_capture().unwrap();
    y.fill(&capture, -3.0).unwrap();
    y.range_mut(n..)
        .unwrap()
        .copy_from_device(&capture, &x)
        .unwrap();
    block
        .copy_2d_from_device(&capture, &m.range(2 * 16 + 5..).unwrap(), shape)
        .unwrap();
    let first_half = y.range_mut(..n).unwrap();
    // SAFETY: captured, not run: each replay scales the `n` floats of the view, whose buffer the
    // graph keeps.
    unsafe { scale.launch(&capture, &cfg, (first_half, 2.0f32, n as u32)) }.unwrap();
    let graph = capture.end().unwrap();
    assert_eq!(
        node_types(graph.raw()),
        [
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET,
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY,
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY,
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL,
        ]
    );
    assert_eq!(
        graph.kept_count(),
        5,
        "the registry, and the memory of y, x, m and block"
    );
    drop((x, m));
    let exec = graph.instantiate().unwrap();
    let mut want = vec![-6.0f32; n];
    want.extend(&data);
    let block_want: Vec<f32> = (0..3)
        .flat_map(|r| matrix[(2 + r) * 16 + 5..][..4].to_vec())
        .collect();
    for _ in 0..2 {
        // SAFETY: the graph keeps every buffer its nodes touch and the registry of its kernel.
        unsafe { exec.launch(&stream) }.unwrap();
        stream.synchronize().unwrap();
        assert_bits(
            &y.to_vec(&stream).unwrap(),
            &want,
            "replayed copies and fills",
        );
        assert_bits(
            &block.to_vec(&stream).unwrap(),
            &block_want,
            "replayed 2D copy",
        );
    }
}

/// Peer access between devices 0 and 1 as far as they allow, and copies from device 1's memory
/// into device 0's (waiting, enqueued, captured) before and after enabling it.
fn peer_copies_match_the_cpu() {
    let mut rng = Rng::new();
    let (h0, h1) = (host(0).unwrap(), host(1).unwrap());
    let (c0, c1) = (h0.context(), h1.context());
    let (s0, s1) = (CudaStream::new(c0).unwrap(), CudaStream::new(c1).unwrap());
    let n = 4099 + rng.index(1000);
    let data = rng.vec(n);
    let x1 = DeviceBuffer::from_slice(c1, &s1, &data).unwrap();
    let mut y0 = DeviceBuffer::from_slice(c0, &s0, &vec![POISON; n + 100]).unwrap();
    let mut want = vec![POISON; n + 100];
    let mut copies = |y0: &mut DeviceBuffer<f32>, want: &mut Vec<f32>| {
        let (at, from, len) = (1 + rng.index(99), rng.index(n / 2), (n / 2) | 1);
        y0.range_mut(at..at + n)
            .unwrap()
            .copy_from_peer(&s0, &x1)
            .unwrap();
        want[at..at + n].copy_from_slice(&data);
        // SAFETY: `x1` lives until `s0` is synchronized below.
        unsafe {
            y0.range_mut(..len)
                .unwrap()
                .copy_from_peer_async(&s0, &x1.range(from..from + len).unwrap())
        }
        .unwrap();
        want[..len].copy_from_slice(&data[from..from + len]);
        s0.synchronize().unwrap();
        assert_bits(&y0.to_vec(&s0).unwrap(), want, "copies from device 1");
    };
    copies(&mut y0, &mut want); // staged through the host, or direct if someone enabled access
    match c0.enable_peer_access(c1) {
        Ok(()) => {
            assert!(c0.can_access_peer(c1).unwrap());
            c0.enable_peer_access(c1).unwrap(); // already enabled: Ok
        }
        Err(AtlasError::PeerAccessUnsupported { device, peer }) => {
            assert!(!c0.can_access_peer(c1).unwrap());
            assert_eq!((device, peer), (0, 1));
        }
        Err(e) => panic!("enabling peer access: {e}"),
    }
    copies(&mut y0, &mut want);

    // Captured on device 0's stream, replayed after device 1's buffer is dropped.
    let mut s0 = s0;
    let capture = s0.begin_capture().unwrap();
    // SAFETY: captured: the graph keeps `x1`.
    unsafe {
        y0.range_mut(100..100 + n)
            .unwrap()
            .copy_from_peer_async(&capture, &x1)
    }
    .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    drop(x1);
    y0.fill(&s0, POISON).unwrap();
    let mut want = vec![POISON; n + 100];
    want[100..].copy_from_slice(&data);
    // SAFETY: the graph keeps both buffers it copies between.
    unsafe { exec.launch(&s0) }.unwrap();
    s0.synchronize().unwrap();
    assert_bits(&y0.to_vec(&s0).unwrap(), &want, "a replayed peer copy");
}

// ---------------------------------------------------------------------------------------------
// On the stand-in
// ---------------------------------------------------------------------------------------------

#[test]
fn views_are_checked_on_the_standin() {
    standin::run(views_are_bounds_checked_and_reach_no_driver_call, &[]);
}

#[test]
fn copies_fills_and_views_match_the_cpu_on_the_standin() {
    standin::run(standin_copies_between_views_match_the_cpu, &[]);
    standin::run(standin_fills_match_the_cpu, &[]);
    standin::run(standin_copies_2d_match_the_cpu, &[]);
    standin::run(standin_views_as_kernel_arguments_match_the_cpu, &[]);
}

#[test]
fn a_capture_of_copies_and_fills_keeps_their_memory_on_the_standin() {
    standin::run(
        standin_captured_copies_and_fills_replay_after_their_buffers_are_dropped,
        &[],
    );
}

#[test]
fn each_copy_and_fill_on_a_created_stream_is_exactly_one_driver_call() {
    standin::run(
        each_copy_and_fill_is_one_driver_call,
        &["-DSTANDIN_DEVICES=2"],
    );
}

#[test]
fn copies_fills_and_views_refuse_before_the_driver() {
    standin::run(
        copies_and_fills_refuse_what_does_not_fit_before_the_driver,
        &["-DSTANDIN_DEVICES=2"],
    );
    standin::run(
        a_view_of_another_devices_buffer_is_refused_as_a_kernel_argument,
        &["-DSTANDIN_DEVICES=2"],
    );
}

#[test]
fn peer_access_and_copies_between_devices_on_the_standin() {
    standin::run(
        standin_peer_access_and_peer_copies,
        &["-DSTANDIN_DEVICES=2"],
    );
    standin::run(
        peer_access_that_cannot_be_enabled_is_refused_and_copies_still_work,
        &["-DSTANDIN_DEVICES=2", "-DSTANDIN_NO_PEER_ACCESS"],
    );
}

#[test]
fn memory_touched_by_enqueued_work_is_freed_after_the_device() {
    standin::run(
        a_buffer_touched_by_enqueued_work_is_freed_after_the_device,
        &[],
    );
}

fn standin_copies_between_views_match_the_cpu() {
    copies_between_views_match_the_cpu(&demo());
    assert_eq!(probe().count("copy_overlap"), 0);
    assert_eq!(probe().count("context_mismatch"), 0);
}

fn standin_fills_match_the_cpu() {
    fills_match_the_cpu(&demo());
    assert_eq!(probe().count("context_mismatch"), 0);
}

fn standin_copies_2d_match_the_cpu() {
    copies_2d_match_the_cpu(&demo());
    assert_eq!(probe().count("copy_overlap"), 0);
}

fn standin_views_as_kernel_arguments_match_the_cpu() {
    views_as_kernel_arguments_match_the_cpu(&demo());
    assert_eq!(probe().count("fault"), 0);
}

/// The capture on the stand-in, which faults a replayed copy or fill that touches freed memory:
/// none does, and once the graph goes, the memory it kept is freed.
fn standin_captured_copies_and_fills_replay_after_their_buffers_are_dropped() {
    let p = probe();
    let registry = demo();
    let live = p.count("live_allocations");
    captured_copies_and_fills_replay_after_their_buffers_are_dropped(&registry);
    assert_eq!(p.count("fault"), 0, "a replay touched freed memory");
    assert_eq!(p.count("copy_overlap"), 0);
    assert_eq!(
        p.count("live_allocations"),
        live,
        "what the graph kept is freed"
    );
}

/// Views are made without a driver call, relative to their view, and refused out of range.
fn views_are_bounds_checked_and_reach_no_driver_call() {
    let registry = demo();
    let stream = registry.stream();
    let data: Vec<u32> = (0..100).collect();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &data).unwrap();
    let base = x.device_ptr();
    let p = probe();
    let calls = p.count("calls");

    let v = x.range(10..30).unwrap();
    assert_eq!((v.len(), v.device_ptr()), (20, base + 40));
    let w = v.range(5..=9).unwrap();
    assert_eq!((w.len(), w.device_ptr()), (5, base + 60));
    assert_eq!(x.range(..).unwrap().len(), 100);
    assert!(x.range(100..).unwrap().is_empty());
    let (a, b) = x.split_at(100).unwrap();
    assert_eq!((a.len(), b.len(), b.device_ptr()), (100, 0, base + 400));
    let chunks: Vec<_> = x
        .chunks(30)
        .unwrap()
        .map(|c| (c.len(), c.device_ptr()))
        .collect();
    assert_eq!(
        chunks,
        [
            (30, base),
            (30, base + 120),
            (30, base + 240),
            (10, base + 360)
        ]
    );
    assert_eq!(x.chunks(30).unwrap().len(), 4);
    let out = |result: atlas_registry::Result<_>, start, end, len| {
        let r: atlas_registry::Result<()> = result.map(|_: ()| ());
        assert_eq!(
            refusal(r),
            MemoryRefusal::OutOfRange { start, end, len },
            "{start}..{end} of {len}"
        );
    };
    out(x.range(90..101).map(drop), 90, 101, 100);
    out(v.range(15..25).map(drop), 15, 25, 20);
    #[allow(clippy::reversed_empty_ranges)]
    out(x.range(30..10).map(drop), 30, 10, 100);
    out(x.split_at(101).map(drop), 0, 101, 100);
    assert_eq!(refusal(x.chunks(0).map(drop)), MemoryRefusal::ZeroChunkSize);

    let (low, high) = x.split_at_mut(40).unwrap();
    assert_eq!(
        (low.len(), high.len(), high.device_ptr()),
        (40, 60, base + 160)
    );
    let inner = high.range_mut(50..).unwrap();
    assert_eq!((inner.len(), inner.device_ptr()), (10, base + 360));
    let sizes: Vec<usize> = x.chunks_mut(7).unwrap().map(|c| c.len()).collect();
    assert_eq!(sizes.len(), 15);
    assert_eq!((sizes[0], sizes[14]), (7, 2));
    out(x.range_mut(0..101).map(drop), 0, 101, 100);
    out(x.split_at_mut(101).map(drop), 0, 101, 100);
    assert_eq!(
        refusal(x.chunks_mut(0).map(drop)),
        MemoryRefusal::ZeroChunkSize
    );
    let empty = DeviceBuffer::<u32>::alloc(registry.ctx(), 0).unwrap();
    assert!(empty.range(..).unwrap().is_empty());
    out(empty.range(0..1).map(drop), 0, 1, 0);
    assert_eq!(p.count("calls"), calls, "views reach no driver call");

    // A view reads what it covers, and only that.
    assert_eq!(
        x.range(10..13).unwrap().to_vec(stream).unwrap(),
        [10, 11, 12]
    );
    let mut host = [0u32; 3];
    x.range(97..).unwrap().copy_to(stream, &mut host).unwrap();
    assert_eq!(host, [97, 98, 99]);
    x.range_mut(1..4)
        .unwrap()
        .copy_from(stream, &[7, 8, 9])
        .unwrap();
    assert_eq!(
        x.range(..5).unwrap().to_vec(stream).unwrap(),
        [0, 7, 8, 9, 4]
    );
    let e = x
        .range(..4)
        .unwrap()
        .copy_to(stream, &mut host)
        .unwrap_err();
    assert!(matches!(e, AtlasError::SizeMismatch { .. }), "{e}");
}

/// With another library's context current, each copy and fill on a created stream is one call of
/// its entry point and nothing else; empty ones are none.
fn each_copy_and_fill_is_one_driver_call() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let data = Rng::new().vec(1024);
    let x = DeviceBuffer::from_slice(ctx, &stream, &data).unwrap();
    let mut y = DeviceBuffer::<f32>::alloc(ctx, 1024).unwrap();
    let p = probe();
    p.foreign_context(0); // whatever is current does not matter on a created stream
    let one_call = |entry: &str, op: &mut dyn FnMut()| {
        let (calls, entries) = (p.count("calls"), p.count(entry));
        op();
        assert_eq!(
            (p.count("calls") - calls, p.count(entry) - entries),
            (1, 1),
            "{entry}: one call of it, and no other"
        );
    };
    let copy = "cuMemcpyDtoDAsync_v2";
    one_call(copy, &mut || y.copy_from_device(&stream, &x).unwrap());
    one_call(copy, &mut || {
        let src = x.range(100..107).unwrap();
        y.range_mut(3..10)
            .unwrap()
            .copy_from_device(&stream, &src)
            .unwrap()
    });
    one_call("cuMemsetD8Async", &mut || y.fill_bytes(&stream, 0).unwrap());
    one_call("cuMemsetD16Async", &mut || y.fill_u16(&stream, 7).unwrap());
    one_call("cuMemsetD32Async", &mut || y.fill_u32(&stream, 7).unwrap());
    one_call("cuMemsetD32Async", &mut || {
        y.range_mut(1..).unwrap().fill(&stream, 1.5).unwrap()
    });
    one_call("cuMemcpy2DAsync_v2", &mut || {
        y.copy_2d_from_device(&stream, &x, Copy2d::packed(32, 32))
            .unwrap()
    });
    // Empty copies and fills reach no driver call.
    let calls = p.count("calls");
    y.range_mut(5..5)
        .unwrap()
        .copy_from_device(&stream, &x.range(..0).unwrap())
        .unwrap();
    y.range_mut(9..9).unwrap().fill(&stream, 2.0).unwrap();
    y.copy_2d_from_device(&stream, &x, Copy2d::packed(0, 32))
        .unwrap();
    assert_eq!(p.count("calls"), calls, "empty copies and fills");

    // Between devices: one cuMemcpyPeerAsync on the destination's stream.
    let h1 = host(1).unwrap();
    let s1 = CudaStream::new(h1.context()).unwrap();
    let mut z1 = DeviceBuffer::<f32>::alloc(h1.context(), 1024).unwrap();
    // SAFETY: `x` lives until `s1` is synchronized below.
    one_call("cuMemcpyPeerAsync", &mut || unsafe {
        z1.copy_from_peer_async(&s1, &x).unwrap()
    });
    s1.synchronize().unwrap();
    assert_eq!(z1.to_vec(&s1).unwrap(), data);
    // The last copy, of 32 rows of 32, covered every element with `x`'s.
    assert_eq!(y.to_vec(&stream).unwrap(), data);
}

/// Every refusal: a stream or source of another device, lengths, fill widths, rows; none reaches
/// the driver, and the same calls done right go through.
fn copies_and_fills_refuse_what_does_not_fit_before_the_driver() {
    let (h0, h1) = (host(0).unwrap(), host(1).unwrap());
    let (c0, c1) = (h0.context(), h1.context());
    let (s0, s1) = (CudaStream::new(c0).unwrap(), CudaStream::new(c1).unwrap());
    let data = Rng::new().vec(64);
    let x0 = DeviceBuffer::from_slice(c0, &s0, &data).unwrap();
    let x1 = DeviceBuffer::from_slice(c1, &s1, &data).unwrap();
    let mut y0 = DeviceBuffer::<f32>::alloc(c0, 64).unwrap();
    let mut b0 = DeviceBuffer::<u8>::alloc(c0, 7).unwrap();
    let mut d0 = DeviceBuffer::<f64>::alloc(c0, 8).unwrap();
    let p = probe();
    let entries = [
        "cuMemcpyDtoDAsync_v2",
        "cuMemcpyPeerAsync",
        "cuMemcpy2DAsync_v2",
        "cuMemsetD8Async",
        "cuMemsetD16Async",
        "cuMemsetD32Async",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2",
        "cuMemAlloc_v2",
        "cuStreamSynchronize",
    ];
    let counts = || entries.map(|entry| p.count(entry));
    let before = counts();

    // A stream of device 1 for memory of device 0.
    let stream_of_1 = |e: AtlasError| assert_wrong_context(e, "the stream", 0, 1);
    stream_of_1(y0.copy_from_device(&s1, &x0).unwrap_err());
    stream_of_1(
        y0.range_mut(..8)
            .unwrap()
            .copy_from_device(&s1, &x0.range(..8).unwrap())
            .unwrap_err(),
    );
    stream_of_1(y0.fill_bytes(&s1, 0).unwrap_err());
    stream_of_1(y0.fill_u16(&s1, 0).unwrap_err());
    stream_of_1(y0.fill_u32(&s1, 0).unwrap_err());
    stream_of_1(y0.fill(&s1, 1.0).unwrap_err());
    stream_of_1(
        y0.copy_2d_from_device(&s1, &x0, Copy2d::packed(8, 8))
            .unwrap_err(),
    );
    stream_of_1(DeviceBuffer::<f32>::zeroed(c0, &s1, 8).unwrap_err());
    // A peer copy goes on a stream of the destination's device, not the source's.
    stream_of_1(y0.copy_from_peer(&s1, &x1).unwrap_err());
    // SAFETY: refused before anything is enqueued.
    stream_of_1(unsafe { y0.copy_from_peer_async(&s1, &x1) }.unwrap_err());
    stream_of_1(
        y0.copy_2d_from_host(&s1, &data, Copy2d::packed(8, 8))
            .unwrap_err(),
    );
    let mut host = vec![0.0f32; 64];
    stream_of_1(
        x0.copy_2d_to_host(&s1, &mut host, Copy2d::packed(8, 8))
            .unwrap_err(),
    );
    stream_of_1(x0.range(..4).unwrap().to_vec(&s1).unwrap_err());

    // A source of device 1 for a copy within device 0.
    let source_of_1 = |e: AtlasError| assert_wrong_context(e, "the source", 0, 1);
    source_of_1(y0.copy_from_device(&s0, &x1).unwrap_err());
    source_of_1(
        y0.copy_2d_from_device(&s0, &x1, Copy2d::packed(8, 8))
            .unwrap_err(),
    );

    // Lengths.
    let mismatch = MemoryRefusal::LengthMismatch {
        dst_len: 64,
        src_len: 63,
    };
    assert_eq!(
        refusal(y0.copy_from_device(&s0, &x0.range(1..).unwrap())),
        mismatch
    );
    assert_eq!(
        refusal(y0.copy_from_peer(&s0, &x1.range(1..).unwrap())),
        mismatch
    );
    let e = y0
        .copy_from_device(&s0, &x0.range(1..).unwrap())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the destination holds 64 element(s) and the source 63: a copy needs equal lengths (copy \
         a range of the longer)"
    );

    // Fill widths: sizes, alignment, values the memsets cannot write.
    let base = b0.device_ptr();
    assert_eq!(
        refusal(b0.fill_u16(&s0, 1)),
        MemoryRefusal::FillSize { width: 2, bytes: 7 }
    );
    assert_eq!(
        refusal(b0.range_mut(1..5).unwrap().fill_u16(&s0, 1)),
        MemoryRefusal::FillAlignment {
            width: 2,
            address: base + 1
        }
    );
    assert_eq!(
        refusal(b0.range_mut(..6).unwrap().fill_u32(&s0, 1)),
        MemoryRefusal::FillSize { width: 4, bytes: 6 }
    );
    assert_eq!(
        refusal(b0.range_mut(2..6).unwrap().fill_u32(&s0, 1)),
        MemoryRefusal::FillAlignment {
            width: 4,
            address: base + 2
        }
    );
    assert_eq!(
        refusal(d0.fill(&s0, 1.0)),
        MemoryRefusal::FillPattern { element_size: 8 }
    );

    // Rows wider than a pitch, rows past the end of a side (source first).
    let shape = |width, height, src_pitch, dst_pitch| Copy2d {
        width,
        height,
        src_pitch,
        dst_pitch,
    };
    assert_eq!(
        refusal(y0.copy_2d_from_device(&s0, &x0, shape(9, 2, 8, 9))),
        MemoryRefusal::RowWiderThanPitch {
            side: CopySide::Source,
            width: 9,
            pitch: 8
        }
    );
    assert_eq!(
        refusal(y0.copy_2d_from_device(&s0, &x0, shape(9, 2, 9, 8))),
        MemoryRefusal::RowWiderThanPitch {
            side: CopySide::Destination,
            width: 9,
            pitch: 8
        }
    );
    assert_eq!(
        refusal(y0.copy_2d_from_device(&s0, &x0, shape(8, 9, 8, 8))),
        MemoryRefusal::RowsOutOfRange {
            side: CopySide::Source,
            width: 8,
            height: 9,
            pitch: 8,
            end: 72,
            len: 64
        }
    );
    assert_eq!(
        refusal(y0.copy_2d_from_device(&s0, &x0.range(..40).unwrap(), shape(4, 4, 10, 21))),
        MemoryRefusal::RowsOutOfRange {
            side: CopySide::Destination,
            width: 4,
            height: 4,
            pitch: 21,
            end: 67,
            len: 64
        }
    );
    assert!(matches!(
        refusal(y0.copy_2d_from_host(&s0, &data[..10], Copy2d::packed(4, 3))),
        MemoryRefusal::RowsOutOfRange {
            side: CopySide::Source,
            end: 12,
            len: 10,
            ..
        }
    ));
    assert!(matches!(
        refusal(x0.copy_2d_to_host(&s0, &mut host[..10], Copy2d::packed(4, 3))),
        MemoryRefusal::RowsOutOfRange {
            side: CopySide::Destination,
            end: 12,
            len: 10,
            ..
        }
    ));
    assert_eq!(counts(), before, "a refused call reached the driver");

    // The same calls, done right, go through.
    y0.copy_from_device(&s0, &x0).unwrap();
    y0.range_mut(..8)
        .unwrap()
        .copy_2d_from_device(&s0, &x0.range(..0).unwrap(), Copy2d::packed(0, 0))
        .unwrap();
    b0.range_mut(..4)
        .unwrap()
        .fill_u32(&s0, 0x0403_0201)
        .unwrap();
    d0.fill(&s0, 0.0).unwrap();
    assert_eq!(y0.to_vec(&s0).unwrap(), data);
    assert_eq!(&b0.to_vec(&s0).unwrap()[..4], [1, 2, 3, 4]);
    assert_eq!(d0.to_vec(&s0).unwrap(), [0.0; 8]);
}

/// A view of device 1's buffer given to device 0's kernel: `WrongDevice`, naming both, before
/// the driver (run there, the kernel would fault and lose the context).
fn a_view_of_another_devices_buffer_is_refused_as_a_kernel_argument() {
    let blobs = ptx_for_model("demo").unwrap();
    let (gpu0, gpu1) = (
        AtlasRegistry::load(0, blobs).unwrap(),
        AtlasRegistry::load(1, blobs).unwrap(),
    );
    let mut x1 = DeviceBuffer::from_slice(gpu1.ctx(), gpu1.stream(), &[1.0f32; 64]).unwrap();
    let (scale, axpy) = (SCALE.get(&gpu0).unwrap(), AXPY.get(&gpu0).unwrap());
    let mut y0 = DeviceBuffer::from_slice(gpu0.ctx(), gpu0.stream(), &[1.0f32; 64]).unwrap();
    let cfg = LaunchConfig::for_elements(32, 32);
    let launches = probe().launches();
    let wrong = |e: AtlasError, index: usize| match e {
        AtlasError::WrongDevice {
            what,
            expected: 0,
            given: Some(1),
            ..
        } => assert_eq!(what, format!("argument {index}")),
        other => panic!("expected WrongDevice for argument {index}, got {other}"),
    };
    // SAFETY: refused before the driver is called.
    let e = unsafe {
        scale.launch(
            gpu0.stream(),
            &cfg,
            (x1.range_mut(..32).unwrap(), 2.0f32, 32u32),
        )
    };
    wrong(e.unwrap_err(), 0);
    // SAFETY: as above.
    let e = unsafe {
        axpy.launch(
            gpu0.stream(),
            &cfg,
            (
                y0.range(..32).unwrap(),
                &x1.range(..32).unwrap(),
                1.0f32,
                32u32,
            ),
        )
    };
    wrong(e.unwrap_err(), 1);
    assert_eq!(probe().launches(), launches);
    // The views of device 0's own buffer go through.
    let (low, mut high) = y0.split_at_mut(32).unwrap();
    // SAFETY: axpy reads 32 floats of `low` and updates 32 of `high`; `to_vec` waits for it.
    unsafe {
        axpy.launch(
            gpu0.stream(),
            &cfg,
            (&low.into_slice(), &mut high, 2.0f32, 32u32),
        )
    }
    .unwrap();
    let got = y0.to_vec(gpu0.stream()).unwrap();
    assert_eq!(&got[..32], [1.0; 32]);
    assert_eq!(&got[32..], [3.0; 32]);
}

/// Peer access queried and enabled (idempotent, one-way), copies between devices as on a GPU,
/// and a capture of one that keeps the other device's buffer.
fn standin_peer_access_and_peer_copies() {
    let p = probe();
    let (h0, h1) = (host(0).unwrap(), host(1).unwrap());
    let (c0, c1) = (h0.context(), h1.context());
    assert!(c0.can_access_peer(c1).unwrap());
    let enables = p.count("cuCtxEnablePeerAccess");
    c0.enable_peer_access(c1).unwrap();
    assert!(p.peer_enabled(0, 1) && !p.peer_enabled(1, 0), "one-way");
    c0.enable_peer_access(c1).unwrap();
    let (queries, calls) = (p.count("cuDeviceCanAccessPeer"), p.count("calls"));
    c0.enable_peer_access(c0).unwrap();
    assert!(c0.can_access_peer(c0).unwrap());
    assert_eq!(
        p.count("calls"),
        calls,
        "a device and itself: no driver call"
    );
    assert_eq!(p.count("cuDeviceCanAccessPeer"), queries);
    assert_eq!(
        p.count("cuCtxEnablePeerAccess") - enables,
        2,
        "the second was answered ALREADY_ENABLED, which is success"
    );
    let live = p.count("live_allocations");
    peer_copies_match_the_cpu();
    assert_eq!(p.count("fault"), 0, "the replay touched freed memory");
    assert_eq!(p.count("live_allocations"), live);
}

/// Devices that cannot reach each other: enabling is refused naming both, before the driver;
/// copies between them still work (the driver stages them).
fn peer_access_that_cannot_be_enabled_is_refused_and_copies_still_work() {
    let p = probe();
    let (h0, h1) = (host(0).unwrap(), host(1).unwrap());
    let (c0, c1) = (h0.context(), h1.context());
    assert!(!c0.can_access_peer(c1).unwrap());
    let e = c0.enable_peer_access(c1).unwrap_err();
    assert!(
        matches!(e, AtlasError::PeerAccessUnsupported { device: 0, peer: 1 }),
        "{e}"
    );
    assert!(
        e.to_string().starts_with(
            "device 0 cannot access device 1's memory directly (cuDeviceCanAccessPeer)"
        ),
        "{e}"
    );
    assert_eq!(
        p.count("cuCtxEnablePeerAccess"),
        0,
        "refused before the driver"
    );
    let (s0, s1) = (CudaStream::new(c0).unwrap(), CudaStream::new(c1).unwrap());
    let data = Rng::new().vec(999);
    let x1 = DeviceBuffer::from_slice(c1, &s1, &data).unwrap();
    let mut y0 = DeviceBuffer::<f32>::alloc(c0, 999).unwrap();
    y0.copy_from_peer(&s0, &x1).unwrap();
    assert_eq!(p.count("cuMemcpyPeerAsync"), 1);
    assert_eq!(y0.to_vec(&s0).unwrap(), data);
}

/// A buffer of `alloc` that enqueued work touched is freed after the device's work
/// (`cuCtxSynchronize`, then `cuMemFree`); one that only waiting copies touched is freed at once,
/// as before; a stream-ordered one on its stream, as before.
fn a_buffer_touched_by_enqueued_work_is_freed_after_the_device() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let p = probe();
    let (live, data) = (p.count("live_allocations"), Rng::new().vec(64));
    let syncs = || p.count("cuCtxSynchronize");

    let waited = DeviceBuffer::from_slice(ctx, &stream, &data).unwrap();
    assert_eq!(waited.to_vec(&stream).unwrap(), data);
    let before = syncs();
    drop(waited);
    assert_eq!(syncs(), before, "only waiting copies: freed at once");

    let mut filled = DeviceBuffer::<f32>::alloc(ctx, 64).unwrap();
    filled.fill_bytes(&stream, 0).unwrap();
    let (before, frees) = (syncs(), p.count("cuMemFree_v2"));
    drop(filled);
    assert_eq!(
        (syncs() - before, p.count("cuMemFree_v2") - frees),
        (1, 1),
        "a filled buffer: the device's work first, then the free"
    );

    let src = DeviceBuffer::from_slice(ctx, &stream, &data).unwrap();
    let mut dst = DeviceBuffer::<f32>::alloc(ctx, 64).unwrap();
    dst.range_mut(..8)
        .unwrap()
        .copy_from_device(&stream, &src.range(8..16).unwrap())
        .unwrap();
    let before = syncs();
    drop(src);
    drop(dst);
    assert_eq!(syncs() - before, 2, "both sides of a copy through views");

    // SAFETY: used on `stream` only, which outlives it.
    let mut pooled = unsafe { DeviceBuffer::<f32>::alloc_async(ctx, &stream, 64) }.unwrap();
    pooled.fill_bytes(&stream, 0).unwrap();
    let (before, async_frees) = (syncs(), p.count("cuMemFreeAsync"));
    drop(pooled);
    assert_eq!(
        (syncs() - before, p.count("cuMemFreeAsync") - async_frees),
        (0, 1),
        "a stream-ordered buffer: freed in its stream's order"
    );
    assert_eq!(p.count("live_allocations"), live);
}

// ---------------------------------------------------------------------------------------------
// On a GPU
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_copies_between_views_match_the_cpu() {
    copies_between_views_match_the_cpu(&load("demo"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_fills_of_every_width_match_the_cpu() {
    fills_match_the_cpu(&load("demo"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_copies_2d_match_the_cpu() {
    copies_2d_match_the_cpu(&load("demo"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_views_as_kernel_arguments_match_the_cpu() {
    views_as_kernel_arguments_match_the_cpu(&load("demo"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_captured_copies_and_fills_replay_after_their_buffers_are_dropped() {
    captured_copies_and_fills_replay_after_their_buffers_are_dropped(&load("demo"));
}

#[test]
#[ignore = "needs two NVIDIA GPUs"]
fn gpu2_peer_copies_match_the_cpu_with_and_without_peer_access() {
    let count = device_count().expect(support::blobs::NEEDS_GPU);
    assert!(
        count >= 2,
        "this test needs two NVIDIA GPUs; the driver reports {count}"
    );
    peer_copies_match_the_cpu();
}
