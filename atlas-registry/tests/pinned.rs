//! Page-locked host memory: pinned buffers (`cuMemHostAlloc`) and registered `Vec`s
//! (`cuMemHostRegister`), their asynchronous copies (one copy call and one event record each),
//! host access and release that wait for that event, mapped memory read by kernels, and every
//! refusal.
//!
//! Stand-in (CI): `cargo test -p atlas-registry --test pinned` (driver calls counted, each refusal
//! before the driver, waits, releases deferred past captures, leaks where the device may still
//! use the memory). GPU: `-- --include-ignored` (uploads and downloads against the CPU on fresh
//! random data, beside a kernel on another stream; a registered `Vec`'s round trip; a mapped
//! buffer scaled by a kernel).

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, CaptureMisuse, CudaStream, DeviceBuffer, HostMemoryRefusal,
    HostRegistration, LaunchConfig, PinnedBuffer, PinnedFlags, RegisterFlags,
};
use support::child::{self, Ending};
use support::graphs::assert_wrong_context;
use support::reference::assert_close;
use support::rng::Rng;
use support::spin::spin_registry;
use support::standin::{self, probe};

child::bodies!(
    a_copy_is_one_copy_call_and_one_event_record,
    host_access_waits_for_the_copies_it_conflicts_with,
    the_release_waits_for_the_copies_then_gives_the_memory_back,
    allocations_and_registrations_are_refused_before_the_driver,
    the_drivers_refusals_are_typed_and_hand_the_vec_back,
    copies_of_another_device_or_length_are_refused,
    captures_refuse_copies_and_waits_and_defer_releases,
    a_copy_the_event_cannot_follow_keeps_the_memory_from_the_host,
    a_mapped_buffer_is_read_by_a_kernel_after_its_use_is_marked,
    gpu_uploads_and_downloads_match_the_cpu_beside_a_kernel,
    gpu_a_registered_vec_round_trips,
    gpu_a_mapped_buffer_is_scaled_by_a_kernel,
);

fn demo(ordinal: usize) -> AtlasRegistry {
    AtlasRegistry::load(ordinal, ptx_for_model("demo").unwrap()).unwrap()
}

/// Every driver call made so far (the stand-in counts every entry point).
fn all_calls() -> u64 {
    probe().count("calls")
}

fn host_refusal<T: std::fmt::Debug>(result: atlas_registry::Result<T>) -> HostMemoryRefusal {
    match result {
        Err(AtlasError::HostMemory(refusal)) => refusal,
        other => panic!("expected a host memory refusal, got {other:?}"),
    }
}

fn capture_misuse<T: std::fmt::Debug>(result: atlas_registry::Result<T>) -> CaptureMisuse {
    match result {
        Err(AtlasError::Capture(misuse)) => misuse,
        other => panic!("expected a capture misuse, got {other:?}"),
    }
}

