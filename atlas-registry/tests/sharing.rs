//! Device memory shared between processes: memory pools exported and imported (the pool's file
//! descriptor, then each allocation's export data), and the legacy handles of `cuMemAlloc`
//! memory; the refusals made before the driver is called.
//!
//! Two processes share memory in every test that says so: this test binary, re-executed as a
//! child (`support/child.rs`), inherits the pool's descriptor (its number in
//! `ATLAS_TEST_SHARE_FD`) and gets the export data in its environment, imports the memory and
//! scales it with a kernel; the parent reads it back exactly. On the stand-in
//! (`cargo test -p atlas-registry --test sharing`) the pool path runs so between two stand-in
//! processes (its pool memory is a memfd); on a GPU (`-- --include-ignored sharing_gpu`) both
//! paths do, and a child that aborts after importing leaves the parent's memory intact.

mod support;

use std::ffi::OsString;
use std::os::fd::OwnedFd;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, DeviceUuid, FunctionCache, ImportedPool,
    IpcMemHandle, LaunchConfig, MemoryOrigin, MemoryPool, PoolPointer, PoolProperties, SharedPool,
    SharingRefusal, host,
};
use support::child::{self, Ending};
use support::graphs::assert_wrong_context;
use support::rng::Rng;
use support::standin;

child::bodies!(
    a_pool_is_shared_within_one_process,
    a_child_imports_the_pool_and_writes,
    a_child_that_aborts_leaves_the_pool_memory_intact,
    import_pool_and_scale,
    open_handle_and_scale,
    a_graph_keeps_an_import,
    sharing_refusals,
    imports_into_another_device_are_refused,
    a_device_without_posix_fds_is_refused,
    a_driver_without_ipc_is_named,
    a_driver_without_pools_is_named,
);

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");

/// What the parent passes its child, in the environment.
const FD_VAR: &str = "ATLAS_TEST_SHARE_FD";
const DATA_VAR: &str = "ATLAS_TEST_SHARE_DATA";
const UUID_VAR: &str = "ATLAS_TEST_SHARE_UUID";
const LEN_VAR: &str = "ATLAS_TEST_SHARE_LEN";
const FACTOR_VAR: &str = "ATLAS_TEST_SHARE_FACTOR";
const ABORT_VAR: &str = "ATLAS_TEST_SHARE_ABORT";

/// The demo model on device 0.
fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(text: &str) -> [u8; N] {
    assert_eq!(text.len(), 2 * N, "{N} bytes in hexadecimal");
    std::array::from_fn(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap())
}

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("the parent sets {var}"))
}

fn sharing(result: Result<impl std::fmt::Debug, AtlasError>) -> SharingRefusal {
    match result {
        Err(AtlasError::Sharing(refusal)) => refusal,
        other => panic!("expected a sharing refusal, got {other:?}"),
    }
}

