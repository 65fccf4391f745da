//! Large kernel parameters (CUDA 12.1+: up to 32,764 bytes, structs passed by value): a typed
//! launch of one is checked against the kernel's layout as any launch is, and refused before the
//! driver is called on a driver older than 12.1, a device older than compute capability 7.0, for
//! a kernel built for the old 4,096-byte limit, and past 32,764 bytes. Against the stand-in (CI),
//! with nvcc 13's cubin of `tests/fixtures/large_params.cu`; on a GPU, with
//! `kernels/large_params.cu` compiled at run time (NVRTC 12.0, which builds `kernels/gen/`, cannot
//! compile it), eagerly and in graphs whose arguments are then updated, checksummed against the
//! CPU.
//!
//! GPU: `cargo test -p atlas-registry --test large_params -- --include-ignored` with
//! `ATLAS_NVRTC_PATH` naming an NVRTC of CUDA 12.1 or newer.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaSource, CudaStream, DeviceBuffer, GraphUpdate, Kernel,
    LargeParamsRefusal, LaunchConfig, LaunchRefusal, MAX_PARAM_BYTES, Model,
};
use support::rng::Rng;
use support::{child, standin};

/// nvcc 13's sm_90 cubin of `tests/fixtures/large_params.cu`: `block_then_pointer(Block, int*)`
/// (4,400 + 8 bytes), `largest(Largest, int)` (32,760 + 4), `scale(float*, float, unsigned)`.
const FIXTURE_CUBIN: &[u8] = include_bytes!("fixtures/large_params.sm_90.cubin");

/// `block_then_pointer` declared for `sm_60` (PTX ISA 8.1 for the device's sake: the stand-in
/// does not compile it; compilers refuse large parameters below `compute_70`, which is what a
/// device of compute capability 6.x would need).
const SM_60_PTX: &str = "
.version 8.1
.target sm_60
.address_size 64
.visible .entry block_then_pointer(
	.param .align 4 .b8 block_then_pointer_param_0[4400],
	.param .u64 block_then_pointer_param_1
)
{
	ret;
}
";

/// `kernels/large_params.cu`: `mix_8k(Words8k, unsigned*, unsigned)`,
/// `mix_32k(unsigned, Words32k, unsigned*)`.
const LARGE_PARAMS_SOURCE: &str = include_str!("../../kernels/large_params.cu");

/// The reason of a refused launch.
fn refusal(e: AtlasError) -> LaunchRefusal {
    match e {
        AtlasError::InvalidLaunch { reason, .. } => reason,
        other => panic!("expected a refused launch, got {other}"),
    }
}

/// The large-parameter reason of a refused launch.
fn large(e: AtlasError) -> LargeParamsRefusal {
    match refusal(e) {
        LaunchRefusal::LargeParams(why) => why,
        other => panic!("expected a large-parameter refusal, got {other}"),
    }
}

/// 1,100 ints, as `block_then_pointer` takes them.
fn block(rng: &mut Rng) -> [i32; 1100] {
    std::array::from_fn(|_| rng.below(1 << 20) as i32 - (1 << 19))
}

// Stand-in (no GPU).

child::bodies!(
    large_structs_launch_checked,
    refusals_before_the_driver,
    older_driver_refuses,
    older_device_refuses
);

fn fixture_registry() -> AtlasRegistry {
    AtlasRegistry::load(0, &[("large_params", FIXTURE_CUBIN)]).unwrap()
}

#[test]
fn a_large_struct_by_value_is_checked_against_the_layout_and_launched_in_one_call() {
    standin::run(large_structs_launch_checked, &[]);
}

