#!/usr/bin/env bash
# Regenerates the kernel blobs from the CUDA C++ sources beside this script.
#
#   kernels/regen.sh [OUT_DIR]      (default: kernels/gen)
#
# For every module: PTX for compute_75 (JIT-compiled by the driver on any GPU from Turing on) and a
# cubin for sm_90 (H100/H200). The elementwise module also gets a fatbin (sm_90 SASS + compute_90 PTX).
# model_tagged.cu is built twice, as model_a and model_b, with different constants.
# NVCC (or ATLAS_NVCC) names the compiler; default: nvcc on PATH.
#
# PTX written by nvcc 13.x carries `.version 9.0`, which only CUDA 13+ drivers JIT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/gen}
nvcc=${NVCC:-${ATLAS_NVCC:-nvcc}}
mkdir -p "$out"
flags=(-O3 -std=c++17)

build() { # NAME SOURCE [DEFINES...]
  local name=$1 src=$here/$2; shift 2
  "$nvcc" "${flags[@]}" "$@" -ptx -arch=compute_75 -o "$out/$name.ptx" "$src"
  "$nvcc" "${flags[@]}" "$@" -cubin -arch=sm_90 -o "$out/$name.sm_90.cubin" "$src"
}

build noop noop.cu
build elementwise elementwise.cu
build block_reduce block_reduce.cu
build device_global device_global.cu
build faults faults.cu
build model_a model_tagged.cu -DMODEL_SCALE=2 -DMODEL_OFFSET=1
build model_b model_tagged.cu -DMODEL_SCALE=-3 -DMODEL_OFFSET=0.5
"$nvcc" "${flags[@]}" -fatbin -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
  -o "$out/elementwise.fatbin" "$here/elementwise.cu"
"$nvcc" --version | tail -n 2 > "$out/NVCC_VERSION"
