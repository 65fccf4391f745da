//! Graph update against re-instantiation, and a device-decided WHILE loop against a host loop of
//! the same steps.
//!
//! - `graph_update/{shape}/…`: an executable graph is made to run a new capture of the same shape
//!   with new arguments. Shapes: `chain64` and `chain1024` (a chain of that many `scale`
//!   launches), `while64` (a decode loop: a counter reset, then a WHILE node whose body is 63
//!   `scale` launches and the `loop_step` that ends the loop) and `layers64` (64 layers of a step:
//!   a 4-byte host-to-device copy, then `scale`, `axpy` and `add_bias`: 256 nodes of four kinds).
//!   The captures are made outside the timed region; one iteration is one change:
//!   - `update`: [`GraphExec::update`] in place; `reinstantiate`: instantiate the new capture and
//!     drop the old executable graph. `raw_update`, `raw_reinstantiate`: the same through the raw
//!     driver calls (`cuGraphExecUpdate_v2` then `cuGraphDestroy` of the new graph;
//!     `cuGraphInstantiateWithFlags` then `cuGraphExecDestroy` and `cuGraphDestroy` of the old
//!     pair), so the driver's own ratio stands beside Atlas's.
//!   - `update_ready`, `reinstantiate_ready`: the same, then [`GraphExec::upload`] and a
//!     synchronize: the time until the changed graph sits on the device, ready to replay.
//!   - `set_one_node` (chains): a change of one kernel's argument made with
//!     [`GraphExec::set_kernel_args`] on that node, against `reinstantiate_one_node`: a capture
//!     with the same one change, instantiated.
//! - `while_loop/{graph,host}`: [`LOOP_STEPS`] steps of the `conditional` model's loop: one replay
//!   of a graph whose WHILE node runs `loop_step` until the kernel ends the loop, or a counter reset
//!   and [`LOOP_STEPS`] `host_step` launches from the host; one iteration is the whole loop,
//!   synchronize included.

use std::time::{Duration, Instant};

use atlas_registry::{
    AtlasRegistry, CudaFunction, CudaGraph, CudaStream, DeviceBuffer, GraphExec, GraphUpdate,
    LaunchConfig,
};
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, measurement::WallTime};

use atlas_sys::{CUgraph, CUgraphExec, CUgraphExecUpdateResultInfo};

use crate::{Env, check, ok, sym};

/// Iterations of the WHILE loop.
const LOOP_STEPS: i32 = 64;
/// Elements the kernels touch.
const ELEMENTS: u32 = 1024;

pub(crate) fn graph_update(c: &mut Criterion, env: &Env) {
    update_vs_reinstantiate(c, env);
    while_loop(c, env);
}

/// The `conditional` model on device 0.
fn conditional_model(env: &Env) -> AtlasRegistry {
    let host = env.registry.host();
    let blobs = atlas_kernels::blobs_for_device("conditional", host.compute_capability())
        .expect("conditional is a model of atlas-kernels");
    ok(
        AtlasRegistry::load(0, blobs),
        "loading the conditional model",
    )
}

/// A graph of one shape, captured again with other arguments at each change.
enum Shape {
    /// `n` `scale` launches in a row.
    Chain(usize),
    /// A counter reset, then a WHILE node around `body - 1` `scale` launches and one `loop_step`.
    Loop { body: usize },
    /// `n` layers of a copy of 4 host bytes into `counter`, `scale`, `axpy` and `add_bias`.
    Layers(usize),
}

/// What the captures use: the kernels, their buffers, the stream they are captured on (taken out
/// while a capture borrows it) and the one their graphs are uploaded on.
struct Captures<'a> {
    capture_stream: Option<CudaStream>,
    stream: &'a CudaStream,
    env_registry: &'a AtlasRegistry,
    scale: CudaFunction,
    axpy: CudaFunction,
    add_bias: CudaFunction,
    loop_step: CudaFunction,
    reset: CudaFunction,
    x: DeviceBuffer<f32>,
    y: DeviceBuffer<f32>,
    counter: DeviceBuffer<i32>,
    /// What the copies of `Layers` read: alive as long as the captures.
    position: Box<i32>,
}