/// Scales the `n` floats of `x` by `factor` on `stream` and waits for it.
fn scale_in_place(
    registry: &AtlasRegistry,
    stream: &CudaStream,
    x: &mut DeviceBuffer<f32>,
    factor: f32,
) {
    let n = x.len() as u32;
    let scale = SCALE.get(registry).unwrap();
    // SAFETY: `scale` touches the `n` floats of `x`, which outlives it (synchronized below).
    unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(n, 256),
            (&mut *x, factor, n),
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Two processes (the parent's side runs on the stand-in and on a GPU alike)
// ---------------------------------------------------------------------------------------------

/// How the child ends: returns, or aborts once it has written the memory.
#[derive(Clone, Copy, PartialEq)]
enum ChildEnd {
    Returns,
    Aborts,
}

/// Runs `body` as a child with `env` (and the abort switch), and checks how it ended.
fn run_child<F: Fn()>(body: F, env: &mut Vec<(&'static str, OsString)>, end: ChildEnd) {
    if end == ChildEnd::Aborts {
        env.push((ABORT_VAR, "1".into()));
    }
    let pairs: Vec<(&str, &std::ffi::OsStr)> =
        env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let child = child::run_with_env(body, None, &pairs);
    let expected = match end {
        ChildEnd::Returns => Ending::Passed,
        ChildEnd::Aborts => Ending::Crashed(libc::SIGABRT),
    };
    assert_eq!(child.ending, expected, "{child}");
    assert!(child.stdout.contains("scaled the shared memory"), "{child}");
}

/// The parent's side of the pool path: an exportable pool, a buffer of fresh random data in it,
/// the pool's descriptor inherited by a child that imports the buffer and scales it; the parent
/// reads it back exactly, then uses and frees it as its own.
fn share_a_pool_with_a_child(end: ChildEnd) {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let pool = MemoryPool::new(ctx, &PoolProperties::new().exportable(true)).unwrap();
    let mut rng = Rng::new();
    let n = 1 + rng.index(100_000);
    let data = rng.vec(n);
    let factor = rng.f32_in(0.5, 4.0);
    // SAFETY: used only on `stream`, which outlives it; no capture. The child's use of it ends
    // before the parent frees it (the child has exited by then).
    let mut x = unsafe { pool.alloc_async::<f32>(&stream, n) }.unwrap();
    x.copy_from(&stream, &data).unwrap(); // waits: the allocation exists before the child sees it
    let shared = pool.export().unwrap();
    let pointer = pool.export_pointer(&x).unwrap();
    assert_eq!(pointer.byte_len(), n as u64 * 4);
    let mut env = vec![
        (FD_VAR, child::inheritable(shared.fd()).into()),
        (UUID_VAR, hex(&shared.device().bytes()).into()),
        (DATA_VAR, hex(&pointer.to_bytes()).into()),
        (LEN_VAR, n.to_string().into()),
        (FACTOR_VAR, factor.to_bits().to_string().into()),
    ];
    run_child(import_pool_and_scale, &mut env, end);
    drop(shared);
    let want: Vec<f32> = data.iter().map(|v| v * factor).collect();
    assert_eq!(
        x.to_vec(&stream).unwrap(),
        want,
        "what the child wrote, exactly"
    );
    // The memory is still the parent's: it scales it again, and frees it.
    scale_in_place(&registry, &stream, &mut x, 0.5);
    let again: Vec<f32> = want.iter().map(|v| v * 0.5).collect();
    assert_eq!(x.to_vec(&stream).unwrap(), again);
    x.free().unwrap();
    stream.synchronize().unwrap();
}

/// The parent's side of the legacy path: a `cuMemAlloc` buffer of fresh random data, its handle
/// passed to a child that opens it and scales it; the parent reads it back exactly.
fn share_a_legacy_handle_with_a_child(end: ChildEnd) {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let mut rng = Rng::new();
    let n = 1 + rng.index(100_000);
    let data = rng.vec(n);
    let factor = rng.f32_in(0.5, 4.0);
    let mut x = DeviceBuffer::from_slice(ctx, &stream, &data).unwrap();
    let handle = IpcMemHandle::export(&x).unwrap();
    assert_eq!(handle.byte_len(), n as u64 * 4);
    assert_eq!(handle.device(), registry.host().uuid().unwrap());
    let mut env = vec![
        (DATA_VAR, hex(&handle.to_bytes()).into()),
        (LEN_VAR, n.to_string().into()),
        (FACTOR_VAR, factor.to_bits().to_string().into()),
    ];
    run_child(open_handle_and_scale, &mut env, end);
    let want: Vec<f32> = data.iter().map(|v| v * factor).collect();
    assert_eq!(
        x.to_vec(&stream).unwrap(),
        want,
        "what the child wrote, exactly"
    );
    scale_in_place(&registry, &stream, &mut x, 2.0);
    let again: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
    assert_eq!(x.to_vec(&stream).unwrap(), again);
    x.free().unwrap();
}

/// The child's side of the pool path: imports the pool and the buffer, scales it, and returns or
/// aborts (the import still held).
fn import_pool_and_scale() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let device = DeviceUuid::from_bytes(unhex(&env(UUID_VAR)));
    let shared = SharedPool::from_parts(child::inherited_fd(FD_VAR), device);
    let pool = ImportedPool::import(ctx, &shared).unwrap();
    drop(shared);
    let pointer = PoolPointer::from_bytes(unhex(&env(DATA_VAR)));
    let n: usize = env(LEN_VAR).parse().unwrap();
    let factor = f32::from_bits(env(FACTOR_VAR).parse().unwrap());
    // SAFETY: the parent made `pointer` with `export_pointer`, synchronized the allocating stream
    // before, and keeps the buffer (and lives) until this process has exited.
    let mut x = unsafe { pool.import_pointer::<f32>(&pointer, n) }.unwrap();
    scale_in_place(&registry, &stream, &mut x, factor);
    println!("scaled the shared memory: {n} floats by {factor}");
    if std::env::var_os(ABORT_VAR).is_some() {
        std::process::abort();
    }
    drop(x);
}

/// The child's side of the legacy path: opens the handle, scales the memory, and returns or
/// aborts (the memory still open).
fn open_handle_and_scale() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let handle = IpcMemHandle::from_bytes(unhex(&env(DATA_VAR)));
    let n: usize = env(LEN_VAR).parse().unwrap();
    let factor = f32::from_bits(env(FACTOR_VAR).parse().unwrap());
    // SAFETY: the parent made `handle` with `export` and keeps the buffer (and lives) until this
    // process has exited.
    let mut x = unsafe { handle.open::<f32>(ctx, n) }.unwrap();
    scale_in_place(&registry, &stream, &mut x, factor);
    println!("scaled the shared memory: {n} floats by {factor}");
    if std::env::var_os(ABORT_VAR).is_some() {
        std::process::abort();
    }
    drop(x);
}

// ---------------------------------------------------------------------------------------------
// On the stand-in
// ---------------------------------------------------------------------------------------------

#[test]
fn a_pool_is_shared_with_a_child_process_on_the_standin() {
    standin::run(a_pool_is_shared_within_one_process, &[]);
    standin::run(a_child_imports_the_pool_and_writes, &[]);
    standin::run(a_child_that_aborts_leaves_the_pool_memory_intact, &[]);
    standin::run(a_graph_keeps_an_import, &[]);
}

#[test]
fn sharing_refusals_on_the_standin() {
    standin::run(sharing_refusals, &[]);
    standin::run(
        imports_into_another_device_are_refused,
        &["-DSTANDIN_DEVICES=2"],
    );
    standin::run(
        a_device_without_posix_fds_is_refused,
        &["-DSTANDIN_NO_POSIX_FD"],
    );
    standin::run(a_driver_without_ipc_is_named, &["-DSTANDIN_NO_IPC"]);
    standin::run(
        a_driver_without_pools_is_named,
        &["-DSTANDIN_NO_MEMORY_POOL_API"],
    );
}

fn a_child_imports_the_pool_and_writes() {
    share_a_pool_with_a_child(ChildEnd::Returns);
    assert_eq!(standin::probe().count("live_pools"), 0);
}

fn a_child_that_aborts_leaves_the_pool_memory_intact() {
    share_a_pool_with_a_child(ChildEnd::Aborts);
}

/// Within one process the stand-in maps an import a second time (what the driver does there is
/// not promised): the imported buffer is the same memory at another address; dropping it releases
/// the import only, and the imported pool goes after the last buffer imported from it.
fn a_pool_is_shared_within_one_process() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let p = standin::probe();
    let pool = MemoryPool::new(ctx, &PoolProperties::new().exportable(true)).unwrap();
    assert!(pool.is_exportable());
    let mut rng = Rng::new();
    let n = 1 + rng.index(5000);
    let data = rng.vec(n);
    // SAFETY: used only on `stream`, which outlives it; no capture.
    let mut x = unsafe { pool.alloc_async::<f32>(&stream, n) }.unwrap();
    x.copy_from(&stream, &data).unwrap();
    let shared = pool.export().unwrap();
    assert_eq!(shared.device(), registry.host().uuid().unwrap());
    let pointer = PoolPointer::from_bytes(pool.export_pointer(&x).unwrap().to_bytes());
    let imported_pool = ImportedPool::import(ctx, &shared).unwrap();
    drop(shared);
    assert_eq!(imported_pool.ordinal(), 0);
    // SAFETY: `pointer` is `x`'s, which lives until after the import is dropped.
    let mut view = unsafe { imported_pool.import_pointer::<f32>(&pointer, n) }.unwrap();
    assert_ne!(view.device_ptr(), x.device_ptr());
    assert!(!view.is_stream_ordered());
    assert_eq!(view.to_vec(&stream).unwrap(), data, "the same memory");
    scale_in_place(&registry, &stream, &mut view, 2.0);
    let want: Vec<f32> = data.iter().map(|v| v * 2.0).collect();
    assert_eq!(
        x.to_vec(&stream).unwrap(),
        want,
        "written through the import"
    );
    // Fewer elements than were shared are fine; more are refused before the driver.
    let imports = p.count("cuMemPoolImportPointer");
    // SAFETY: refused before anything is imported.
    let long = unsafe { imported_pool.import_pointer::<f32>(&pointer, n + 1) };
    assert_eq!(
        sharing(long),
        SharingRefusal::TooLong {
            len: n + 1,
            element_size: 4,
            bytes: n as u64 * 4
        }
    );
    assert_eq!(p.count("cuMemPoolImportPointer"), imports);
    // SAFETY: as for `view`.
    let short = unsafe { imported_pool.import_pointer::<u8>(&pointer, 3) }.unwrap();
    assert_eq!(short.len(), 3);
    drop(short);

    // The pool goes after its last import: releasing the view releases the import only.
    let (destroys, frees) = (p.count("cuMemPoolDestroy"), p.count("cuMemFree_v2"));
    drop(imported_pool);
    assert_eq!(
        p.count("cuMemPoolDestroy"),
        destroys,
        "the view holds the imported pool"
    );
    assert_eq!(p.count("live_imports"), 1);
    drop(view);
    assert_eq!(p.count("live_imports"), 0);
    assert_eq!(p.count("cuMemFree_v2"), frees + 1, "the import released");
    assert_eq!(
        p.count("cuMemPoolDestroy"),
        destroys + 1,
        "then the imported pool"
    );
    assert_eq!(
        x.to_vec(&stream).unwrap(),
        want,
        "the exporter's memory stays"
    );
    x.free().unwrap();
}

