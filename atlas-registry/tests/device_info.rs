//! What an engine asks of its device: identity (UUID, PCI address), memory, attributes, context
//! limits, a kernel's attributes and its occupancy. Each answer is the driver's, asked in the right
//! context whatever is current, with one driver call where one is meant; what the driver would
//! refuse is refused before it, typed.
//!
//! CPU (the stand-in libcuda, in child processes): `cargo test -p atlas-registry --test
//! device_info`. GPU: `cargo test -p atlas-registry --test device_info -- --include-ignored`
//! (the H200's figures are checked when the device is one).

mod support;

use std::process::Command;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::CUdevice_attribute as Attr;
use atlas_registry::{
    AtlasError, AtlasRegistry, ContextLimit, ContextLimitRefusal, DeviceBuffer, DeviceUuid,
    LimitError, PciBusId, host,
};
use support::blobs::NEEDS_GPU;
use support::child;
use support::standin::{self, probe};

child::bodies!(
    identity_memory_and_attributes_are_the_devices,
    the_uuid_falls_back_to_cu_device_get_uuid,
    memory_and_limits_are_asked_in_the_right_context,
    limits_round_trip_and_refusals_are_typed,
    an_older_device_has_a_sync_depth_up_to_24,
    function_attributes_are_eight_reads_never_kept,
    occupancy_is_checked_opted_in_and_one_call,
    setting_a_limit_while_capturing_is_refused,
);

// ---------------------------------------------------------------------------------------------
// CPU: the stand-in libcuda
// ---------------------------------------------------------------------------------------------

/// The stand-in's UUID of device `d` (`standin_uuid` in standin.c).
fn standin_uuid(d: u8) -> [u8; 16] {
    [
        0x5c, 0x1e, 0x32, 0x9a, 0x07, 0x44, 0x8f, 0x2b, 0x91, 0x0d, 0xe6, 0x73, 0x4a, 0xb8, 0x00, d,
    ]
}

