//! Events and stream order against the raw driver, as ratios pair by pair (see [`paired`]).
//!
//! `event_paired/record_wait/{raw,atlas}`: one side of a pair is a batch of [`RECORDS`] raw
//! `cuEventRecord` on one stream + `cuStreamWaitEvent` on another, then a synchronize of the
//! waiting stream; the other side is the same batch through `CudaEvent::record` and
//! `CudaStream::wait` (their context and capture checks included), also followed by the
//! synchronize. `raw` against itself is what the method reads when there is no difference.

use std::time::Duration;

use atlas_registry::{CudaEvent, CudaStream};
use criterion::BenchmarkId;

use crate::paired::{self, timed};
use crate::{Env, PairedCriterion, check, ok, sym};

/// Record + wait pairs per batch.
const RECORDS: usize = 256;

/// `CudaEvent::record` + `CudaStream::wait` against raw `cuEventRecord` + `cuStreamWaitEvent`.
pub(crate) fn events(c: &mut PairedCriterion, env: &Env) {
    let ctx = env.registry.ctx();
    let (producer, consumer) = (
        ok(CudaStream::new(ctx), "creating a stream"),
        ok(CudaStream::new(ctx), "creating a stream"),
    );
    let (raw_producer, raw_consumer) = (producer.raw(), consumer.raw());
    let record = sym!(env.cuda, cuEventRecord);
    let wait = sym!(env.cuda, cuStreamWaitEvent);
    let stream_sync = sym!(env.cuda, cuStreamSynchronize);
    // The raw side's event is an Atlas one too (its handle used raw): the same kind of event,
    // alive for the whole group.
    let raw_owner = ok(CudaEvent::new(ctx), "creating an event");
    let raw_event = raw_owner.raw();
    let event = std::cell::RefCell::new(ok(CudaEvent::new(ctx), "creating an event"));
    let sync = || {
        // SAFETY: the stream is live.
        check(unsafe { stream_sync(raw_consumer) }, "cuStreamSynchronize");
    };
    let raw = || {
        for _ in 0..RECORDS {
            // SAFETY: a live event and live streams of its context.
            unsafe {
                check(record(raw_event, raw_producer), "cuEventRecord");
                check(wait(raw_consumer, raw_event, 0), "cuStreamWaitEvent");
            }
        }
        sync();
    };
    let atlas = || {
        let mut event = event.borrow_mut();
        for _ in 0..RECORDS {
            ok(event.record(&producer), "record");
            ok(consumer.wait(&event), "wait");
        }
        sync();
    };
    let mut group = c.benchmark_group("event_paired");
    group.sampling_mode(paired::SAMPLING);
    group.measurement_time(Duration::from_secs(3));
    for (variant, other) in [("raw", &raw as &dyn Fn()), ("atlas", &atlas)] {
        let mut other_first = false;
        group.bench_function(BenchmarkId::new("record_wait", variant), |b| {
            b.iter_custom(|iters| {
                paired::pairs(iters, &mut other_first, |other_side| {
                    if other_side {
                        timed(other)
                    } else {
                        timed(&raw)
                    }
                })
            })
        });
    }
    group.finish();
}
