//! Green contexts: a device's multiprocessors split into groups, a green context on a group and
//! streams on it that launch the device's kernels as any stream of its primary context does;
//! refusals before the driver (a driver without green contexts, splits that cannot be made, a
//! group of another device, a stream of another device given to a launch). On a GPU, two green
//! contexts of 64 multiprocessors each run a persistent kernel on disjoint multiprocessors.
//!
//! CPU (the stand-in libcuda, in child processes): `cargo test -p atlas-registry --test
//! green_contexts`. GPU: `cargo test -p atlas-registry --test green_contexts -- --include-ignored
//! --nocapture`.

mod support;

use std::collections::BTreeSet;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::{self, CUcontext, CUgreenCtx, CUresult};
use atlas_registry::{
    AtlasError, AtlasRegistry, DeviceBuffer, GreenContext, GreenContextRefusal, LaunchConfig,
    SmGranularity, SmResource,
};
use support::blobs::NEEDS_GPU;
use support::child;
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    a_driver_without_green_contexts_is_named,
    splits_green_contexts_and_their_streams,
    other_devices_are_refused,
);

// ---------------------------------------------------------------------------------------------
// CPU: the stand-in libcuda
// ---------------------------------------------------------------------------------------------

#[test]
fn a_driver_without_green_contexts_refuses_them_by_name() {
    standin::run(
        a_driver_without_green_contexts_is_named,
        &["-DSTANDIN_NO_GREEN_CONTEXTS"],
    );
}

#[test]
fn a_split_makes_green_contexts_whose_streams_launch_the_devices_kernels() {
    standin::run(splits_green_contexts_and_their_streams, &[]);
}

#[test]
fn groups_and_streams_of_another_device_are_refused() {
    standin::run(other_devices_are_refused, &["-DSTANDIN_DEVICES=2"]);
}

fn demo(ordinal: usize) -> AtlasRegistry {
    AtlasRegistry::load(ordinal, ptx_for_model("demo").unwrap()).unwrap()
}

fn refusal(e: AtlasError) -> GreenContextRefusal {
    match e {
        AtlasError::GreenContext(reason) => reason,
        other => panic!("expected a green context refusal, got {other}"),
    }
}

fn a_driver_without_green_contexts_is_named() {
    let registry = demo(0);
    let e = refusal(SmResource::of_device(registry.ctx()).unwrap_err());
    let missing = [
        "cuDeviceGetDevResource",
        "cuDevSmResourceSplitByCount",
        "cuDevResourceGenerateDesc",
        "cuGreenCtxCreate",
        "cuGreenCtxDestroy",
        "cuCtxFromGreenCtx",
        "cuGreenCtxGetDevResource",
        "cuGreenCtxStreamCreate",
    ];
    assert_eq!(
        e,
        GreenContextRefusal::Unsupported {
            missing: missing.to_vec()
        }
    );
    let shown = AtlasError::GreenContext(e).to_string();
    assert!(
        shown.starts_with("green contexts need cuDeviceGetDevResource, ")
            && shown.ends_with("which this driver lacks (drivers of CUDA 12.5 or newer have them)"),
        "{shown}"
    );
}