fn a_copy_is_one_copy_call_and_one_event_record() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let (a, b) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let data: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let mut host = PinnedBuffer::from_slice(ctx, &data, PinnedFlags::new()).unwrap();
    let mut device = DeviceBuffer::<f32>::alloc(ctx, 100).unwrap();
    // Another library's context current: a copy on a created stream does not care.
    p.foreign_context(0);
    let counts = |names: &[&str]| names.iter().map(|n| p.count(n)).collect::<Vec<_>>();
    let names = [
        "calls",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2",
        "cuEventRecord",
        "cuStreamWaitEvent",
    ];
    let delta = |before: &[u64]| {
        counts(&names)
            .iter()
            .zip(before)
            .map(|(after, before)| after - before)
            .collect::<Vec<_>>()
    };
    let before = counts(&names);
    host.copy_to_device(&a, &mut device).unwrap();
    assert_eq!(delta(&before), [2, 1, 0, 1, 0], "upload: {names:?}");
    let before = counts(&names);
    host.copy_from_device(&a, &device).unwrap();
    assert_eq!(delta(&before), [2, 0, 1, 1, 0], "download, same stream");
    // On another stream while the last copy may still run: that stream waits for it first.
    let before = counts(&names);
    host.copy_to_device(&b, &mut device).unwrap();
    assert_eq!(delta(&before), [3, 1, 0, 1, 1], "upload on another stream");
    // Once waited for, nothing is pending: no wait on a stream switch.
    host.synchronize().unwrap();
    let before = counts(&names);
    host.copy_from_device(&a, &device).unwrap();
    assert_eq!(delta(&before), [2, 0, 1, 1, 0], "download after a wait");
    assert_eq!(host.as_slice().unwrap(), &data[..]);
    // The same for a registered Vec.
    let mut registered =
        HostRegistration::register(ctx, data.clone(), RegisterFlags::new()).unwrap();
    let before = counts(&names);
    registered.copy_to_device(&a, &mut device).unwrap();
    registered.copy_from_device(&a, &device).unwrap();
    assert_eq!(
        delta(&before),
        [4, 1, 1, 2, 0],
        "registered: upload and download"
    );
    assert_eq!(registered.into_vec().unwrap(), data);
}

#[test]
fn a_copy_of_page_locked_memory_is_one_copy_call_and_one_event_record() {
    standin::run(a_copy_is_one_copy_call_and_one_event_record, &[]);
}

fn host_access_waits_for_the_copies_it_conflicts_with() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let mut host = PinnedBuffer::<f32>::alloc(ctx, 33, PinnedFlags::new()).unwrap();
    // The stand-in fills new page-locked memory with 0xA5 bytes: Atlas hands out zeros.
    assert_eq!(host.as_slice().unwrap(), &[0.0f32; 33][..]);
    let data: Vec<f32> = (0..33).map(|i| i as f32 * 0.5).collect();
    let device = DeviceBuffer::from_slice(ctx, &stream, &data).unwrap();
    let syncs = || p.count("cuEventSynchronize");
    // Nothing pending: no wait.
    let before = syncs();
    host.as_mut_slice().unwrap().fill(1.0);
    assert_eq!(syncs(), before);
    // A copy into the buffer: the next read waits, once.
    host.copy_from_device(&stream, &device).unwrap();
    let before = syncs();
    assert_eq!(host.as_slice().unwrap(), &data[..]);
    assert_eq!(syncs(), before + 1, "a read after a download waits");
    assert_eq!(host.as_slice().unwrap(), &data[..]);
    assert_eq!(syncs(), before + 1, "and only once");
    // A copy from the buffer: reads need not wait, writes do.
    let mut other = DeviceBuffer::<f32>::alloc(ctx, 33).unwrap();
    host.copy_to_device(&stream, &mut other).unwrap();
    let before = syncs();
    assert_eq!(host.as_slice().unwrap()[32], 16.0);
    assert_eq!(syncs(), before, "a read after an upload does not wait");
    host.as_mut_slice().unwrap()[0] = 7.0;
    assert_eq!(syncs(), before + 1, "a write after an upload waits");
    assert_eq!(other.to_vec(&stream).unwrap(), data);
    // From another thread, through a shared reference: one wait for both readers.
    host.copy_from_device(&stream, &other).unwrap();
    let before = syncs();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| assert_eq!(host.as_slice().unwrap(), &data[..]));
        }
    });
    assert!((before + 1..=before + 2).contains(&syncs()));
}

#[test]
fn host_access_waits_for_the_event_of_the_copies_it_conflicts_with() {
    standin::run(host_access_waits_for_the_copies_it_conflicts_with, &[]);
}

