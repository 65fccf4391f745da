//! Cold start: the time from process start to the first launch of every kernel of a model of
//! 1,000 small kernels, in fresh processes, for each way of getting the code onto the GPU.
//!
//! | code                         | driver JIT cache           | Atlas compile cache |
//! |------------------------------|----------------------------|---------------------|
//! | PTX (`compute_XX`)           | off (`CUDA_CACHE_DISABLE=1`) | —                 |
//! | PTX                          | warm (`CUDA_CACHE_PATH`)   | —                   |
//! | cubin (`sm_XX`)              | off                        | —                   |
//! | CUDA C++ through NVRTC       | off                        | cold (empty)        |
//! | CUDA C++ through NVRTC       | off                        | warm                |
//!
//! each with and without preload ([`Model::preload`]). The PTX and the cubin are NVRTC's own
//! output for the same source, made once at the start. Each row runs `--reps` fresh processes
//! (this binary again, as a child); a warm row first runs one unmeasured process to warm its
//! cache. The child loads the model through Atlas (`AtlasRegistry::load_model`), looks up every
//! kernel (`function_cached`) and launches it once, synchronizes, and prints `READY`; the parent
//! measures from spawning the child to reading that line, so the figure includes starting the
//! process, loading the driver and `cuInit`. The child then checks every kernel's output on the
//! CPU. The parent prints a Markdown table (median and range of the runs; the child's own
//! split of load and first launches).
//!
//! Run on a GPU machine with NVRTC (found as the compile tests find it: `ATLAS_NVRTC_PATH`, the
//! pinned NVRTC 12.0 under `target/`, or Atlas's own search): `cargo bench --bench cold_start` (well under three minutes
//! with the defaults: five processes per row), or the packed binary with `--bench [--kernels N] [--reps R]
//! [--dir DIR]`. Without `--bench` (as `cargo test --benches` runs it), or without a usable
//! device 0 or NVRTC, it prints one line and exits 0.

#[path = "../common/many_kernels.rs"]
mod many_kernels;
#[path = "../common/nvrtc.rs"]
mod nvrtc;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use atlas_registry::{
    AtlasRegistry, CompileCache, CompileTarget, Compiler, CudaSource, DeviceBuffer, LaunchConfig,
    Model,
};

/// Names the configuration a child runs; absent in the parent.
const CHILD_VAR: &str = "ATLAS_COLD_START_CHILD";

/// How a child gets the model's code.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Code {
    Ptx,
    Cubin,
    Source,
}

/// One row of the table.
struct Row {
    code: Code,
    jit_cache_warm: bool,
    atlas_cache_warm: bool,
    preload: bool,
}

impl Row {
    fn label(&self) -> [&'static str; 4] {
        [
            match self.code {
                Code::Ptx => "PTX",
                Code::Cubin => "cubin",
                Code::Source => "CUDA C++ (NVRTC)",
            },
            match (self.code, self.jit_cache_warm) {
                (Code::Ptx, true) => "warm",
                _ => "off",
            },
            match (self.code, self.atlas_cache_warm) {
                (Code::Source, true) => "warm",
                (Code::Source, false) => "cold",
                _ => "—",
            },
            if self.preload { "yes" } else { "no" },
        ]
    }
}

struct Options {
    kernels: usize,
    reps: usize,
    dir: PathBuf,
}

fn main() -> ExitCode {
    let start = Instant::now();
    if let Ok(config) = std::env::var(CHILD_VAR) {
        return child(start, &config);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("cold_start: not run (run it with --bench: cargo bench --bench cold_start)");
        return ExitCode::SUCCESS;
    }
    // The children inherit the choice. SAFETY: no other thread runs yet.
    if let Err(why) = unsafe { nvrtc::choose() } {
        println!("cold_start: not run: {why}");
        return ExitCode::SUCCESS;
    }
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let options = Options {
        kernels: value("--kernels")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000),
        reps: value("--reps")
            .and_then(|v| v.parse().ok())
            .unwrap_or(5)
            .max(1),
        dir: value("--dir").map(PathBuf::from).unwrap_or_else(|| {
            std::env::temp_dir().join(format!("atlas-cold-start-{}", std::process::id()))
        }),
    };
    match parent(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(NotRun(why)) => {
            println!("cold_start: not run: {why}");
            ExitCode::SUCCESS
        }
    }
}