/// An imported buffer given to a captured launch is shared with the graph: the import is
/// released when the last of the buffer and the graph goes.
fn a_graph_keeps_an_import() {
    let registry = demo();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let p = standin::probe();
    let pool = MemoryPool::new(ctx, &PoolProperties::new().exportable(true)).unwrap();
    // SAFETY: used only on the stream, which outlives it; no capture.
    let mut x = unsafe { pool.alloc_async::<f32>(&stream, 64) }.unwrap();
    x.copy_from(&stream, &[1.0; 64]).unwrap();
    let imported = ImportedPool::import(ctx, &pool.export().unwrap()).unwrap();
    // SAFETY: `x` outlives the import and the graph below.
    let mut view =
        unsafe { imported.import_pointer::<f32>(&pool.export_pointer(&x).unwrap(), 64) }.unwrap();
    let scale = SCALE.get(&registry).unwrap();
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: the graph keeps the import.
    unsafe {
        scale.launch(
            &capture,
            &LaunchConfig::for_elements(64, 64),
            (&mut view, 3.0f32, 64u32),
        )
    }
    .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    drop((view, imported));
    assert_eq!(p.count("live_imports"), 1, "the graph holds the import");
    // SAFETY: the graph keeps the import it scales.
    unsafe { exec.launch(&stream) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(x.to_vec(&stream).unwrap(), [3.0; 64]);
    drop(exec);
    assert_eq!(p.count("live_imports"), 0, "released with the last graph");
    assert_eq!(p.count("fault"), 0);
}

/// Each refusal of the sharing doors, before the driver is called; and the driver's own refusal
/// of a legacy handle opened in the process that made it.
fn sharing_refusals() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let p = standin::probe();
    let plain = MemoryPool::new(ctx, &PoolProperties::new()).unwrap();
    let exportable = MemoryPool::new(ctx, &PoolProperties::new().exportable(true)).unwrap();
    // SAFETY: used only on `stream`, which outlives them; no capture.
    let (ordered, empty) = unsafe {
        (
            exportable.alloc_async::<f32>(&stream, 16).unwrap(),
            exportable.alloc_async::<f32>(&stream, 0).unwrap(),
        )
    };
    let allocated = DeviceBuffer::<f32>::alloc(ctx, 16).unwrap();
    let calls = (
        p.count("cuMemPoolExportToShareableHandle"),
        p.count("cuMemPoolExportPointer"),
        p.count("cuIpcGetMemHandle"),
    );

    assert_eq!(
        sharing(plain.export()),
        SharingRefusal::NotExportable { device: 0 }
    );
    assert_eq!(
        sharing(MemoryPool::device_default(ctx).unwrap().export()),
        SharingRefusal::NotExportable { device: 0 }
    );
    assert_eq!(
        sharing(plain.export_pointer(&ordered)),
        SharingRefusal::NotExportable { device: 0 }
    );
    assert_eq!(
        sharing(exportable.export_pointer(&allocated)),
        SharingRefusal::WrongOrigin {
            needs: MemoryOrigin::StreamOrdered,
            origin: MemoryOrigin::Allocated
        }
    );
    assert_eq!(
        sharing(exportable.export_pointer(&empty)),
        SharingRefusal::Empty
    );
    let wrong = IpcMemHandle::export(&ordered);
    let text = wrong.as_ref().unwrap_err().to_string();
    assert!(
        text.contains("DeviceBuffer::alloc") && text.contains("stream order"),
        "{text}"
    );
    assert_eq!(
        sharing(wrong),
        SharingRefusal::WrongOrigin {
            needs: MemoryOrigin::Allocated,
            origin: MemoryOrigin::StreamOrdered
        }
    );
    // SAFETY: used only on `stream`, which outlives it; no capture.
    let default_ordered = unsafe { DeviceBuffer::<u8>::alloc_async(ctx, &stream, 8) }.unwrap();
    assert!(matches!(
        sharing(IpcMemHandle::export(&default_ordered)),
        SharingRefusal::WrongOrigin {
            origin: MemoryOrigin::StreamOrdered,
            ..
        }
    ));
    assert_eq!(
        sharing(IpcMemHandle::export(
            &DeviceBuffer::<f32>::alloc(ctx, 0).unwrap()
        )),
        SharingRefusal::Empty
    );
    // An imported buffer is borrowed memory: not shared again.
    let imported = ImportedPool::import(ctx, &exportable.export().unwrap()).unwrap();
    let pointer = exportable.export_pointer(&ordered).unwrap();
    // SAFETY: `ordered` outlives the import.
    let view = unsafe { imported.import_pointer::<f32>(&pointer, 16) }.unwrap();
    assert!(matches!(
        sharing(IpcMemHandle::export(&view)),
        SharingRefusal::WrongOrigin {
            origin: MemoryOrigin::Kept,
            ..
        }
    ));
    assert!(matches!(
        sharing(exportable.export_pointer(&view)),
        SharingRefusal::WrongOrigin {
            origin: MemoryOrigin::Kept,
            ..
        }
    ));
    assert_eq!(
        (
            p.count("cuMemPoolExportToShareableHandle"),
            p.count("cuMemPoolExportPointer"),
            p.count("cuIpcGetMemHandle"),
        ),
        (calls.0 + 1, calls.1 + 1, calls.2),
        "only the two exports that were not refused reached the driver"
    );

    // The legacy handle of `cuMemAlloc` memory; too long an opening is refused before the
    // driver, and the driver refuses to open it in the process that made it.
    let handle = IpcMemHandle::export(&allocated).unwrap();
    assert_eq!(handle.byte_len(), 64);
    // SAFETY: refused before anything is opened.
    let long = unsafe { handle.open::<f32>(ctx, 17) };
    assert!(matches!(
        sharing(long),
        SharingRefusal::TooLong { len: 17, .. }
    ));
    assert_eq!(p.count("cuIpcOpenMemHandle_v2"), 0);
    // SAFETY: `allocated` outlives the attempt (which the driver refuses).
    let own = unsafe { handle.open::<f32>(ctx, 16) }.unwrap_err();
    assert!(matches!(own, AtlasError::Driver(_)), "{own:?}");
    assert_eq!(
        own.cuda_code(),
        Some(201),
        "CUDA_ERROR_INVALID_CONTEXT: {own}"
    );
}