fn the_release_waits_for_the_copies_then_gives_the_memory_back() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let mut device = DeviceBuffer::<u32>::alloc(ctx, 16).unwrap();
    let counts = || {
        (
            p.count("cuEventSynchronize"),
            p.count("cuMemFreeHost"),
            p.count("cuMemHostUnregister"),
        )
    };
    // Dropped with a copy pending: one wait, then the free.
    let mut host = PinnedBuffer::from_slice(ctx, &[3u32; 16], PinnedFlags::new()).unwrap();
    host.copy_to_device(&stream, &mut device).unwrap();
    let before = counts();
    drop(host);
    assert_eq!(counts(), (before.0 + 1, before.1 + 1, before.2));
    // Nothing pending: no wait.
    let host = PinnedBuffer::<u32>::alloc(ctx, 16, PinnedFlags::new()).unwrap();
    let before = counts();
    host.free().unwrap();
    assert_eq!(counts(), (before.0, before.1 + 1, before.2));
    // A registration: one wait, then the unregistration.
    let mut registered =
        HostRegistration::register(ctx, vec![0u32; 16], RegisterFlags::new()).unwrap();
    registered.copy_from_device(&stream, &device).unwrap();
    let before = counts();
    drop(registered);
    assert_eq!(counts(), (before.0 + 1, before.1, before.2 + 1));
    let mut registered =
        HostRegistration::register(ctx, vec![0u32; 16], RegisterFlags::new()).unwrap();
    registered.copy_from_device(&stream, &device).unwrap();
    let before = counts();
    assert_eq!(registered.into_vec().unwrap(), vec![3u32; 16]);
    assert_eq!(counts(), (before.0 + 1, before.1, before.2 + 1));
    // A wait that fails leaves the memory to the device: leaked, not freed.
    let mut host = PinnedBuffer::from_slice(ctx, &[1u32; 16], PinnedFlags::new()).unwrap();
    host.copy_to_device(&stream, &mut device).unwrap();
    p.inject("cuEventSynchronize", 999, 1);
    let before = counts();
    assert!(matches!(host.free(), Err(AtlasError::Driver(_))));
    assert_eq!(counts(), (before.0 + 1, before.1, before.2), "leaked");
}

#[test]
fn the_release_of_page_locked_memory_waits_for_its_copies() {
    standin::run(
        the_release_waits_for_the_copies_then_gives_the_memory_back,
        &[],
    );
}

fn allocations_and_registrations_are_refused_before_the_driver() {
    let registry = demo(0);
    let ctx = registry.ctx();
    let calls = all_calls();
    assert_eq!(
        host_refusal(PinnedBuffer::<f32>::alloc(ctx, 0, PinnedFlags::new())),
        HostMemoryRefusal::Empty {
            len: 0,
            element_size: 4
        }
    );
    assert_eq!(
        host_refusal(PinnedBuffer::<[u8; 0]>::alloc(ctx, 5, PinnedFlags::new())),
        HostMemoryRefusal::Empty {
            len: 5,
            element_size: 0
        }
    );
    match PinnedBuffer::<u64>::alloc(ctx, usize::MAX / 4, PinnedFlags::new()) {
        Err(AtlasError::AllocationTooLarge { len, element_size }) => {
            assert_eq!((len, element_size), (usize::MAX / 4, 8))
        }
        other => panic!("{other:?}"),
    }
    let failed =
        HostRegistration::<f32>::register(ctx, Vec::with_capacity(8), RegisterFlags::new())
            .unwrap_err();
    assert!(matches!(
        failed.error(),
        AtlasError::HostMemory(HostMemoryRefusal::Empty { len: 0, .. })
    ));
    assert_eq!(failed.into_vec().capacity(), 8, "the Vec is handed back");
    assert_eq!(all_calls(), calls, "refused before the driver");
    let text = host_refusal(PinnedBuffer::<f32>::alloc(ctx, 0, PinnedFlags::new())).to_string();
    assert!(text.contains("0 element(s) of 4 bytes"), "{text}");
}

#[test]
fn empty_and_overflowing_page_locked_memory_is_refused_before_the_driver() {
    standin::run(
        allocations_and_registrations_are_refused_before_the_driver,
        &[],
    );
}