fn splits_green_contexts_and_their_streams() {
    let registry = demo(0);
    let ctx = registry.ctx();
    let all = SmResource::of_device(ctx).unwrap();
    assert_eq!((all.sm_count(), all.ordinal()), (132, 0));
    // Refusals before the driver.
    let calls = probe().count("calls");
    assert_eq!(
        refusal(all.split(0, 8).unwrap_err()),
        GreenContextRefusal::NoGroups
    );
    assert_eq!(
        refusal(all.split(1, 133).unwrap_err()),
        GreenContextRefusal::MinCountAboveSms {
            min_count: 133,
            sms: 132
        }
    );
    assert_eq!(probe().count("calls"), calls, "a refusal called the driver");

    // Two groups of 64 of the 132, as on an H200; the driver rounds 60 up to 64 as well.
    let split = all.split(2, 60).unwrap();
    assert_eq!(probe().count("cuDevSmResourceSplitByCount"), 1);
    let counts: Vec<u32> = split.groups.iter().map(SmResource::sm_count).collect();
    let size = SmGranularity::of(registry.host().compute_capability()).group_size(60);
    assert_eq!((counts, size), (vec![64, 64], 64));
    assert_eq!(split.remainder.sm_count(), 4);
    assert_eq!(
        refusal(split.groups[0].split(2, 8).unwrap_err()),
        GreenContextRefusal::SplitOfGroup
    );
    assert_eq!(probe().count("cuDevSmResourceSplitByCount"), 1);

    let green = GreenContext::new(ctx, &split.groups[1]).unwrap();
    assert_eq!(green.ordinal(), 0);
    assert_eq!(green.sm_resource().unwrap().sm_count(), 64);
    assert!(!green.raw().is_null() && !green.raw_context().is_null());
    // Its own resource splits again.
    let halves = green.sm_resource().unwrap().split(2, 32).unwrap();
    assert_eq!(halves.groups.len(), 2);

    // A stream of the green context launches the device's kernels and copies its buffers.
    let stream = green.stream().unwrap();
    assert_eq!(stream.context(), ctx.raw());
    let mut rng = Rng::new();
    let input: Vec<f32> = (0..1000).map(|_| rng.f32()).collect();
    let mut x = DeviceBuffer::from_slice(ctx, &stream, &input).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let cfg = LaunchConfig::for_elements(1000, 256);
    // SAFETY: `scale` touches the 1000 floats of `x`; `to_vec` waits for it on the same stream.
    unsafe { scale.launch(&stream, &cfg, (&mut x, 3.0f32, 1000u32)) }.unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * 3.0).collect();
    assert_eq!(x.to_vec(&stream).unwrap(), want);
    // Once the kernel's layout is read (the first launch), a launch there is one driver call.
    let calls = probe().count("calls");
    // SAFETY: as above.
    unsafe { scale.launch(&stream, &cfg, (&mut x, 0.5f32, 1000u32)) }.unwrap();
    assert_eq!(probe().count("calls") - calls, 1, "one cuLaunchKernel");
    let want: Vec<f32> = want.iter().map(|v| v * 0.5).collect();
    assert_eq!(x.to_vec(&stream).unwrap(), want);
    assert_eq!(probe().count("context_mismatch"), 0);

    // Priorities as for any stream: within the device's range.
    let (_, greatest) = ctx.stream_priorities().unwrap();
    let urgent = green.stream_with_priority(greatest).unwrap();
    assert_eq!(urgent.priority().unwrap(), greatest);
    match green.stream_with_priority(greatest - 1).unwrap_err() {
        AtlasError::StreamPriority { priority, .. } => assert_eq!(priority, greatest - 1),
        other => panic!("expected the priority refusal, got {other}"),
    }
    assert_eq!(probe().count("cuGreenCtxStreamCreate"), 2);

    // The streams keep the green context: it is destroyed once, after the last of them.
    drop(green);
    drop(urgent);
    assert_eq!(probe().count("cuGreenCtxDestroy"), 0);
    drop(stream);
    assert_eq!(probe().count("cuGreenCtxDestroy"), 1);
    assert_eq!(probe().count("stale_handle"), 0);
}

fn other_devices_are_refused() {
    let (zero, one) = (demo(0), demo(1));
    let group = SmResource::of_device(one.ctx())
        .unwrap()
        .split(1, 64)
        .unwrap()
        .groups
        .remove(0);
    let created = probe().count("cuGreenCtxCreate");
    assert_eq!(
        refusal(GreenContext::new(zero.ctx(), &group).unwrap_err()),
        GreenContextRefusal::OtherDevice {
            resource: 1,
            device: 0
        }
    );
    assert_eq!(probe().count("cuGreenCtxCreate"), created);
    // A stream of device 1's green context is device 1's: device 0's kernels refuse it.
    let green = GreenContext::new(one.ctx(), &group).unwrap();
    let stream = green.stream().unwrap();
    let mut x = DeviceBuffer::<f32>::zeroed(zero.ctx(), zero.stream(), 16).unwrap();
    let scale = zero.function_cached("elementwise", "scale").unwrap();
    let launches = probe().launches();
    // SAFETY: refused before the launch.
    let e = unsafe {
        scale.launch(
            &stream,
            &LaunchConfig::for_elements(16, 64),
            (&mut x, 2.0f32, 16u32),
        )
    }
    .unwrap_err();
    match e {
        AtlasError::WrongDevice {
            what,
            expected: 0,
            given: Some(1),
            ..
        } => assert_eq!(what, "the stream"),
        other => panic!("expected the device refusal, got {other}"),
    }
    assert_eq!(probe().launches(), launches);
}

