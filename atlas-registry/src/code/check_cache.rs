//! The PTX texts and cubins this process has checked, so that a load of the same bytes again (a
//! model loaded once per device, or dropped and loaded again) neither checks them again nor reads
//! their kernels' layouts again.
//!
//! A blob is found by its bytes: their hash (XXH3, 64 bits) picks the blob kept of the same
//! length and hash under the lock, and the bytes are compared in full after it is released, on a
//! shared handle of the kept blob; so a miss compares nothing under the lock, a hit compares its
//! bytes once, and a hash that two blobs share can make only a miss. The check is a function of
//! the bytes alone, so equal bytes get the verdict they got before. Only blobs that passed are
//! kept (a refusal is made again, with its module's name), of at most [`MOST_BYTES`] each, and at
//! most [`MOST_KEPT`] of them and [`MOST_KEPT_BYTES`] of memory in all, the oldest forgotten
//! first. The memory counted is what keeping them keeps alive: the bytes, and the layouts read of
//! them, measured as they are read ([`BlobLayouts::heap_bytes`]: from a few thousandths of the
//! bytes for NVIDIA's libraries to four times them for a text of tiny kernels); it is counted anew
//! each time a blob is kept, so layouts read since the last time count from the next. The bytes
//! kept are those the layouts are read from at their first need, so keeping them costs no copy
//! beyond the one a load made before.
//!
//! Fatbins, blob sets and compiled sources are not kept: a fatbin's code is checked for the
//! device it is loaded on, and a source's is checked as it is compiled.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use crate::code::blob::BlobKind;
use crate::code::layout::BlobLayouts;

/// The largest blob kept: larger ones take long enough to load that their check is a small part.
const MOST_BYTES: usize = 4 << 20;
/// How many blobs are kept.
const MOST_KEPT: usize = 256;
/// How much memory what is kept keeps alive in all: the blobs' bytes and their layouts.
const MOST_KEPT_BYTES: usize = 64 << 20;

/// A blob that passed its check: its bytes and their hash, what it is, and its kernels' layouts.
struct Passed {
    bytes: Arc<[u8]>,
    hash: u64,
    kind: BlobKind,
    layouts: Arc<BlobLayouts>,
}

impl Passed {
    /// What keeping it keeps alive: its bytes, and its layouts once read (until then they share
    /// the bytes).
    fn cost(&self) -> usize {
        self.bytes.len() + self.layouts.heap_bytes().unwrap_or(0)
    }
}

/// Blobs that passed, within bounds: at most `most_kept` of them, keeping `most_kept_bytes`
/// alive in all, `most_bytes` each.
struct Cache {
    kept: Mutex<VecDeque<Passed>>,
    most_bytes: usize,
    most_kept: usize,
    most_kept_bytes: usize,
}

/// The process's.
static CACHE: Cache = Cache::new(MOST_BYTES, MOST_KEPT, MOST_KEPT_BYTES);

/// What `blob` is, and its layouts, when bytes equal to it passed the check before.
pub(crate) fn find(blob: &[u8]) -> Option<(BlobKind, Arc<BlobLayouts>)> {
    CACHE.find(blob)
}

/// The layouts of `blob`, a PTX text or cubin of `kind` that has just passed its check, read at
/// their first need from a copy; the copy is kept, so that a load of equal bytes is [`find`]'s.
/// `None` for any other kind.
pub(crate) fn remember(kind: BlobKind, blob: &[u8]) -> Option<Arc<BlobLayouts>> {
    CACHE.remember(kind, blob)
}

/// The hash a blob is looked up by.
fn hash(blob: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(blob)
}

impl Cache {
    const fn new(most_bytes: usize, most_kept: usize, most_kept_bytes: usize) -> Self {
        Self {
            kept: Mutex::new(VecDeque::new()),
            most_bytes,
            most_kept,
            most_kept_bytes,
        }
    }

