//! Bounds-checked little-endian reads, and the byte counts that refusals print.
//!
//! Every read of a blob goes through [`bytes_at`]: offsets and sizes come from the blob itself,
//! so they are `u64`s that may be anything, and an out-of-range read is a `None`, never a panic.

use std::fmt;

/// Why a blob is refused: the reason of [`AtlasError::InvalidModule`](crate::AtlasError).
/// Built only on the way out, so a blob that passes allocates nothing.
pub(super) type Check<T = ()> = Result<T, String>;

/// Why a blob is refused, by a check that decompresses part of it: [`Check`]'s, or a
/// [`Refusal::TooLarge`].
pub(in crate::code) type Refused<T = ()> = Result<T, Refusal>;

/// Why a blob is refused, where a compressed piece of it may be too large to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::code) enum Refusal {
    /// Its structure: [`Check`]'s reason, which becomes
    /// [`AtlasError::InvalidModule`](crate::AtlasError::InvalidModule)'s.
    Malformed(String),
    /// A compressed piece declares more bytes uncompressed than
    /// [`UNCOMPRESSED_LIMIT`](super::UNCOMPRESSED_LIMIT): what it is (empty until the container
    /// that holds it names it, [`Refusal::within`]) and what it declares. Becomes
    /// [`AtlasError::TooLargeToCheck`](crate::AtlasError::TooLargeToCheck).
    TooLarge {
        /// `fatbin entry 2 (ELF sm_90 at offset 560, zstd-compressed)`.
        what: String,
        /// The bytes it declares uncompressed.
        declared: u64,
    },
}

impl From<String> for Refusal {
    fn from(reason: String) -> Self {
        Self::Malformed(reason)
    }
}

impl Refusal {
    /// This refusal of a piece of `what` (`fatbin entry 2 (ELF sm_90 ...)`), said of `what`.
    #[cold]
    pub(super) fn within(self, what: &str) -> Self {
        match self {
            Self::Malformed(reason) => Self::Malformed(format!("{what}: {reason}")),
            Self::TooLarge {
                what: piece,
                declared,
            } if piece.is_empty() => Self::TooLarge {
                what: what.to_owned(),
                declared,
            },
            Self::TooLarge {
                what: piece,
                declared,
            } => Self::TooLarge {
                what: format!("{what}: {piece}"),
                declared,
            },
        }
    }
}

/// `len` bytes of `b` from `offset`, or `None` when any of them lies outside `b`.
#[inline]
pub(super) fn bytes_at(b: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    b.get(start..end)
}

#[inline]
fn array_at<const N: usize>(b: &[u8], at: u64) -> Option<[u8; N]> {
    bytes_at(b, at, N as u64)?.try_into().ok()
}

#[inline]
pub(super) fn u8_at(b: &[u8], at: u64) -> Option<u8> {
    array_at::<1>(b, at).map(|[x]| x)
}

#[inline]
pub(super) fn u16_at(b: &[u8], at: u64) -> Option<u16> {
    array_at(b, at).map(u16::from_le_bytes)
}

#[inline]
pub(super) fn u32_at(b: &[u8], at: u64) -> Option<u32> {
    array_at(b, at).map(u32::from_le_bytes)
}

#[inline]
pub(super) fn u64_at(b: &[u8], at: u64) -> Option<u64> {
    array_at(b, at).map(u64::from_le_bytes)
}

/// The `N` bytes of `record` at `at`, for records of a fixed size read once with [`bytes_at`]: with
/// constant offsets inside the record the compiler drops every check. Zeros outside it (never, for
/// the records and offsets this crate uses).
#[inline(always)]
pub(super) fn field<const R: usize, const N: usize>(record: &[u8; R], at: usize) -> [u8; N] {
    record
        .get(at..)
        .and_then(<[u8]>::first_chunk)
        .copied()
        .unwrap_or([0; N])
}

/// `offset + size <= limit`, in checked arithmetic.
#[inline]
pub(super) fn fits(offset: u64, size: u64, limit: u64) -> bool {
    offset.checked_add(size).is_some_and(|end| end <= limit)
}

/// The first two of `ranges` (`(offset, size)` each; empty ones left out) whose bytes overlap, by
/// their places in `ranges`, the lower first. Ranges in file order, as toolchains write them, take
/// one pass and no allocation ([`InOrder`]); others are sorted (n log n).
pub(super) fn overlapping(
    ranges: impl Iterator<Item = (u64, u64)> + Clone,
) -> Option<(usize, usize)> {
    let mut scan = InOrder::default();
    for (i, (offset, size)) in ranges.clone().enumerate() {
        if scan.push(i, offset, size).is_some() {
            break;
        }
    }
    match scan.end() {
        Scanned::Apart => None,
        Scanned::Overlap(first, second) => Some((first, second)),
        Scanned::Unordered => sorted_overlapping(ranges),
    }
}

