//! The capture record's protocol (`src/device/capture/record.rs`), compiled here against `loom`'s
//! atomics, mutex and condition variable and checked in every interleaving of its threads (up to
//! a bound of preemptions): a launch made through a capture is held by that capture's graph and no
//! other, whatever other captures begin and end meanwhile; a free that would break a capture waits
//! for it and is made exactly once; a free that synchronizes a context is never made while a
//! capture of that context is in progress, holds off only that context's captures, and deadlocks
//! nothing.
//!
//! `cargo test -p atlas-registry --test capture_model` (a few seconds). `LOOM_MAX_PREEMPTIONS`
//! widens the bound (default here: 3).

#![allow(dead_code)] // the record's functions the models do not call

/// What the record is written against: `loom`'s types, where the crate uses the standard library's.
mod sync {
    pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard, atomic};
    pub(crate) use loom::thread;
}

#[path = "../src/device/capture/record.rs"]
mod record;

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use loom::sync::{Condvar, Mutex};
use loom::thread;
use record::{Captures, Conflict, Hold, Lookup, Record, StreamKey};

/// Two contexts, as addresses.
const CONTEXT_0: usize = 0x1000;
const CONTEXT_1: usize = 0x2000;

/// A free in the model: which one it is.
struct Free(usize);

/// A record, and what the models watch.
struct World {
    state: AtomicU64,
    record: Mutex<Record<Free>>,
    synced: Condvar,
    /// How often each free was made.
    made: [AtomicUsize; 4],
    /// Captures of context 0 in progress, as their threads see them.
    active_0: AtomicUsize,
    /// Whether a free is synchronizing context 0 now.
    syncing_0: AtomicBool,
}

impl World {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            state: AtomicU64::new(0),
            record: Mutex::new(Record::new()),
            synced: Condvar::new(),
            made: Default::default(),
            active_0: AtomicUsize::new(0),
            syncing_0: AtomicBool::new(false),
        })
    }

    fn captures(&self) -> Captures<'_, Free> {
        Captures::new(&self.state, &self.record, &self.synced)
    }

    /// Makes a free the record handed out; one of context 0 is a synchronize, which no capture of
    /// context 0 may overlap.
    fn make(&self, free: &Free, synchronizes_0: bool) {
        if synchronizes_0 {
            self.syncing_0.store(true, Ordering::SeqCst);
            assert_eq!(
                self.active_0.load(Ordering::SeqCst),
                0,
                "a synchronize ran during a capture of its context"
            );
            thread::yield_now();
            self.syncing_0.store(false, Ordering::SeqCst);
        }
        self.made[free.0].fetch_add(1, Ordering::SeqCst);
    }

    fn made(&self, free: usize) -> usize {
        self.made[free].load(Ordering::SeqCst)
    }
}

/// A launch on `stream`, as `launch::held::enqueue` makes it: the word first, then the record.
/// Returns the graph that holds `hold`, if any.
fn launch(captures: Captures<'_, Free>, stream: StreamKey, hold: Hold) -> Option<u64> {
    if !captures.watch().capturing() {
        return None;
    }
    match captures.recorded_graph(stream) {
        Lookup::Graph(graph) => {
            let again = captures.hold(graph, vec![hold], false);
            assert!(again.is_empty(), "each hold is new");
            Some(graph)
        }
        Lookup::NoCapture | Lookup::NotRecorded => None,
    }
}

fn hold() -> Hold {
    Arc::new(0u8)
}

fn model(body: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(body);
}

/// A launch made through a capture from another thread (after the capture began, before it ends:
/// what `&Capture` guarantees) is held by that capture's graph, while a third thread begins,
/// launches into and ends a capture of another stream.
#[test]
fn a_launch_through_a_capture_is_held_by_its_graph_alone() {
    model(|| {
        let world = World::new();
        let (s1, s2) = (StreamKey(1), StreamKey(2));
        world.captures().began(s1, CONTEXT_0, None);
        let through = {
            let world = Arc::clone(&world);
            thread::spawn(move || launch(world.captures(), s1, hold()))
        };
        let other = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let captures = world.captures();
                captures.began(s2, CONTEXT_1, None);
                let graph = launch(captures, s2, hold());
                let (keep, ready) = captures.ended(s2);
                assert!(ready.is_empty());
                assert_eq!(keep.len(), 1, "the other capture keeps its own launch");
                graph
            })
        };
        let graph = through.join().unwrap();
        let other_graph = other.join().unwrap();
        assert!(graph.is_some(), "the launch found its capture");
        assert_ne!(graph, other_graph);
        let (keep, ready) = world.captures().ended(s1);
        assert!(ready.is_empty());
        assert_eq!(keep.len(), 1, "the graph keeps the launch made through it");
        assert!(!world.captures().watch().capturing());
    });
}

/// A free on a stream being captured (and one from the capturing thread) waits for the capture to
/// end and is made then, exactly once, by the thread that ends it; a free from another thread that
/// breaks nothing is made at once.
#[test]
fn frees_that_would_break_a_capture_wait_for_it_and_are_made_once() {
    model(|| {
        let world = World::new();
        let s = StreamKey(1);
        let captures = world.captures();
        captures.began(s, CONTEXT_0, None);
        // From the capturing thread: `cuMemFree` would invalidate its capture.
        assert!(captures.free(Free(0), Conflict::ThisThread).is_none());
        let other = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let captures = world.captures();
                // On the captured stream: waits, unless the capture ended already.
                if let Some(now) = captures.free(Free(1), Conflict::Stream(s)) {
                    assert!(
                        !captures.is_recorded(s),
                        "made during the capture of its stream"
                    );
                    world.make(&now.free, false);
                }
                // Another thread's `cuMemFree` breaks no capture of this one.
                let now = captures
                    .free(Free(2), Conflict::ThisThread)
                    .expect("made at once");
                world.make(&now.free, false);
            })
        };
        let (_, ready) = captures.ended(s);
        for now in ready {
            world.make(&now.free, false);
        }
        other.join().unwrap();
        for free in 0..3 {
            assert_eq!(world.made(free), 1, "free {free} made once");
        }
    });
}

/// A free that synchronizes context 0 races a capture of context 0 and one of context 1: it is
/// made once, never while context 0 is being captured; the capture of context 0 waits for it or
/// it waits for the capture; the capture of context 1 goes on regardless. A deadlock would fail
/// the model.
#[test]
fn a_synchronizing_free_and_the_captures_of_its_context_exclude_each_other() {
    model(|| {
        let world = World::new();
        let freeing = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                if let Some(now) = world.captures().free(Free(0), Conflict::Context(CONTEXT_0)) {
                    world.make(&now.free, true);
                    drop(now); // lets the captures of context 0 begin
                }
            })
        };
        let capturing_0 = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let captures = world.captures();
                let s = StreamKey(1);
                captures.began(s, CONTEXT_0, None);
                world.active_0.fetch_add(1, Ordering::SeqCst);
                assert!(
                    !world.syncing_0.load(Ordering::SeqCst),
                    "a capture began during a synchronize of its context"
                );
                world.active_0.fetch_sub(1, Ordering::SeqCst);
                let (_, ready) = captures.ended(s);
                for now in ready {
                    world.make(&now.free, true);
                }
            })
        };
        let captures = world.captures();
        captures.began(StreamKey(2), CONTEXT_1, None);
        let (_, ready) = captures.ended(StreamKey(2));
        assert!(
            ready.is_empty(),
            "context 1's capture holds back no free of context 0"
        );
        freeing.join().unwrap();
        capturing_0.join().unwrap();
        assert_eq!(world.made(0), 1, "the free was made once");
    });
}
