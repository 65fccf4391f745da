//! [`FunctionTable`]: a registry's looked-up functions by `module::function`, read without a lock.
//!
//! Entries are added under a mutex and never removed while the table lives. Readers find them
//! through an open-addressing index of atomic pointers, at most half full: a hash, a few atomic
//! loads and one name comparison. When the index would pass half full, a twice larger one replaces
//! it; the old one is kept until the table goes, since a reader may still be probing it.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::launch::kernel::Kernel;

/// What the table holds: a value named by a module and a function.
pub(crate) trait Named {
    /// The module and function names.
    fn parts(&self) -> (&str, &str);
    /// Whether this is `module::function`.
    fn is(&self, module: &str, function: &str) -> bool {
        self.parts() == (module, function)
    }
}

impl Named for Kernel {
    fn parts(&self) -> (&str, &str) {
        Kernel::parts(self)
    }
    #[inline]
    fn is(&self, module: &str, function: &str) -> bool {
        Kernel::is(self, module, function)
    }
}

/// Slots of the first index.
const FIRST_CAPACITY: usize = 64;

/// Hash slots; a slot is null until it holds an entry, and then holds it for the index's life.
struct Index<E> {
    slots: Box<[AtomicPtr<E>]>,
}

impl<E: Named> Index<E> {
    /// An index of `capacity` (a power of two) slots holding `entries`.
    fn with(capacity: usize, entries: &[Arc<E>]) -> Box<Self> {
        let index = Box::new(Self {
            slots: (0..capacity)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        });
        for entry in entries {
            index.insert(entry);
        }
        index
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    fn find(&self, module: &str, function: &str) -> Option<&E> {
        let mask = self.mask();
        let mut i = hash(module, function) & mask;
        loop {
            let entry = self.slots[i].load(Ordering::Acquire);
            // SAFETY: a non-null slot points at an entry that the table owns (`insert`'s contract)
            // and never drops before itself; the index is borrowed from the table.
            let entry = unsafe { entry.as_ref() }?;
            if entry.is(module, function) {
                return Some(entry);
            }
            // At most half the slots are taken, so the probe meets a null slot.
            i = (i + 1) & mask;
        }
    }

    /// Puts `entry` in the first free slot of its probe sequence. Only under the table's lock, with
    /// `entry` owned by the table; the index must have a free slot.
    fn insert(&self, entry: &Arc<E>) {
        let mask = self.mask();
        let (module, function) = entry.parts();
        let mut i = hash(module, function) & mask;
        while !self.slots[i].load(Ordering::Relaxed).is_null() {
            i = (i + 1) & mask;
        }
        self.slots[i].store(Arc::as_ptr(entry).cast_mut(), Ordering::Release);
    }
}

/// What the table's lock guards: the entries, and every index made (the last is the current one).
struct Owned<E> {
    entries: Vec<Arc<E>>,
    #[allow(
        clippy::vec_box,
        reason = "`current` points at an index: each must keep its address as the Vec grows"
    )]
    indexes: Vec<Box<Index<E>>>,
}

/// A registry's functions, looked up once each (see the module docs).
pub(crate) struct FunctionTable<E = Kernel> {
    /// The current index, or null before the first entry. Points into `owned.indexes`.
    current: AtomicPtr<Index<E>>,
    owned: Mutex<Owned<E>>,
}

impl<E> Default for FunctionTable<E> {
    fn default() -> Self {
        Self {
            current: AtomicPtr::new(std::ptr::null_mut()),
            owned: Mutex::new(Owned {
                entries: Vec::new(),
                indexes: Vec::new(),
            }),
        }
    }
}

impl<E: Named> FunctionTable<E> {
    /// The entry for `module::function`, if there is one; no lock.
    #[inline]
    pub(crate) fn get(&self, module: &str, function: &str) -> Option<&E> {
        let index = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null `current` points at an index in `owned.indexes`, which keeps every
        // index until the table is dropped, and `&self` borrows the table.
        unsafe { index.as_ref() }?.find(module, function)
    }

    /// The entry for `module::function`: the one already there, or the one `make` builds, added.
    pub(crate) fn get_or_insert(
        &self,
        module: &str,
        function: &str,
        make: impl FnOnce() -> E,
    ) -> &E {
        let mut owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = self.get(module, function) {
            return existing;
        }
        let entry = Arc::new(make());
        owned.entries.push(Arc::clone(&entry));
        let capacity = owned.indexes.last().map_or(0, |index| index.slots.len());
        if owned.entries.len() * 2 > capacity {
            let grown = Index::with((capacity * 2).max(FIRST_CAPACITY), &owned.entries);
            owned.indexes.push(grown);
            // The pointer is taken from the index in its final place: moving a `Box` asserts
            // unique ownership again, which would invalidate a pointer taken before the move.
            if let Some(index) = owned.indexes.last() {
                self.current
                    .store(std::ptr::from_ref(&**index).cast_mut(), Ordering::Release);
            }
        } else if let Some(index) = owned.indexes.last() {
            index.insert(&entry);
        }
        // SAFETY: the entry is owned by `owned.entries`, from which nothing is removed while the
        // table lives; `&self` borrows the table. `Arc::as_ptr` points into the shared allocation
        // without claiming it, so later moves of the `Arc`s in the Vec leave the pointer valid.
        unsafe { &*Arc::as_ptr(&entry) }
    }
}