/// Memory of one device is not imported into another's context: refused before the driver,
/// naming both devices.
fn imports_into_another_device_are_refused() {
    let (gpu0, gpu1) = (host(0).unwrap(), host(1).unwrap());
    let (ctx0, ctx1) = (gpu0.context(), gpu1.context());
    let p = standin::probe();
    let pool0 = MemoryPool::new(ctx0, &PoolProperties::new().exportable(true)).unwrap();
    let pool1 = MemoryPool::new(ctx1, &PoolProperties::new().exportable(true)).unwrap();
    let stream1 = CudaStream::new(ctx1).unwrap();
    // SAFETY: used only on `stream1`, which outlives it; no capture.
    let on1 = unsafe { pool1.alloc_async::<f32>(&stream1, 8) }.unwrap();
    assert_wrong_context(pool0.export_pointer(&on1).unwrap_err(), "the buffer", 0, 1);

    let shared0 = pool0.export().unwrap();
    let imports = p.count("cuMemPoolImportFromShareableHandle");
    let refused = ImportedPool::import(ctx1, &shared0);
    let text = refused.as_ref().unwrap_err().to_string();
    match sharing(refused) {
        SharingRefusal::OtherDevice {
            exporter,
            device: 1,
            importer,
        } => {
            assert_eq!(exporter, gpu0.uuid().unwrap().bytes());
            assert_eq!(importer, gpu1.uuid().unwrap().bytes());
        }
        other => panic!("{other:?}"),
    }
    assert!(
        text.contains(&gpu0.uuid().unwrap().to_string()) && text.contains("device 1"),
        "{text}"
    );
    assert_eq!(p.count("cuMemPoolImportFromShareableHandle"), imports);

    // A pointer of device 1's pool into device 0's imported pool.
    let imported0 = ImportedPool::import(ctx0, &shared0).unwrap();
    let pointer1 = pool1.export_pointer(&on1).unwrap();
    // SAFETY: refused before anything is imported.
    let refused = unsafe { imported0.import_pointer::<f32>(&pointer1, 8) };
    assert!(matches!(
        sharing(refused),
        SharingRefusal::OtherDevice { device: 0, .. }
    ));
    assert_eq!(p.count("cuMemPoolImportPointer"), 0);
}

