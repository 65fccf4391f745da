//! Lookup: finding `elementwise::scale` in the loaded module, each way there is.

use std::hint::black_box;
use std::ptr::null_mut;

use atlas_registry::FunctionCache;
use atlas_sys::CUfunction;
use criterion::{BenchmarkId, Criterion};

use crate::{Env, check, ok, sym};

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");

/// Each way of finding `elementwise::scale`, timed per lookup.
pub(crate) fn lookup(c: &mut Criterion, env: &Env) {
    let get_function = sym!(env.cuda, cuModuleGetFunction);
    let registry = &env.registry;
    let module = ok(registry.raw_module("elementwise"), "raw_module elementwise");
    let mut group = c.benchmark_group("lookup");
    group.bench_function(BenchmarkId::new("scale", "raw"), |b| {
        b.iter(|| {
            let mut func: CUfunction = null_mut();
            // SAFETY: the module is loaded while the registry lives, the name is NUL-terminated,
            // `func` is a live out-pointer, and the module's context is current.
            let status =
                unsafe { get_function(&mut func, black_box(module), black_box(c"scale").as_ptr()) };
            check(status, "cuModuleGetFunction");
            func
        })
    });
    group.bench_function(BenchmarkId::new("scale", "function_cached"), |b| {
        b.iter(|| {
            ok(
                registry.function_cached(black_box("elementwise"), black_box("scale")),
                "function_cached",
            )
        })
    });
    group.bench_function(BenchmarkId::new("scale", "raw_function_cached"), |b| {
        b.iter(|| {
            ok(
                registry.raw_function_cached(black_box("elementwise"), black_box("scale")),
                "raw_function_cached",
            )
        })
    });
    group.bench_function(BenchmarkId::new("scale", "function_cache_get"), |b| {
        b.iter(|| ok(SCALE.get(black_box(registry)), "FunctionCache::get").raw())
    });
    group.finish();
}