/// Every entry point's calls made by `f`, as `(name, calls)` for those called, with its result.
fn calls_of<T>(f: impl FnOnce() -> T) -> (T, Vec<(&'static str, u64)>) {
    const NAMES: &[&str] = &[
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",
        "cuDeviceGetAttribute",
        "cuMemGetInfo_v2",
        "cuDeviceGetUuid",
        "cuDeviceGetUuid_v2",
        "cuDeviceGetPCIBusId",
        "cuCtxSetLimit",
        "cuCtxGetLimit",
        "cuFuncGetAttribute",
        "cuFuncSetAttribute",
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        "cuOccupancyMaxPotentialBlockSize",
    ];
    let p = probe();
    let before: Vec<u64> = NAMES.iter().map(|n| p.count(n)).collect();
    let all = p.count("calls");
    let out = f();
    let made: Vec<(&str, u64)> = NAMES
        .iter()
        .zip(before)
        .map(|(n, b)| (*n, p.count(n) - b))
        .filter(|&(_, c)| c > 0)
        .collect();
    let counted: u64 = made.iter().map(|&(_, c)| c).sum();
    assert_eq!(
        p.count("calls") - all,
        counted,
        "calls to entry points outside the list: {made:?}"
    );
    (out, made)
}

#[test]
fn uuid_pci_address_memory_and_attributes_are_the_devices_in_one_call_each() {
    standin::run(identity_memory_and_attributes_are_the_devices, &[]);
}

fn identity_memory_and_attributes_are_the_devices() {
    let host = host(0).unwrap();
    let (uuid, made) = calls_of(|| host.uuid().unwrap());
    assert_eq!(made, [("cuDeviceGetUuid_v2", 1)]);
    assert_eq!(uuid, DeviceUuid::from_bytes(standin_uuid(0)));
    assert_eq!(uuid.to_string(), "GPU-5c1e329a-0744-8f2b-910d-e6734ab80000");

    let (pci, made) = calls_of(|| host.pci_bus_id().unwrap());
    assert_eq!(made, [("cuDeviceGetPCIBusId", 1)]);
    let expected = PciBusId {
        domain: 0,
        bus: 0x1b,
        device: 0,
        function: 0,
    };
    assert_eq!(pci, expected);
    assert_eq!(pci.to_string(), "0000:1b:00.0");
    let bus = host
        .attribute(Attr::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)
        .unwrap();
    assert_eq!(bus, i32::from(pci.bus), "the driver's two answers agree");

    assert_eq!(host.limits().multiprocessors, 132);
    let (l2, made) = calls_of(|| host.l2_cache_bytes().unwrap());
    assert_eq!((l2, made), (50 << 20, vec![("cuDeviceGetAttribute", 1)]));
    assert_eq!(host.memory_clock_khz().unwrap(), 3_201_000);
    assert_eq!(host.memory_bus_width_bits().unwrap(), 6144);
    assert_eq!(host.max_threads_per_multiprocessor().unwrap(), 2048);
    let (sms, made) = calls_of(|| {
        host.attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap()
    });
    assert_eq!((sms, made), (132, vec![("cuDeviceGetAttribute", 1)]));
    match host.attribute(Attr(9999)) {
        Err(AtlasError::Driver(failure)) => {
            assert_eq!(failure.call, "cuDeviceGetAttribute");
            assert_eq!(failure.code, 1, "CUDA_ERROR_INVALID_VALUE");
            assert!(failure.subject.contains("attribute 9999"), "{failure}");
        }
        other => panic!("an unknown attribute is the driver's refusal, not {other:?}"),
    }

    let context = host.context();
    context.bind().unwrap();
    let (memory, made) = calls_of(|| context.memory_info().unwrap());
    assert_eq!(made, [("cuCtxGetCurrent", 1), ("cuMemGetInfo_v2", 1)]);
    assert_eq!(memory.total, 150_000_000_000);
    let buffer = DeviceBuffer::<u8>::alloc(context, 1 << 20).unwrap();
    let after = context.memory_info().unwrap();
    assert_eq!(memory.free - after.free, 1 << 20);
    drop(buffer);
    assert_eq!(context.memory_info().unwrap(), memory);
}

#[test]
fn a_driver_without_cu_device_get_uuid_v2_answers_through_cu_device_get_uuid() {
    standin::run(
        the_uuid_falls_back_to_cu_device_get_uuid,
        &["-DSTANDIN_NO_UUID_V2"],
    );
}

fn the_uuid_falls_back_to_cu_device_get_uuid() {
    let host = host(0).unwrap();
    let (uuid, made) = calls_of(|| host.uuid().unwrap());
    assert_eq!(made, [("cuDeviceGetUuid", 1)]);
    assert_eq!(uuid.bytes(), standin_uuid(0));
}

#[test]
fn memory_and_limits_are_asked_of_the_callers_device_whatever_context_is_current() {
    standin::run(
        memory_and_limits_are_asked_in_the_right_context,
        &["-DSTANDIN_DEVICES=2"],
    );
}

fn memory_and_limits_are_asked_in_the_right_context() {
    let p = probe();
    let (zero, one) = (host(0).unwrap(), host(1).unwrap());
    assert_eq!(one.uuid().unwrap().bytes(), standin_uuid(1));
    assert_eq!(one.pci_bus_id().unwrap().bus, 0x2b);

    let used = DeviceBuffer::<u8>::alloc(one.context(), 3 << 20).unwrap();
    zero.context().bind().unwrap();
    let memory = one.context().memory_info().unwrap();
    assert_eq!(memory.total - memory.free, 3 << 20, "device 1's memory");
    assert_eq!(p.current_context(), one.context().raw());
    p.foreign_context(0);
    let memory = zero.context().memory_info().unwrap();
    assert_eq!(
        memory.free, memory.total,
        "device 0's memory, not device 1's"
    );

    let stack = ContextLimit::StackSize;
    let before = zero.context().limit(stack).unwrap();
    p.foreign_context(0);
    one.context().set_limit(stack, 8192).unwrap();
    assert_eq!(p.current_context(), one.context().raw());
    assert_eq!(one.context().limit(stack).unwrap(), 8192);
    assert_eq!(
        zero.context().limit(stack).unwrap(),
        before,
        "device 0 untouched"
    );
    drop(used);
}

#[test]
fn context_limits_round_trip_and_each_refusal_is_typed() {
    standin::run(limits_round_trip_and_refusals_are_typed, &[]);
}

/// The refusal inside an [`AtlasError::ContextLimit`] about `limit` and `value`.
fn limit_refusal(e: AtlasError, limit: ContextLimit, value: Option<usize>) -> ContextLimitRefusal {
    match e {
        AtlasError::ContextLimit {
            device: 0,
            limit: l,
            value: v,
            reason,
        } if l == limit && v == value => reason,
        other => panic!("expected a refusal of {limit} ({value:?}), got {other:?}: {other}"),
    }
}

fn limits_round_trip_and_refusals_are_typed() {
    let p = probe();
    let host = host(0).unwrap();
    let context = host.context();
    context.bind().unwrap();

    let (_, made) = calls_of(|| context.set_limit(ContextLimit::StackSize, 4000).unwrap());
    assert_eq!(made, [("cuCtxGetCurrent", 1), ("cuCtxSetLimit", 1)]);
    let (stack, made) = calls_of(|| context.limit(ContextLimit::StackSize).unwrap());
    assert_eq!(made, [("cuCtxGetCurrent", 1), ("cuCtxGetLimit", 1)]);
    assert_eq!(stack, 4000, "4000 is a multiple of 16: taken as asked");
    context.set_limit(ContextLimit::StackSize, 1000).unwrap();
    assert_eq!(context.limit(ContextLimit::StackSize).unwrap(), 1008);
    for (limit, value) in [
        (ContextLimit::PrintfFifoSize, 64 << 20),
        (ContextLimit::MallocHeapSize, 256 << 20),
        (ContextLimit::DevRuntimePendingLaunchCount, 4096),
        (ContextLimit::MaxL2FetchGranularity, 128),
        (ContextLimit::CigShmemFallbackEnabled, 0),
    ] {
        context.set_limit(limit, value).unwrap();
        assert_eq!(context.limit(limit).unwrap(), value, "{limit}");
    }
    context
        .set_limit(ContextLimit::PersistingL2CacheSize, 1 << 30)
        .unwrap();
    assert_eq!(
        context.limit(ContextLimit::PersistingL2CacheSize).unwrap(),
        30 << 20,
        "clamped by the driver, read back as it took it"
    );
    assert_eq!(context.limit(ContextLimit::CigEnabled).unwrap(), 0);

    // Refused before the driver, from what its documentation says.
    let refusals = [
        (ContextLimit::ShmemSize, 1, ContextLimitRefusal::ReadOnly),
        (ContextLimit::CigEnabled, 1, ContextLimitRefusal::ReadOnly),
        (
            ContextLimit::MaxL2FetchGranularity,
            129,
            ContextLimitRefusal::TooLarge { max: 128 },
        ),
        (
            ContextLimit::DevRuntimeSyncDepth,
            4,
            ContextLimitRefusal::Unsupported {
                compute_capability: (9, 0),
            },
        ),
    ];
    for (limit, value, expected) in refusals {
        let (result, made) = calls_of(|| context.set_limit(limit, value));
        let reason = limit_refusal(result.unwrap_err(), limit, Some(value));
        assert_eq!(reason, expected, "{limit}");
        assert!(
            made.iter().all(|&(name, _)| name == "cuDeviceGetAttribute"),
            "only the compute capability may be asked: {made:?}"
        );
    }
    let text = context
        .set_limit(ContextLimit::DevRuntimeSyncDepth, 4)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH")
            && text.contains("device 0")
            && text.contains("to 4")
            && text.contains("9.0"),
        "{text}"
    );

    // The driver's refusals, typed.
    let e = context
        .limit(ContextLimit::DevRuntimeSyncDepth)
        .unwrap_err();
    assert_eq!(
        limit_refusal(e, ContextLimit::DevRuntimeSyncDepth, None),
        ContextLimitRefusal::Unsupported {
            compute_capability: (9, 0)
        },
        "CUDA_ERROR_UNSUPPORTED_LIMIT"
    );
    p.inject("cuCtxSetLimit", 1, 1); // as after a kernel that prints was launched
    let e = context
        .set_limit(ContextLimit::PrintfFifoSize, 1 << 20)
        .unwrap_err();
    let text = e.to_string();
    let reason = limit_refusal(e, ContextLimit::PrintfFifoSize, Some(1 << 20));
    assert_eq!(
        reason,
        ContextLimitRefusal::Driver {
            setting: true,
            code: 1
        }
    );
    assert!(
        text.contains("CUDA_ERROR_INVALID_VALUE") && text.contains("before the context's first"),
        "{text}"
    );
    p.inject("cuCtxGetLimit", 2, 1);
    let e = context.limit(ContextLimit::StackSize).unwrap_err();
    assert_eq!(
        limit_refusal(e, ContextLimit::StackSize, None),
        ContextLimitRefusal::Driver {
            setting: false,
            code: 2
        }
    );
    p.inject("cuCtxSetLimit", 700, 1); // a lost context stays what it is
    let e = context
        .set_limit(ContextLimit::StackSize, 2048)
        .unwrap_err();
    assert!(e.is_context_lost(), "{e:?}");
}

