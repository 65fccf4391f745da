//! Round trip: one `noop` launch and waiting for it, the latency a synchronous caller sees.

use criterion::{BenchmarkId, Criterion};

use crate::launches::Launches;
use crate::{Env, ok};

/// One `noop` launch and its synchronize, each way of [`Launches`].
pub(crate) fn roundtrip(c: &mut Criterion, env: &Env, cases: &mut [Launches<'_>]) {
    let registry = &env.registry;
    let raw_sync = env.syncer();
    let Some(noop) = cases.iter_mut().find(|case| case.kernel == "noop") else {
        return;
    };
    let mut group = c.benchmark_group("roundtrip");
    for (variant, launch) in noop.variants() {
        group.bench_function(BenchmarkId::new("noop", variant), |b| {
            b.iter(|| {
                launch();
                if variant == "raw" {
                    raw_sync();
                } else {
                    ok(
                        registry.stream_synchronize(registry.stream()),
                        "stream_synchronize",
                    );
                }
            })
        });
    }
    group.finish();
}
