//! The protocol behind Atlas's record of its captures, free of driver calls: one atomic word that
//! every launch reads, one lock around the captures in progress, what each capture's graph keeps,
//! and the frees that wait for a capture to end.
//!
//! The word holds the number of captures in progress (low 32 bits) and of captures begun so far
//! (high 32 bits, wrapping). It is written only under the lock, after the list changed, so a
//! launch that reads "none in progress" takes no lock at all, and one that reads a capture finds
//! it in the list. That a launch enqueued while a capture of its stream is in progress is seen
//! there follows from the types: a capture begins and ends only through `&mut CudaStream` (or
//! the [`Capture`](crate::Capture) that borrows it), so no launch on that stream overlaps either.
//!
//! Everything here goes through `super::sync`: the standard library's types in the crate, and
//! `loom`'s in `tests/capture_model.rs`, which includes this file and checks the protocol in every
//! interleaving of a few threads.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, PoisonError};

use super::sync::atomic::{AtomicU64, Ordering};
use super::sync::thread::{self, ThreadId};
use super::sync::{Condvar, Mutex, MutexGuard};

/// Captures in progress, in the low 32 bits of the word.
const IN_PROGRESS: u64 = u32::MAX as u64;
/// One capture begun, in the high 32 bits.
const ONE_BEGUN: u64 = 1 << 32;

/// A stream handle as a key: compared, never dereferenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamKey(pub(crate) usize);

/// A reference that keeps something alive for a graph: a registry (its modules stay loaded), an
/// allocation (its memory stays allocated). Only its life matters.
pub(crate) type Hold = Arc<dyn Send + Sync>;

/// What a graph keeps alive: each thing once, however many of its launches use it.
#[derive(Default)]
pub(crate) struct Keep {
    /// By the address of what is held.
    held: HashMap<usize, Hold, BuildHasherDefault<AddressHasher>>,
    /// Whether a launch with cluster dimensions or a cooperative launch was captured into the
    /// graph: its kernel nodes then carry attributes that argument updates check again.
    attributed: bool,
}

impl Keep {
    /// Everything `holds` keeps, added; what was already kept is given back, to be dropped by the
    /// caller.
    pub(crate) fn extend(&mut self, holds: Vec<Hold>, attributed: bool) -> Vec<Hold> {
        self.attributed |= attributed;
        let mut again = Vec::new();
        for hold in holds {
            let key = Arc::as_ptr(&hold).cast::<()>().addr();
            match self.held.entry(key) {
                std::collections::hash_map::Entry::Occupied(_) => again.push(hold),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(hold);
                }
            }
        }
        again
    }

    /// Whether an attributed launch (clusters, cooperative) was captured into the graph.
    pub(crate) fn attributed(&self) -> bool {
        self.attributed
    }

    /// How many things are kept.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

/// Hashes an address (the only key of a [`Keep`]) with one multiplication: addresses are distinct
/// and need no protection against chosen collisions, and every captured launch hashes a few.
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, address: usize) {
        self.0 = (address as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// What a free would break if it were made while a capture is in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Conflict {
    /// Nothing: it can be made at once.
    Nothing,
    /// The captures of the calling thread (`cuMemFree` from a capturing thread invalidates its
    /// captures; from another thread it does not).
    ThisThread,
    /// The capture of this stream (`cuMemFreeAsync` there would become a node of its graph).
    Stream(StreamKey),
    /// Every capture of this context (an address), and the calling thread's:
    /// `cuCtxSynchronize` invalidates every capture in progress in its context, whichever thread
    /// calls it and in every capture mode. While it runs, no capture of the context begins.
    Context(usize),
}

/// What a waiting free waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// The thread's last capture to end.
    Thread(ThreadId),
    /// The capture of the stream to end.
    Stream(StreamKey),
    /// The last capture of the context, and of the thread, to end.
    Context(usize, ThreadId),
}