/// A fast hash of `module` and `function`, eight bytes at a time, with no call out of line (names
/// are a few dozen bytes at most). Kernel names are not chosen by an adversary, so flooding
/// resistance buys nothing here.
#[inline]
fn hash(module: &str, function: &str) -> usize {
    let mut h = (module.len() as u64) << 32 | function.len() as u64;
    for part in [module.as_bytes(), function.as_bytes()] {
        let mut bytes = part;
        while let Some((word, rest)) = bytes.split_first_chunk::<8>() {
            h = mix(h, u64::from_le_bytes(*word));
            bytes = rest;
        }
        h = mix(h, tail(bytes));
    }
    (h ^ (h >> 29)) as usize
}

#[inline]
fn mix(h: u64, word: u64) -> u64 {
    (h.rotate_left(23) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The last 0 to 7 bytes of a name as one word (two overlapping 4-byte reads from 4 bytes on).
#[inline]
fn tail(bytes: &[u8]) -> u64 {
    match (bytes.first_chunk::<4>(), bytes.last_chunk::<4>()) {
        (Some(low), Some(high)) => {
            u64::from(u32::from_le_bytes(*low)) | u64::from(u32::from_le_bytes(*high)) << 32
        }
        _ => bytes.iter().fold(0, |word, &b| word << 8 | u64::from(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in entry: the table needs nothing of a kernel but its names.
    struct Entry {
        name: String,
        module_len: usize,
    }

    impl Named for Entry {
        fn parts(&self) -> (&str, &str) {
            let (module, rest) = self.name.split_at(self.module_len);
            (module, &rest[2..])
        }
    }

    fn entry(module: &str, function: &str) -> Entry {
        Entry {
            name: format!("{module}::{function}"),
            module_len: module.len(),
        }
    }

    #[test]
    fn finds_every_entry_through_growth() {
        let table = FunctionTable::<Entry>::default();
        assert!(table.get("m", "f0").is_none());
        let names: Vec<String> = (0..500).map(|i| format!("kernel_{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            let module = if i % 2 == 0 { "even" } else { "odd" };
            let added = table.get_or_insert(module, name, || entry(module, name));
            assert_eq!(added.name, format!("{module}::{name}"));
            let again = table.get_or_insert(module, name, || unreachable!("already there"));
            assert!(std::ptr::eq(added, again));
        }
        for (i, name) in names.iter().enumerate() {
            let (module, other) = if i % 2 == 0 {
                ("even", "odd")
            } else {
                ("odd", "even")
            };
            let found = table.get(module, name).expect("inserted above");
            assert_eq!(found.name, format!("{module}::{name}"));
            assert!(table.get(other, name).is_none());
        }
    }

    #[test]
    fn threads_adding_the_same_names_share_one_entry_each() {
        let table = FunctionTable::<Entry>::default();
        let names: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
        let seen: Vec<Vec<usize>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..8)
                .map(|t| {
                    let (table, names) = (&table, &names);
                    scope.spawn(move || {
                        // Each thread walks the names from a different start, reading as it adds.
                        (0..names.len())
                            .map(|i| {
                                let name = &names[(i + t * 37) % names.len()];
                                let entry = table.get_or_insert("m", name, || entry("m", name));
                                assert!(table.get("m", name).is_some());
                                std::ptr::from_ref(entry) as usize
                            })
                            .collect()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        for (t, addresses) in seen.iter().enumerate() {
            for (i, &address) in addresses.iter().enumerate() {
                let name = &names[(i + t * 37) % names.len()];
                let entry = table.get("m", name).expect("added");
                assert_eq!(std::ptr::from_ref(entry) as usize, address, "{name}");
            }
        }
    }

    #[test]
    fn module_and_function_do_not_run_together() {
        let table = FunctionTable::<Entry>::default();
        table.get_or_insert("a::b", "c", || entry("a::b", "c"));
        assert!(table.get("a", "b::c").is_none());
        assert!(table.get("a::b", "c").is_some());
        table.get_or_insert("a", "b::c", || entry("a", "b::c"));
        assert!(!std::ptr::eq(
            table.get("a", "b::c").unwrap(),
            table.get("a::b", "c").unwrap()
        ));
    }
}
