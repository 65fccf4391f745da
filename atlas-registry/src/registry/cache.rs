//! Per-call-site function caches: [`FunctionCache`] and [`cached_function!`](crate::cached_function!).
//!
//! A cache is a `static` at the call site that holds only a slot number; the cached handles live in
//! the registry, in that slot. So a cache asked with registry B can only answer with B's function,
//! and the answer borrows B: it cannot outlive B's modules. The hit path is three atomic loads (the
//! slot number, the registry's table, the slot), no lock and no driver call.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::Result;
use crate::registry::AtlasRegistry;
use crate::registry::function::FunctionRef;

/// A function cache for one call site: declare it `static` (or use [`cached_function!`](crate::cached_function!)) and ask it
/// with whichever registry the call is for.
///
/// ```no_run
/// use atlas_registry::{AtlasRegistry, FunctionCache, LaunchConfig};
///
/// static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
///
/// fn scale(registry: &AtlasRegistry, x: &atlas_registry::DeviceBuffer<f32>, by: f32) -> atlas_registry::Result<()> {
///     let n = x.len() as u32;
///     let cfg = LaunchConfig::for_elements(n, 256);
///     // SAFETY: `scale` touches the first `n` floats of `x`, all of it, and `x` outlives the launch
///     // (the stream is synchronized before it can drop).
///     unsafe { SCALE.get(registry)?.launch(registry.stream(), &cfg, (x, by, n)) }?;
///     registry.stream_synchronize(registry.stream())
/// }
/// ```
#[derive(Debug)]
pub struct FunctionCache {
    module: &'static str,
    function: &'static str,
    /// This call site's slot number plus one; 0 until first use.
    slot: AtomicUsize,
}

impl FunctionCache {
    /// A cache for `module::function`, empty until first use.
    pub const fn new(module: &'static str, function: &'static str) -> Self {
        Self {
            module,
            function,
            slot: AtomicUsize::new(0),
        }
    }

    /// `registry`'s `module::function`: looked up on the first call with each registry, then
    /// served without a lock or a driver call. The handle borrows `registry`.
    #[inline]
    pub fn get<'r>(&self, registry: &'r AtlasRegistry) -> Result<FunctionRef<'r>> {
        let slot = self.slot.load(Ordering::Relaxed);
        if slot != 0
            && let Some(kernel) = registry.inner.call_sites.get(slot - 1)
        {
            return Ok(FunctionRef::new(kernel));
        }
        self.fill(registry)
    }

    #[cold]
    fn fill<'r>(&self, registry: &'r AtlasRegistry) -> Result<FunctionRef<'r>> {
        let kernel = registry.cached_kernel(self.module, self.function)?;
        // SAFETY: the kernel is an entry of this registry's function table (`cached_kernel`).
        unsafe { registry.inner.call_sites.set(self.slot(), kernel) };
        Ok(FunctionRef::new(kernel))
    }

    /// This call site's slot, assigned on first use from a process-wide counter.
    fn slot(&self) -> usize {
        static NEXT: AtomicUsize = AtomicUsize::new(1);
        let current = self.slot.load(Ordering::Relaxed);
        if current != 0 {
            return current - 1;
        }
        let fresh = NEXT.fetch_add(1, Ordering::Relaxed);
        match self
            .slot
            .compare_exchange(0, fresh, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => fresh - 1,
            Err(taken) => taken - 1,
        }
    }
}

/// `cached_function!(registry, "module", "function")`: the function from a per-call-site
/// [`FunctionCache`] declared in place, as `Result<FunctionRef>`.
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// let noop = atlas_registry::cached_function!(registry, "noop", "noop")?;
/// // SAFETY: `noop` takes no arguments and touches no memory.
/// unsafe { noop.launch(registry.stream(), &atlas_registry::LaunchConfig::for_elements(1, 1), ()) }?;
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! cached_function {
    ($registry:expr, $module:expr, $function:expr) => {{
        static CACHE: $crate::FunctionCache = $crate::FunctionCache::new($module, $function);
        CACHE.get($registry)
    }};
}
