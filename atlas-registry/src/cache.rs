//! Per-call-site function caches: [`FunctionCache`] and [`cached_function!`](crate::cached_function!).
//!
//! A cache is a `static` at the call site that holds only a slot number; the cached handles live in
//! the registry, in that slot. So a cache asked with registry B can only answer with B's function,
//! and the answer borrows B: it cannot outlive B's modules. The hit path is three atomic loads (the
//! slot number, the registry's table, the slot), no lock and no driver call.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::error::Result;
use crate::function::{FunctionEntry, FunctionRef};
use crate::registry::AtlasRegistry;

/// Call sites with a slot in every registry; more are served from the registry's function table.
const CALL_SITES: usize = 4096;

/// A registry's cached functions, one slot per call site: a pointer to the registry's own entry
/// for that function (entries live as long as the registry), or null before first use.
/// Allocated on first use, so that loading a model that no call site uses costs nothing here.
#[derive(Default)]
pub(crate) struct CallSiteTable {
    slots: OnceLock<Box<[AtomicPtr<FunctionEntry>]>>,
}

impl CallSiteTable {
    #[inline]
    fn get(&self, slot: usize) -> Option<&FunctionEntry> {
        let entry = self.slots.get()?.get(slot)?.load(Ordering::Acquire);
        // SAFETY: a non-null slot points at an entry of this registry's function table (`set`'s
        // contract), which lives as long as the registry and so as long as `&self`.
        unsafe { entry.as_ref() }
    }

    /// Records `entry` for `slot`, unless the slot is past the table (that call site then keeps
    /// looking in the registry's function table). `entry` must be held by the registry's function table,
    /// so that it lives as long as the registry.
    fn set(&self, slot: usize, entry: &FunctionEntry) {
        let slots = self.slots.get_or_init(|| {
            (0..CALL_SITES)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect()
        });
        if let Some(cell) = slots.get(slot) {
            cell.store(std::ptr::from_ref(entry).cast_mut(), Ordering::Release);
        }
    }
}

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
///     registry.stream_synchronize()
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
            && let Some(entry) = registry.inner.call_sites.get(slot - 1)
        {
            return Ok(FunctionRef {
                registry: &registry.inner,
                entry,
            });
        }
        self.fill(registry)
    }

    #[cold]
    fn fill<'r>(&self, registry: &'r AtlasRegistry) -> Result<FunctionRef<'r>> {
        let entry = registry.cached_entry(self.module, self.function)?;
        registry.inner.call_sites.set(self.slot(), entry);
        Ok(FunctionRef {
            registry: &registry.inner,
            entry,
        })
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
