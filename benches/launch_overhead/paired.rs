//! Paired benches: criterion measuring Atlas time / raw time, pair by pair.
//!
//! One iteration of a paired bench runs the raw baseline once and the Atlas path once, back to
//! back; the order alternates from one iteration to the next, so neither side always runs first.
//! A sample's value is the Atlas side's total time over the raw side's, both summed over the
//! sample's pairs, and criterion reports, as for any bench, the mean and median over the samples.
//! Both sides of a pair see the same machine state, so drift over seconds (clocks, other tenants,
//! the scheduler), which moves whole benches by more than the Atlas layer costs, cancels out.
//!
//! A ratio of sums, not a mean of the pairs' ratios: the mean of `a / b` over pairs exceeds
//! `mean(a) / mean(b)` by about the square of the raw times' relative spread (`1 / b` is convex),
//! so on a host whose batches vary by 5–8 % it reads 0.3–0.6 % high, and the raw batch paired
//! with itself (`…/raw`, the control) reads above 1. The ratio of the sums has no such bias.

use std::time::{Duration, Instant};

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{Criterion, SamplingMode, Throughput};

use crate::PairedCriterion;

/// The measurement of a paired bench: a ratio, produced only by `iter_custom` through [`pairs`].
pub(crate) struct PairedRatio;

impl Measurement for PairedRatio {
    type Intermediate = ();
    type Value = f64;

    fn start(&self) {
        unreachable!("a paired bench is measured with iter_custom and paired::pairs")
    }

    fn end(&self, _: ()) -> f64 {
        unreachable!("a paired bench is measured with iter_custom and paired::pairs")
    }

    fn add(&self, a: &f64, b: &f64) -> f64 {
        a + b
    }

    fn zero(&self) -> f64 {
        0.0
    }

    fn to_f64(&self, value: &f64) -> f64 {
        *value
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &RatioFormatter
    }
}

/// Shows a ratio as it is, with the unit `× raw`.
struct RatioFormatter;

impl ValueFormatter for RatioFormatter {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "× raw"
    }

    fn scale_throughputs(
        &self,
        _typical: f64,
        _: &Throughput,
        _values: &mut [f64],
    ) -> &'static str {
        "× raw"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ratio"
    }
}

/// The criterion of the paired groups: 30 samples of equal size (an iteration is two whole runs,
/// milliseconds for a batch of launches), a second of warm-up, five of measurement.
pub(crate) fn criterion() -> PairedCriterion {
    Criterion::default()
        .with_measurement(PairedRatio)
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
}

/// The sampling mode the paired groups use: every sample the same number of pairs.
pub(crate) const SAMPLING: SamplingMode = SamplingMode::Flat;

/// Runs `iters` pairs: `time(false)` runs and times the raw side, `time(true)` the Atlas side;
/// which goes first alternates (`atlas_first` carries the order over from one call to the next).
/// Returns `iters` times the ratio of the Atlas side's total time to the raw side's, so that
/// criterion's value per iteration is that ratio.
pub(crate) fn pairs(
    iters: u64,
    atlas_first: &mut bool,
    mut time: impl FnMut(bool) -> Duration,
) -> f64 {
    let (mut raw, mut atlas) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..iters {
        let first = time(*atlas_first);
        let second = time(!*atlas_first);
        let (raw_time, atlas_time) = if *atlas_first {
            (second, first)
        } else {
            (first, second)
        };
        *atlas_first = !*atlas_first;
        raw += raw_time;
        atlas += atlas_time;
    }
    iters as f64 * atlas.as_secs_f64() / raw.as_secs_f64()
}

/// How long one call of `run` takes.
pub(crate) fn timed(mut run: impl FnMut()) -> Duration {
    let start = Instant::now();
    run();
    start.elapsed()
}