#[test]
fn below_compute_capability_9_the_sync_depth_is_set_up_to_24() {
    standin::run(
        an_older_device_has_a_sync_depth_up_to_24,
        &["-DSTANDIN_CC_MAJOR=8"],
    );
}

fn an_older_device_has_a_sync_depth_up_to_24() {
    let host = host(0).unwrap();
    let context = host.context();
    let depth = ContextLimit::DevRuntimeSyncDepth;
    assert_eq!(context.limit(depth).unwrap(), 2, "the default");
    context.set_limit(depth, 24).unwrap();
    assert_eq!(context.limit(depth).unwrap(), 24);
    let (result, made) = calls_of(|| context.set_limit(depth, 25));
    assert_eq!(
        limit_refusal(result.unwrap_err(), depth, Some(25)),
        ContextLimitRefusal::TooLarge { max: 24 }
    );
    assert!(made.iter().all(|&(name, _)| name != "cuCtxSetLimit"));
}

/// The `demo` model's PTX on the stand-in (which knows its kernels by name).
fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

#[test]
fn function_attributes_are_eight_driver_reads_each_time() {
    standin::run(function_attributes_are_eight_reads_never_kept, &[]);
}

fn function_attributes_are_eight_reads_never_kept() {
    let registry = demo();
    let block_sum = registry
        .function_cached("block_reduce", "block_sum")
        .unwrap();
    let (attributes, made) = calls_of(|| block_sum.attributes().unwrap());
    assert_eq!(made, [("cuFuncGetAttribute", 8)]);
    assert_eq!(attributes.max_threads_per_block, 1024);
    assert_eq!(attributes.registers, 16);
    assert_eq!(attributes.static_shared_bytes, 4096);
    assert_eq!(attributes.const_bytes, 12);
    assert_eq!(attributes.local_bytes, 24);
    assert_eq!(attributes.max_dynamic_shared_bytes, 49152 - 4096);
    assert_eq!(attributes.ptx_version, (8, 0));
    assert_eq!(attributes.binary_version, (9, 0));
    // The opt-in (made by an occupancy question as by a launch) shows at the next read.
    block_sum
        .active_blocks_per_multiprocessor(256, 96 << 10)
        .unwrap();
    assert_eq!(
        block_sum.attributes().unwrap().max_dynamic_shared_bytes,
        96 << 10
    );
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    assert_eq!(scale.attributes().unwrap().static_shared_bytes, 0);
}