fn large_structs_launch_checked() {
    let mut rng = Rng::new();
    let registry = fixture_registry();
    let stream = registry.stream();
    let kernel = registry
        .function_cached("large_params", "block_then_pointer")
        .unwrap();
    assert_eq!(kernel.param_sizes().unwrap(), Some(&[4400, 8][..]));
    let mut out = DeviceBuffer::from_slice(registry.ctx(), stream, &[i32::MIN; 2]).unwrap();
    let cfg = LaunchConfig::for_elements(1, 1);
    let b = block(&mut rng);
    // SAFETY: the kernel writes the first int of `out`, which holds two.
    unsafe { kernel.launch(stream, &cfg, (b, &mut out)) }.unwrap();
    assert_eq!(out.to_vec(stream).unwrap(), [b[0] + b[1099], i32::MIN]);

    // One driver call, whatever the size.
    let p = standin::probe();
    let b = block(&mut rng);
    let (calls, launches) = (p.count("calls"), p.launches());
    // SAFETY: as above.
    unsafe { kernel.launch(stream, &cfg, (b, &mut out)) }.unwrap();
    assert_eq!((p.count("calls") - calls, p.launches() - launches), (1, 1));
    assert_eq!(out.to_vec(stream).unwrap(), [b[0] + b[1099], i32::MIN]);

    // Checked against the layout as any launch: a struct of another size is refused.
    let short = [0i32; 1099];
    // SAFETY: refused before the driver.
    let e = unsafe { kernel.launch(stream, &cfg, (short, &mut out)) }.unwrap_err();
    match refusal(e) {
        LaunchRefusal::Arguments {
            expected, given, ..
        } => {
            assert_eq!((&*expected, &*given), (&[4400, 8][..], &[4396, 8][..]));
        }
        other => panic!("{other}"),
    }

    // The most a kernel takes: 32,760 + 4 bytes.
    let largest = registry.function_cached("large_params", "largest").unwrap();
    assert_eq!(largest.param_sizes().unwrap(), Some(&[32760, 4][..]));
    let zeros = [0u8; 32760];
    // SAFETY: the kernel reads its own parameter only.
    unsafe { largest.launch(stream, &cfg, (zeros, 5i32)) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(p.count("fault"), 0, "the kernel saw the zeros it was given");
}

#[test]
fn past_32764_bytes_and_for_a_kernel_built_for_4096_a_launch_never_reaches_the_driver() {
    standin::run(refusals_before_the_driver, &[]);
}

fn refusals_before_the_driver() {
    let registry = fixture_registry();
    let stream = registry.stream();
    let mut out = DeviceBuffer::from_slice(registry.ctx(), stream, &[0f32; 16]).unwrap();
    let cfg = LaunchConfig::for_elements(16, 16);
    let largest = registry.function_cached("large_params", "largest").unwrap();
    let scale = registry.function_cached("large_params", "scale").unwrap();
    let launches = standin::probe().launches();

    // Past the most any kernel takes: refused whatever the layout says.
    let (bytes, tail) = ([0u8; 32760], [0u8; 8]);
    // SAFETY: refused before the driver.
    let e = unsafe { largest.launch(stream, &cfg, (bytes, tail)) }.unwrap_err();
    let text = e.to_string();
    assert_eq!(
        large(e),
        LargeParamsRefusal::TooLarge {
            bytes: 32768,
            max: MAX_PARAM_BYTES
        }
    );
    assert!(
        text.contains("`large_params::largest`") && text.contains("32764"),
        "{text}"
    );

    // A kernel whose parameters take 16 bytes was not built for 8 KiB of them.
    let words = [1.0f32; 2048];
    // SAFETY: refused before the driver.
    let e = unsafe { scale.launch(stream, &cfg, (words, 2.0f32, 16u32)) }.unwrap_err();
    assert_eq!(
        large(e),
        LargeParamsRefusal::KernelLimit {
            bytes: 8200,
            kernel_bytes: 16
        }
    );
    assert_eq!(
        standin::probe().launches(),
        launches,
        "nothing reached the driver"
    );
    // Small launches go on.
    // SAFETY: `scale` touches the 16 floats of `out`.
    unsafe { scale.launch(stream, &cfg, (&mut out, 2.0f32, 16u32)) }.unwrap();
    assert_eq!(standin::probe().launches(), launches + 1);

    // A graph's kernel-node argument update passes the same checks.
    let mut graph_stream = CudaStream::new(registry.ctx()).unwrap();
    let capture = graph_stream.begin_capture().unwrap();
    // SAFETY: captured, not run: `scale` touches the 16 floats of `out`, which the graph keeps.
    unsafe { scale.launch(&capture, &cfg, (&mut out, 2.0f32, 16u32)) }.unwrap();
    let mut exec = capture.end().unwrap().instantiate().unwrap();
    let updates = standin::probe().count("cuGraphExecKernelNodeSetParams_v2");
    // SAFETY: refused before the driver.
    let e = unsafe { exec.set_kernel_args(0, &largest, &cfg, (bytes, tail)) }.unwrap_err();
    assert!(matches!(
        large(e),
        LargeParamsRefusal::TooLarge { bytes: 32768, .. }
    ));
    // SAFETY: refused before the driver.
    let e = unsafe { exec.set_kernel_args(0, &scale, &cfg, (words, 2.0f32, 16u32)) }.unwrap_err();
    assert!(matches!(
        large(e),
        LargeParamsRefusal::KernelLimit { bytes: 8200, .. }
    ));
    assert_eq!(
        standin::probe().count("cuGraphExecKernelNodeSetParams_v2"),
        updates
    );
    // SAFETY: the graph touches the 16 floats of `out`, which it keeps.
    unsafe { exec.launch(&graph_stream) }.unwrap();
    graph_stream.synchronize().unwrap();
    assert_eq!(
        out.to_vec(stream).unwrap(),
        [0f32; 16],
        "0 scaled, as captured"
    );
}

#[test]
fn a_driver_older_than_12_1_refuses_large_parameters_naming_its_release() {
    // CUDA 12.0's driver: no cuFuncGetParamInfo either, so the layout comes from the cubin.
    standin::run(
        older_driver_refuses,
        &["-DSTANDIN_DRIVER_VERSION=12000", "-DSTANDIN_NO_PARAM_INFO"],
    );
}

fn older_driver_refuses() {
    let mut rng = Rng::new();
    let registry = fixture_registry();
    let stream = registry.stream();
    let kernel = registry
        .function_cached("large_params", "block_then_pointer")
        .unwrap();
    assert_eq!(
        kernel.param_sizes().unwrap(),
        Some(&[4400, 8][..]),
        "from the cubin"
    );
    let mut out = DeviceBuffer::from_slice(registry.ctx(), stream, &[7i32]).unwrap();
    let launches = standin::probe().launches();
    let cfg = LaunchConfig::for_elements(1, 1);
    // SAFETY: refused before the driver.
    let e = unsafe { kernel.launch(stream, &cfg, (block(&mut rng), &mut out)) }.unwrap_err();
    let text = e.to_string();
    assert_eq!(
        large(e),
        LargeParamsRefusal::DriverTooOld {
            bytes: 4408,
            driver: (12, 0)
        }
    );
    assert!(
        text.contains("12.1") && text.contains("CUDA 12.0"),
        "{text}"
    );
    assert_eq!(standin::probe().launches(), launches);
    assert_eq!(out.to_vec(stream).unwrap(), [7]);
}

#[test]
fn a_device_older_than_7_0_refuses_large_parameters_naming_its_compute_capability() {
    standin::run(
        older_device_refuses,
        &["-DSTANDIN_CC_MAJOR=6", "-DSTANDIN_CC_MINOR=1"],
    );
}

fn older_device_refuses() {
    let registry = AtlasRegistry::load(0, &[("large_params", SM_60_PTX.as_bytes())]).unwrap();
    let stream = registry.stream();
    let kernel = registry
        .function_cached("large_params", "block_then_pointer")
        .unwrap();
    let mut out = DeviceBuffer::from_slice(registry.ctx(), stream, &[7i32]).unwrap();
    let launches = standin::probe().launches();
    let cfg = LaunchConfig::for_elements(1, 1);
    // SAFETY: refused before the driver.
    let e = unsafe { kernel.launch(stream, &cfg, ([3i32; 1100], &mut out)) }.unwrap_err();
    let text = e.to_string();
    assert_eq!(
        large(e),
        LargeParamsRefusal::DeviceTooOld {
            bytes: 4408,
            compute_capability: (6, 1)
        }
    );
    assert!(text.contains("7.0") && text.contains("6.1"), "{text}");
    assert_eq!(standin::probe().launches(), launches);
    assert_eq!(out.to_vec(stream).unwrap(), [7]);
}

// GPU.

const WORDS_8K: usize = 2048;
const WORDS_32K: usize = 8000;
/// What the output holds outside what a kernel writes.
const POISON: u32 = 0xDEAD_BEEF;
/// Words past what a kernel writes, checked to stay poisoned.
const TAIL: usize = 61;

/// What `mix` writes for `words` and `salt`: each word mixed with its index and the salt, then the
/// wrapping sum of `words[i] * (i + 1)`.
fn mixed(words: &[u32], salt: u32) -> Vec<u32> {
    let mut out: Vec<u32> = (0u32..)
        .zip(words)
        .map(|(i, &w)| w ^ i.wrapping_mul(2_654_435_761).wrapping_add(salt))
        .collect();
    out.push(
        (1u32..)
            .zip(words)
            .fold(0u32, |sum, (i, &w)| sum.wrapping_add(w.wrapping_mul(i))),
    );
    out
}

fn words<const N: usize>(rng: &mut Rng) -> [u32; N] {
    std::array::from_fn(|_| rng.next_u64() as u32)
}

/// A buffer of `n + TAIL` poisoned words.
fn poisoned(registry: &AtlasRegistry, n: usize) -> DeviceBuffer<u32> {
    DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &vec![POISON; n + TAIL]).unwrap()
}

