//! The ring of one context's most recent launches: fixed slots of plain words, written without a
//! lock or an allocation by any number of threads, read (rarely) while they write.
//!
//! Each launch takes its device's next sequence number (one atomic increment, made by the caller)
//! and writes its record into slot `sequence % len` (a power of two: the low bits). A slot is a
//! seqlock of its own: its stamp holds the sequence number of the record in it (shifted left by
//! two) and two low bits, "being written" and "withdrawn". A writer takes the slot by one
//! compare-and-swap from a complete (or withdrawn), older record to its own number with the first
//! bit set, writes the words, and ends with one release store of the stamp: its number alone once
//! the record stands, or with the "withdrawn" bit when it does not (a launch's record is written
//! before the driver call, while what it is made of is in cache, and stands only when the driver
//! accepts the launch). A reader loads the stamp, the words and the stamp again, and keeps the
//! words only when both stamps are the same complete record: since stamps only grow, the same
//! stamp twice means no writer came in between, so no record is ever read torn.
//!
//! Two writers meet in one slot only when one of them is preempted, or its launch still in the
//! driver, while `len` more launches are recorded. The later one then gives its record up rather than wait (the ring counts it), and
//! a record older than the one in the slot is given up too: a slot never goes back in time.
//!
//! Every word is an atomic accessed with relaxed ordering, ordered by the stamp's
//! acquire/release and two fences (as in Boehm's "Can seqlocks get along with programming
//! language memory models?"), so a read racing a write is no data race. Everything here goes
//! through `super::sync`: the standard library's atomics in the crate, and `loom`'s in
//! `tests/recorder_model.rs`, which includes this file and checks the protocol in every
//! interleaving of a few threads.

use super::sync::atomic::{AtomicU64, Ordering, fence};

/// The words of one record, besides its stamp.
pub(crate) const WORDS: usize = 15;

/// The stamp's "being written" bit.
const WRITING: u64 = 1;

/// The stamp's "withdrawn" bit: the record's launch was refused, and it is no record.
const WITHDRAWN: u64 = 2;

/// How far a stamp's sequence number is shifted, past the two bits.
const STAMP_SHIFT: u32 = 2;

/// One record: its stamp and words, a cache line pair of its own so that writers of neighbouring
/// slots never share a line.
#[repr(align(128))]
struct Slot<const W: usize> {
    /// 0 for never written; else the record's sequence number shifted left by [`STAMP_SHIFT`],
    /// with [`WRITING`] set while the record is open and [`WITHDRAWN`] once withdrawn.
    stamp: AtomicU64,
    words: [AtomicU64; W],
}

impl<const W: usize> Slot<W> {
    fn new() -> Self {
        Self {
            stamp: AtomicU64::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// A fixed ring of `N` records (a power of two) of `W` words (the recorder's are [`WORDS`]; the
/// model checks fewer). The slots are the ring's own, not behind a pointer: a record's slot is
/// found from the ring's address and its number, with no load in between.
pub(crate) struct Ring<const N: usize, const W: usize = WORDS> {
    slots: [Slot<W>; N],
    /// Records given up because their slot was taken (see the module's documentation).
    given_up: AtomicU64,
}

impl<const N: usize, const W: usize> Ring<N, W> {
    /// A ring of `N` empty slots. `N` is a power of two: a record's slot is its sequence number
    /// masked, not divided (a division costs more than the rest of a record's write).
    pub(crate) fn new() -> Self {
        const { assert!(N.is_power_of_two()) };
        Self {
            slots: std::array::from_fn(|_| Slot::new()),
            given_up: AtomicU64::new(0),
        }
    }

    /// How many slots the ring has.
    pub(crate) fn len(&self) -> usize {
        N
    }

    /// Writes record `sequence` (never 0, never reused) into its slot, complete at once; gives it
    /// up when the slot is being written by another thread or holds a newer record.
    #[inline]
    pub(crate) fn write(&self, sequence: u64, words: &[u64; W]) {
        if let Some(open) = self.open(sequence, words) {
            open.stand();
        }
    }

    /// Takes record `sequence`'s slot (never 0, never reused) and writes the words while the
    /// stamp says "being written": the record is read only once [`Open::stand`] completes it.
    /// `None` when the record is given up (the slot is being written by another thread or holds
    /// a newer record).
    #[inline(always)]
    pub(crate) fn open(&self, sequence: u64, words: &[u64; W]) -> Option<Open<'_, W>> {
        // `N` is a power of two.
        let slot = &self.slots[(sequence as usize) & (N - 1)];
        let mine = sequence << STAMP_SHIFT;
        let mut seen = slot.stamp.load(Ordering::Relaxed);
        loop {
            if seen & WRITING != 0 || seen >= mine {
                self.give_up();
                return None;
            }
            // Acquire: the previous writer's words are ordered before this writer's.
            match slot.stamp.compare_exchange_weak(
                seen,
                mine | WRITING,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        // The "being written" stamp is ordered before every word written below: a reader that
        // sees one of them sees that stamp (or a later one) when it loads the stamp again.
        fence(Ordering::Release);
        for (word, &value) in slot.words.iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
        Some(Open { slot, mine })
    }

    #[cold]
    fn give_up(&self) {
        self.given_up.fetch_add(1, Ordering::Relaxed);
    }

    /// How many records were given up so far.
    pub(crate) fn given_up(&self) -> u64 {
        self.given_up.load(Ordering::Relaxed)
    }

    /// The record in slot `index` as `(sequence, words)`: `None` when the slot is empty or a
    /// writer is in it (a torn read is never returned).
    pub(crate) fn read(&self, index: usize) -> Option<(u64, [u64; W])> {
        let slot = &self.slots[index];
        let before = slot.stamp.load(Ordering::Acquire);
        if before == 0 || before & (WRITING | WITHDRAWN) != 0 {
            return None;
        }
        let words = std::array::from_fn(|i| slot.words[i].load(Ordering::Relaxed));
        // Every word read above is ordered before the stamp read below: a word of a later writer
        // makes that writer's stamp (or a later one) visible here.
        fence(Ordering::Acquire);
        let after = slot.stamp.load(Ordering::Relaxed);
        (after == before).then_some((before >> STAMP_SHIFT, words))
    }

    /// Every complete record, newest first; a slot being written is read again a few times and
    /// then left out.
    pub(crate) fn records(&self) -> Vec<(u64, [u64; W])> {
        let mut found: Vec<_> = (0..N)
            .filter_map(|index| (0..4).find_map(|_| self.read(index)))
            .collect();
        found.sort_unstable_by_key(|&(sequence, _)| std::cmp::Reverse(sequence));
        found
    }
}

/// A record written into its slot whose stamp still says "being written" (see [`Ring::open`]):
/// [`stand`](Self::stand) completes it; dropped, it is withdrawn. Either way the slot is free for
/// a newer record, and a withdrawn one is never read.
pub(crate) struct Open<'a, const W: usize> {
    slot: &'a Slot<W>,
    mine: u64,
}

impl<const W: usize> Open<'_, W> {
    /// Completes the record: readers take it from now on.
    #[inline(always)]
    pub(crate) fn stand(self) {
        // Release: every word is ordered before the stamp a reader checks them against.
        self.slot.stamp.store(self.mine, Ordering::Release);
        std::mem::forget(self);
    }
}

impl<const W: usize> Drop for Open<'_, W> {
    fn drop(&mut self) {
        // Release, as in `stand`: the next writer's acquire of the slot orders these words first.
        self.slot
            .stamp
            .store(self.mine | WITHDRAWN, Ordering::Release);
    }
}