impl Captures<'_> {
    /// The factor of launch `i` in a capture numbered `version`; `only_one` changes launch `i`'s
    /// factor between versions and no other.
    fn factor(version: u64, i: usize, only_one: Option<usize>) -> f32 {
        let changes = only_one.is_none_or(|k| k == i);
        let v = if changes { (version % 7) as f32 } else { 0.0 };
        1.0 + v + i as f32 * 1e-3
    }

    /// A capture of `shape`, version `version`.
    fn capture(&mut self, shape: &Shape, version: u64, only_one: Option<usize>) -> CudaGraph {
        let cfg = LaunchConfig::for_elements(ELEMENTS, 256);
        let mut capture_stream = self.capture_stream.take().expect("one capture at a time");
        let mut capture = ok(capture_stream.begin_capture(), "begin_capture");
        let stream = &capture;
        match *shape {
            Shape::Chain(n) => {
                for i in 0..n {
                    self.capture_scale(stream, &cfg, Self::factor(version, i, only_one));
                }
            }
            Shape::Loop { body } => {
                let one = LaunchConfig::for_elements(1, 1);
                // SAFETY: captured, not run: at a replay it writes the int of `counter`, which
                // outlives every executable graph of this bench (none is replayed).
                ok(
                    unsafe { self.reset.launch(&capture, &one, (&mut self.counter,)) },
                    "capturing reset_counter",
                );
                let cond = ok(capture.conditional_handle(true), "conditional_handle");
                let captured = capture.capture_while(cond, |inner| {
                    let inner = &*inner;
                    for i in 0..body - 1 {
                        self.capture_scale(inner, &cfg, Self::factor(version, i, only_one));
                    }
                    // SAFETY: captured, not run: an iteration touches the ELEMENTS floats of `x`
                    // and the int of `counter`, and sets `cond`, a handle of this graph.
                    unsafe {
                        self.loop_step.launch(
                            inner,
                            &cfg,
                            (&mut self.x, ELEMENTS, cond, &mut self.counter, LOOP_STEPS),
                        )
                    }
                });
                ok(captured, "capture_while");
            }
            Shape::Layers(n) => {
                for i in 0..n {
                    let f = Self::factor(version, i, only_one);
                    // SAFETY: captured, not run: at a replay it copies the 4 bytes of `position`
                    // (boxed, alive as long as `self`) into the int of `counter`.
                    let copied = unsafe {
                        self.env_registry.copy_h2d_async(
                            self.counter.device_ptr(),
                            (&raw const *self.position).cast(),
                            4,
                            stream,
                        )
                    };
                    ok(copied, "capturing the copy");
                    self.capture_scale(stream, &cfg, f);
                    // SAFETY: captured, not run: at a replay these touch the ELEMENTS floats of
                    // `x` and `y`, which outlive every executable graph of this bench.
                    unsafe {
                        ok(
                            self.axpy
                                .launch(stream, &cfg, (&self.x, &mut self.y, f, ELEMENTS)),
                            "capturing axpy",
                        );
                        ok(
                            self.add_bias.launch(stream, &cfg, (&mut self.y, ELEMENTS)),
                            "capturing add_bias",
                        );
                    }
                }
            }
        }
        let graph = ok(capture.end(), "end_capture");
        self.capture_stream = Some(capture_stream);
        graph
    }

    fn capture_scale(&self, stream: &CudaStream, cfg: &LaunchConfig, factor: f32) {
        // SAFETY: captured, not run: at a replay `scale` touches the ELEMENTS floats of `x`,
        // which outlives every executable graph of this bench (none is replayed).
        ok(
            unsafe { self.scale.launch(stream, cfg, (&self.x, factor, ELEMENTS)) },
            "capturing scale",
        );
    }
}