fn the_drivers_refusals_are_typed_and_hand_the_vec_back() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    // Out of memory: the driver's error, naming the size; the buffer's event is destroyed again.
    p.inject("cuMemHostAlloc", 2, 1);
    let destroyed = p.count("cuEventDestroy_v2");
    match PinnedBuffer::<f32>::alloc(ctx, 1 << 20, PinnedFlags::new()) {
        Err(AtlasError::Driver(failure)) => {
            assert_eq!(failure.code, 2);
            let text = AtlasError::Driver(failure).to_string();
            assert!(
                text.contains("4194304 bytes of page-locked host memory"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.count("cuEventDestroy_v2"), destroyed + 1);
    // A registration overlapping memory registered outside Atlas: refused as the driver does,
    // typed, with the Vec untouched.
    let cuda = atlas_registry::sys::driver().unwrap();
    let register = atlas_registry::sys::entry!(cuda, cuMemHostRegister_v2).unwrap();
    let unregister = atlas_registry::sys::entry!(cuda, cuMemHostUnregister).unwrap();
    let mut data: Vec<u16> = (0..500).collect();
    let start = data.as_mut_ptr();
    // SAFETY: 200 bytes inside `data`, which outlives the registration (unregistered below).
    let status = unsafe { register(start.wrapping_add(100).cast(), 200, 0) };
    assert_eq!(status.0, 0);
    let failed = HostRegistration::register(ctx, data, RegisterFlags::new()).unwrap_err();
    match failed.error() {
        AtlasError::HostMemory(HostMemoryRefusal::AlreadyRegistered { address, bytes }) => {
            assert_eq!((*address, *bytes), (start.addr(), 1000))
        }
        other => panic!("{other:?}"),
    }
    assert!(
        failed.to_string().contains("page-locked already"),
        "{failed}"
    );
    let data = failed.into_vec();
    assert_eq!(data, (0..500).collect::<Vec<u16>>());
    // SAFETY: registered above, unregistered once.
    assert_eq!(unsafe { unregister(start.wrapping_add(100).cast()) }.0, 0);
    let registered = HostRegistration::register(ctx, data, RegisterFlags::new()).unwrap();
    // Memory allocated page-locked counts as registered too.
    let pinned = PinnedBuffer::<u8>::alloc(ctx, 64, PinnedFlags::new()).unwrap();
    // SAFETY: 64 bytes of `pinned`, never unregistered (the driver refuses).
    let status = unsafe { register(pinned.as_ptr().cast(), 64, 0) };
    assert_eq!(status.0, 712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED");
    // Another refusal of the driver is its error; the Vec comes back.
    p.inject("cuMemHostRegister_v2", 1, 1);
    let failed =
        HostRegistration::register(ctx, vec![1.0f64; 9], RegisterFlags::new()).unwrap_err();
    let (error, vec) = failed.into_parts();
    assert_eq!(error.cuda_code(), Some(1));
    assert_eq!(vec, vec![1.0f64; 9]);
    let as_atlas: AtlasError =
        HostRegistration::register(ctx, Vec::<u8>::new(), RegisterFlags::new())
            .unwrap_err()
            .into();
    assert!(matches!(
        as_atlas,
        AtlasError::HostMemory(HostMemoryRefusal::Empty { .. })
    ));
    drop((registered, pinned));
}

#[test]
fn the_drivers_refusals_of_page_locked_memory_are_typed() {
    standin::run(the_drivers_refusals_are_typed_and_hand_the_vec_back, &[]);
}

fn copies_of_another_device_or_length_are_refused() {
    let p = probe();
    let (r0, r1) = (demo(0), demo(1));
    let (c0, c1) = (r0.ctx(), r1.ctx());
    let (s0, s1) = (CudaStream::new(c0).unwrap(), CudaStream::new(c1).unwrap());
    let mut host = PinnedBuffer::<f32>::alloc(c0, 10, PinnedFlags::new()).unwrap();
    let mut d0 = DeviceBuffer::<f32>::alloc(c0, 10).unwrap();
    let mut d1 = DeviceBuffer::<f32>::alloc(c1, 10).unwrap();
    let mut short = DeviceBuffer::<f32>::alloc(c0, 9).unwrap();
    let mut registered =
        HostRegistration::register(c0, vec![0.0f32; 10], RegisterFlags::new().read_only()).unwrap();
    let mut writable =
        HostRegistration::register(c0, vec![0.0f32; 10], RegisterFlags::new()).unwrap();
    let calls = all_calls();
    assert_wrong_context(
        host.copy_to_device(&s1, &mut d0).unwrap_err(),
        "the stream",
        0,
        1,
    );
    assert_wrong_context(
        host.copy_from_device(&s1, &d0).unwrap_err(),
        "the stream",
        0,
        1,
    );
    assert_wrong_context(
        host.copy_to_device(&s0, &mut d1).unwrap_err(),
        "the device buffer",
        0,
        1,
    );
    assert_wrong_context(
        writable.copy_from_device(&s0, &d1).unwrap_err(),
        "the device buffer",
        0,
        1,
    );
    assert_wrong_context(host.mark_used_by(&s1).unwrap_err(), "the stream", 0, 1);
    match host.copy_to_device(&s0, &mut short) {
        Err(AtlasError::SizeMismatch {
            what,
            expected,
            given,
        }) => {
            assert!(
                what.contains("10 elements") && what.contains("of 9"),
                "{what}"
            );
            assert_eq!((expected, given), (40, 36));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        host.copy_from_device(&s0, &short),
        Err(AtlasError::SizeMismatch { .. })
    ));
    assert_eq!(
        host_refusal(registered.copy_from_device(&s0, &d0)),
        HostMemoryRefusal::ReadOnly
    );
    assert_eq!(all_calls(), calls, "refused before the driver");
    // Read-only for the device, still copied to it.
    registered.copy_to_device(&s0, &mut d0).unwrap();
    assert_eq!(p.count("context_mismatch"), 0);
}

#[test]
fn copies_of_another_devices_stream_or_buffer_or_another_length_are_refused() {
    standin::run(
        copies_of_another_device_or_length_are_refused,
        &["-DSTANDIN_DEVICES=2"],
    );
}

fn captures_refuse_copies_and_waits_and_defer_releases() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let (mut stream, mut side) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let other = CudaStream::new(ctx).unwrap();
    let mut device = DeviceBuffer::<f32>::alloc(ctx, 8).unwrap();
    let mut host = PinnedBuffer::<f32>::alloc(ctx, 8, PinnedFlags::new()).unwrap();
    let mut registered =
        HostRegistration::register(ctx, vec![0.0f32; 8], RegisterFlags::new()).unwrap();
    let dropped = PinnedBuffer::<f32>::alloc(ctx, 8, PinnedFlags::new()).unwrap();
    let unregistered =
        HostRegistration::register(ctx, vec![0.0f32; 8], RegisterFlags::new()).unwrap();
    let handed_back =
        HostRegistration::register(ctx, vec![0.0f32; 8], RegisterFlags::new()).unwrap();
    // A download on another stream, not waited for yet.
    host.copy_from_device(&other, &device).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    let calls = all_calls();
    assert_eq!(
        capture_misuse(host.copy_to_device(&capture, &mut device)),
        CaptureMisuse::PageLockedCopy
    );
    assert_eq!(
        capture_misuse(registered.copy_from_device(&capture, &device)),
        CaptureMisuse::PageLockedCopy
    );
    assert_eq!(
        capture_misuse(host.mark_used_by(&capture)),
        CaptureMisuse::PageLockedCopy
    );
    assert_eq!(
        capture_misuse(PinnedBuffer::<f32>::alloc(ctx, 8, PinnedFlags::new())),
        CaptureMisuse::PageLockWhileCapturing
    );
    let failed =
        HostRegistration::register(ctx, vec![2.0f32; 8], RegisterFlags::new()).unwrap_err();
    assert_eq!(
        capture_misuse::<()>(Err(failed.error().clone())),
        CaptureMisuse::PageLockWhileCapturing
    );
    assert_eq!(failed.into_vec(), vec![2.0f32; 8]);
    // The host would wait for the download: cuEventSynchronize from the capturing thread.
    assert_eq!(
        capture_misuse(host.as_slice()),
        CaptureMisuse::HostWaitWhileCapturing
    );
    // Nothing to wait for: no driver call, no refusal.
    assert_eq!(registered.as_slice().unwrap(), &[0.0f32; 8][..]);
    assert_eq!(all_calls(), calls, "refused before the driver");
    // A stream forked into the capture is part of it.
    capture
        .fork(&mut side, |_, side| {
            let copy = registered.copy_to_device(side, &mut device);
            assert_eq!(capture_misuse(copy), CaptureMisuse::PageLockedCopy);
            Ok(())
        })
        .unwrap();
    // Another thread is not capturing: it waits.
    std::thread::scope(|s| {
        s.spawn(|| host.synchronize().unwrap());
    });
    // Releases from the capturing thread wait for the capture to end.
    let (frees, unregisters) = (p.count("cuMemFreeHost"), p.count("cuMemHostUnregister"));
    drop(dropped);
    drop(unregistered);
    assert_eq!(
        capture_misuse(handed_back.into_vec()),
        CaptureMisuse::HostWaitWhileCapturing
    );
    assert_eq!(
        (p.count("cuMemFreeHost"), p.count("cuMemHostUnregister")),
        (frees, unregisters)
    );
    let graph = capture.end().expect("the capture was not invalidated");
    assert_eq!(
        (p.count("cuMemFreeHost"), p.count("cuMemHostUnregister")),
        (frees + 1, unregisters + 2)
    );
    drop(graph);
    // After the capture, everything works again.
    host.copy_to_device(&stream, &mut device).unwrap();
    assert_eq!(host.as_slice().unwrap(), &[0.0f32; 8][..]);
}

#[test]
fn captures_refuse_page_locked_copies_and_waits_and_defer_releases() {
    standin::run(captures_refuse_copies_and_waits_and_defer_releases, &[]);
}

fn a_copy_the_event_cannot_follow_keeps_the_memory_from_the_host() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let device = DeviceBuffer::from_slice(ctx, &stream, &[5.0f32; 4]).unwrap();
    let mut host = PinnedBuffer::<f32>::alloc(ctx, 4, PinnedFlags::new()).unwrap();
    // The record fails: the stream is synchronized instead, and the memory is the host's.
    p.inject("cuEventRecord", 999, 1);
    let syncs = p.count("cuStreamSynchronize");
    assert!(host.copy_from_device(&stream, &device).is_err());
    assert_eq!(p.count("cuStreamSynchronize"), syncs + 1);
    assert_eq!(host.as_slice().unwrap(), &[5.0f32; 4][..]);
    // The record and the synchronize fail: the host never gets the memory, and it is leaked.
    p.inject("cuEventRecord", 999, 1);
    p.inject("cuStreamSynchronize", 999, 1);
    assert!(host.copy_from_device(&stream, &device).is_err());
    assert_eq!(host_refusal(host.as_slice()), HostMemoryRefusal::Unfenced);
    assert_eq!(
        host_refusal(host.as_mut_slice()),
        HostMemoryRefusal::Unfenced
    );
    assert_eq!(
        host_refusal(host.copy_from_device(&stream, &device)),
        HostMemoryRefusal::Unfenced
    );
    let frees = p.count("cuMemFreeHost");
    assert_eq!(host_refusal(host.free()), HostMemoryRefusal::Unfenced);
    assert_eq!(p.count("cuMemFreeHost"), frees, "leaked");
}

#[test]
fn a_copy_its_event_cannot_follow_keeps_the_memory_from_the_host() {
    standin::run(
        a_copy_the_event_cannot_follow_keeps_the_memory_from_the_host,
        &[],
    );
}

fn a_mapped_buffer_is_read_by_a_kernel_after_its_use_is_marked() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let plain = PinnedBuffer::<f32>::alloc(ctx, 4, PinnedFlags::new()).unwrap();
    assert_eq!(plain.device_ptr(), None);
    let data = [1.0f32, 2.0, 3.0, 4.0];
    let pointers = p.count("cuMemHostGetDevicePointer_v2");
    let mut host = PinnedBuffer::from_slice(ctx, &data, PinnedFlags::new().mapped()).unwrap();
    assert_eq!(p.count("cuMemHostGetDevicePointer_v2"), pointers + 1);
    let address = host.device_ptr().expect("mapped");
    let scale = registry.function("elementwise", "scale").unwrap();
    // SAFETY: `scale` reads and writes the 4 floats at the mapped address, which outlives it
    // (the buffer waits for the stream's work before its drop: `mark_used_by` below); the host
    // holds no slice of the buffer until the kernel is waited for.
    unsafe {
        scale.launch(
            &stream,
            &LaunchConfig::for_elements(4, 4),
            (address, 3.0f32, 4u32),
        )
    }
    .unwrap();
    let (calls, records) = (all_calls(), p.count("cuEventRecord"));
    host.mark_used_by(&stream).unwrap();
    assert_eq!(
        (all_calls() - calls, p.count("cuEventRecord") - records),
        (1, 1)
    );
    let syncs = p.count("cuEventSynchronize");
    assert_eq!(host.as_slice().unwrap(), &[3.0f32, 6.0, 9.0, 12.0][..]);
    assert_eq!(p.count("cuEventSynchronize"), syncs + 1);
    // A mapped registration.
    let registered =
        HostRegistration::register(ctx, data.to_vec(), RegisterFlags::new().mapped()).unwrap();
    assert_eq!(
        registered.device_ptr(),
        Some(registered.as_ptr().addr() as u64)
    );
    assert_eq!(registered.into_vec().unwrap(), data);
    assert_eq!(p.count("fault"), 0);
}

