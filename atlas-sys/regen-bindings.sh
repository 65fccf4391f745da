#!/usr/bin/env bash
# Regenerates the declarations of the libraries atlas-sys loads at run time, from pinned inputs:
# src/bindings.rs (the CUDA driver API, cuda.h) and src/nvrtc_bindings.rs (NVRTC, nvrtc.h).
#
#   atlas-sys/regen-bindings.sh                    rewrite both files
#   atlas-sys/regen-bindings.sh --check            exit 1 if a committed file differs from a fresh generation
#   atlas-sys/regen-bindings.sh --install-missing  also install libclang-dev with apt-get when it is missing
#
# Inputs, all pinned: cuda.h from the nvidia-cuda-runtime-cu12 12.9.79 wheel and nvrtc.h from the
# nvidia-cuda-nvrtc-cu12 12.9.86 wheel (PyPI; both of CUDA 12.9.1), bindgen-cli 0.72.1 (crates.io),
# libclang from the distribution (Debian's libclang-dev, clang 14), rustfmt.
#
# The downloaded tools live in one cache folder, target/regen-bindings/ (ATLAS_REGEN_CACHE overrides
# it): bindgen-cli installed there with `cargo install --root`, and the include folders of the
# wheels. The first run fills it (about two minutes, mostly building bindgen-cli); later runs reuse
# it and take seconds. Nothing outside the cache and the two files is changed, unless
# --install-missing is given: without it, a missing system package is reported with the command
# that installs it.
#
# The generated methods (`CudaDriver::cuName(..)`, `Nvrtc::nvrtcName(..)`) are rewritten so that a
# function the loaded library does not export returns an error status instead of panicking:
# CUDA_ERROR_NOT_FOUND for the driver, NVRTC_ERROR_INTERNAL_ERROR for NVRTC, a null pointer for
# nvrtcGetErrorString (see the crate docs).
set -euo pipefail
CUDA_WHEEL_VERSION=12.9.79
NVRTC_WHEEL_VERSION=12.9.86
BINDGEN_VERSION=0.72.1
here=$(cd "$(dirname "$0")" && pwd)
check=0 install_missing=0
for arg in "$@"; do
  case $arg in
    --check) check=1 ;;
    --install-missing) install_missing=1 ;;
    *) echo "usage: $0 [--check] [--install-missing]" >&2; exit 2 ;;
  esac
done
cache=${ATLAS_REGEN_CACHE:-${CARGO_TARGET_DIR:-$here/../target}/regen-bindings}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

fail() { echo "regen-bindings: $*" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# libclang (bindgen loads it at run time): the one system package, installed only when asked.
have_libclang() {
  [ -n "${LIBCLANG_PATH:-}" ] || ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 ||
    { command -v ldconfig >/dev/null && ldconfig -p | grep -q 'libclang[-.0-9]*\.so'; }
}
if ! have_libclang; then
  if ((install_missing)) && command -v apt-get >/dev/null; then
    echo "regen-bindings: installing libclang-dev with apt-get"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev >/dev/null; } ||
      fail "apt-get could not install libclang-dev (it needs root and the distribution's package index)"
  elif command -v apt-get >/dev/null; then
    fail "libclang is missing; install it with: sudo apt-get install libclang-dev (or pass --install-missing)"
  else
    fail "libclang is missing; install your distribution's libclang development package (clang 14 reproduces the committed file) or set LIBCLANG_PATH"
  fi
fi

# bindgen-cli, built once into the cache.
bindgen=$cache/bindgen-cli-$BINDGEN_VERSION/bin/bindgen
if [ ! -x "$bindgen" ]; then
  echo "regen-bindings: installing bindgen-cli $BINDGEN_VERSION into $cache (once)"
  rm -rf "$cache/bindgen-cli-$BINDGEN_VERSION.partial"
  cargo install --quiet --locked bindgen-cli --version "$BINDGEN_VERSION" \
    --root "$cache/bindgen-cli-$BINDGEN_VERSION.partial" >"$cache/bindgen-install.log" 2>&1 ||
    fail "cannot install bindgen-cli $BINDGEN_VERSION: cargo install needs crates.io (network or a configured mirror); details in $cache/bindgen-install.log"
  mv "$cache/bindgen-cli-$BINDGEN_VERSION.partial" "$cache/bindgen-cli-$BINDGEN_VERSION"
fi