/// What [`InOrder`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scanned {
    /// No two ranges overlap.
    Apart,
    /// Ranges `.0` and `.1` overlap (the first such pair).
    Overlap(usize, usize),
    /// A range starts before the one given before it: only sorting can tell.
    Unordered,
}

/// The one-pass scan of [`overlapping`], fed a range at a time (so a pass over a table that
/// reads the ranges anyway can scan them too): the first overlap of ranges in file order, or that
/// they are not in order.
#[derive(Debug, Default)]
pub(super) struct InOrder {
    /// The last non-empty range: its place, start and end.
    last: Option<(usize, u64, u64)>,
    found: Option<Scanned>,
}

impl InOrder {
    /// Takes range `i`, `size` bytes at `offset` (empty ones are left out); what the scan found,
    /// once it has found something.
    #[inline]
    pub(super) fn push(&mut self, i: usize, offset: u64, size: u64) -> Option<Scanned> {
        if size == 0 || self.found.is_some() {
            return self.found;
        }
        if let Some((j, start, end)) = self.last {
            if offset < start {
                self.found = Some(Scanned::Unordered);
            } else if offset < end {
                // No overlap before, so every earlier range ends by `end`.
                self.found = Some(Scanned::Overlap(j, i));
            }
        }
        self.last = Some((i, offset, offset.saturating_add(size)));
        self.found
    }

    /// What the scan found of all the ranges pushed.
    pub(super) fn end(&self) -> Scanned {
        self.found.unwrap_or(Scanned::Apart)
    }
}

/// [`overlapping`] of ranges out of order: sorted by start, each against the furthest end before.
#[cold]
fn sorted_overlapping(ranges: impl Iterator<Item = (u64, u64)>) -> Option<(usize, usize)> {
    let mut spans: Vec<(u64, u64, usize)> = ranges
        .enumerate()
        .filter(|(_, (_, size))| *size > 0)
        .map(|(i, (offset, size))| (offset, offset.saturating_add(size), i))
        .collect();
    spans.sort_unstable();
    let mut reach: Option<(u64, usize)> = None;
    for (start, end, i) in spans {
        if let Some((furthest, j)) = reach {
            if start < furthest {
                return Some((i.min(j), i.max(j)));
            }
            if end <= furthest {
                continue;
            }
        }
        reach = Some((end, i));
    }
    None
}

/// A byte count with thousands separators (`5,600`), as people read sizes.
#[derive(Clone, Copy)]
pub(super) struct Size(pub(super) u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.0.to_string();
        for (i, digit) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                f.write_str(",")?;
            }
            write!(f, "{digit}")?;
        }
        Ok(())
    }
}

/// The refusal for `size` bytes at `offset` that do not fit in the `len`-byte `whole`.
pub(super) fn past_end(what: &str, offset: u64, size: u64, len: usize, whole: &str) -> String {
    format!(
        "{what}: offset {offset} + size {size} is past the end of the {}-byte {whole} \
         (truncated or corrupt)",
        Size(len as u64)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_checked() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(u16_at(&b, 0), Some(0x0201));
        assert_eq!(u64_at(&b, 1), Some(0x0908_0706_0504_0302));
        assert_eq!(u64_at(&b, 2), None);
        assert_eq!(u32_at(&b, u64::MAX), None);
        assert_eq!(bytes_at(&b, 9, 0), Some(&[][..]));
        assert_eq!(bytes_at(&b, 10, 0), None);
        assert_eq!(bytes_at(&b, 1, u64::MAX), None);
        assert!(fits(4, 5, 9) && !fits(4, 6, 9) && !fits(u64::MAX, 2, u64::MAX));
    }

    #[test]
    fn overlaps_are_found_in_any_order() {
        let find = |ranges: &[(u64, u64)]| overlapping(ranges.iter().copied());
        assert_eq!(find(&[]), None);
        assert_eq!(find(&[(0, 4), (4, 4), (8, 0), (8, 1)]), None);
        assert_eq!(find(&[(0, 4), (3, 4)]), Some((0, 1)));
        assert_eq!(find(&[(0, 4), (0, 0), (4, 4), (4, 4)]), Some((2, 3)));
        assert_eq!(find(&[(8, 4), (0, 4), (4, 4)]), None);
        assert_eq!(find(&[(8, 4), (0, 4), (4, 5)]), Some((0, 2)));
        assert_eq!(find(&[(100, 1), (0, 50), (10, 5)]), Some((1, 2)));
    }

    #[test]
    fn sizes_have_thousands_separators() {
        for (n, text) in [
            (0, "0"),
            (999, "999"),
            (5600, "5,600"),
            (123_456, "123,456"),
            (1_234_567, "1,234,567"),
        ] {
            assert_eq!(Size(n).to_string(), text);
        }
    }
}