/// One capture Atlas began: with `begin_capture`, or of a conditional node's body.
struct Capture {
    stream: StreamKey,
    /// The stream's context, as an address.
    context: usize,
    /// The thread that began it (Atlas captures in thread-local mode, so that thread also ends
    /// it, and the driver refuses that thread's unsafe calls meanwhile).
    thread: ThreadId,
    /// The driver's id of the capture (0 until read): a stream that joins the capture (waits for
    /// an event recorded on a capturing stream) reports the same id.
    id: u64,
    /// Atlas's number of the graph being built: a body's capture has its parent's.
    graph: u64,
    /// For a conditional node's body, the stream whose capture it belongs to.
    parent: Option<StreamKey>,
    /// What the graph will keep alive (gathered on the capture begun with `begin_capture`).
    keep: Keep,
}

/// The captures in progress and the frees that wait for them (`F`: a free, made by the caller).
pub(crate) struct Record<F> {
    captures: Vec<Capture>,
    waiting: Vec<(Until, F)>,
    /// The contexts being synchronized for a free now (one entry per free): no capture of them
    /// begins meanwhile.
    syncing: Vec<usize>,
    /// Graph numbers handed out so far.
    graphs: u64,
}

impl<F> Record<F> {
    /// No capture, no waiting free.
    pub(crate) const fn new() -> Self {
        Self {
            captures: Vec::new(),
            waiting: Vec::new(),
            syncing: Vec::new(),
            graphs: 0,
        }
    }

    fn capture(&self, stream: StreamKey) -> Option<&Capture> {
        self.captures.iter().find(|c| c.stream == stream)
    }

    fn thread_captures(&self, thread: ThreadId) -> bool {
        self.captures.iter().any(|c| c.thread == thread)
    }

    /// Whether what `until` waits for is still in progress.
    fn still(&self, until: Until) -> bool {
        match until {
            Until::Thread(thread) => self.thread_captures(thread),
            Until::Stream(stream) => self.capture(stream).is_some(),
            Until::Context(context, thread) => self
                .captures
                .iter()
                .any(|c| c.context == context || c.thread == thread),
        }
    }

    /// What `conflict` makes a free made now wait for, if anything is in progress.
    fn until(&self, conflict: Conflict) -> Option<Until> {
        let me = thread::current().id();
        let until = match conflict {
            Conflict::Nothing => return None,
            Conflict::ThisThread => Until::Thread(me),
            Conflict::Stream(stream) => Until::Stream(stream),
            Conflict::Context(context) => Until::Context(context, me),
        };
        self.still(until).then_some(until)
    }
}

/// A free handed out by the record, to be made now; for one that synchronizes a context, no
/// capture of that context begins until this is dropped (after the free was made).
pub(crate) struct Ready<'a, F> {
    /// The free.
    pub(crate) free: F,
    /// The context being synchronized, and the record to tell when it is done.
    syncing: Option<(usize, Captures<'a, F>)>,
}

impl<F> Drop for Ready<'_, F> {
    fn drop(&mut self) {
        if let Some((context, captures)) = self.syncing.take() {
            let mut record = captures.lock();
            if let Some(at) = record.syncing.iter().position(|&c| c == context) {
                record.syncing.swap_remove(at);
            }
            drop(record);
            captures.synced.notify_all();
        }
    }
}

/// What a launch reads before it is enqueued: whether a capture is in progress anywhere.
#[derive(Clone, Copy)]
pub(crate) struct Watch(u64);

impl Watch {
    /// Whether Atlas had a capture in progress somewhere.
    #[inline(always)]
    pub(crate) fn capturing(self) -> bool {
        self.0 & IN_PROGRESS != 0
    }
}