# A header folder of a wheel, extracted once into the cache: fetch_include PROJECT VERSION DIR
# (DIR: the wheel's folder under nvidia/, holding include/). Prints the include folder.
fetch_include() {
  local project=$1 version=$2 dir=$3
  local include=$cache/$project-$version/include
  if [ ! -d "$include" ]; then
    echo "regen-bindings: downloading $project==$version into $cache (once)" >&2
    python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
      "$project==$version" -d "$work/$project" >"$work/pip.log" 2>&1 ||
      fail "cannot download $project==$version: python3 -m pip download needs PyPI (network or PIP_INDEX_URL)"
    python3 -m zipfile -e "$work/$project"/*.whl "$work/$project/x"
    rm -rf "$cache/$project-$version"
    mkdir -p "$cache/$project-$version"
    mv "$work/$project/x/nvidia/$dir/include" "$include"
  fi
  echo "$include"
}
cuda_include=$(fetch_include nvidia-cuda-runtime-cu12 "$CUDA_WHEEL_VERSION" cuda_runtime)
[ -f "$cuda_include/cuda.h" ] || fail "$cuda_include has no cuda.h"
nvrtc_include=$(fetch_include nvidia-cuda-nvrtc-cu12 "$NVRTC_WHEEL_VERSION" cuda_nvrtc)
[ -f "$nvrtc_include/nvrtc.h" ] || fail "$nvrtc_include has no nvrtc.h"

# generate OUT HEADER INPUTS STRUCT PREFIX: bindgen's dynamic-loading table STRUCT of every
# function, type and constant whose name starts with PREFIX (any case), made never to panic.
generate() {
  local out=$1 header=$2 inputs=$3 struct=$4 prefix=$5
  local upper lower
  upper=$(tr '[:lower:]' '[:upper:]' <<<"$prefix") lower=$prefix
  {
    cat <<BANNER
// Generated by atlas-sys/regen-bindings.sh: do not edit by hand.
// Inputs: $inputs, bindgen-cli $BINDGEN_VERSION, libclang.

BANNER
    "$bindgen" "$header" \
      --dynamic-loading "$struct" \
      --allowlist-function "^$lower.*" --allowlist-type "^($upper|$lower).*" --allowlist-var "^($upper|$lower).*" \
      --default-enum-style newtype --no-layout-tests --no-doc-comments \
      --rust-edition 2024 --rust-target 1.85 \
      -- -I"$(dirname "$header")"
  } >"$out"

  # bindgen's methods `expect` the entry point, a panic when the library lacks it: make each one
  # return an error status instead, and fail here if bindgen's output no longer has that shape.
  python3 - "$out" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
# What a method returns when its function is missing, by the method's return type.
FALLBACK = {
    "CUresult": "CUresult::CUDA_ERROR_NOT_FOUND",
    "nvrtcResult": "nvrtcResult::NVRTC_ERROR_INTERNAL_ERROR",
    "*const ::std::os::raw::c_char": "::std::ptr::null()",
}
method = re.compile(
    r'(pub unsafe fn \w+\s*\(\s*&self[^{]*->\s*(?P<ret>[^{]+?)\s*\{\s*)'
    r'\(\s*self\s*\.\s*(?P<field>\w+)\s*\.\s*as_ref\(\)\s*\.\s*expect\("Expected function, got error\."\)\s*\)'
)
def rewrite(m):
    ret = " ".join(m["ret"].split())
    if ret not in FALLBACK:
        sys.exit(f"regen-bindings: no fallback for a method returning {ret}; add one in regen-bindings.sh")
    return f'{m.group(1)}let Ok(entry) = &self.{m["field"]} else {{ return {FALLBACK[ret]}; }}; entry'
text, rewritten = method.subn(rewrite, text)
methods = len(re.findall(r'pub unsafe fn \w+\s*\(\s*&self', text))
if rewritten == 0 or rewritten != methods or 'expect(' in text:
    sys.exit(f"regen-bindings: bindgen's methods changed shape ({rewritten} rewritten of {methods}); "
             "update the rewrite in regen-bindings.sh")
open(path, 'w').write(text)
PY
  rustfmt --edition 2024 "$out"
}

generate "$work/bindings.rs" "$cuda_include/cuda.h" \
  "cuda.h of nvidia-cuda-runtime-cu12==$CUDA_WHEEL_VERSION" CudaDriver cu
generate "$work/nvrtc_bindings.rs" "$nvrtc_include/nvrtc.h" \
  "nvrtc.h of nvidia-cuda-nvrtc-cu12==$NVRTC_WHEEL_VERSION" Nvrtc nvrtc

status=0
for file in bindings.rs nvrtc_bindings.rs; do
  target=$here/src/$file
  if ((check)); then
    if [ ! -f "$target" ] || ! diff -q "$target" "$work/$file" >/dev/null; then
      echo "regen-bindings: $target differs from a fresh generation" >&2
      diff -u "$target" "$work/$file" 2>&1 | head -n 40 >&2
      status=1
    else
      echo "regen-bindings: $target is up to date"
    fi
  else
    cp "$work/$file" "$target"
    echo "regen-bindings: wrote $target"
  fi
done
exit $status
