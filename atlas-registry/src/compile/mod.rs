//! Run-time compilation of CUDA C++ with NVRTC, and the persistent cache of what it made.
//!
//! - [`CudaSource`]: a program's text, the headers it includes by name, its options and the C++
//!   names (template instantiations) of the kernels to look up.
//! - [`CompileTarget`]: what to make for a device: its own SASS (a cubin for its exact `sm_XX`)
//!   when the NVRTC knows the architecture (`nvrtcGetSupportedArchs`), else PTX for the newest
//!   architecture it knows below the device's, which the driver JIT-compiles.
//! - [`Compiler`]: NVRTC (loaded at run time like libcuda: see [`atlas_sys::nvrtc`]; the calls
//!   are the driver tier's, `driver::nvrtc`) with a [`CompileCache`] ([`cache`]): a compile looks
//!   in the cache first and stores what it made, in a directory the process's user alone may
//!   write to ([`cache_dir`]), unless NVRTC may read a file for the source ([`file_reads`]).
//!
//! A [`Model`](crate::Model) takes sources beside blobs; compiled modules are ordinary modules of
//! the registry, checked, loaded and launched as blobs are, and their name expressions are looked
//! up by their C++ name (`registry.function("gemm", "gemm<128>")`).

pub(crate) mod cache;
pub(crate) mod cache_dir;
pub(crate) mod file_reads;

use std::ffi::CString;
use std::fmt;

use crate::code::blob::{BlobKind, validate_blob};
use crate::driver::nvrtc::{self, CompileFailure, ProgramInput};
use crate::error::{AtlasError, CompileRefusal, Result};
use crate::report::{WithoutLogger, report};
pub use cache::{CacheOutcome, CompileCache};
pub use cache_dir::Distrust;
pub use file_reads::FileRead;

/// CUDA C++ source to compile at run time: the program, the headers it includes by name, the
/// NVRTC options and the name expressions whose lowered names the registry looks up.
///
/// ```
/// use atlas_registry::CudaSource;
///
/// let source = CudaSource::new(
///     "scale.cu",
///     r#"#include "config.h"
///        template <int N> __global__ void scale(float *x) { /* ... */ }"#,
/// )
/// .header("config.h", "#define FACTOR 2.0f")
/// .option("-std=c++17")
/// .name_expression("scale<128>");
/// assert_eq!(source.name_expressions(), ["scale<128>"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CudaSource {
    name: String,
    text: String,
    headers: Vec<(String, String)>,
    options: Vec<String>,
    name_expressions: Vec<String>,
}

impl CudaSource {
    /// A program named `name` (the file name NVRTC's messages use) with source `text`.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            text: text.into(),
            headers: Vec::new(),
            options: Vec::new(),
            name_expressions: Vec::new(),
        }
    }

    /// Adds a header that the program includes as `#include "name"`.
    pub fn header(mut self, name: impl Into<String>, contents: impl Into<String>) -> Self {
        self.headers.push((name.into(), contents.into()));
        self
    }

    /// Adds an NVRTC option (`-std=c++17`, `-DTILE=64`, `--use_fast_math`). The architecture is
    /// Atlas's to choose ([`CompileTarget`]): an option naming one is refused.
    pub fn option(mut self, option: impl Into<String>) -> Self {
        self.options.push(option.into());
        self
    }

    /// Adds a name expression (`scale<128>`, `ns::gemm<float, 64>`): NVRTC instantiates it, and
    /// the registry finds the kernel by this C++ name.
    #[doc(alias = "nvrtcAddNameExpression")]
    pub fn name_expression(mut self, expression: impl Into<String>) -> Self {
        self.name_expressions.push(expression.into());
        self
    }

    /// The program's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The program's source text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The headers, as `(name, contents)`, in the order added.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The options, in the order added.
    pub fn options(&self) -> &[String] {
        &self.options
    }

    /// The name expressions, in the order added.
    pub fn name_expressions(&self) -> &[String] {
        &self.name_expressions
    }

    /// Checks what can be checked before NVRTC sees the source; the reason when it is refused.
    fn check(&self) -> std::result::Result<(), String> {
        let strings = [
            ("the program's name", &self.name),
            ("the source", &self.text),
        ]
        .into_iter()
        .chain(
            self.headers
                .iter()
                .flat_map(|(n, c)| [("a header's name", n), ("a header", c)]),
        )
        .chain(self.options.iter().map(|o| ("an option", o)))
        .chain(
            self.name_expressions
                .iter()
                .map(|e| ("a name expression", e)),
        );
        for (what, text) in strings {
            if let Some(at) = text.find('\0') {
                return Err(format!("{what} has a NUL byte at offset {at}"));
            }
        }
        if let Some(option) = self.options.iter().find(|o| names_an_architecture(o)) {
            return Err(format!(
                "the option `{option}` names an architecture; Atlas compiles for each device's own \
                 (its SASS when NVRTC knows it, else PTX), so leave it out"
            ));
        }
        Ok(())
    }
}