/// Why the table was not made (no device, no NVRTC, a failed child).
struct NotRun(String);

impl<E: std::fmt::Display> From<E> for NotRun {
    fn from(e: E) -> Self {
        Self(e.to_string().replace('\n', " "))
    }
}

fn parent(options: &Options) -> Result<(), NotRun> {
    let host = atlas_registry::host(0)?;
    let compiler = Compiler::with_cache(CompileCache::disabled())?;
    let (major, minor) = host.compute_capability();
    let arch = 10 * major + minor;
    let ptx_arch = compiler
        .supported_archs()
        .iter()
        .copied()
        .filter(|&a| a <= arch)
        .max()
        .ok_or_else(|| NotRun(format!("NVRTC cannot compile for sm_{arch}")))?;
    let _ = std::fs::remove_dir_all(&options.dir);
    std::fs::create_dir_all(&options.dir)?;
    let source = CudaSource::new("model.cu", many_kernels::source(options.kernels));
    let made = Instant::now();
    let ptx = compiler.compile(&source, CompileTarget::Ptx { arch: ptx_arch })?;
    std::fs::write(options.dir.join("model.ptx"), ptx.image())?;
    let cubin_target = compiler.target_for("model", (major, minor))?;
    let cubin = compiler.compile(&source, cubin_target)?;
    std::fs::write(options.dir.join("model.cubin"), cubin.image())?;
    println!(
        "cold_start: device 0 is {} (sm_{arch}); NVRTC {:?}; {} kernels: PTX for compute_{ptx_arch} \
         ({} KB) and {cubin_target} ({} KB) made in {:.1} s; {} runs per row",
        host.name(),
        compiler.version(),
        options.kernels,
        ptx.image().len() / 1024,
        cubin.image().len() / 1024,
        made.elapsed().as_secs_f64(),
        options.reps,
    );
    let rows = [
        (Code::Ptx, false, false),
        (Code::Ptx, true, false),
        (Code::Cubin, false, false),
        (Code::Source, false, false),
        (Code::Source, false, true),
    ];
    let mut table = vec![
        "| code | driver JIT cache | Atlas cache | preload | start → every kernel launched, ms (median, min–max) | load, ms | first launches, ms |".to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    for (code, jit_cache_warm, atlas_cache_warm) in rows {
        for preload in [false, true] {
            let row = Row {
                code,
                jit_cache_warm,
                atlas_cache_warm,
                preload,
            };
            table.push(measure(&row, options)?);
            println!("{}", table.last().expect("just pushed"));
        }
    }
    println!("\n{}", table.join("\n"));
    let _ = std::fs::remove_dir_all(&options.dir);
    Ok(())
}

/// Runs one row's processes and formats its line of the table.
fn measure(row: &Row, options: &Options) -> Result<String, NotRun> {
    let tag = row.label().join("-").replace([' ', '(', ')', '+'], "");
    let warm_dir = options.dir.join(format!("cache-{tag}"));
    let warm = (row.code == Code::Ptx && row.jit_cache_warm)
        || (row.code == Code::Source && row.atlas_cache_warm);
    if warm {
        run_child(row, options, &warm_dir)?;
    }
    let mut runs = Vec::with_capacity(options.reps);
    for rep in 0..options.reps {
        let dir = if warm {
            warm_dir.clone()
        } else {
            options.dir.join(format!("cache-{tag}-{rep}"))
        };
        runs.push(run_child(row, options, &dir)?);
    }
    runs.sort_by_key(|run| run.total);
    let median = &runs[runs.len() / 2];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let [code, jit, atlas, preload] = row.label();
    Ok(format!(
        "| {code} | {jit} | {atlas} | {preload} | {:.1} ({:.1}–{:.1}) | {:.1} | {:.1} |",
        ms(median.total),
        ms(runs[0].total),
        ms(runs[runs.len() - 1].total),
        ms(median.load),
        ms(median.launches),
    ))
}

/// One child's figures.
struct Run {
    /// From spawning to reading `READY`.
    total: Duration,
    /// The child's own: loading the model (compiling included).
    load: Duration,
    /// The child's own: looking up and launching every kernel once, and synchronizing.
    launches: Duration,
}

fn run_child(row: &Row, options: &Options, cache: &Path) -> Result<Run, NotRun> {
    let code = match row.code {
        Code::Ptx => "ptx",
        Code::Cubin => "cubin",
        Code::Source => "source",
    };
    let config = format!("{code}:{}:{}", row.preload, options.kernels);
    let mut command = Command::new(std::env::current_exe()?);
    command
        .env(CHILD_VAR, config)
        .env("ATLAS_COLD_START_DIR", &options.dir)
        .env("ATLAS_CACHE_DIR", cache)
        .env_remove("ATLAS_CACHE_DISABLE")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if row.code == Code::Ptx && row.jit_cache_warm {
        command
            .env_remove("CUDA_CACHE_DISABLE")
            .env("CUDA_CACHE_PATH", cache);
    } else {
        command.env("CUDA_CACHE_DISABLE", "1");
    }
    let spawned = Instant::now();
    let mut process = command.spawn()?;
    let stdout = process
        .stdout
        .take()
        .ok_or_else(|| NotRun("no stdout".into()))?;
    let mut total = None;
    let (mut load, mut launches) = (Duration::ZERO, Duration::ZERO);
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("READY ") {
            total = Some(spawned.elapsed());
            let field = |name: &str| {
                rest.split_whitespace()
                    .find_map(|f| f.strip_prefix(name)?.parse::<u64>().ok())
                    .map_or(Duration::ZERO, Duration::from_micros)
            };
            load = field("load_us=");
            launches = field("launch_us=");
        } else {
            println!("  child: {line}");
        }
    }
    let status = process.wait()?;
    match total {
        Some(total) if status.success() => Ok(Run {
            total,
            load,
            launches,
        }),
        _ => Err(NotRun(format!(
            "a child ({}) failed: {status}",
            row.label().join(", ")
        ))),
    }
}

