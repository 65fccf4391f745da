//! [`CallSiteTable`]: a registry's cached kernels, one slot per call site, read without a lock.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::launch::kernel::Kernel;

/// Call sites with a slot in every registry; more are served from the registry's function table.
const CALL_SITES: usize = 4096;

/// A registry's cached functions, one slot per call site: a pointer to the registry's own entry
/// for that function (entries live as long as the registry), or null before first use.
/// Allocated on first use, so that loading a model that no call site uses costs nothing here.
#[derive(Default)]
pub(crate) struct CallSiteTable {
    slots: OnceLock<Box<[AtomicPtr<Kernel>]>>,
}

impl CallSiteTable {
    #[inline]
    pub(crate) fn get(&self, slot: usize) -> Option<&Kernel> {
        let entry = self.slots.get()?.get(slot)?.load(Ordering::Acquire);
        // SAFETY: a non-null slot points at an entry of this registry's function table (`set`'s
        // contract), which lives as long as the registry and so as long as `&self`.
        unsafe { entry.as_ref() }
    }

    /// Records `entry` for `slot`, unless the slot is past the table (that call site then keeps
    /// looking in the registry's function table).
    ///
    /// # Safety
    ///
    /// 1. `entry` is held by the function table of the registry that owns this table, so that it
    ///    lives as long as the registry.
    pub(crate) unsafe fn set(&self, slot: usize, entry: &Kernel) {
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
