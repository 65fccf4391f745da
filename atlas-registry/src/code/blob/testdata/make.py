#!/usr/bin/env python3
"""Writes the CUDA 13 test blobs of Atlas's blob checks (atlas-registry/src/code/blob/testdata/).

    python3 atlas-registry/src/code/blob/testdata/make.py

cuda13.elementwise.fatbin: kernels/elementwise.cu compiled by NVRTC 13.5 (PTX for compute_75,
cubins for sm_75, sm_90 and sm_100: ELF ABI version 8, the SM number in bits 8-15 of e_flags) and
put in a fatbin by nvFatbin 13.5, uncompressed, as CUDA 13 toolchains lay it out: the PTX entry
named "elementwise.cu" with the ptxas options "-O3 --maxrregcount=64" in its header, the sm_90
entry with a 64-byte header and no name, the sm_100 entry named "elementwise.cu" with the record
that nvFatbin 13 adds to the headers of sm_100 and later entries.

nvcc13.0.elementwise.fatbin (not written here) is the fatbin nvcc 13.0 made of the same source
(`nvcc -O3 -std=c++17 -fatbin -gencode arch=compute_90,code=sm_90 -gencode
arch=compute_90,code=compute_90`): its PTX zstd-compressed, its sm_90 cubin of ABI version 8. It was committed once as kernels/gen/elementwise.fatbin, before the
blobs were rebuilt with NVRTC 12.0 (`git log -- kernels/gen/elementwise.fatbin`).

The wheels (nvidia-cuda-nvrtc 13.5.37, nvidia-nvfatbin 13.5.37, x86-64 Linux) are fetched with pip
into target/cuda13-testdata/ once; nothing is installed on the system.
"""

import ctypes
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
CACHE = ROOT / "target" / "cuda13-testdata"
WHEELS = ("nvidia-cuda-nvrtc==13.5.37", "nvidia-nvfatbin==13.5.37")
OPTIONS = ("-std=c++17", "-D__NV_TARGET_H")

sys.path.insert(0, str(ROOT / "kernels"))
from nvrtc import Nvrtc  # noqa: E402  (the ctypes driver of kernels/nvrtc.py)


def libraries():
    lib = CACHE / "nvidia" / "cu13" / "lib"
    if not (lib / "libnvfatbin.so.13").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--platform", "manylinux2014_x86_64", "-d", str(CACHE), *WHEELS],
            check=True,
        )
        for wheel in CACHE.glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(CACHE)
    return lib


def fatbin(lib, entries):
    """nvFatbin's fatbin of `entries`: (kind, arch, code, identifier, ptxas options)."""
    fb = ctypes.CDLL(str(lib / "libnvfatbin.so.13"))
    handle = ctypes.c_void_p()
    options = [b"-64", b"-host=linux", b"-compress=false"]
    status = fb.nvFatbinCreate(ctypes.byref(handle), (ctypes.c_char_p * 3)(*options), 3)
    assert status == 0, f"nvFatbinCreate: {status}"
    for kind, arch, code, identifier, ptxas in entries:
        if kind == "ptx":
            code += b"\0"
            status = fb.nvFatbinAddPTX(handle, code, len(code), arch, identifier, ptxas)
        else:
            status = fb.nvFatbinAddCubin(handle, code, len(code), arch, identifier)
        assert status == 0, f"adding {kind} for {arch}: {status}"
    size = ctypes.c_size_t()
    assert fb.nvFatbinSize(handle, ctypes.byref(size)) == 0
    out = ctypes.create_string_buffer(size.value)
    assert fb.nvFatbinGet(handle, out) == 0
    fb.nvFatbinDestroy(ctypes.byref(handle))
    return out.raw


def main():
    lib = libraries()
    nvrtc = Nvrtc(lib / "libnvrtc.so.13")
    assert nvrtc.version == (13, 5), nvrtc.version
    source = (ROOT / "kernels" / "elementwise.cu").read_bytes()
    code = {
        target: nvrtc.compile("elementwise.cu", source, target, OPTIONS)
        for target in ("compute_75", "sm_75", "sm_90", "sm_100")
    }
    blob = fatbin(lib, [
        ("ptx", b"75", code["compute_75"], b"elementwise.cu", b"-O3 --maxrregcount=64"),
        ("cubin", b"75", code["sm_75"], None, None),
        ("cubin", b"90", code["sm_90"], None, None),
        ("cubin", b"100", code["sm_100"], b"elementwise.cu", None),
    ])
    (HERE / "cuda13.elementwise.fatbin").write_bytes(blob)
    print(f"cuda13.elementwise.fatbin: {len(blob)} bytes")


if __name__ == "__main__":
    main()