    fn find(&self, blob: &[u8]) -> Option<(BlobKind, Arc<BlobLayouts>)> {
        if blob.len() > self.most_bytes {
            return None;
        }
        let hash = hash(blob);
        // The newest of that length and hash; its bytes compared once the lock is released.
        let (bytes, kind, layouts) = {
            let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            let passed = kept
                .iter()
                .rev()
                .find(|passed| passed.hash == hash && passed.bytes.len() == blob.len())?;
            let layouts = Arc::clone(&passed.layouts);
            (Arc::clone(&passed.bytes), passed.kind, layouts)
        };
        (*bytes == *blob).then_some((kind, layouts))
    }

    fn remember(&self, kind: BlobKind, blob: &[u8]) -> Option<Arc<BlobLayouts>> {
        if !matches!(kind, BlobKind::Ptx | BlobKind::Cubin) {
            return None;
        }
        let bytes: Arc<[u8]> = Arc::from(blob);
        let layouts = Arc::new(BlobLayouts::of_shared(Arc::clone(&bytes)));
        if blob.len() <= self.most_bytes {
            let passed = Passed {
                hash: hash(blob),
                bytes,
                kind,
                layouts: Arc::clone(&layouts),
            };
            // Dropped after the lock is released: the last handle on a blob's bytes and layouts
            // frees them.
            let mut forgotten = Vec::new();
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            kept.push_back(passed);
            // As it stands: layouts read since the last count count now.
            let mut cost: usize = kept.iter().map(Passed::cost).sum();
            while kept.len() > self.most_kept || cost > self.most_kept_bytes {
                let Some(oldest) = kept.pop_front() else {
                    break;
                };
                cost = cost.saturating_sub(oldest.cost());
                forgotten.push(oldest);
            }
            drop(kept);
            drop(forgotten);
        }
        Some(layouts)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use super::*;

    #[test]
    fn equal_bytes_are_found_with_the_same_layouts_other_bytes_are_not() {
        let ptx = atlas_kernels::ptx_for_model("demo").unwrap()[1].1;
        let layouts = remember(BlobKind::Ptx, ptx).unwrap();
        let copy = ptx.to_vec();
        let (kind, found) = find(&copy).unwrap();
        assert_eq!(kind, BlobKind::Ptx);
        assert!(Arc::ptr_eq(&layouts, &found));
        let mut other = copy.clone();
        *other.last_mut().unwrap() ^= 1;
        assert!(find(&other).is_none());
        assert!(find(&copy[..copy.len() - 1]).is_none());
        assert!(remember(BlobKind::Fatbin, atlas_kernels::ELEMENTWISE_FATBIN).is_none());
        assert!(find(atlas_kernels::ELEMENTWISE_FATBIN).is_none());
    }

    #[test]
    fn a_hash_alone_finds_nothing() {
        let cache = Cache::new(MOST_BYTES, MOST_KEPT, MOST_KEPT_BYTES);
        let ptx = atlas_kernels::ptx_for_model("demo").unwrap()[1].1;
        let layouts = cache.remember(BlobKind::Ptx, ptx).unwrap();
        // Bytes of the same length kept under the hash of `ptx`, as a collision would have them.
        let mut other = ptx.to_vec();
        other[0] ^= 1;
        cache
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(Passed {
                bytes: Arc::from(&other[..]),
                hash: hash(ptx),
                kind: BlobKind::Ptx,
                layouts: Arc::new(BlobLayouts::unknown("a collision".into())),
            });
        // The newest of that hash is the impostor: its bytes differ, so `ptx` is a miss.
        assert!(cache.find(ptx).is_none());
        assert!(cache.find(&other).is_none());
        let mut kept = cache.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.pop_back();
        drop(kept);
        let (_, found) = cache.find(ptx).unwrap();
        assert!(Arc::ptr_eq(&found, &layouts));
    }

    /// What `cache` keeps alive now: every blob's bytes, and its layouts' heap where they have
    /// been read.
    fn alive(cache: &Cache) -> (usize, usize) {
        let kept = cache.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes = kept.iter().map(|p| p.bytes.len()).sum();
        let layouts = kept.iter().filter_map(|p| p.layouts.heap_bytes()).sum();
        (bytes, layouts)
    }

    #[test]
    fn the_oldest_are_forgotten_past_the_bounds() {
        let cache = Cache::new(MOST_BYTES, MOST_KEPT, MOST_KEPT_BYTES);
        let cubin = atlas_kernels::cubin_for_model("demo", 90).unwrap()[0].1;
        // Distinct bytes, as far as the cache can tell: the same cubin with a different tail.
        let variant = |n: usize| [cubin, &n.to_le_bytes()].concat();
        for n in 0..MOST_KEPT + 8 {
            cache.remember(BlobKind::Cubin, &variant(n));
        }
        assert!(cache.find(&variant(0)).is_none());
        assert!(cache.find(&variant(MOST_KEPT + 7)).is_some());
        let kept = cache
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        assert_eq!(kept, MOST_KEPT);
        assert!(alive(&cache).0 <= MOST_KEPT_BYTES);
    }

    /// A PTX text of about `size` bytes: kernels of two parameters, named apart by `tag`.
    fn ptx_of_kernels(tag: usize, size: usize) -> Vec<u8> {
        let mut text = String::from(".version 8.0\n.target sm_75\n.address_size 64\n\n");
        let mut n = 0;
        while text.len() < size {
            text.push_str(&format!(
                ".visible .entry k{tag}_{n}(.param .u64 p, .param .u32 n)\n{{\n\tret;\n}}\n"
            ));
            n += 1;
        }
        text.into_bytes()
    }

    #[test]
    fn what_is_kept_alive_counts_the_layouts_read_of_it() {
        let bound = 1 << 20;
        let cache = Cache::new(bound, MOST_KEPT, bound);
        for tag in 0..48 {
            let ptx = ptx_of_kernels(tag, 32 << 10);
            let layouts = cache.remember(BlobKind::Ptx, &ptx).unwrap();
            let (bytes, layouts_heap) = alive(&cache);
            assert!(
                bytes + layouts_heap <= bound,
                "after {} PTX texts of 32 KiB, the cache keeps {bytes} bytes of them and \
                 {layouts_heap} of their layouts alive, more than its bound of {bound}",
                tag + 1
            );
            // A load of it reads its layouts (a typed launch, a preload).
            assert!(
                layouts
                    .get()
                    .as_ref()
                    .is_ok_and(|kernels| kernels.len() > 500)
            );
        }
    }

    #[test]
    fn a_miss_compares_no_bytes_under_the_lock() {
        let cache = Cache::new(MOST_BYTES, MOST_KEPT, MOST_KEPT_BYTES);
        // Blobs of the largest size kept, equal but for their last byte: the worst case of a
        // comparison byte for byte, which reads each to its end.
        let blob = |last: u8| {
            let mut b = vec![0x5a; MOST_BYTES];
            *b.last_mut().unwrap() = last;
            b
        };
        for last in 0..12 {
            cache.remember(BlobKind::Cubin, &blob(last));
        }
        let miss = blob(255);
        let done = AtomicBool::new(false);
        let (mut locked, mut samples) = (0u64, 0u64);
        let start = Instant::now();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..16 {
                    assert!(cache.find(&miss).is_none());
                }
                done.store(true, Ordering::Release);
            });
            // How often the cache's lock is held, while the other thread looks the miss up.
            while !done.load(Ordering::Acquire) {
                samples += 1;
                locked += u64::from(cache.kept.try_lock().is_err());
            }
        });
        let share = locked as f64 / samples.max(1) as f64;
        println!(
            "16 misses among 12 blobs of 4 MiB: {:.0?}, the lock held at {:.1}% of {samples} \
             samples",
            start.elapsed(),
            share * 100.0
        );
        assert!(
            share < 0.25,
            "the cache's lock was held at {:.0}% of the samples taken while a thread looked up \
             misses: a miss must not compare bytes under it",
            share * 100.0
        );
        assert!(cache.find(&blob(3)).is_some());
    }
}
