//! What graph tests share: a graph's node types asked of the driver, a graph replayed after its
//! registry was released, the `conditional` model's counted loop captured, and the check of a
//! `WrongContext` refusal.

use atlas_registry::sys::{CUgraph, CUgraphNode, CUgraphNodeType, CUresult};
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaGraph, CudaStream, DeviceBuffer, GraphExec, LaunchConfig,
    release,
};

/// The types of a graph's nodes, asked of the driver directly.
pub fn node_types(graph: CUgraph) -> Vec<CUgraphNodeType> {
    let cuda = atlas_registry::sys::driver().unwrap();
    let get_nodes = atlas_registry::sys::entry!(cuda, cuGraphGetNodes).unwrap();
    let node_type = atlas_registry::sys::entry!(cuda, cuGraphNodeGetType).unwrap();
    let mut count = 0usize;
    // SAFETY: the graph is live; a null array asks for the count.
    let status = unsafe { get_nodes(graph, std::ptr::null_mut(), &mut count) };
    assert_eq!(status, CUresult::CUDA_SUCCESS);
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: the array has room for `count` nodes.
    let status = unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut count) };
    assert_eq!(status, CUresult::CUDA_SUCCESS);
    nodes
        .into_iter()
        .map(|node| {
            let mut kind = CUgraphNodeType(u32::MAX);
            // SAFETY: a node of the live graph; `kind` is a live out-pointer.
            let status = unsafe { node_type(node, &mut kind) };
            assert_eq!(status, CUresult::CUDA_SUCCESS);
            kind
        })
        .collect()
}

/// Captures on `stream` the `conditional` model's counted loop: `reset_counter` on `counter`, then
/// a WHILE node whose body is one `loop_step` over the floats of `x` that ends the loop once
/// `counter` reaches `limit`. The graph keeps `x`, `counter` and the registry.
pub fn capture_counted_loop(
    registry: &AtlasRegistry,
    stream: &mut CudaStream,
    x: &mut DeviceBuffer<f32>,
    counter: &mut DeviceBuffer<i32>,
    limit: i32,
) -> CudaGraph {
    let step = registry
        .function_cached("conditional", "loop_step")
        .unwrap();
    let reset = registry
        .function_cached("conditional", "reset_counter")
        .unwrap();
    let n = x.len() as u32;
    let cfg = LaunchConfig::for_elements(n, 256);
    let mut capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: at each replay it writes the one int of `counter`, which the
    // graph keeps.
    unsafe {
        reset.launch(
            &capture,
            &LaunchConfig::for_elements(1, 1),
            (&mut *counter,),
        )
    }
    .unwrap();
    let cond = capture.conditional_handle(true).unwrap();
    capture
        .capture_while(cond, |body| {
            // SAFETY: captured, not run: each iteration touches the `n` floats of `x` and the int
            // of `counter` (the graph keeps both) and sets `cond`, a handle of this graph, while
            // running in it.
            unsafe { step.launch(&*body, &cfg, (&mut *x, n, cond, &mut *counter, limit)) }
        })
        .unwrap();
    capture.end().unwrap()
}

/// Asserts that `e` refuses `what` of device `given` where device `expected`'s was needed.
pub fn assert_wrong_context(e: AtlasError, what: &str, expected: usize, given: usize) {
    match e {
        AtlasError::WrongContext {
            what: w,
            expected: e,
            given: g,
        } => assert_eq!((w.as_str(), e, g), (what, Some(expected), Some(given))),
        other => panic!("expected WrongContext for {what}, got {other}"),
    }
}

/// Captures one launch of `noop` on a new stream of `registry`'s context, ends the capture, drops
/// the function and releases the registry (asserting `InUse`: the graph holds it), then
/// instantiates the graph and replays it three times, synchronized. The stream and the executable
/// graph, which holds the registry's modules loaded.
pub fn replay_noop_after_release(registry: AtlasRegistry) -> (CudaStream, GraphExec) {
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let noop = registry.function("noop", "noop").unwrap();
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: noop takes no arguments and touches no memory.
    unsafe { noop.launch(&capture, &LaunchConfig::for_elements(1, 1), ()) }.unwrap();
    let graph = capture.end().unwrap();
    drop(noop);
    let e = release(registry).unwrap_err();
    assert!(
        matches!(e, AtlasError::InUse { handles: 1, .. }),
        "the graph holds the registry: {e}"
    );
    let exec = graph.instantiate().unwrap();
    for _ in 0..3 {
        // SAFETY: the graph's kernel touches no memory; the graph keeps its module loaded.
        unsafe { exec.launch(&stream) }.unwrap();
    }
    stream.synchronize().unwrap();
    (stream, exec)
}