#[test]
fn occupancy_questions_are_checked_opted_in_and_one_driver_call() {
    standin::run(occupancy_is_checked_opted_in_and_one_call, &[]);
}

/// The limit inside an [`AtlasError::Occupancy`] about `function`.
fn occupancy_refusal(e: AtlasError, function: &str) -> LimitError {
    match e {
        AtlasError::Occupancy {
            function: f,
            reason,
        } if f == function => reason,
        other => panic!("expected an occupancy refusal, got {other:?}"),
    }
}

fn occupancy_is_checked_opted_in_and_one_call() {
    let p = probe();
    let registry = demo();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    registry.ctx().bind().unwrap();

    let (blocks, made) = calls_of(|| scale.active_blocks_per_multiprocessor(256, 0).unwrap());
    assert_eq!(blocks, 8, "2048 threads an SM");
    assert_eq!(
        made,
        [
            ("cuCtxGetCurrent", 1),
            ("cuOccupancyMaxActiveBlocksPerMultiprocessor", 1)
        ]
    );
    let ((min_grid, block), made) = calls_of(|| scale.max_potential_block_size(0, None).unwrap());
    assert_eq!(
        made,
        [
            ("cuCtxGetCurrent", 1),
            ("cuOccupancyMaxPotentialBlockSize", 1)
        ]
    );
    assert_eq!(
        (min_grid, block),
        (2 * 132, 1024),
        "the largest of equal occupancy"
    );
    let (min_grid, block) = scale.max_potential_block_size(0, Some(100)).unwrap();
    assert_eq!(
        (min_grid, block),
        (32 * 132, 64),
        "100 and 96 leave threads unused"
    );
    assert_eq!(
        min_grid,
        scale.active_blocks_per_multiprocessor(block, 0).unwrap() * 132
    );

    // Past 48 KiB, the question is the launch's: the opt-in is made first.
    let block_sum = registry
        .function_cached("block_reduce", "block_sum")
        .unwrap();
    let blocks = block_sum
        .active_blocks_per_multiprocessor(256, 96 << 10)
        .unwrap();
    assert_eq!(blocks, 2, "two blocks of 96 KiB in the SM's 227 KiB");
    assert_eq!(p.max_dynamic_shared(block_sum.raw().raw()), Some(96 << 10));
    let (min_grid, block) = block_sum.max_potential_block_size(112 << 10, None).unwrap();
    assert_eq!((min_grid, block), (2 * 132, 1024));
    assert_eq!(p.max_dynamic_shared(block_sum.raw().raw()), Some(112 << 10));

    // Blocks no launch could have never reach the driver.
    let name = "elementwise::scale";
    let most = scale.host().limits().max_shared_mem_optin;
    let refused: [(Box<dyn Fn() -> AtlasError>, LimitError); 5] = [
        (
            Box::new(|| scale.active_blocks_per_multiprocessor(0, 0).unwrap_err()),
            LimitError::ZeroBlock((0, 1, 1)),
        ),
        (
            Box::new(|| scale.active_blocks_per_multiprocessor(1025, 0).unwrap_err()),
            LimitError::BlockThreads {
                block: (1025, 1, 1),
                threads: 1025,
                max: 1024,
            },
        ),
        (
            Box::new(|| {
                scale
                    .active_blocks_per_multiprocessor(128, most + 1)
                    .unwrap_err()
            }),
            LimitError::SharedMemory {
                bytes: most + 1,
                max: most,
            },
        ),
        (
            Box::new(|| scale.max_potential_block_size(0, Some(0)).unwrap_err()),
            LimitError::ZeroBlock((0, 1, 1)),
        ),
        (
            Box::new(|| {
                scale
                    .max_potential_block_size(most + 1, Some(256))
                    .unwrap_err()
            }),
            LimitError::SharedMemory {
                bytes: most + 1,
                max: most,
            },
        ),
    ];
    for (ask, expected) in refused {
        let (e, made) = calls_of(ask);
        let text = e.to_string();
        assert_eq!(occupancy_refusal(e, name), expected);
        assert!(made.is_empty(), "{made:?}");
        assert!(
            text.starts_with("cannot compute the occupancy of `elementwise::scale`"),
            "{text}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// GPU: the driver's own answers
// ---------------------------------------------------------------------------------------------

/// Device 0's host; fails the test without a GPU.
fn gpu_host() -> std::sync::Arc<atlas_registry::CudaHost> {
    host(0).unwrap_or_else(|e| panic!("device 0 ({NEEDS_GPU}): {e}"))
}

/// `(uuid, PCI address)` of every GPU, as `nvidia-smi` lists them.
fn nvidia_smi_gpus() -> Vec<(String, PciBusId)> {
    let output = Command::new("nvidia-smi")
        .args(["--query-gpu=uuid,pci.bus_id", "--format=csv,noheader"])
        .output()
        .unwrap_or_else(|e| panic!("nvidia-smi cannot be run ({NEEDS_GPU} and nvidia-smi): {e}"));
    assert!(output.status.success(), "nvidia-smi: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let (uuid, pci) = line
                .split_once(',')
                .unwrap_or_else(|| panic!("nvidia-smi line `{line}`"));
            let pci = PciBusId::parse(pci.trim())
                .unwrap_or_else(|| panic!("nvidia-smi's PCI address `{pci}`"));
            (uuid.trim().to_string(), pci)
        })
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_uuid_and_pci_address_are_what_nvidia_smi_says() {
    let gpus = nvidia_smi_gpus();
    for ordinal in 0..atlas_registry::device_count().unwrap() {
        let host = host(ordinal).unwrap();
        let (uuid, pci) = (host.uuid().unwrap(), host.pci_bus_id().unwrap());
        let text = uuid.to_string();
        assert_eq!(text.len(), 40, "{text}");
        let listed = gpus
            .iter()
            .find(|(_, p)| *p == pci)
            .unwrap_or_else(|| panic!("device {ordinal} at {pci} is not in {gpus:?}"));
        assert_eq!(listed.0, text, "device {ordinal} at {pci}");
        let bus = host
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)
            .unwrap();
        let domain = host
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)
            .unwrap();
        let device = host
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)
            .unwrap();
        let from_attributes = (domain as u32, bus as u8, device as u8, 0);
        assert_eq!(
            from_attributes,
            (pci.domain, pci.bus, pci.device, pci.function)
        );
        println!("device {ordinal}: {} {uuid} at {pci}", host.name());
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_memory_and_attributes_are_the_devices() {
    let host = gpu_host();
    let context = host.context();
    let memory = context.memory_info().unwrap();
    assert!(0 < memory.free && memory.free <= memory.total, "{memory:?}");
    let bytes = 256usize << 20;
    let buffer = DeviceBuffer::<u8>::alloc(context, bytes).unwrap();
    let during = context.memory_info().unwrap();
    let taken = memory.free - during.free;
    assert!(
        (bytes..=bytes + (64 << 20)).contains(&taken),
        "allocating {bytes} B took {taken} B of free memory"
    );
    drop(buffer);
    assert_eq!(during.total, memory.total);

    let sms = host.limits().multiprocessors;
    let smx = host
        .attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .unwrap();
    assert_eq!(smx as u32, sms);
    assert_eq!(
        host.attribute(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE).unwrap(),
        32
    );
    let (l2, clock, width) = (
        host.l2_cache_bytes().unwrap(),
        host.memory_clock_khz().unwrap(),
        host.memory_bus_width_bits().unwrap(),
    );
    let per_sm = host.max_threads_per_multiprocessor().unwrap();
    let bandwidth = 2.0 * f64::from(clock) * 1e3 * f64::from(width) / 8.0;
    println!(
        "{}: {sms} SMs, {} B total, {} B free, L2 {l2} B, memory {clock} kHz x {width} bits \
         ({:.2} TB/s), {per_sm} threads/SM",
        host.name(),
        memory.total,
        memory.free,
        bandwidth / 1e12
    );
    assert!(l2 > 0 && clock > 0 && width > 0 && per_sm >= 1024);
    if host.name().contains("H200") {
        assert_eq!(sms, 132);
        assert!(
            (135 << 30..=150 << 30).contains(&memory.total),
            "an H200 has about 140 GB: {}",
            memory.total
        );
        assert_eq!(per_sm, 2048);
        assert!((40 << 20..=64 << 20).contains(&l2), "L2 of {l2} B");
        assert!(
            (4.0e12..=5.5e12).contains(&bandwidth),
            "an H200's memory moves about 4.8 TB/s: {bandwidth}"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_context_limits_are_set_read_back_and_refused_as_the_driver_does() {
    let host = gpu_host();
    let context = host.context();
    let stack = context.limit(ContextLimit::StackSize).unwrap();
    assert!(stack > 0);
    context.set_limit(ContextLimit::StackSize, 4096).unwrap();
    assert!(context.limit(ContextLimit::StackSize).unwrap() >= 4096);
    for (limit, value) in [
        (ContextLimit::PrintfFifoSize, 8usize << 20),
        (ContextLimit::MallocHeapSize, 64 << 20),
    ] {
        context.set_limit(limit, value).unwrap();
        assert!(context.limit(limit).unwrap() >= value, "{limit}");
    }
    context
        .set_limit(ContextLimit::MaxL2FetchGranularity, 64)
        .unwrap();
    assert!(context.limit(ContextLimit::MaxL2FetchGranularity).unwrap() <= 128);
    let most = host
        .attribute(Attr::CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)
        .unwrap() as usize;
    context
        .set_limit(ContextLimit::PersistingL2CacheSize, most / 2)
        .unwrap();
    assert!(context.limit(ContextLimit::PersistingL2CacheSize).unwrap() <= most);
    context
        .set_limit(ContextLimit::PersistingL2CacheSize, 0)
        .unwrap();
    println!(
        "stack {stack} B; CIG: {:?}",
        context.limit(ContextLimit::CigEnabled)
    );

    // What Atlas refuses beforehand, the driver refuses too.
    let cuda = atlas_sys::driver().unwrap();
    let set = atlas_sys::entry!(cuda, cuCtxSetLimit).unwrap();
    if host.compute_capability().0 >= 9 {
        let e = context
            .set_limit(ContextLimit::DevRuntimeSyncDepth, 4)
            .unwrap_err();
        assert!(matches!(
            e,
            AtlasError::ContextLimit {
                reason: ContextLimitRefusal::Unsupported { .. },
                ..
            }
        ));
        context.bind().unwrap();
        // SAFETY: plain values, in Atlas's context (current: bound above).
        let status = unsafe { set(ContextLimit::DevRuntimeSyncDepth.raw(), 4) };
        assert_eq!(status.0, 215, "the driver's CUDA_ERROR_UNSUPPORTED_LIMIT");
    }
    for limit in [ContextLimit::ShmemSize, ContextLimit::CigEnabled] {
        let e = context.set_limit(limit, 1).unwrap_err();
        assert!(matches!(
            e,
            AtlasError::ContextLimit {
                reason: ContextLimitRefusal::ReadOnly,
                ..
            }
        ));
        context.bind().unwrap();
        // SAFETY: as above.
        let status = unsafe { set(limit.raw(), 1) };
        assert_ne!(status.0, 0, "the driver refuses setting {limit} too");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_questions_and_limits_from_a_capturing_thread_leave_the_capture_intact() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap())
        .unwrap_or_else(|e| panic!("loading the demo model ({NEEDS_GPU}): {e}"));
    let (host, context) = (registry.host(), registry.ctx());
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let stack = context.limit(ContextLimit::StackSize).unwrap();
    // Atlas refuses none of these but `set_limit` while the calling thread captures (in
    // thread-local mode, as Atlas captures): the driver must neither refuse them nor invalidate
    // the capture, and `set_limit` must be refused before it, the capture going on.
    type Question<'a> = Box<dyn Fn() -> atlas_registry::Result<()> + 'a>;
    let questions: [(&str, Question); 8] = [
        ("memory_info", Box::new(|| context.memory_info().map(drop))),
        ("uuid", Box::new(|| host.uuid().map(drop))),
        ("pci_bus_id", Box::new(|| host.pci_bus_id().map(drop))),
        (
            "l2_cache_bytes",
            Box::new(|| host.l2_cache_bytes().map(drop)),
        ),
        (
            "limit",
            Box::new(|| context.limit(ContextLimit::StackSize).map(drop)),
        ),
        (
            "set_limit",
            Box::new(|| context.set_limit(ContextLimit::StackSize, stack + 1024)),
        ),
        ("attributes", Box::new(|| scale.attributes().map(drop))),
        (
            "occupancy",
            Box::new(|| {
                scale.active_blocks_per_multiprocessor(256, 0)?;
                scale.max_potential_block_size(0, None).map(drop)
            }),
        ),
    ];
    let mut stream = atlas_registry::CudaStream::new(context).unwrap();
    let mut broken = Vec::new();
    for (name, ask) in &questions {
        let capture = stream.begin_capture().unwrap();
        let answered = ask();
        let ended = capture.end();
        // Setting a limit is refused beforehand (the driver invalidates the capture otherwise).
        let refused = matches!(
            answered,
            Err(atlas_registry::AtlasError::Capture(
                atlas_registry::CaptureMisuse::SetLimitWhileCapturing
            ))
        );
        let answered = if *name == "set_limit" && refused {
            Ok(())
        } else if *name == "set_limit" {
            Err(answered
                .err()
                .unwrap_or(atlas_registry::AtlasError::Capture(
                    atlas_registry::CaptureMisuse::SetLimitWhileCapturing,
                )))
        } else {
            answered
        };
        if answered.is_err() || ended.is_err() {
            broken.push(format!(
                "{name}: {answered:?}, then the capture: {:?}",
                ended.err()
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "calls that break a capture, which Atlas should refuse beforehand: {broken:#?}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_function_attributes_and_occupancy_of_the_demo_kernels_are_consistent() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap())
        .unwrap_or_else(|e| panic!("loading the demo model ({NEEDS_GPU}): {e}"));
    let host = registry.host();
    let sms = host.limits().multiprocessors;
    let per_sm = host.max_threads_per_multiprocessor().unwrap();
    let cc = host.compute_capability();
    for (module, name) in [
        ("elementwise", "scale"),
        ("elementwise", "axpy"),
        ("block_reduce", "block_sum"),
        ("noop", "noop"),
    ] {
        let kernel = registry.function_cached(module, name).unwrap();
        let a = kernel.attributes().unwrap();
        println!("{module}::{name}: {a:?}");
        assert!((1..=1024).contains(&a.max_threads_per_block), "{a:?}");
        if name != "noop" {
            assert!(a.registers > 0, "{a:?}");
        }
        assert_eq!(a.binary_version, cc, "JIT-compiled for the device");
        assert_eq!(a.ptx_version, (7, 5), "the demo's PTX is for compute_75");
        assert_eq!(
            u64::from(a.static_shared_bytes) + u64::from(a.max_dynamic_shared_bytes),
            48 << 10,
            "before any opt-in"
        );

        for shared in [0u32, 1 << 10] {
            let (min_grid, block) = kernel.max_potential_block_size(shared, None).unwrap();
            let blocks = kernel
                .active_blocks_per_multiprocessor(block, shared)
                .unwrap();
            assert!(blocks >= 1 && block <= a.max_threads_per_block, "{block}");
            assert!(blocks * block <= per_sm, "{blocks} x {block}");
            assert_eq!(min_grid, blocks * sms, "{name}, {shared} B");
            // No other warp multiple keeps more threads resident.
            for size in (32..=a.max_threads_per_block).step_by(32) {
                let other = kernel
                    .active_blocks_per_multiprocessor(size, shared)
                    .unwrap();
                assert!(other * size <= blocks * block, "{size}: {other} blocks");
            }
            let (_, capped) = kernel.max_potential_block_size(shared, Some(128)).unwrap();
            assert!((1..=128).contains(&capped), "{capped}");
        }
    }

    // Past 48 KiB the opt-in is made, as a launch makes it.
    let block_sum = registry
        .function_cached("block_reduce", "block_sum")
        .unwrap();
    let blocks = block_sum
        .active_blocks_per_multiprocessor(256, 96 << 10)
        .unwrap();
    assert!((1..=2).contains(&blocks), "{blocks} blocks of 96 KiB");
    assert_eq!(
        block_sum.attributes().unwrap().max_dynamic_shared_bytes,
        96 << 10
    );
}

/// `set_limit` from a capturing thread is refused before the driver (which would invalidate the
/// capture: measured on an H200), and the capture goes on.
fn setting_a_limit_while_capturing_is_refused() {
    let p = probe();
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    let context = registry.ctx();
    let mut stream = atlas_registry::CudaStream::new(context).unwrap();
    let capture = stream.begin_capture().unwrap();
    let sets = p.count("cuCtxSetLimit");
    assert!(matches!(
        context.set_limit(ContextLimit::StackSize, 4096),
        Err(AtlasError::Capture(
            atlas_registry::CaptureMisuse::SetLimitWhileCapturing
        ))
    ));
    assert_eq!(p.count("cuCtxSetLimit"), sets, "refused before the driver");
    drop(capture.end().unwrap());
    context.set_limit(ContextLimit::StackSize, 4096).unwrap();
}

#[test]
fn a_limit_set_from_a_capturing_thread_is_refused_and_the_capture_goes_on() {
    standin::run(setting_a_limit_while_capturing_is_refused, &[]);
}