/// A device that cannot share memory as POSIX file descriptors: no exportable pool is made, and
/// nothing is imported.
fn a_device_without_posix_fds_is_refused() {
    let host = host(0).unwrap();
    let ctx = host.context();
    let refused = MemoryPool::new(ctx, &PoolProperties::new().exportable(true));
    let text = refused.as_ref().unwrap_err().to_string();
    assert_eq!(
        sharing(refused),
        SharingRefusal::PosixFdUnsupported { device: 0 }
    );
    assert!(
        text.contains("CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES"),
        "{text}"
    );
    assert_eq!(standin::probe().count("cuMemPoolCreate"), 0);
    let some_fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let uuid = host.uuid().unwrap();
    let shared = SharedPool::from_parts(some_fd, uuid);
    assert_eq!(
        sharing(ImportedPool::import(ctx, &shared)),
        SharingRefusal::PosixFdUnsupported { device: 0 }
    );
    assert_eq!(
        standin::probe().count("cuMemPoolImportFromShareableHandle"),
        0
    );
    // Pools that are not exported are made as ever.
    MemoryPool::new(ctx, &PoolProperties::new()).unwrap();
}

/// A driver without the legacy IPC entry points: named.
fn a_driver_without_ipc_is_named() {
    let host = host(0).unwrap();
    let ctx = host.context();
    let b = DeviceBuffer::<f32>::alloc(ctx, 4).unwrap();
    match IpcMemHandle::export(&b).unwrap_err() {
        AtlasError::MissingSymbol(missing) => assert_eq!(missing.name, "cuIpcGetMemHandle"),
        other => panic!("{other:?}"),
    }
    let handle = IpcMemHandle::from_bytes([0; IpcMemHandle::SIZE]);
    // SAFETY: refused before anything is opened.
    match unsafe { handle.open::<f32>(ctx, 0) }.unwrap_err() {
        AtlasError::MissingSymbol(missing) => assert_eq!(missing.name, "cuIpcGetMemHandle"),
        other => panic!("{other:?}"),
    }
}

