//! The PTX texts and cubins this process has checked, so that a load of the same bytes again (a
//! model loaded once per device, or dropped and loaded again) neither checks them again nor reads
//! their kernels' layouts again.
//!
//! A blob is found by its bytes, compared in full with those kept: the check is a function of the
//! bytes alone, so equal bytes get the verdict they got before. Only blobs that passed are kept
//! (a refusal is made again, with its module's name), of at most [`MOST_BYTES`] each, and at most
//! [`MOST_KEPT`] of them and [`MOST_KEPT_BYTES`] in all, the oldest forgotten first. The bytes
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
/// How many bytes are kept in all.
const MOST_KEPT_BYTES: usize = 64 << 20;

/// A blob that passed its check: its bytes, what it is, and its kernels' layouts.
struct Passed {
    bytes: Arc<[u8]>,
    kind: BlobKind,
    layouts: Arc<BlobLayouts>,
}

struct Kept {
    blobs: VecDeque<Passed>,
    bytes: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    blobs: VecDeque::new(),
    bytes: 0,
});

/// What `blob` is, and its layouts, when bytes equal to it passed the check before.
pub(crate) fn find(blob: &[u8]) -> Option<(BlobKind, Arc<BlobLayouts>)> {
    if blob.len() > MOST_BYTES {
        return None;
    }
    let kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    kept.blobs
        .iter()
        .rev()
        .find(|passed| *passed.bytes == *blob)
        .map(|passed| (passed.kind, Arc::clone(&passed.layouts)))
}

/// The layouts of `blob`, a PTX text or cubin of `kind` that has just passed its check, read at
/// their first need from a copy; the copy is kept, so that a load of equal bytes is [`find`]'s.
/// `None` for any other kind.
pub(crate) fn remember(kind: BlobKind, blob: &[u8]) -> Option<Arc<BlobLayouts>> {
    if !matches!(kind, BlobKind::Ptx | BlobKind::Cubin) {
        return None;
    }
    let bytes: Arc<[u8]> = Arc::from(blob);
    let layouts = Arc::new(BlobLayouts::of_shared(Arc::clone(&bytes)));
    if blob.len() <= MOST_BYTES {
        let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        kept.bytes += blob.len();
        kept.blobs.push_back(Passed {
            bytes,
            kind,
            layouts: Arc::clone(&layouts),
        });
        while kept.blobs.len() > MOST_KEPT || kept.bytes > MOST_KEPT_BYTES {
            match kept.blobs.pop_front() {
                Some(oldest) => kept.bytes -= oldest.bytes.len(),
                None => break,
            }
        }
    }
    Some(layouts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests here, one at a time: the second fills the cache past its bounds.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn equal_bytes_are_found_with_the_same_layouts_other_bytes_are_not() {
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
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
    fn the_oldest_are_forgotten_past_the_bounds() {
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let cubin = atlas_kernels::cubin_for_model("demo", 90).unwrap()[0].1;
        // Distinct bytes, as far as the cache can tell: the same cubin with a different tail.
        let variant = |n: usize| {
            let mut b = cubin.to_vec();
            b.extend_from_slice(&n.to_le_bytes());
            b
        };
        for n in 0..MOST_KEPT + 8 {
            remember(BlobKind::Cubin, &variant(1_000_000 + n));
        }
        assert!(find(&variant(1_000_000)).is_none());
        assert!(find(&variant(1_000_000 + MOST_KEPT + 7)).is_some());
        let kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(kept.blobs.len() <= MOST_KEPT && kept.bytes <= MOST_KEPT_BYTES);
        assert_eq!(
            kept.bytes,
            kept.blobs.iter().map(|p| p.bytes.len()).sum::<usize>()
        );
    }
}
