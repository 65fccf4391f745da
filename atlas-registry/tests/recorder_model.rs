//! The flight recorder's ring (`src/flight_recorder/ring.rs`), compiled here against `loom`'s
//! atomics and checked in every interleaving of its threads (up to a bound of preemptions): two
//! writers meeting in one slot and a reader never yield a torn record, and a slot never goes back
//! to an older record; a record withdrawn after it was written is never read.
//!
//! `cargo test -p atlas-registry --test recorder_model` (a few seconds). `LOOM_MAX_PREEMPTIONS`
//! widens the bound (default here: 3).

#![allow(dead_code)] // the ring's functions the models do not call

/// What the ring is written against: `loom`'s types, where the crate uses the standard library's.
mod sync {
    pub(crate) use loom::sync::atomic;
}

#[path = "../src/flight_recorder/ring.rs"]
mod ring;

use std::sync::Arc;

use loom::thread;
use ring::Ring;

/// Words a record has in the models: enough to tear, few enough to explore every interleaving.
const WORDS: usize = 2;

/// Every word of record `sequence`: a torn record mixes two of them.
fn words_of(sequence: u64) -> [u64; WORDS] {
    std::array::from_fn(|i| sequence * 100 + i as u64)
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// Checks that `read` is a whole record of one of `written`.
fn whole(read: Option<(u64, [u64; WORDS])>, written: &[u64]) {
    if let Some((sequence, words)) = read {
        assert!(
            written.contains(&sequence),
            "record {sequence} was never written"
        );
        assert_eq!(words, words_of(sequence), "torn record {sequence}");
    }
}

#[test]
fn two_writers_of_one_slot_and_a_reader_never_tear_a_record() {
    model(|| {
        // One slot: records 1 and 2 meet in it.
        let ring = Arc::new(Ring::<1, WORDS>::new());
        let writers: Vec<_> = [1u64, 2]
            .into_iter()
            .map(|sequence| {
                let ring = Arc::clone(&ring);
                thread::spawn(move || ring.write(sequence, &words_of(sequence)))
            })
            .collect();
        whole(ring.read(0), &[1, 2]);
        for writer in writers {
            writer.join().unwrap();
        }
        let last = ring.read(0);
        whole(last, &[1, 2]);
        let kept = last.map(|(sequence, _)| sequence);
        // Record 2 is kept unless it arrived while record 1 was being written (given up then);
        // record 1 never replaces record 2.
        match kept {
            Some(2) => {}
            Some(1) => assert_eq!(ring.given_up(), 1, "record 2 was given up"),
            other => panic!("after both writers the slot holds {other:?}"),
        }
    });
}

#[test]
fn a_reader_during_a_write_sees_the_old_record_or_none() {
    model(|| {
        let ring = Arc::new(Ring::<2, WORDS>::new());
        ring.write(1, &words_of(1));
        let writer = {
            let ring = Arc::clone(&ring);
            thread::spawn(move || ring.write(3, &words_of(3)))
        };
        whole(ring.read(1), &[1, 3]);
        writer.join().unwrap();
        let (sequence, words) = ring.read(1).expect("a complete record");
        assert_eq!((sequence, words), (3, words_of(3)));
        assert_eq!(ring.given_up(), 0);
    });
}

#[test]
fn a_withdrawn_record_is_never_read_and_frees_its_slot() {
    model(|| {
        let ring = Arc::new(Ring::<2, WORDS>::new());
        ring.write(1, &words_of(1));
        // Record 3 opens over record 1 (a launch's record, written before the driver call) and is
        // withdrawn (the driver refused the launch) while a reader looks.
        let writer = {
            let ring = Arc::clone(&ring);
            thread::spawn(move || {
                let open = ring.open(3, &words_of(3)).expect("the slot is free");
                drop(open);
            })
        };
        whole(ring.read(1), &[1]);
        writer.join().unwrap();
        assert_eq!(ring.read(1), None, "a withdrawn record is no record");
        // The slot takes the next record, and that one stands.
        ring.write(5, &words_of(5));
        assert_eq!(ring.read(1), Some((5, words_of(5))));
        assert_eq!(ring.given_up(), 0);
    });
}
