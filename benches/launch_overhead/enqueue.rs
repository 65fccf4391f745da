//! Enqueue: the host cost of enqueueing one launch, for each kernel and each way of
//! [`Launches`], timed on its own (`enqueue`) and as ratios to raw pair by pair
//! (`enqueue_paired`).

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};

use crate::launches::Launches;
use crate::{BATCH, Env, PairedCriterion, paired};

/// Times one batch of `launches` launches, after waiting for the stream to drain (not timed), so
/// the launch queue never fills and never stalls the host.
fn time_batch(sync: &impl Fn(), launch: &mut dyn FnMut(), launches: u64) -> Duration {
    sync();
    let start = Instant::now();
    for _ in 0..launches {
        launch();
    }
    start.elapsed()
}

/// Enqueue timing convention: one criterion iteration is ONE launch, so criterion reports the host
/// time of enqueueing one launch directly. The `iters` launches go out in batches of [`BATCH`]
/// (the last one may be shorter), each timed by [`time_batch`].
fn time_enqueues(iters: u64, sync: &impl Fn(), launch: &mut dyn FnMut()) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let batch = left.min(BATCH);
        total += time_batch(sync, launch, batch);
        left -= batch;
    }
    sync();
    total
}

/// Absolute: the host time of enqueueing one launch, each kernel, each way.
pub(crate) fn enqueue(c: &mut Criterion, env: &Env, cases: &mut [Launches<'_>]) {
    let sync = env.syncer();
    let mut group = c.benchmark_group("enqueue");
    for case in cases {
        let kernel = case.kernel;
        for (variant, launch) in case.variants() {
            group.bench_function(BenchmarkId::new(kernel, variant), |b| {
                b.iter_custom(|iters| time_enqueues(iters, &sync, launch))
            });
        }
    }
    group.finish();
}

/// Paired: Atlas / raw for a batch of [`BATCH`] launches against a batch of raw
/// ones, pair by pair (see [`paired`]). `…/raw` pairs the raw batch with itself: it shows what
/// the method reads when there is no difference.
pub(crate) fn enqueue_paired(c: &mut PairedCriterion, env: &Env, cases: &mut [Launches<'_>]) {
    let sync = env.syncer();
    let mut group = c.benchmark_group("enqueue_paired");
    group.sampling_mode(paired::SAMPLING);
    for case in cases {
        let kernel = case.kernel;
        let [(_, raw), rest @ ..] = case.variants();
        let mut bench = |variant: &str, mut atlas: Option<&mut (dyn FnMut() + '_)>| {
            let mut atlas_first = false;
            group.bench_function(BenchmarkId::new(kernel, variant), |b| {
                b.iter_custom(|iters| {
                    paired::pairs(iters, &mut atlas_first, |atlas_side| {
                        match atlas.as_deref_mut() {
                            Some(atlas) if atlas_side => time_batch(&sync, atlas, BATCH),
                            _ => time_batch(&sync, &mut *raw, BATCH),
                        }
                    })
                })
            });
        };
        bench("raw", None);
        for (variant, atlas) in rest {
            bench(variant, Some(atlas));
        }
    }
    group.finish();
    sync();
}