fn update_vs_reinstantiate(c: &mut Criterion, env: &Env) {
    let conditional = conditional_model(env);
    let stream = ok(CudaStream::new(env.registry.ctx()), "creating a stream");
    let function =
        |registry: &AtlasRegistry, module, name| ok(registry.function(module, name), name);
    let mut captures = Captures {
        capture_stream: Some(ok(CudaStream::new(env.registry.ctx()), "creating a stream")),
        stream: &stream,
        env_registry: &env.registry,
        scale: function(&env.registry, "elementwise", "scale"),
        axpy: function(&env.registry, "elementwise", "axpy"),
        add_bias: function(&env.registry, "device_global", "add_bias"),
        loop_step: function(&conditional, "conditional", "loop_step"),
        reset: function(&conditional, "conditional", "reset_counter"),
        x: ok(
            DeviceBuffer::alloc(env.registry.ctx(), ELEMENTS as usize),
            "allocating x",
        ),
        y: ok(
            DeviceBuffer::alloc(env.registry.ctx(), ELEMENTS as usize),
            "allocating y",
        ),
        counter: ok(
            DeviceBuffer::alloc(env.registry.ctx(), 1),
            "allocating the counter",
        ),
        position: Box::new(7),
    };
    let mut group = c.benchmark_group("graph_update");
    // Each change needs a new capture outside the timed region (up to a few milliseconds for 1024
    // launches): shorter windows keep the group's wall time in bounds.
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (name, shape) in [
        ("chain64", Shape::Chain(64)),
        ("chain1024", Shape::Chain(1024)),
        ("while64", Shape::Loop { body: 64 }),
        ("layers64", Shape::Layers(64)),
    ] {
        update_vs_reinstantiate_shape(&mut group, env, &mut captures, name, &shape);
    }
    group.finish();
    ok(stream.synchronize(), "synchronize");
}

fn update_vs_reinstantiate_shape(
    group: &mut BenchmarkGroup<'_, WallTime>,
    env: &Env,
    captures: &mut Captures<'_>,
    name: &str,
    shape: &Shape,
) {
    let stream = captures.stream;
    let mut exec = ok(
        captures.capture(shape, 0, None).instantiate(),
        "instantiate",
    );
    // The driver decides whether a new capture of this shape updates in place: say what it did.
    // SAFETY: the new capture touches `x` and `counter`, which outlive `exec`; nothing replays it.
    let outcome = ok(
        unsafe { exec.update(captures.capture(shape, 1, None)) },
        "update",
    );
    println!("graph_update/{name}: a new capture {outcome:?}");
    if let Shape::Chain(_) = shape {
        assert_eq!(
            outcome,
            GraphUpdate::Updated,
            "a same-topology chain updates"
        );
    }
    let ready = |exec: &GraphExec| {
        ok(exec.upload(stream), "upload");
        ok(stream.synchronize(), "synchronize");
    };
    let update = |exec: &mut GraphExec, graph| {
        // SAFETY: the new capture touches `x` and `counter`, which outlive `exec`; nothing
        // replays it here.
        ok(unsafe { exec.update(graph) }, "update");
    };
    let reinstantiate = |exec: &mut GraphExec, graph: CudaGraph| {
        drop(std::mem::replace(
            exec,
            ok(graph.instantiate(), "instantiate"),
        ));
    };
    group.bench_function(BenchmarkId::new(name, "update"), |b| {
        timed_change(b, captures, shape, None, &mut |graph| {
            update(&mut exec, graph)
        })
    });
    group.bench_function(BenchmarkId::new(name, "reinstantiate"), |b| {
        timed_change(b, captures, shape, None, &mut |graph| {
            reinstantiate(&mut exec, graph)
        })
    });
    group.bench_function(BenchmarkId::new(name, "update_ready"), |b| {
        timed_change(b, captures, shape, None, &mut |graph| {
            update(&mut exec, graph);
            ready(&exec);
        })
    });
    group.bench_function(BenchmarkId::new(name, "reinstantiate_ready"), |b| {
        timed_change(b, captures, shape, None, &mut |graph| {
            reinstantiate(&mut exec, graph);
            ready(&exec);
        })
    });
    raw_update_vs_reinstantiate(group, env, captures, name, shape);
    let Shape::Chain(n) = *shape else { return };
    // One kernel's argument changes: the kernel in the middle of the chain.
    let k = n / 2;
    let cfg = LaunchConfig::for_elements(ELEMENTS, 256);
    let mut version = 0;
    group.bench_function(BenchmarkId::new(name, "set_one_node"), |b| {
        b.iter(|| {
            version += 1;
            let factor = Captures::factor(version, k, Some(k));
            // SAFETY: `scale` touches the ELEMENTS floats of `x`, which outlives `exec`; nothing
            // replays it here.
            let set = unsafe {
                exec.set_kernel_args(k, &captures.scale, &cfg, (&captures.x, factor, ELEMENTS))
            };
            ok(set, "set_kernel_args");
        })
    });
    group.bench_function(BenchmarkId::new(name, "reinstantiate_one_node"), |b| {
        timed_change(b, captures, shape, Some(k), &mut |graph| {
            reinstantiate(&mut exec, graph)
        })
    });
}

