//! Load everywhere: the demo model on every device, one library load against a load per device.

use std::hint::black_box;

use atlas_registry::{AtlasLibrary, AtlasRegistry, device_count};
use criterion::{BenchmarkId, Criterion};

use crate::paired::timed;
use crate::{PairedCriterion, demo_ptx, ok, paired};

/// Loading the demo model for every device (and unloading it): one `AtlasLibrary` load
/// plus a registry per device, against one `AtlasRegistry::load` per device; each timed on its own
/// and, in `load_all_devices_paired`, as the ratio one_library / registry_per_device pair by pair.
pub(crate) fn load_all_devices(c: &mut Criterion, pc: &mut PairedCriterion) {
    let devices = ok(device_count(), "device_count");
    // One load for every device: the PTX, which each device JIT-compiles for itself (the devices
    // of one machine need not share an architecture).
    let blobs = demo_ptx();
    let ordinals: Vec<usize> = (0..devices).collect();
    for &ordinal in &ordinals {
        ok(atlas_registry::host(ordinal), "creating the device's host");
    }
    let per_device = || {
        let registries: Vec<_> = ordinals
            .iter()
            .map(|&o| ok(AtlasRegistry::load(o, blobs), "AtlasRegistry::load"))
            .collect();
        black_box(&registries);
    };
    let one_library = || {
        let library = ok(AtlasLibrary::load(blobs), "AtlasLibrary::load");
        let registries: Vec<_> = ordinals
            .iter()
            .map(|&o| ok(library.registry(o), "AtlasLibrary::registry"))
            .collect();
        black_box(&registries);
    };
    let id = format!("{devices}_gpus");
    let mut group = c.benchmark_group("load_all_devices");
    group.bench_function(BenchmarkId::new(&id, "registry_per_device"), |b| {
        b.iter(per_device)
    });
    group.bench_function(BenchmarkId::new(&id, "one_library"), |b| {
        b.iter(one_library)
    });
    group.finish();
    let mut group = pc.benchmark_group("load_all_devices_paired");
    group.sampling_mode(paired::SAMPLING);
    let mut library_first = false;
    group.bench_function(BenchmarkId::new(&id, "one_library"), |b| {
        b.iter_custom(|iters| {
            paired::pairs(iters, &mut library_first, |library_side| {
                if library_side {
                    timed(one_library)
                } else {
                    timed(per_device)
                }
            })
        })
    });
    group.finish();
}