/// Asserts that `out` holds what `mix` writes for `words` and `salt`, then the untouched tail.
fn check(out: &DeviceBuffer<u32>, stream: &CudaStream, words: &[u32], salt: u32, what: &str) {
    let got = out.to_vec(stream).unwrap();
    let want = mixed(words, salt);
    let n = want.len();
    if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: word {i} of {n}: got {:#x}, want {:#x}",
            got[i], want[i]
        );
    }
    assert!(
        got[n..].iter().all(|&w| w == POISON),
        "{what}: wrote past its {n} words"
    );
}

/// The registry of the GPU tests: `large_params.cu` compiled with the NVRTC found, and the demo.
fn gpu_registry() -> AtlasRegistry {
    let model = Model::new().blobs(ptx_for_model("demo").unwrap()).source(
        "large_params",
        CudaSource::new("large_params.cu", LARGE_PARAMS_SOURCE).option("-std=c++17"),
    );
    AtlasRegistry::load_model(0, &model).unwrap()
}

/// The kernels of `large_params.cu`, with what `cuFuncGetParamInfo` (or the blob) says of them.
fn mix_kernels(
    registry: &AtlasRegistry,
) -> (atlas_registry::CudaFunction, atlas_registry::CudaFunction) {
    let mix_8k = registry.function_cached("large_params", "mix_8k").unwrap();
    let mix_32k = registry.function_cached("large_params", "mix_32k").unwrap();
    println!(
        "device {:?}: mix_8k takes {:?}, mix_32k {:?}",
        atlas_registry::host(0).unwrap().compute_capability(),
        mix_8k.param_sizes().unwrap(),
        mix_32k.param_sizes().unwrap()
    );
    assert_eq!(mix_8k.param_sizes().unwrap(), Some(&[8192, 8, 4][..]));
    assert_eq!(mix_32k.param_sizes().unwrap(), Some(&[4, 32000, 8][..]));
    (mix_8k, mix_32k)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_8_kib_and_32000_byte_structs_by_value_reach_the_kernel_whole() {
    let mut rng = Rng::new();
    let registry = gpu_registry();
    let stream = registry.stream();
    let (mix_8k, mix_32k) = mix_kernels(&registry);
    let cfg = LaunchConfig::for_elements(WORDS_8K as u32, 128);
    for round in 0..3 {
        let (w8, salt) = (words::<WORDS_8K>(&mut rng), rng.next_u64() as u32);
        let mut out = poisoned(&registry, WORDS_8K + 1);
        // SAFETY: `mix_8k` writes 2,049 words of `out`, which holds more; `check` waits for it.
        unsafe { mix_8k.launch(stream, &cfg, (w8, &mut out, salt)) }.unwrap();
        check(&out, stream, &w8, salt, &format!("mix_8k, round {round}"));

        let (w32, salt) = (words::<WORDS_32K>(&mut rng), rng.next_u64() as u32);
        let mut out = poisoned(&registry, WORDS_32K + 1);
        let cfg = LaunchConfig::for_elements(WORDS_32K as u32 / 3, 64); // threads stride
        // SAFETY: `mix_32k` writes 8,001 words of `out`, which holds more.
        unsafe { mix_32k.launch(stream, &cfg, (salt, w32, &mut out)) }.unwrap();
        check(&out, stream, &w32, salt, &format!("mix_32k, round {round}"));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_large_struct_launches_replay_from_graphs_and_take_new_arguments() {
    let mut rng = Rng::new();
    let registry = gpu_registry();
    let (mix_8k, mix_32k) = mix_kernels(&registry);
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let cfg = LaunchConfig::for_elements(WORDS_8K as u32, 256);
    let mut out8 = poisoned(&registry, WORDS_8K + 1);
    let mut out32 = poisoned(&registry, WORDS_32K + 1);
    let (w8, s8) = (words::<WORDS_8K>(&mut rng), rng.next_u64() as u32);
    let (w32, s32) = (words::<WORDS_32K>(&mut rng), rng.next_u64() as u32);

    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: each kernel writes its output's words, which the graph keeps.
    unsafe {
        mix_8k.launch(&capture, &cfg, (w8, &mut out8, s8)).unwrap();
        mix_32k
            .launch(&capture, &cfg, (s32, w32, &mut out32))
            .unwrap();
    }
    let mut exec = capture.end().unwrap().instantiate().unwrap();
    assert_eq!(exec.kernel_count(), 2);
    // SAFETY: the graph reaches only the outputs, which it keeps.
    unsafe { exec.launch(&stream) }.unwrap();
    check(&out8, &stream, &w8, s8, "mix_8k replayed");
    check(&out32, &stream, &w32, s32, "mix_32k replayed");

    // New structs through kernel-node argument updates.
    let (w8, s8) = (words::<WORDS_8K>(&mut rng), rng.next_u64() as u32);
    let (w32, s32) = (words::<WORDS_32K>(&mut rng), rng.next_u64() as u32);
    // SAFETY: as for the captured launches they replace.
    unsafe {
        exec.set_kernel_args(0, &mix_8k, &cfg, (w8, &mut out8, s8))
            .unwrap();
        exec.set_kernel_args(1, &mix_32k, &cfg, (s32, w32, &mut out32))
            .unwrap();
        exec.launch(&stream).unwrap();
    }
    check(&out8, &stream, &w8, s8, "mix_8k after its argument update");
    check(
        &out32,
        &stream,
        &w32,
        s32,
        "mix_32k after its argument update",
    );

    // An update past the limit is refused, and the graph replays what it had.
    let too_many = [0u32; 8200];
    // SAFETY: refused before the driver.
    let e = unsafe { exec.set_kernel_args(1, &mix_32k, &cfg, (s32, too_many, &mut out32)) }
        .unwrap_err();
    assert!(matches!(
        large(e),
        LargeParamsRefusal::TooLarge { bytes: 32812, .. }
    ));

    // A whole new capture, same topology: updated in place.
    let (w8, s8) = (words::<WORDS_8K>(&mut rng), rng.next_u64() as u32);
    let (w32, s32) = (words::<WORDS_32K>(&mut rng), rng.next_u64() as u32);
    let capture = stream.begin_capture().unwrap();
    // SAFETY: as for the first capture.
    unsafe {
        mix_8k.launch(&capture, &cfg, (w8, &mut out8, s8)).unwrap();
        mix_32k
            .launch(&capture, &cfg, (s32, w32, &mut out32))
            .unwrap();
    }
    let graph = capture.end().unwrap();
    // SAFETY: the new graph reaches only the outputs, which it keeps.
    let updated = unsafe { exec.update(graph) }.unwrap();
    assert_eq!(updated, GraphUpdate::Updated);
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    check(&out8, &stream, &w8, s8, "mix_8k after a whole-graph update");
    check(
        &out32,
        &stream,
        &w32,
        s32,
        "mix_32k after a whole-graph update",
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_launch_past_the_limit_or_to_a_small_kernel_is_refused_and_leaves_memory_alone() {
    let registry = gpu_registry();
    let stream = registry.stream();
    let (_, mix_32k) = mix_kernels(&registry);
    let mut out = poisoned(&registry, WORDS_32K + 1);
    let cfg = LaunchConfig::for_elements(256, 256);
    // 4 + 32,800 + 8 bytes.
    let too_many = [1u32; 8200];
    // SAFETY: refused before the driver.
    let e = unsafe { mix_32k.launch(stream, &cfg, (7u32, too_many, &mut out)) }.unwrap_err();
    assert_eq!(
        large(e),
        LargeParamsRefusal::TooLarge {
            bytes: 32812,
            max: MAX_PARAM_BYTES
        }
    );
    let scale: &Kernel = &registry.function_cached("elementwise", "scale").unwrap();
    let words = [1.0f32; 2048];
    // SAFETY: refused before the driver.
    let e = unsafe { scale.launch(stream, &cfg, (words, 2.0f32, 16u32)) }.unwrap_err();
    assert!(matches!(
        large(e),
        LargeParamsRefusal::KernelLimit {
            bytes: 8200,
            kernel_bytes: 16
        }
    ));
    assert!(out.to_vec(stream).unwrap().iter().all(|&w| w == POISON));
}
