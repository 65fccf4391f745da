#!/usr/bin/env bash
# Atlas under NVIDIA's tools, on a GPU machine with 16 cores, in about 2 minutes on an H200:
#
# 1. The GPU tests (the ignored ones), except those that fault or make the driver fail on purpose
#    (listed below, with why), under compute-sanitizer's memcheck, racecheck, initcheck and
#    synccheck with --error-exitcode 9, each test binary under each tool one process, JOBS (12)
#    of them at once: each one's ERROR SUMMARY, and every failed API call the tool reported,
#    counted. The excluded tests run without the sanitizer, in the plain GPU suite
#    (docs/testing_on_a_gpu.md).
# 2. Whether Nsight Compute (ncu) and Nsight Systems (nsys) are there; a short launch loop
#    (clean_program's gpu_launch_loop) under `ncu --clock-control none` and, when present, nsys.
#
# Test binaries are built where Rust is and put in .gpu/tests/ (docs/testing_on_a_gpu.md). Then,
# on the GPU machine, from the repository root:
#
#   bash atlas-registry/tests/gpu/nvidia_tools.sh [TEST_BINARY_DIR]     # default .gpu/tests
#
# Logs go to $OUT/nvidia_tools (or /tmp/nvidia_tools). The last line says whether every
# sanitizer run reported 0 errors.
set -u

bins=${1:-.gpu/tests}
logs=${OUT:-/tmp}/nvidia_tools
mkdir -p "$logs"
export PATH=$PATH:/usr/local/cuda/bin
start=$SECONDS

# Tests excluded from the sanitizer runs: `name  why`. Matched against the test's function name.
excluded='
a_trapping_kernel_loses_the_context_and_every_next_call_says_restart  faults on purpose (a trap)
an_out_of_bounds_write_loses_the_context_and_every_next_call_says_restart  faults on purpose (an illegal address)
fuzz_mutants_load_without_crashing  hands the driver mutated blobs that it refuses
a_thousand_random_blobs_are_refused_without_a_crash  hands the driver PTX-looking garbage that it refuses
truncated_ptx_fails_to_load_naming_the_module  broken PTX, refused by the JIT
a_ptx_syntax_error_gives_a_jit_log_naming_the_line  broken PTX, refused by the JIT
a_good_module_then_a_bad_one_fails_naming_the_bad_one  broken PTX, refused by the JIT
ptx_syntax_error_reports_the_jit_log  broken PTX, refused by the JIT
ptx_that_does_not_compile_fails_at_registry_with_the_jit_log  broken PTX, refused by the JIT
an_unknown_function_is_not_found_naming_module_and_name  unknown names: cuModuleGetFunction answers NOT_FOUND
a_function_of_another_module_is_not_found  unknown names: cuModuleGetFunction answers NOT_FOUND
an_unknown_device_symbol_is_not_found_naming_module_and_name  unknown names: cuModuleGetGlobal answers NOT_FOUND
unknown_names_give_errors_naming_them  unknown names: the driver answers NOT_FOUND
a_cubin_for_another_architecture_is_refused_naming_both  the driver refuses cubins of other architectures (NO_BINARY_FOR_GPU)
another_topology_is_instantiated_again  cuGraphExecUpdate refuses a graph of another shape, by design
blob_layouts_of_every_model_match_the_driver  walks cuFuncGetParamInfo past the last parameter, on purpose
large_parameter_layouts_match_the_driver  walks cuFuncGetParamInfo past the last parameter, on purpose
crash_fixtures_crash_the_plain_driver_and_atlas_refuses_them  crashes the plain driver on purpose, in child processes
ptx_layouts_of_every_type_and_alignment_match_the_driver  the same walk, and PTX the JIT refuses
gpu_atlas_refuses_newer_ptx_exactly_when_the_driver_does  hands the plain driver PTX newer than it JITs (UNSUPPORTED_PTX_VERSION), to compare
gpu_no_variant_atlas_passes_crashes_the_driver  hands the plain driver changed cubins, some of which crash it
child_print_nvrtc_outcome  the body of a child process (does nothing alone)
exit_with_registries_in_statics_and_thread_locals_prints_nothing  unloads at process exit, answered with teardown codes
process_exit_from_a_test_with_live_registries_prints_nothing  unloads at process exit, answered with teardown codes
a_thousand_load_drop_cycles_keep_device_and_host_memory_flat  time: a thousand loads
two_gpus_a_buffer_or_stream_of_the_other_device_is_refused  needs two GPUs
a_graph_or_stream_of_another_device_is_refused_and_the_graph_replays_as_before  needs two GPUs
two_gpus_one_library_load_serves_both  needs two GPUs
two_gpus_are_independent  needs two GPUs
compressed_mutants_load_without_crashing  hands the driver mutated blobs that it refuses
foreign_entry_mutants_and_the_driver  hands the driver mutated blobs
corpus_loads_as_the_driver_does  hands the driver every fatbin of the toolkit, most for other GPUs (NO_BINARY_FOR_GPU)
third_party_layouts_match_the_driver  walks cuFuncGetParamInfo past the last parameter, on purpose
fuzz_child  the body of a child process (does nothing alone)
child_print_driver_outcome  the body of a child process (does nothing alone)
'
is_excluded() { grep -q "^$1 " <<<"$excluded"; }