/// Where the graph of a stream's work is found.
pub(crate) enum Lookup {
    /// No capture of Atlas's is in progress anywhere.
    NoCapture,
    /// The stream's own capture, or a conditional body's, builds this graph.
    Graph(u64),
    /// Captures are in progress, none of them on this stream: the stream may have joined one
    /// (ask the driver for its capture id, then [`Captures::graph_with_id`]).
    NotRecorded,
}

/// The record as the crate uses it: its word, its lock, and the signal that a context's
/// synchronization for a free is over.
pub(crate) struct Captures<'a, F> {
    state: &'a AtomicU64,
    record: &'a Mutex<Record<F>>,
    synced: &'a Condvar,
}

impl<F> Clone for Captures<'_, F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F> Copy for Captures<'_, F> {}

impl<'a, F> Captures<'a, F> {
    /// The record made of `state` (0 at first), `record` and `synced`.
    pub(crate) const fn new(
        state: &'a AtomicU64,
        record: &'a Mutex<Record<F>>,
        synced: &'a Condvar,
    ) -> Self {
        Self {
            state,
            record,
            synced,
        }
    }

    fn lock(&self) -> MutexGuard<'a, Record<F>> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the word from the list, under the lock.
    fn publish(&self, record: &Record<F>, begun: bool) {
        let begun = if begun { ONE_BEGUN } else { 0 };
        let state = self.state.load(Ordering::Relaxed);
        let next = ((state & !IN_PROGRESS).wrapping_add(begun)) | record.captures.len() as u64;
        self.state.store(next, Ordering::Release);
    }

    /// Whether any capture is in progress: one atomic load.
    #[inline(always)]
    pub(crate) fn watch(&self) -> Watch {
        Watch(self.state.load(Ordering::Acquire))
    }

    /// Notes that the calling thread begins capturing `stream`, of `context` (an address): into a
    /// graph of its own, or, for a conditional node's body, into the graph `parent` is capturing.
    /// Recorded before the driver begins; waits while a free synchronizes the context (which
    /// would invalidate the capture), without holding the lock.
    pub(crate) fn began(&self, stream: StreamKey, context: usize, parent: Option<StreamKey>) {
        let mut record = self.lock();
        while record.syncing.contains(&context) {
            record = self
                .synced
                .wait(record)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let graph = match parent {
            None => {
                record.graphs += 1;
                record.graphs
            }
            Some(parent) => record.capture(parent).map_or(0, |c| c.graph),
        };
        record.captures.push(Capture {
            stream,
            context,
            thread: thread::current().id(),
            id: 0,
            graph,
            parent,
            keep: Keep::default(),
        });
        self.publish(&record, true);
    }

    /// Remembers the driver's id of the capture of `stream`, for the streams that join it.
    pub(crate) fn set_id(&self, stream: StreamKey, id: u64) {
        let mut record = self.lock();
        if let Some(capture) = record
            .captures
            .iter_mut()
            .rev()
            .find(|c| c.stream == stream)
        {
            capture.id = id;
        }
    }

    /// Notes that the capture of `stream` ended (or never began): returns what its graph keeps
    /// (nothing when Atlas began none) and the frees that waited for it, for the caller to make.
    pub(crate) fn ended(&self, stream: StreamKey) -> (Keep, Vec<Ready<'a, F>>) {
        if !self.watch().capturing() {
            return (Keep::default(), Vec::new());
        }
        let mut record = self.lock();
        // The latest entry: a second `began` on a stream already captured is the one undone.
        let Some(at) = record.captures.iter().rposition(|c| c.stream == stream) else {
            return (Keep::default(), Vec::new());
        };
        let capture = record.captures.remove(at);
        self.publish(&record, false);
        let mut ready = Vec::new();
        let mut at = 0;
        while at < record.waiting.len() {
            let until = record.waiting[at].0;
            if record.still(until) {
                at += 1;
                continue;
            }
            let (_, free) = record.waiting.swap_remove(at);
            let syncing = match until {
                Until::Context(context, _) => {
                    record.syncing.push(context);
                    Some((context, *self))
                }
                Until::Thread(_) | Until::Stream(_) => None,
            };
            ready.push(Ready { free, syncing });
        }
        (capture.keep, ready)
    }

    /// `free` back, to be made now, or `None` when it waits (in the record) for the capture it
    /// would break to end: [`ended`](Self::ended) then hands it out. A free that synchronizes a
    /// context holds off the captures of that context until the [`Ready`] is dropped.
    pub(crate) fn free(&self, free: F, conflict: Conflict) -> Option<Ready<'a, F>> {
        let context = match conflict {
            Conflict::Nothing => None,
            Conflict::ThisThread | Conflict::Stream(_) if !self.watch().capturing() => None,
            Conflict::ThisThread | Conflict::Stream(_) => {
                let mut record = self.lock();
                if let Some(until) = record.until(conflict) {
                    record.waiting.push((until, free));
                    return None;
                }
                None
            }
            // Always under the lock: the synchronization is recorded even when nothing captures.
            Conflict::Context(context) => {
                let mut record = self.lock();
                if let Some(until) = record.until(conflict) {
                    record.waiting.push((until, free));
                    return None;
                }
                record.syncing.push(context);
                Some((context, *self))
            }
        };
        Some(Ready {
            free,
            syncing: context,
        })
    }

