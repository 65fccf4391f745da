#!/usr/bin/env bash
# Builds the kernels of a third-party CUDA project, NVIDIA's cuda-samples, into PTX for
# compute_90 and cubins for sm_90, for `tests/third_party_layouts.rs`. Its code is not part of
# this repository: the script reads a checkout (or a bare git directory) of it and writes only
# what nvcc makes of it.
#
#   atlas-registry/tests/third_party.sh SOURCE OUT_DIR
#
# SOURCE is the project's work tree, or its git directory (its HEAD is read with `git archive`).
# Every `.cu` file under Samples/ is compiled on its own with `-I Common -I <its folder>`, to
# OUT_DIR/<path with / as __>.ptx and .sm_90.cubin; a file that nvcc alone cannot build (it needs
# OpenGL, MPI, a library's headers, or is only ever #included by another) is listed in
# OUT_DIR/FAILED with nvcc's first error line and left out. OUT_DIR/SOURCE names the commit,
# OUT_DIR/NVCC_VERSION the compiler. NVCC names the compiler (default: nvcc on PATH); JOBS the
# parallel compiles (default: the number of processors).
set -euo pipefail
src=${1:?usage: third_party.sh SOURCE OUT_DIR}
out=${2:?usage: third_party.sh SOURCE OUT_DIR}
nvcc=${NVCC:-nvcc}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
tree=$src
if [ -f "$src/HEAD" ] && [ ! -d "$src/Samples" ]; then
  tree=$(mktemp -d)
  trap 'rm -rf "$tree"' EXIT
  # Sources and headers only (a mirror may lack its large data files).
  git --git-dir="$src" ls-tree -r HEAD Samples Common |
    awk -F'\t' '$2 ~ /\.(cu|cuh|h|hpp|inl|c|cpp)$/ { split($1, f, " "); print f[3] "\t" $2 }' |
    while IFS=$'\t' read -r blob path; do
      mkdir -p "$tree/$(dirname "$path")"
      git --git-dir="$src" cat-file blob "$blob" > "$tree/$path"
    done
  echo "$(git --git-dir="$src" rev-parse HEAD) (NVIDIA/cuda-samples)" > "$out/SOURCE"
else
  (cd "$src" && echo "$(git rev-parse HEAD 2>/dev/null || echo unknown) (NVIDIA/cuda-samples)") > "$out/SOURCE"
fi
"$nvcc" --version | tail -n 2 > "$out/NVCC_VERSION"
: > "$out/FAILED"
export nvcc tree out
build() { # FILE.cu, relative to the tree
  local rel=$1 name dir log
  name=${rel//\//__}; name=${name%.cu}
  dir=$(dirname "$tree/$rel")
  log=$(mktemp)
  if "$nvcc" -std=c++17 -I"$tree/Common" -I"$dir" -ptx -arch=compute_90 \
       -o "$out/$name.ptx" "$tree/$rel" 2>"$log" &&
     "$nvcc" -std=c++17 -I"$tree/Common" -I"$dir" -cubin -arch=sm_90 \
       -o "$out/$name.sm_90.cubin" "$tree/$rel" 2>>"$log"; then
    :
  else
    rm -f "$out/$name.ptx" "$out/$name.sm_90.cubin"
    printf '%s\t%s\n' "$rel" "$(grep -m1 -i 'error' "$log" | cut -c1-200)" >> "$out/FAILED"
  fi
  rm -f "$log"
}
export -f build
(cd "$tree" && find Samples -name '*.cu' | sort) | xargs -P "$jobs" -I{} bash -c 'build "$1"' _ {}
sort -o "$out/FAILED" "$out/FAILED"
echo "$(ls "$out"/*.ptx 2>/dev/null | wc -l) PTX modules and $(ls "$out"/*.cubin 2>/dev/null | wc -l) cubins in $out; $(wc -l < "$out/FAILED") files nvcc alone does not build (FAILED)"