# Test binaries in the order they are worth the time (the clean program first); then the rest.
order='clean_program gpu graph stream_forms copies stream_memory launch_attributes library blobs launch_limits
graph_update safety bad_blobs concurrency teardown param_layout'
binaries=()
for name in $order; do
  for b in "$bins/$name"-*; do [ -x "$b" ] && binaries+=("$b"); done
done
for b in "$bins"/*; do
  [ -x "$b" ] || continue
  case " ${binaries[*]} " in *" $b "*) ;; *) binaries+=("$b") ;; esac
done
[ ${#binaries[@]} -gt 0 ] || { echo "no test binaries in $bins: build them and put them there first (docs/testing_on_a_gpu.md)" >&2; exit 2; }

# The ignored (GPU) tests of a binary that are not excluded, one per line.
gpu_tests() {
  "$1" --list --ignored 2>/dev/null | sed -n 's/: test$//p' | while read -r t; do
    is_excluded "${t##*::}" || echo "$t"
  done
}

echo "== excluded from the sanitizer runs (they run in the plain GPU suite)"
sed '/^$/d; s/^\([^ ]*\)  \(.*\)$/  \1: \2/' <<<"$excluded"

sanitizer=$(command -v compute-sanitizer || true)
failed=0
# One sanitizer run of one test binary's tests: TOOL BINARY TIMEOUT. Writes its log and a
# summary line (`$logs/TOOL.NAME.sum`); the runs go in parallel, JOBS at a time, as the GPU
# takes several processes at once.
run_one() {
  local tool=$1 b=$2 limit=$3 name log t0 rc tests
  name=$(basename "$b")
  log="$logs/$tool.$name.log"
  mapfile -t tests < <(gpu_tests "$b")
  [ ${#tests[@]} -gt 0 ] || return 0
  t0=$SECONDS
  timeout -k 5 "$limit" "$sanitizer" --tool "$tool" --error-exitcode 9 --target-processes all \
    "$b" --ignored --exact --test-threads=1 "${tests[@]}" >"$log" 2>&1
  rc=$?
  # A binary whose tests make no CUDA call (they validate blobs, or find nothing to do) ends
  # with the sanitizer's exit status 255 and "terminated before first instrumented API call".
  if [ "$rc" = 255 ] && grep -q 'terminated before first instrumented API call' "$log" &&
    grep -q '^test result: ok' "$log"; then
    rc=0
    echo "(no CUDA call)" >>"$log"
  fi
  {
    summaries=$(grep -oE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)|\(no CUDA call\)' "$log" |
      sort | uniq -c | sed 's/^ *//' | paste -sd ',' -)
    result=$(grep -E '^test result:' "$log" | tail -1)
    echo "  $name (${#tests[@]} tests, $((SECONDS - t0))s, exit $rc): ${summaries:-no ERROR SUMMARY}; ${result:-no test result}"
    # "Program hit CUDA_ERROR_X (error N) due to "..." on CUDA API call to cuY.", counted.
    grep 'on CUDA API call to' "$log" |
      sed -E 's/.*Program hit ([A-Z_]+).* on CUDA API call to ([A-Za-z0-9_]+).*/\1 on \2/' |
      sort | uniq -c | sed 's/^/      /'
    grep -E '^test .* FAILED$' "$log" | sed 's/^/      /' | head -10
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      echo "      (timed out after ${limit}s, in: $(grep -E '^test .* \.\.\. ?$' "$log" | tail -1 | sed 's/^test //; s/ \.\.\.//'); log: $log)"
    fi
    echo "errors=$(grep -oE '(ERROR SUMMARY|RACECHECK SUMMARY): [0-9]+' "$log" | awk '{ e += $3 } END { print e + 0 }')"
    echo "rc=$rc"
  } >"$logs/$tool.$name.sum"
}
export -f run_one gpu_tests is_excluded
export excluded logs sanitizer