/// The child: loads the model as `config` says, launches every kernel once, reports, checks.
fn child(start: Instant, config: &str) -> ExitCode {
    match child_run(start, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cold_start child ({config}): {e}");
            ExitCode::FAILURE
        }
    }
}

fn child_run(start: Instant, config: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut parts = config.split(':');
    let (code, preload, kernels) = (
        parts.next().unwrap_or_default(),
        parts.next() == Some("true"),
        parts
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1000),
    );
    let dir = PathBuf::from(std::env::var_os("ATLAS_COLD_START_DIR").ok_or("no directory")?);
    let blob;
    let model = match code {
        "ptx" | "cubin" => {
            blob = std::fs::read(dir.join(format!("model.{code}")))?;
            Model::new().blob("model", &blob)
        }
        _ => Model::new().source(
            "model",
            CudaSource::new("model.cu", many_kernels::source(kernels)),
        ),
    }
    .preload(preload);
    let registry = AtlasRegistry::load_model(0, &model)?;
    let loaded = start.elapsed();
    let stream = registry.stream();
    let mut out = DeviceBuffer::from_slice(registry.ctx(), stream, &vec![f32::NAN; kernels])?;
    let one = LaunchConfig::for_elements(1, 1);
    for i in 0..kernels {
        let kernel = registry.function_cached("model", &format!("k{i}"))?;
        // SAFETY: kernel `k{i}` writes `out[i]`, and `out` holds `kernels` floats; `out` outlives
        // the launch (the stream is synchronized below, before it is dropped).
        unsafe { kernel.launch(stream, &one, (&mut out,)) }?;
    }
    registry.stream_synchronize(stream)?;
    let ready = start.elapsed();
    println!(
        "READY load_us={} launch_us={}",
        loaded.as_micros(),
        (ready - loaded).as_micros()
    );
    let got = out.to_vec(stream)?;
    if let Some(i) = (0..kernels).find(|&i| got[i] != i as f32 + 1.0) {
        return Err(format!("kernel k{i} wrote {}, not {}", got[i], i + 1).into());
    }
    Ok(())
}