    /// Which graph work enqueued on `stream` is captured into, as far as the record knows.
    pub(crate) fn recorded_graph(&self, stream: StreamKey) -> Lookup {
        if !self.watch().capturing() {
            return Lookup::NoCapture;
        }
        let record = self.lock();
        if record.captures.is_empty() {
            return Lookup::NoCapture;
        }
        match record.capture(stream) {
            Some(capture) => Lookup::Graph(capture.graph),
            None => Lookup::NotRecorded,
        }
    }

    /// The graph of the capture the driver calls `id`, when Atlas began it.
    pub(crate) fn graph_with_id(&self, id: u64) -> Option<u64> {
        if id == 0 {
            return None;
        }
        let record = self.lock();
        record.captures.iter().find(|c| c.id == id).map(|c| c.graph)
    }

    /// Adds `holds` to what graph `graph` keeps (`attributed`: they come from a launch with
    /// cluster dimensions or a cooperative one). What is not kept (already kept, or the capture
    /// is over) comes back, to be dropped by the caller after the lock: a hold dropped last
    /// frees what it holds, which takes the lock.
    #[must_use = "drop what comes back outside the lock"]
    pub(crate) fn hold(&self, graph: u64, holds: Vec<Hold>, attributed: bool) -> Vec<Hold> {
        let mut record = self.lock();
        match record
            .captures
            .iter_mut()
            .find(|c| c.graph == graph && c.parent.is_none())
        {
            Some(capture) => capture.keep.extend(holds, attributed),
            None => holds,
        }
    }

    /// Whether Atlas began the capture of `stream` with `begin_capture` (not a body's).
    pub(crate) fn is_begun(&self, stream: StreamKey) -> bool {
        self.watch().capturing()
            && self
                .lock()
                .capture(stream)
                .is_some_and(|c| c.parent.is_none())
    }

    /// Whether a fork or a body belongs to the capture of `stream`.
    pub(crate) fn has_branches(&self, stream: StreamKey) -> bool {
        self.watch().capturing()
            && self
                .lock()
                .captures
                .iter()
                .any(|c| c.parent == Some(stream))
    }

    /// Whether Atlas is capturing `stream` (begun by any thread).
    #[inline]
    pub(crate) fn is_recorded(&self, stream: StreamKey) -> bool {
        self.watch().capturing() && self.lock().capture(stream).is_some()
    }

    /// Whether the calling thread has a capture in progress that Atlas began.
    #[inline]
    pub(crate) fn thread_is_capturing(&self) -> bool {
        self.watch().capturing() && self.lock().thread_captures(thread::current().id())
    }
}