if [ -z "$sanitizer" ]; then
  echo "== compute-sanitizer: not found"
  failed=1
else
  echo "== $("$sanitizer" --version | tail -1)"
  # The sixteen-thread test launches 500 times a thread, not 10,000: the same interleavings of
  # launches, loads and drops, in a time racecheck can follow.
  export ATLAS_CONCURRENCY_LAUNCHES=500
  # Seconds one binary may take under each tool (racecheck is the slowest: it follows every
  # shared-memory access); JOBS runs at once.
  jobs=${JOBS:-12}
  for spec in racecheck:420 memcheck:240 initcheck:240 synccheck:240; do
    for b in "${binaries[@]}"; do printf '%s %s %s\n' "${spec%:*}" "$b" "${spec#*:}"; done
  done | xargs -P "$jobs" -L 1 bash -c 'run_one "$@"' _
  for tool in memcheck racecheck initcheck synccheck; do
    echo "== $tool"
    for b in "${binaries[@]}"; do
      sum="$logs/$tool.$(basename "$b").sum"
      [ -f "$sum" ] || continue
      grep -vE '^(rc|errors)=' "$sum"
      grep -q '^rc=0$' "$sum" || failed=1
    done
    # In all: tests, binaries, errors reported, binaries that failed or timed out.
    cat "$logs/$tool".*.sum 2>/dev/null | awk -v tool="$tool" '
      /^  [^ ]+ \([0-9]+ tests/ { n++; t += substr($2, 2) }
      /^errors=/ { e += substr($0, 8) }
      /^rc=/ && $0 != "rc=0" { bad++ }
      END { printf "  %s in all: %d tests in %d binaries, %d errors reported, %d runs not clean\n", tool, t, n, e, bad }'
  done
fi

echo "== Nsight tools"
launch_loop=$(ls "$bins"/clean_program-* 2>/dev/null | head -1)
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
  echo "-- ncu: $ncu ($("$ncu" --version | tail -1))"
  # The first five launches of the loop (200 launches of elementwise::axpy on 65,536 floats),
  # summarized per kernel; clocks left as the driver sets them.
  timeout -k 5 30 "$ncu" --clock-control none --launch-count 5 --print-summary per-kernel \
    --target-processes all "$launch_loop" --ignored --exact --test-threads=1 gpu_launch_loop \
    >"$logs/ncu.log" 2>&1
  echo "   exit $?"
  grep -vE '^(running|test |$)' "$logs/ncu.log" | head -80 | sed 's/^/   /'
else
  echo "-- ncu: not found (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)"
fi
if [ -n "$nsys" ]; then
  echo "-- nsys: $nsys ($("$nsys" --version | tail -1))"
  timeout -k 5 30 "$nsys" profile --trace=cuda --stats=true --force-overwrite true \
    -o "$logs/launch_loop" "$launch_loop" --ignored --exact --test-threads=1 gpu_launch_loop \
    >"$logs/nsys.log" 2>&1
  echo "   exit $?"
  grep -E 'cuLaunchKernel|cuModuleLoadData|cuFuncGetParamInfo|cuStreamSynchronize|axpy|Time \(%\)' \
    "$logs/nsys.log" | head -20 | sed 's/^/   /'
else
  echo "-- nsys: not found (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-systems)"
fi

echo "== $((SECONDS - start))s in all; logs in $logs"
if [ "$failed" = 0 ]; then
  echo "every sanitizer run: 0 errors"
else
  echo "some sanitizer run reported errors, failed or timed out (see above)"
fi
exit "$failed"