#[test]
fn a_mapped_buffer_is_read_by_a_kernel_and_host_access_waits_for_it() {
    standin::run(
        a_mapped_buffer_is_read_by_a_kernel_after_its_use_is_marked,
        &[],
    );
}

/// Fresh random data up and down through pinned buffers, async, on a copy stream, while a spin
/// kernel runs on another stream; destinations poisoned (NaN) before; odd lengths, the whole
/// buffers compared with the CPU.
fn gpu_uploads_and_downloads_match_the_cpu_beside_a_kernel() {
    let mut rng = Rng::new();
    let registry = demo(0);
    let spin = spin_registry(0);
    let ctx = registry.ctx();
    let (copies, busy) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let spin_fn = spin.function("spin", "spin").unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    for (len, flags) in [
        (1usize, PinnedFlags::new()),
        (4097, PinnedFlags::new().write_combined()),
        ((64 << 20) / 4 + 3, PinnedFlags::new().portable()),
    ] {
        let data = rng.vec(len);
        let factor = rng.f32_in(-4.0, 4.0);
        let mut upload = PinnedBuffer::from_slice(ctx, &data, flags).unwrap();
        let mut device = DeviceBuffer::from_slice(ctx, &copies, &vec![f32::NAN; len]).unwrap();
        let mut download =
            PinnedBuffer::from_slice(ctx, &vec![f32::NAN; len], PinnedFlags::new()).unwrap();
        // SAFETY: `spin` reads its one argument and touches no memory.
        unsafe { spin_fn.launch(&busy, &LaunchConfig::for_elements(1, 1), (20_000_000u64,)) }
            .unwrap();
        upload.copy_to_device(&copies, &mut device).unwrap();
        let n = len as u32;
        // SAFETY: `scale` touches the `n` floats of `device`, which outlives it (the download
        // below is waited for on the same stream before `device` goes).
        unsafe {
            scale.launch(
                &copies,
                &LaunchConfig::for_elements(n, 256),
                (&mut device, factor, n),
            )
        }
        .unwrap();
        download.copy_from_device(&copies, &device).unwrap();
        // The upload's source is still readable while the copies run.
        assert_eq!(upload.as_slice().unwrap(), &data[..]);
        let want: Vec<f32> = data.iter().map(|x| x * factor).collect();
        assert_close(
            download.as_slice().unwrap(),
            &want,
            0.0,
            "pinned round trip",
        );
        // Overwriting the source waits for the upload; a second round trip sees the new data.
        upload
            .as_mut_slice()
            .unwrap()
            .iter_mut()
            .for_each(|x| *x = -*x);
        upload.copy_to_device(&copies, &mut device).unwrap();
        download.copy_from_device(&copies, &device).unwrap();
        let negated: Vec<f32> = data.iter().map(|x| -x).collect();
        assert_close(
            download.as_slice().unwrap(),
            &negated,
            0.0,
            "second round trip",
        );
        busy.synchronize().unwrap();
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_pinned_uploads_and_downloads_match_the_cpu_beside_a_kernel() {
    let child = child::run_on(
        gpu_uploads_and_downloads_match_the_cpu_beside_a_kernel,
        None,
    );
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

fn gpu_a_registered_vec_round_trips() {
    let mut rng = Rng::new();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let len = (16 << 20) / 4 + 5;
    let data = rng.vec(len);
    let mut up = HostRegistration::register(ctx, data.clone(), RegisterFlags::new()).unwrap();
    let mut down =
        HostRegistration::register(ctx, vec![f32::NAN; len], RegisterFlags::new()).unwrap();
    let mut device = DeviceBuffer::from_slice(ctx, &stream, &vec![f32::NAN; len]).unwrap();
    up.copy_to_device(&stream, &mut device).unwrap();
    down.copy_from_device(&stream, &device).unwrap();
    assert_eq!(up.into_vec().unwrap(), data);
    assert_close(
        &down.into_vec().unwrap(),
        &data,
        0.0,
        "registered round trip",
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_registered_vec_round_trips_through_the_device() {
    let child = child::run_on(gpu_a_registered_vec_round_trips, None);
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

fn gpu_a_mapped_buffer_is_scaled_by_a_kernel() {
    let mut rng = Rng::new();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let len = 100_003;
    let data = rng.vec(len);
    let factor = rng.f32_in(-4.0, 4.0);
    // One more element than the kernel touches, poisoned: a stray write would show.
    let mut padded = data.clone();
    padded.push(f32::NAN);
    let mut host = PinnedBuffer::from_slice(ctx, &padded, PinnedFlags::new().mapped()).unwrap();
    let address = host.device_ptr().expect("mapped");
    let scale = registry.function("elementwise", "scale").unwrap();
    let n = len as u32;
    // SAFETY: `scale` reads and writes the first `n` floats at the mapped address (the buffer
    // holds `n + 1`); the buffer outlives the kernel and the host holds no slice of it until the
    // kernel is waited for (`mark_used_by`, then `as_slice`).
    unsafe {
        scale.launch(
            &stream,
            &LaunchConfig::for_elements(n, 256),
            (address, factor, n),
        )
    }
    .unwrap();
    host.mark_used_by(&stream).unwrap();
    let got = host.as_slice().unwrap();
    let want: Vec<f32> = data.iter().map(|x| x * factor).collect();
    assert_close(&got[..len], &want, 0.0, "mapped scale");
    assert!(
        got[len].is_nan(),
        "the element past the kernel's is untouched"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_mapped_pinned_buffer_is_scaled_by_a_kernel() {
    let child = child::run_on(gpu_a_mapped_buffer_is_scaled_by_a_kernel, None);
    assert_eq!(child.ending, Ending::Passed, "{child}");
}
