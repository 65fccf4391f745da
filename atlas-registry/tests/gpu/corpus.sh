#!/usr/bin/env bash
# The real-world corpus on a GPU machine, in one go, from the packed test binaries: build them
# here and put them in .gpu/tests/ (docs/testing_on_a_gpu.md), build the third-party
# kernels with atlas-registry/tests/third_party.sh into .corpus/cuda-samples, carry both, and run
# from the repository root:
#
#   bash atlas-registry/tests/gpu/corpus.sh
#
# Sections, each with its own time limit, its output also in $OUT/<section>.log (or /tmp):
#   nvcc      tests/nvcc_corpus.sh builds nvcc's outputs of kernels/*.cu with the machine's nvcc
#             (/usr/local/cuda/bin first on PATH) into $ATLAS_NVCC_CORPUS (default /tmp/nvcc-corpus)
#   corpus    tests/corpus.rs, corpus_loads_as_the_driver_does, on ATLAS_CORPUS (default
#             /usr/local/cuda/lib64) and the nvcc corpus
#   fixtures  tests/real_fatbins.rs (no GPU needed)
#   fuzz      tests/compressed_fuzz.rs, every test (the GPU ones included)
#   layouts   tests/third_party_layouts.rs, every test, on ATLAS_THIRD_PARTY (default
#             .corpus/cuda-samples)
# Section names as arguments run only those. Prints each section's result and time, then
# 'N passed, N failed' (sections); exits non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PATH=/usr/local/cuda/bin:$PATH RUST_BACKTRACE=${RUST_BACKTRACE:-0}
logs=${OUT:-/tmp}
nvcc_out=${ATLAS_NVCC_CORPUS:-/tmp/nvcc-corpus}
export ATLAS_CORPUS=${ATLAS_CORPUS:-/usr/local/cuda/lib64}
export ATLAS_THIRD_PARTY=${ATLAS_THIRD_PARTY:-$PWD/.corpus/cuda-samples}
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(nvcc corpus fixtures fuzz layouts)

binary() { # the packed test binary of tests/NAME.rs
  local found=(.gpu/tests/"$1"-*)
  [ -x "${found[0]}" ] || { echo "no .gpu/tests/$1-*: build the test binaries into .gpu/tests/ first (docs/testing_on_a_gpu.md)" >&2; return 1; }
  echo "${found[0]}"
}

section() { # NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 start rc
  shift 2
  echo "=== $name (at most $limit s)"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$logs/$name.log" |
    grep -vE '^test .* \.\.\. (ok|ignored)' | grep -vE '^\s*$'
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "$name: stopped after $limit s"
  echo "--- $name: $([ "$rc" -eq 0 ] && echo passed || echo "FAILED (exit $rc)") in $(( $(date +%s) - start )) s"
  return "$rc"
}

passed=0 failed=0
for s in "${sections[@]}"; do
  case $s in
    nvcc) section nvcc "${NVCC_LIMIT_S:-120}" atlas-registry/tests/nvcc_corpus.sh "$nvcc_out" ;;
    corpus)
      bin=$(binary corpus) && (
        export ATLAS_CORPUS=$ATLAS_CORPUS:$nvcc_out
        section corpus "${CORPUS_LIMIT_S:-240}" \
          "$bin" --ignored --exact corpus_loads_as_the_driver_does --nocapture --test-threads=1
      ) ;;
    fixtures)
      bin=$(binary real_fatbins) && section fixtures 60 "$bin" --test-threads=1 ;;
    fuzz)
      bin=$(binary compressed_fuzz) &&
        section fuzz "${FUZZ_LIMIT_S:-150}" "$bin" --include-ignored --nocapture --test-threads=1 ;;
    layouts)
      bin=$(binary third_party_layouts) &&
        section layouts "${LAYOUTS_LIMIT_S:-90}" "$bin" --include-ignored --nocapture --test-threads=1 ;;
    *) echo "unknown section $s (nvcc corpus fixtures fuzz layouts)"; false ;;
  esac && passed=$((passed + 1)) || failed=$((failed + 1))
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