/// Whether an NVRTC option sets the architecture (`-arch=sm_90`, `--gpu-architecture compute_80`).
fn names_an_architecture(option: &str) -> bool {
    ["-arch", "--gpu-architecture"].iter().any(|flag| {
        option == *flag
            || option
                .strip_prefix(flag)
                .is_some_and(|r| r.starts_with('='))
    })
}

/// What NVRTC makes for a device: SASS for one architecture (a cubin), or PTX for one virtual
/// architecture, which the driver JIT-compiles for the device when the module loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CompileTarget {
    /// A cubin of SASS for `sm_{arch}` (`arch` = `10 * major + minor`: 90 for sm_90).
    Cubin {
        /// The architecture, `10 * major + minor`.
        arch: u32,
    },
    /// PTX for `compute_{arch}`.
    Ptx {
        /// The virtual architecture, `10 * major + minor`.
        arch: u32,
    },
}

impl CompileTarget {
    /// The target for a device of compute capability `(major, minor)`, given the architectures an
    /// NVRTC makes SASS for: the device's own SASS when `supported` holds its architecture, else
    /// PTX for the newest supported architecture below it (which the driver JIT-compiles for the
    /// device). `None` when every supported architecture is newer than the device.
    ///
    /// ```
    /// use atlas_registry::CompileTarget;
    ///
    /// let nvrtc_12_0 = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
    /// assert_eq!(CompileTarget::choose((9, 0), &nvrtc_12_0), Some(CompileTarget::Cubin { arch: 90 }));
    /// assert_eq!(CompileTarget::choose((10, 0), &nvrtc_12_0), Some(CompileTarget::Ptx { arch: 90 }));
    /// assert_eq!(CompileTarget::choose((3, 5), &nvrtc_12_0), None);
    /// ```
    pub fn choose((major, minor): (u32, u32), supported: &[u32]) -> Option<Self> {
        let arch = 10 * major + minor;
        if supported.contains(&arch) {
            return Some(Self::Cubin { arch });
        }
        supported
            .iter()
            .copied()
            .filter(|&a| a < arch)
            .max()
            .map(|arch| Self::Ptx { arch })
    }

    /// The architecture, `10 * major + minor`.
    pub fn arch(self) -> u32 {
        match self {
            Self::Cubin { arch } | Self::Ptx { arch } => arch,
        }
    }

    /// The kind of blob compiling for this target makes.
    fn kind(self) -> BlobKind {
        match self {
            Self::Cubin { .. } => BlobKind::Cubin,
            Self::Ptx { .. } => BlobKind::Ptx,
        }
    }

    /// NVRTC's option for it: `--gpu-architecture=sm_90` or `--gpu-architecture=compute_90`.
    fn option(self) -> String {
        match self {
            Self::Cubin { arch } => format!("--gpu-architecture=sm_{arch}"),
            Self::Ptx { arch } => format!("--gpu-architecture=compute_{arch}"),
        }
    }
}

impl fmt::Display for CompileTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cubin { arch } => write!(f, "sm_{arch} SASS"),
            Self::Ptx { arch } => write!(f, "compute_{arch} PTX"),
        }
    }
}

/// What NVRTC made of a [`CudaSource`] for one target, from the cache or compiled now.
#[derive(Debug, Clone)]
pub struct CompiledCode {
    target: CompileTarget,
    /// The code: the cubin, or the PTX with its terminating NUL, a blob that passed
    /// [`validate_blob`].
    bytes: Vec<u8>,
    /// `(name expression, lowered name)`, in the source's order.
    lowered: Vec<(String, String)>,
    log: String,
    cache: CacheOutcome,
}

impl CompiledCode {
    /// What was made.
    pub fn target(&self) -> CompileTarget {
        self.target
    }

    /// The code: a cubin, or NUL-terminated PTX; a blob as [`AtlasRegistry::load`] takes it.
    ///
    /// [`AtlasRegistry::load`]: crate::AtlasRegistry::load
    pub fn image(&self) -> &[u8] {
        &self.bytes
    }

