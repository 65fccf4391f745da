#!/usr/bin/env bash
# Builds nvcc's outputs of the project's kernels (kernels/*.cu) the ways users build theirs, into
# one directory for the corpus test (tests/corpus.rs reads fatbins, and the .nv_fatbin and
# __nv_relfatbin sections of the libraries and objects):
#
#   atlas-registry/tests/nvcc_corpus.sh OUT_DIR
#
# For every kernel source:
#   -fatbin for -arch=all and -arch=all-major, each with -compress-mode default, size, speed,
#     balance and none (nvcc compresses an entry only where that pays), and again with
#     -Xfatbin=-compress-all for every mode that compresses (every entry compressed);
#   -fatbin for arch-specific and family targets (sm_90a, sm_100f, sm_120f: flags 0x100000 and
#     0x200000 on their entries);
#   -shared -Xcompiler -fPIC for -arch=all and for sm_90 (a .so; its first fatbin is the CUDA
#     runtime's own);
#   -rdc=true: a relocatable -fatbin for -arch=all, and an object (-c) whose __nv_relfatbin holds
#     it.
# model_tagged.cu is built with -DMODEL_SCALE=2 -DMODEL_OFFSET=1. NVCC names the compiler
# (default: nvcc on PATH), JOBS the parallel builds (default: the number of processors). Prints
# what it built and the time it took; OUT_DIR/NVCC_VERSION names the compiler.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../kernels" && pwd)
out=${1:?usage: nvcc_corpus.sh OUT_DIR}
nvcc=${NVCC:-nvcc}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
nvcc_path=$(command -v "$nvcc")
# The CUDA runtime and device runtime libraries that -shared links: lib64 in a toolkit, lib in
# NVIDIA's wheels.
libs=()
for dir in "$(dirname "$nvcc_path")/../lib64" "$(dirname "$nvcc_path")/../lib"; do
  [ -d "$dir" ] && libs+=("-L$(cd "$dir" && pwd)")
done
start=$(date +%s.%N)
"$nvcc" --version | tail -n 2 > "$out/NVCC_VERSION"

specific=(-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_100f,code=sm_100f
  -gencode arch=compute_120f,code='[sm_120f,compute_120f]')
# One line per build: NAME<TAB>nvcc arguments (the source and -o are added).
builds() {
  local mode
  for arch in all all-major; do
    for mode in default size speed balance none; do
      printf '%s\t%s\n' "$arch.$mode.fatbin" "-fatbin -arch=$arch -compress-mode=$mode"
      [ "$mode" = none ] && continue
      printf '%s\t%s\n' "$arch.$mode.compress-all.fatbin" \
        "-fatbin -arch=$arch -compress-mode=$mode -Xfatbin=-compress-all"
    done
  done
  printf '%s\t%s\n' "specific.fatbin" "-fatbin ${specific[*]}"
  printf '%s\t%s\n' "specific.speed.compress-all.fatbin" \
    "-fatbin ${specific[*]} -compress-mode=speed -Xfatbin=-compress-all"
  printf '%s\t%s\n' "all.so" "-shared -Xcompiler -fPIC -arch=all ${libs[*]}"
  printf '%s\t%s\n' "sm_90.so" "-shared -Xcompiler -fPIC -arch=sm_90 ${libs[*]}"
  printf '%s\t%s\n' "all.rdc.fatbin" "-rdc=true -fatbin -arch=all"
  printf '%s\t%s\n' "all.rdc.o" "-rdc=true -c -arch=all"
}

jobs_file=$(mktemp)
trap 'rm -f "$jobs_file"' EXIT
for src in "$here"/*.cu; do
  name=$(basename "$src" .cu)
  defines=""
  [ "$name" = model_tagged ] && defines="-DMODEL_SCALE=2 -DMODEL_OFFSET=1"
  builds | while IFS=$'\t' read -r what args; do
    printf '%s\t%s\t%s\n' "$src" "$name.$what" "-O3 -std=c++17 $defines $args"
  done
done > "$jobs_file"

export nvcc out
# Word splitting of the arguments is meant: they hold no spaces of their own.
# shellcheck disable=SC2086
xargs -P "$jobs" -d '\n' -n 1 bash -c '
  IFS=$'"'"'\t'"'"' read -r src target args <<< "$1"
  if ! "$nvcc" $args -o "$out/$target" "$src" 2> "$out/$target.log"; then
    echo "nvcc failed: $target (see $out/$target.log)" >&2
    exit 255
  fi
  rm -f "$out/$target.log"
' _ < "$jobs_file"
end=$(date +%s.%N)
count=$(wc -l < "$jobs_file")
echo "nvcc corpus: $count builds of $(ls "$here"/*.cu | wc -l) kernel sources in $out" \
  "($(du -sh "$out" | cut -f1)), $(awk "BEGIN { printf \"%.0f\", $end - $start }") s with $jobs jobs"
