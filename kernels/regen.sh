#!/usr/bin/env bash
# Builds the kernel blobs with nvcc instead of NVRTC: the same files as kernels/nvrtc.py, for
# trying a kernel change on a machine with a CUDA toolkit. The committed blobs come from
# kernels/nvrtc.py; build.rs calls this script only when ATLAS_NVCC names an nvcc.
#
#   kernels/regen.sh OUT_DIR
#
# For every module: PTX for compute_75, cubins for sm_75, sm_80, sm_86, sm_89 and sm_90; the
# elementwise module also gets a fatbin (those cubins and the PTX). model_tagged.cu is built twice,
# as model_a and model_b, with different constants; conditional.cu gets PTX and an sm_90 cubin only,
# and needs nvcc 12.3 or newer. NVCC (or ATLAS_NVCC) names the compiler.
#
# The PTX ISA version follows the nvcc: 12.0 writes 8.0, as committed; nvcc 13 writes 9.0, which
# only CUDA 13+ drivers JIT. The tests of atlas-kernels check what the committed blobs promise
# (PTX ISA 8.0, uncompressed fatbin entries that are the cubins byte for byte); blobs from another
# nvcc can fail them, and the failure says which promise they break.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: kernels/regen.sh OUT_DIR}
nvcc=${NVCC:-${ATLAS_NVCC:-nvcc}}
mkdir -p "$out"
flags=(-O3 -std=c++17)
archs=(75 80 86 89 90)

build() { # NAME SOURCE [DEFINES...]
  local name=$1 src=$here/$2; shift 2
  "$nvcc" "${flags[@]}" "$@" -ptx -arch=compute_75 -o "$out/$name.ptx" "$src"
  for sm in "${archs[@]}"; do
    "$nvcc" "${flags[@]}" "$@" -cubin -arch="sm_$sm" -o "$out/$name.sm_$sm.cubin" "$src"
  done
}

build noop noop.cu
build elementwise elementwise.cu
build block_reduce block_reduce.cu
build device_global device_global.cu
build faults faults.cu
build pdl pdl.cu
build cluster cluster.cu
build cooperative cooperative.cu
build tma tma.cu
build smid smid.cu
build model_a model_tagged.cu -DMODEL_SCALE=2 -DMODEL_OFFSET=1
build model_b model_tagged.cu -DMODEL_SCALE=-3 -DMODEL_OFFSET=0.5
# conditional.cu calls cudaGraphSetConditional, which only the assemblers of CUDA 12.3 and newer
# resolve: this needs nvcc 12.3+. Its PTX and its sm_90 cubin are what kernels/lib.rs embeds (the
# committed PTX comes from NVRTC 12.0, the committed sm_90 cubin from this line with nvcc 13.0).
"$nvcc" "${flags[@]}" -ptx -arch=compute_75 -o "$out/conditional.ptx" "$here/conditional.cu"
"$nvcc" "${flags[@]}" -cubin -arch=sm_90 -o "$out/conditional.sm_90.cubin" "$here/conditional.cu"
gencode=(-gencode arch=compute_75,code=compute_75)
for sm in "${archs[@]}"; do gencode+=(-gencode "arch=compute_$sm,code=sm_$sm"); done
"$nvcc" "${flags[@]}" -fatbin "${gencode[@]}" -o "$out/elementwise.fatbin" "$here/elementwise.cu"
"$nvcc" --version | tail -n 2 > "$out/NVCC_VERSION"