    /// The code, as [`image`](Self::image), without copying it.
    pub fn into_image(self) -> Vec<u8> {
        self.bytes
    }

    /// The code and its kind, to hand to the driver: checked by the blob validator when it was
    /// compiled or taken from the cache (whose entries it refuses are compiled again), and PTX
    /// NUL-terminated.
    pub(crate) fn into_checked(self) -> (BlobKind, Vec<u8>) {
        let kind = self.kind();
        let mut image = self.into_image();
        if kind == BlobKind::Ptx && image.last() != Some(&0) {
            image.push(0);
        }
        (kind, image)
    }

    /// What kind of blob [`image`](Self::image) is.
    pub fn kind(&self) -> BlobKind {
        self.target.kind()
    }

    /// The lowered (mangled) name of a name expression of the source, as the module's symbol
    /// table has it (`scale<128>` → `_Z5scaleILi128EEvPf`).
    #[doc(alias = "nvrtcGetLoweredName")]
    pub fn lowered_name(&self, expression: &str) -> Option<&str> {
        self.lowered
            .iter()
            .find(|(e, _)| e == expression)
            .map(|(_, lowered)| lowered.as_str())
    }

    /// Every `(name expression, lowered name)`, in the source's order.
    pub fn lowered_names(&self) -> &[(String, String)] {
        &self.lowered
    }

    /// NVRTC's log of the compile (warnings); empty when it said nothing or the code came from
    /// the cache.
    pub fn log(&self) -> &str {
        &self.log
    }

    /// Whether the code came from the cache.
    pub fn cache_outcome(&self) -> &CacheOutcome {
        &self.cache
    }
}

/// NVRTC with a compile cache: compiles [`CudaSource`]s, from the cache when it holds them.
///
/// ```no_run
/// use atlas_registry::{CompileTarget, Compiler, CudaSource};
///
/// # fn main() -> atlas_registry::Result<()> {
/// let compiler = Compiler::new()?; // NVRTC, and the cache ATLAS_CACHE_DIR names
/// let source = CudaSource::new("k.cu", "extern \"C\" __global__ void k(float *x) { x[0] = 1; }");
/// let code = compiler.compile(&source, CompileTarget::Cubin { arch: 90 })?;
/// println!("{} bytes, {:?}", code.image().len(), code.cache_outcome());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Compiler {
    nvrtc: &'static nvrtc::Loaded,
    cache: CompileCache,
}

impl fmt::Debug for Compiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiler")
            .field("version", &self.nvrtc.version)
            .field("cache", &self.cache)
            .finish()
    }
}

impl Compiler {
    /// NVRTC (loaded on first use; see [`atlas_sys::nvrtc`]) with the cache of
    /// [`CompileCache::from_env`]. Without NVRTC, [`AtlasError::NvrtcUnavailable`] lists every
    /// library tried.
    pub fn new() -> Result<Self> {
        Self::with_cache(CompileCache::from_env())
    }

    /// NVRTC with `cache`.
    pub fn with_cache(cache: CompileCache) -> Result<Self> {
        Ok(Self {
            nvrtc: nvrtc::loaded().map_err(AtlasError::from)?,
            cache,
        })
    }

    /// The cache compiles go through.
    pub fn cache(&self) -> &CompileCache {
        &self.cache
    }

    /// NVRTC's version, `(major, minor)` (`nvrtcVersion`).
    #[doc(alias = "nvrtcVersion")]
    pub fn version(&self) -> (u32, u32) {
        self.nvrtc.version
    }