/// A driver without memory pools: importing one names the first entry point missing.
fn a_driver_without_pools_is_named() {
    let host = host(0).unwrap();
    let ctx = host.context();
    let some_fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let shared = SharedPool::from_parts(some_fd, host.uuid().unwrap());
    for err in [
        ImportedPool::import(ctx, &shared).unwrap_err(),
        MemoryPool::new(ctx, &PoolProperties::new().exportable(true)).unwrap_err(),
    ] {
        match err {
            AtlasError::MissingSymbol(missing) => assert_eq!(missing.name, "cuMemAllocAsync"),
            other => panic!("{other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// On a GPU
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn sharing_gpu_pool_child_writes_parent_reads() {
    share_a_pool_with_a_child(ChildEnd::Returns);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn sharing_gpu_legacy_child_writes_parent_reads() {
    share_a_legacy_handle_with_a_child(ChildEnd::Returns);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn sharing_gpu_a_child_that_aborts_leaves_memory_intact() {
    share_a_pool_with_a_child(ChildEnd::Aborts);
    share_a_legacy_handle_with_a_child(ChildEnd::Aborts);
}

/// The driver refuses to open a legacy handle in the process that made it: its error is returned.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn sharing_gpu_legacy_handle_does_not_open_in_its_own_process() {
    let host = host(0).unwrap();
    let ctx = host.context();
    let x = DeviceBuffer::<f32>::alloc(ctx, 1024).unwrap();
    let handle = IpcMemHandle::export(&x).unwrap();
    // SAFETY: `x` outlives the attempt.
    let refused = unsafe { handle.open::<f32>(ctx, 1024) }.unwrap_err();
    println!("opening in the exporting process: {refused}");
    assert!(matches!(refused, AtlasError::Driver(_)), "{refused:?}");
}