// ---------------------------------------------------------------------------------------------
// GPU
// ---------------------------------------------------------------------------------------------

/// `cuStreamGetCtx_v2` of `stream`: the context and the green context the driver says it is of.
fn contexts_of(stream: sys::CUstream) -> (CUcontext, CUgreenCtx) {
    let cuda = sys::driver().unwrap();
    let get = sys::entry!(cuda, cuStreamGetCtx_v2).expect("a driver of CUDA 12.5 or newer");
    let (mut context, mut green) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: a live stream and two live out-pointers.
    let status = unsafe { get(stream, &mut context, &mut green) };
    assert_eq!(status, CUresult::CUDA_SUCCESS, "cuStreamGetCtx_v2");
    (context, green)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn two_green_contexts_run_a_persistent_kernel_on_disjoint_multiprocessors() {
    let registry = AtlasRegistry::load(0, ptx_for_model("hopper").unwrap())
        .unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    let ctx = registry.ctx();
    let host = registry.host();
    let all = SmResource::of_device(ctx).unwrap();
    assert_eq!(all.sm_count(), host.limits().multiprocessors);
    let split = all.split(2, 64).unwrap();
    let size = SmGranularity::of(host.compute_capability()).group_size(64);
    println!(
        "{} multiprocessors: groups of {:?}, {} left over (guideline: {size})",
        all.sm_count(),
        split
            .groups
            .iter()
            .map(SmResource::sm_count)
            .collect::<Vec<_>>(),
        split.remainder.sm_count()
    );
    assert_eq!(
        split.groups.len(),
        2,
        "two groups of 64 fit in {}",
        all.sm_count()
    );
    let greens: Vec<GreenContext> = split
        .groups
        .iter()
        .map(|group| GreenContext::new(ctx, group).unwrap())
        .collect();
    let kernel = registry.function_cached("smid", "smid_items").unwrap();
    let mut rng = Rng::new();
    let mut runs = Vec::new();
    for (green, group) in greens.iter().zip(&split.groups) {
        let sms = group.sm_count();
        assert_eq!(sms, size, "the driver's group size is the documented one");
        // The split queried back from the green context.
        assert_eq!(green.sm_resource().unwrap().sm_count(), sms);
        let stream = green.stream().unwrap();
        // The driver's rule Atlas follows: a stream of a green context is of the primary context.
        let (context, of_green) = contexts_of(stream.raw());
        assert_eq!(context, ctx.raw(), "cuStreamGetCtx_v2: the primary context");
        assert_eq!(
            of_green,
            green.raw(),
            "cuStreamGetCtx_v2: the green context"
        );
        println!(
            "cuCtxFromGreenCtx: {:?} (primary context {:?})",
            green.raw_context(),
            ctx.raw()
        );
        // Fresh item counts and hold times; every slot poisoned.
        let items = sms * (8 + rng.below(8) as u32);
        let hold_ns = 20_000 + rng.below(20_000) as u32;
        let out = DeviceBuffer::from_slice(ctx, &stream, &vec![u32::MAX; items as usize]).unwrap();
        runs.push((stream, out, items, hold_ns, sms));
    }
    // Both run at once: four blocks per multiprocessor of the group, each holding its
    // multiprocessor for a while per item.
    for (stream, out, items, hold_ns, sms) in &mut runs {
        let cfg = LaunchConfig {
            grid: (4 * *sms, 1, 1),
            block: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: smid_items writes `items` u32s of `out`, which holds that many; the streams are
        // synchronized (by `to_vec`) before `out` is read or dropped.
        unsafe { kernel.launch(&*stream, &cfg, (&mut *out, *items, *hold_ns)) }.unwrap();
    }
    let mut seen = Vec::new();
    for (stream, out, _, _, sms) in &runs {
        let got = out.to_vec(stream).unwrap();
        assert!(
            got.iter().all(|&sm| sm < all.sm_count()),
            "an item was not run, or ran on no multiprocessor of the device: {got:?}"
        );
        let ids: BTreeSet<u32> = got.into_iter().collect();
        println!("{} multiprocessors used: {ids:?}", ids.len());
        assert_eq!(
            ids.len() as u32,
            *sms,
            "the kernel ran on exactly the group's multiprocessors"
        );
        seen.push(ids);
    }
    assert!(
        seen[0].is_disjoint(&seen[1]),
        "the groups share multiprocessors: {:?}",
        seen[0].intersection(&seen[1]).collect::<Vec<_>>()
    );
}