    /// The architectures NVRTC makes SASS for, as `10 * major + minor`, ascending
    /// (`nvrtcGetSupportedArchs`).
    #[doc(alias = "nvrtcGetSupportedArchs")]
    pub fn supported_archs(&self) -> &'static [u32] {
        &self.nvrtc.archs
    }

    /// The target for a device of compute capability `(major, minor)`: see
    /// [`CompileTarget::choose`]. A device older than every architecture the NVRTC knows is
    /// [`AtlasError::CannotCompile`] naming `module`.
    pub fn target_for(
        &self,
        module: &str,
        compute_capability: (u32, u32),
    ) -> Result<CompileTarget> {
        let supported = self.supported_archs();
        CompileTarget::choose(compute_capability, supported).ok_or_else(|| {
            AtlasError::CannotCompile {
                module: module.escape_debug().to_string(),
                reason: CompileRefusal::DeviceTooOld {
                    nvrtc: self.version(),
                    oldest: supported.first().copied().unwrap_or(0),
                    device: 10 * compute_capability.0 + compute_capability.1,
                },
            }
        })
    }

    /// Compiles `source` for `target`, or takes it from the cache.
    ///
    /// A compile error is [`AtlasError::Compile`] carrying NVRTC's log, naming `source`'s name;
    /// a source with a NUL byte, or an option naming an architecture, is
    /// [`AtlasError::InvalidModule`] before NVRTC is called. What NVRTC makes is checked as every
    /// blob is ([`validate_blob`]) before it is stored or returned. A source for which NVRTC may
    /// read a file from disk (an include path, a pre-included header, an `#include` of a name
    /// that is not one of its headers) is compiled every time
    /// ([`CacheOutcome::ReadsFiles`]).
    #[doc(alias = "nvrtcCompileProgram")]
    pub fn compile(&self, source: &CudaSource, target: CompileTarget) -> Result<CompiledCode> {
        source.check().map_err(|reason| AtlasError::InvalidModule {
            module: source.name.escape_debug().to_string(),
            reason,
        })?;
        if self.cache.dir().is_some()
            && let Some(reason) = file_reads::file_read(source)
        {
            let mut code = compile_now(self.nvrtc, source, target)?;
            code.cache = CacheOutcome::ReadsFiles { reason };
            return Ok(code);
        }
        let key = cache::Key::new(source, target, self.nvrtc.version);
        let looked = self.cache.look_up(&key, &source.name_expressions);
        let looked = match looked {
            cache::Lookup::Hit { code, lowered } => {
                return Ok(CompiledCode {
                    target,
                    bytes: code,
                    lowered,
                    log: String::new(),
                    cache: CacheOutcome::Hit,
                });
            }
            other => other,
        };
        let mut code = compile_now(self.nvrtc, source, target)?;
        code.cache = self.cache.store(&key, &code, looked);
        let fallback = match &code.cache {
            CacheOutcome::Replaced { reason } => Some(format!(
                "an unusable compile cache entry was replaced: {reason}"
            )),
            CacheOutcome::NotStored { reason } => {
                Some(format!("compiled code was not cached: {reason}"))
            }
            CacheOutcome::Untrusted { dir, reason } => Some(format!(
                "the compile cache {} is not used: {reason}",
                dir.display()
            )),
            _ => None,
        };
        if let Some(fallback) = fallback {
            report(
                log::Level::Warn,
                module_path!(),
                format_args!("{fallback}"),
                WithoutLogger::Silent,
            );
        }
        Ok(code)
    }
}

/// Runs NVRTC on `source` for `target` and checks what it made.
fn compile_now(
    nvrtc: &nvrtc::Loaded,
    source: &CudaSource,
    target: CompileTarget,
) -> Result<CompiledCode> {
    // `check` found no NUL byte, so none of these conversions fails.
    let c = |s: &str| CString::new(s).unwrap_or_default();
    let headers: Vec<(CString, CString)> =
        source.headers.iter().map(|(n, t)| (c(n), c(t))).collect();
    let options: Vec<CString> = source
        .options
        .iter()
        .map(|o| c(o))
        .chain([c(&target.option())])
        .collect();
    let expressions: Vec<CString> = source.name_expressions.iter().map(|e| c(e)).collect();
    let (name, text) = (c(&source.name), c(&source.text));
    let input = ProgramInput {
        name: &name,
        source: &text,
        headers: &headers,
        options: &options,
        name_expressions: &expressions,
        cubin: matches!(target, CompileTarget::Cubin { .. }),
    };
    let output = nvrtc::compile_program(nvrtc, &input).map_err(|failure| match failure {
        CompileFailure::Refused { code, log } => AtlasError::Compile {
            module: source.name.escape_debug().to_string(),
            target: target.to_string(),
            code,
            log,
        },
        CompileFailure::Other(e) => e.into(),
    })?;
    let expected = target.kind();
    let kind = validate_blob(&source.name, &output.image)?;
    if kind != expected {
        return Err(AtlasError::InvalidModule {
            module: source.name.escape_debug().to_string(),
            reason: format!("NVRTC made {kind:?} code where {expected:?} was asked for"),
        });
    }
    Ok(CompiledCode {
        target,
        bytes: output.image,
        lowered: source
            .name_expressions
            .iter()
            .cloned()
            .zip(output.lowered)
            .collect(),
        log: output.log,
        cache: CacheOutcome::Off,
    })
}