/// `raw_update` and `raw_reinstantiate` of `shape`: the driver calls alone, on an executable graph
/// of their own.
fn raw_update_vs_reinstantiate(
    group: &mut BenchmarkGroup<'_, WallTime>,
    env: &Env,
    captures: &mut Captures<'_>,
    name: &str,
    shape: &Shape,
) {
    let instantiate = sym!(env.cuda, cuGraphInstantiateWithFlags);
    let update = sym!(env.cuda, cuGraphExecUpdate_v2);
    let exec_destroy = sym!(env.cuda, cuGraphExecDestroy);
    let graph_destroy = sym!(env.cuda, cuGraphDestroy);
    // The graph's handle, owned from here on by the raw calls (a `CudaGraph` holds nothing else).
    let into_raw = |graph: CudaGraph| {
        let raw = graph.raw();
        std::mem::forget(graph);
        raw
    };
    let new_exec = |graph: CUgraph| {
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: a live graph of the current context (the registry's, bound by `Env::new`).
        check(
            unsafe { instantiate(&mut exec, graph, 0) },
            "cuGraphInstantiateWithFlags",
        );
        exec
    };
    let first = into_raw(captures.capture(shape, 0, None));
    let mut pair = (new_exec(first), first);
    group.bench_function(BenchmarkId::new(name, "raw_update"), |b| {
        timed_change(b, captures, shape, None, &mut |graph| {
            let graph = into_raw(graph);
            // SAFETY: the result info is written by the call.
            let mut info: CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
            // SAFETY: a live executable graph and a live graph of one context, which is current;
            // the new graph's kernels touch buffers that outlive the pair; nothing replays it.
            check(
                unsafe { update(pair.0, graph, &mut info) },
                "cuGraphExecUpdate_v2",
            );
            // SAFETY: the new graph is owned here and destroyed once.
            check(unsafe { graph_destroy(graph) }, "cuGraphDestroy");
        })
    });
    group.bench_function(BenchmarkId::new(name, "raw_reinstantiate"), |b| {
        timed_change(b, captures, shape, None, &mut |graph| {
            let graph = into_raw(graph);
            let old = std::mem::replace(&mut pair, (new_exec(graph), graph));
            // SAFETY: the old pair is owned here and destroyed once, the executable graph first.
            unsafe {
                check(exec_destroy(old.0), "cuGraphExecDestroy");
                check(graph_destroy(old.1), "cuGraphDestroy");
            }
        })
    });
    // SAFETY: the last pair, owned here and destroyed once; nothing replays it.
    unsafe {
        check(exec_destroy(pair.0), "cuGraphExecDestroy");
        check(graph_destroy(pair.1), "cuGraphDestroy");
    }
}

/// One change per iteration, timed from the new capture's end: `apply` makes an executable graph
/// run `graph`'s work (captured from `shape`, version by version, with `only_one`'s launch changed
/// or all).
fn timed_change(
    b: &mut criterion::Bencher<'_>,
    captures: &mut Captures<'_>,
    shape: &Shape,
    only_one: Option<usize>,
    apply: &mut dyn FnMut(CudaGraph),
) {
    b.iter_custom(|iters| {
        let mut total = Duration::ZERO;
        for i in 0..iters {
            let graph = captures.capture(shape, i + 2, only_one);
            let start = Instant::now();
            apply(graph);
            total += start.elapsed();
        }
        total
    })
}

fn while_loop(c: &mut Criterion, env: &Env) {
    let registry = conditional_model(env);
    let mut stream = ok(CudaStream::new(registry.ctx()), "creating a stream");
    // A driver without conditional nodes names what it lacks, and the loop is not benched.
    if let Err(e) = ok(stream.begin_capture(), "begin_capture").conditional_handle(true) {
        println!("while_loop: not run: {e}");
        return;
    }
    let function = |name| ok(registry.function_cached("conditional", name), name);
    let (step, host_step, reset) = (
        function("loop_step"),
        function("host_step"),
        function("reset_counter"),
    );
    let mut x = ok(
        DeviceBuffer::from_slice(registry.ctx(), &stream, &vec![1.0f32; ELEMENTS as usize]),
        "allocating x",
    );
    let mut counter = ok(
        DeviceBuffer::from_slice(registry.ctx(), &stream, &[0i32]),
        "allocating the counter",
    );
    let cfg = LaunchConfig::for_elements(ELEMENTS, 256);
    let one = LaunchConfig::for_elements(1, 1);
    let mut capture = ok(stream.begin_capture(), "begin_capture");
    // SAFETY: captured, not run: at a replay it writes the int of `counter`, which outlives `exec`.
    ok(
        unsafe { reset.launch(&capture, &one, (&mut counter,)) },
        "capturing reset_counter",
    );
    let cond = ok(capture.conditional_handle(true), "conditional_handle");
    ok(
        capture.capture_while(cond, |body| {
            // SAFETY: captured, not run: each iteration touches the ELEMENTS floats of `x` and the
            // int of `counter` (both outlive `exec`) and sets `cond`, a handle of this graph.
            unsafe {
                step.launch(
                    &*body,
                    &cfg,
                    (&mut x, ELEMENTS, cond, &mut counter, LOOP_STEPS),
                )
            }
        }),
        "capture_while",
    );
    let exec = ok(
        ok(capture.end(), "end_capture").instantiate(),
        "instantiate",
    );
    ok(exec.upload(&stream), "upload");
    let mut group = c.benchmark_group("while_loop");
    group.bench_function(
        BenchmarkId::new(format!("steps{LOOP_STEPS}"), "graph"),
        |b| {
            b.iter(|| {
                // SAFETY: `x` and `counter` outlive `exec`.
                ok(unsafe { exec.launch(&stream) }, "graph launch");
                ok(stream.synchronize(), "synchronize");
            })
        },
    );
    group.bench_function(
        BenchmarkId::new(format!("steps{LOOP_STEPS}"), "host"),
        |b| {
            b.iter(|| {
                // SAFETY: writes the int of `counter`, alive until the synchronize below.
                ok(
                    unsafe { reset.launch(&stream, &one, (&mut counter,)) },
                    "reset_counter",
                );
                for _ in 0..LOOP_STEPS {
                    // SAFETY: touches the ELEMENTS floats of `x` and the int of `counter`, alive
                    // until the synchronize below.
                    ok(
                        unsafe {
                            host_step.launch(&stream, &cfg, (&mut x, ELEMENTS, &mut counter))
                        },
                        "host_step",
                    );
                }
                ok(stream.synchronize(), "synchronize");
            })
        },
    );
    group.finish();
    // One replay of the graph, checked, whatever the filter let criterion run.
    // SAFETY: `x` and `counter` outlive `exec`.
    ok(unsafe { exec.launch(&stream) }, "graph launch");
    let steps = ok(counter.to_vec(&stream), "reading the counter");
    assert_eq!(steps, [LOOP_STEPS], "the loop ran LOOP_STEPS steps");
}
