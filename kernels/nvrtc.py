#!/usr/bin/env python3
"""Builds the committed kernel blobs (kernels/gen/) from kernels/*.cu with NVRTC 12.0.

    python3 kernels/nvrtc.py            rewrite kernels/gen/
    python3 kernels/nvrtc.py --check    fail, with a short summary, if kernels/gen/ differs from a
                                        fresh build (nothing is written)
    python3 kernels/nvrtc.py --out DIR  write the blobs to DIR instead
    python3 kernels/nvrtc.py --fetch    only fetch the pinned NVRTC, and print the path of its
                                        libnvrtc.so.12 (what the compile tests and CI load)

Why NVRTC 12.0: the oldest driver Atlas supports is CUDA 12.0's. PTX JIT-compiles only on drivers
that know its ISA version, and NVRTC 12.0 writes PTX ISA 8.0, which every CUDA 12.0+ driver knows
(nvcc 13 writes 9.0, which needs a CUDA 13 driver). Its cubins load on every 12.0+ driver of their
architecture. NVRTC is a library: it needs no GPU, no toolkit and no driver, so this runs anywhere
Python and pip do.

Inputs, all pinned: the nvidia-cuda-nvrtc-cu12 12.0.140 wheel (x86-64 Linux, checked against its
SHA-256), the sources and the compile options below. The wheel is fetched with pip into
target/nvrtc-12.0.140/ and unpacked there once; later runs reuse it and take seconds (about ten on
two cores). This script installs nothing on the system. libnvrtc is loaded with ctypes and driven
through its C API (nvrtcCreateProgram, nvrtcCompileProgram, nvrtcGetPTX, nvrtcGetCUBIN,
nvrtcGetProgramLog).

What it writes, per module: NAME.ptx (compute_75, PTX ISA 8.0) and NAME.sm_XY.cubin for each of
sm_75, sm_80, sm_86, sm_89 and sm_90 (PTX only for the modules in PTX_ONLY); elementwise.fatbin;
NVRTC_VERSION. The blobs in NVCC_BLOBS come from nvcc and are left alone. The output depends only on
the inputs: two runs write the same bytes (--check relies on it).

Options: -std=c++17 and the module's defines; NVRTC optimises at -O3 by default. One addition:
-D__NV_TARGET_H. NVRTC 12.0 puts the namespace-scope constants of its built-in <nv/target> header
into every module as 38 unused device globals (about 4 KiB more per cubin); predefining that
header's include guard leaves them out. None of the kernels uses <nv/target> (NV_IF_TARGET); one
that does fails to compile here, loudly.

The fatbin: NVRTC does not make fatbins, so this script writes elementwise.fatbin itself, from the
same NVRTC cubins and PTX: one ELF entry per cubin architecture and one PTX entry (compute_75), all
uncompressed. The driver picks the SASS of the device's architecture (or an older minor of the
same major) and JIT-compiles the PTX on anything else, so the fatbin runs on every GPU and driver
the other blobs run on. Keeping nvcc 13's fatbin instead would have left one blob that loads only
on sm_90 or under a CUDA 13 driver. The container layout is described at write_fatbin; it was
checked byte by byte against nvcc 13.0's elementwise.fatbin and against what NVIDIA's nvFatbin
library (12.9, -compress=false) makes of these same PTX and cubins: identical headers, the only
difference being that nvFatbin strips the PTX's comments and indentation.
"""

import argparse
import ctypes
import difflib
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WHEEL_PROJECT = "nvidia-cuda-nvrtc-cu12"
WHEEL_VERSION = "12.0.140"
WHEEL_FILE = "nvidia_cuda_nvrtc_cu12-12.0.140-py3-none-manylinux1_x86_64.whl"
WHEEL_SHA256 = "8e94e991d85c422de4da87bdc7472fdc1364367bd4aace7000b559cd33122071"
LIBRARIES = ("libnvrtc.so.12", "libnvrtc-builtins.so.12.0")

PTX_ARCH = 75
PTX_ISA = ".version 8.0"
CUBIN_ARCHS = (75, 80, 86, 89, 90)
OPTIONS = ("-std=c++17", "-D__NV_TARGET_H")

# (module, source, defines): model_tagged.cu is built twice, with different constants.
MODULES = (
    ("noop", "noop.cu", ()),
    ("elementwise", "elementwise.cu", ()),
    ("block_reduce", "block_reduce.cu", ()),
    ("device_global", "device_global.cu", ()),
    ("faults", "faults.cu", ()),
    ("pdl", "pdl.cu", ()),
    ("cluster", "cluster.cu", ()),
    ("cooperative", "cooperative.cu", ()),
    ("model_a", "model_tagged.cu", ("-DMODEL_SCALE=2", "-DMODEL_OFFSET=1")),
    ("model_b", "model_tagged.cu", ("-DMODEL_SCALE=-3", "-DMODEL_OFFSET=0.5")),
    ("conditional", "conditional.cu", ()),
    ("tma", "tma.cu", ()),
    ("smid", "smid.cu", ()),
)
# Modules NVRTC 12.0 compiles to PTX only. conditional.cu calls cudaGraphSetConditional, a device
# function of CUDA 12.3+ that the PTX keeps as an extern call: a CUDA 12.3+ driver resolves it when
# it JIT-compiles the PTX, but NVRTC 12.0's own assembler cannot ("Unresolved extern function"), so
# it makes no cubins of it. Its sm_90 cubin comes from nvcc 12.3+ (kernels/regen.sh, see NVCC_BLOBS).
PTX_ONLY = ("conditional",)
# Blobs in kernels/gen/ that nvcc builds, not this script (nvcc 13.0 on the GPU machine:
#   nvcc -O3 -std=c++17 -cubin -arch=sm_90 -o kernels/gen/conditional.sm_90.cubin kernels/conditional.cu
# ): --check does not compare them and a rebuild does not remove them.
NVCC_BLOBS = ("conditional.sm_90.cubin",)
FATBIN_MODULE = "elementwise"
BLOB_SUFFIXES = (".ptx", ".cubin", ".fatbin", "_VERSION")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = ROOT / "target" / f"nvrtc-{WHEEL_VERSION}"
PIP_COMMAND = [
    sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
    "--platform", "manylinux2014_x86_64", f"{WHEEL_PROJECT}=={WHEEL_VERSION}",
]


class Failure(Exception):
    """A reason to stop, printed as one line."""


def say(message):
    print(f"nvrtc.py: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# The pinned NVRTC: fetched once into target/, checked, unpacked next to it.


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def nvrtc_library():
    """The path of libnvrtc.so.12 from the pinned wheel, fetching and unpacking it if needed."""
    lib_dir = CACHE / "lib"
    if all((lib_dir / name).is_file() for name in LIBRARIES):
        return lib_dir / LIBRARIES[0]
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise Failure(
            f"the pinned NVRTC wheel is for x86-64 Linux; this is {platform.system()} {platform.machine()}"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    wheel = CACHE / WHEEL_FILE
    if not wheel.is_file():
        command = PIP_COMMAND + ["-d", str(CACHE)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not wheel.is_file():
            why = (done.stderr.strip().splitlines() or ["no wheel written"])[-1]
            raise Failure(
                f"cannot fetch the NVRTC wheel ({why}); fetch it with: {' '.join(command)}"
            )
    if sha256(wheel) != WHEEL_SHA256:
        raise Failure(f"{wheel} is not the pinned wheel (SHA-256 differs); delete it and run again")
    # Unpack into a fresh folder and rename it into place, so that an interrupted run leaves no
    # half-written library behind for the next one to trust.
    staging = Path(tempfile.mkdtemp(prefix="lib.", dir=CACHE))
    with zipfile.ZipFile(wheel) as archive:
        for name in LIBRARIES:
            with archive.open(f"nvidia/cuda_nvrtc/lib/{name}") as src, open(staging / name, "wb") as dst:
                shutil.copyfileobj(src, dst)
    if lib_dir.exists():
        shutil.rmtree(lib_dir)
    staging.rename(lib_dir)
    return lib_dir / LIBRARIES[0]


class Nvrtc:
    """The few NVRTC entry points this script calls, loaded from the pinned library."""

    def __init__(self, path):
        # libnvrtc finds its builtins library through its RUNPATH ($ORIGIN): both lie in one folder.
        self.lib = ctypes.CDLL(str(path))
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    def check(self, status, call, log=""):
        if status != 0:
            text = self.lib.nvrtcGetErrorString(status).decode()
            raise Failure(f"{call} failed: {text}{log}")

    def compile(self, source_name, source, arch, options):
        """The PTX text (for compute_XY) or the cubin (for sm_XY) of one source."""
        program = ctypes.c_void_p()
        self.check(
            self.lib.nvrtcCreateProgram(
                ctypes.byref(program), source, source_name.encode(), 0, None, None
            ),
            "nvrtcCreateProgram",
        )
        try:
            args = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in options]
            status = self.lib.nvrtcCompileProgram(
                program, len(args), (ctypes.c_char_p * len(args))(*args)
            )
            log = self.read(program, "ProgramLog").rstrip(b"\0").decode(errors="replace").strip()
            self.check(status, f"compiling {source_name} for {arch}", f":\n{log}" if log else "")
            if log:
                raise Failure(f"compiling {source_name} for {arch} warned:\n{log}")
            if arch.startswith("compute_"):
                return self.read(program, "PTX").rstrip(b"\0")
            return self.read(program, "CUBIN")
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(program))

    def read(self, program, what):
        size = ctypes.c_size_t()
        get_size = getattr(self.lib, f"nvrtcGet{what}Size")
        self.check(get_size(program, ctypes.byref(size)), f"nvrtcGet{what}Size")
        buffer = ctypes.create_string_buffer(size.value)
        self.check(getattr(self.lib, f"nvrtcGet{what}")(program, buffer), f"nvrtcGet{what}")
        return buffer.raw


# ---------------------------------------------------------------------------------------------
# What the blobs must be, checked on every build.


def check_ptx(name, text):
    lines = [line for line in text.decode().splitlines() if line and not line.startswith("//")]
    if lines[:2] != [PTX_ISA, f".target sm_{PTX_ARCH}"]:
        raise Failure(f"{name}.ptx starts with {lines[:2]}, not {PTX_ISA} / .target sm_{PTX_ARCH}")


def cubin_arch(elf):
    """The SM architecture a CUDA ELF of ABI version 7 (CUDA 12) is built for: e_flags' low byte."""
    if elf[:4] != b"\x7fELF" or elf[8] != 7:
        raise Failure("not a CUDA ELF of ABI version 7")
    (e_flags,) = struct.unpack_from("<I", elf, 48)
    return e_flags & 0xFF


# ---------------------------------------------------------------------------------------------
# The fatbin container, as nvcc lays it out:
#
#   header (16 bytes): u32 magic 0xBA55ED50, u16 version 1, u16 header size 16, u64 body size
#   entries, back to back, each a header then its payload:
#     +0  u16 kind (1 PTX, 2 ELF)       +2  u16 entry version 0x0101   +4 u32 header size
#     +8  u64 payload size              +16 u32 compressed size (0: not compressed)
#     +20 u32 offset of the options record in this header (0: none)
#     +24 u16 code version minor        +26 u16 code version major     +28 u32 arch (e.g. 90)
#     +32 u32 name offset, +36 u32 name length (0: unnamed)
#     +40 u64 flags: 0x1 64-bit, 0x10 Linux host (0x8000 / 0x2000 would mean compressed)
#     +48 u64 0                         +56 u64 uncompressed size (0: not compressed)
#   A PTX entry has 16 more header bytes: the options record (u32 offset 0x48 of the options text,
#   u32 its length, 0) and 8 zero bytes, as nvcc writes them. The code version is the PTX ISA
#   version for PTX (8.0) and [1, ELF ABI version] for an ELF (1.7 for CUDA 12 cubins). Payloads
#   are padded with zeros to 8 bytes; PTX text ends in a NUL.

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
FLAGS = 0x1 | 0x10


def fatbin_entry(kind, arch, version, payload):
    payload += b"\0" * (-len(payload) % 8)
    extra = struct.pack("<IIQ", 0x48, 0, 0) if kind == KIND_PTX else b""
    header = struct.pack(
        "<HHIQIIHHIIIQQQ",
        kind, 0x0101, 64 + len(extra), len(payload),
        0, 64 if extra else 0,
        version[1], version[0], arch,
        0, 0,
        FLAGS, 0, 0,
    )
    return header + extra + payload


def write_fatbin(ptx, cubins):
    major, minor = (int(v) for v in PTX_ISA.split()[1].split("."))
    entries = [fatbin_entry(KIND_PTX, PTX_ARCH, (major, minor), ptx + b"\0")]
    for arch, elf in cubins:
        entries.append(fatbin_entry(KIND_ELF, arch, (1, elf[8]), elf))
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


# ---------------------------------------------------------------------------------------------


def build(out):
    """Compiles every module into `out`; returns the file names written."""
    nvrtc = Nvrtc(nvrtc_library())
    if nvrtc.version != (12, 0):
        raise Failure(f"the library in {CACHE} is NVRTC {nvrtc.version}, not 12.0")
    # One program per (module, target). NVRTC compiles separate programs on separate threads, and
    # ctypes lets go of the GIL during each call; the results are gathered in a fixed order.
    jobs = [
        (name, source_name, defines, target)
        for name, source_name, defines in MODULES
        for target in [f"compute_{PTX_ARCH}"]
        + ([] if name in PTX_ONLY else [f"sm_{arch}" for arch in CUBIN_ARCHS])
    ]

    def run(job):
        name, source_name, defines, target = job
        source = (HERE / source_name).read_bytes()
        return nvrtc.compile(source_name, source, target, OPTIONS + defines)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        blobs = dict(zip([(job[0], job[3]) for job in jobs], pool.map(run, jobs)))
    written = {}
    for name, _, _ in MODULES:
        ptx = blobs[(name, f"compute_{PTX_ARCH}")]
        check_ptx(name, ptx)
        written[f"{name}.ptx"] = ptx
        if name in PTX_ONLY:
            continue
        cubins = []
        for arch in CUBIN_ARCHS:
            elf = blobs[(name, f"sm_{arch}")]
            if cubin_arch(elf) != arch:
                raise Failure(f"{name}: the sm_{arch} cubin says it is for sm_{cubin_arch(elf)}")
            written[f"{name}.sm_{arch}.cubin"] = elf
            cubins.append((arch, elf))
        if name == FATBIN_MODULE:
            written[f"{name}.fatbin"] = write_fatbin(ptx, cubins)
    written["NVRTC_VERSION"] = (
        f"NVRTC {nvrtc.version[0]}.{nvrtc.version[1]} from {WHEEL_PROJECT}=={WHEEL_VERSION}\n"
        f"{WHEEL_FILE} sha256 {WHEEL_SHA256}\n"
        f"options: {' '.join(OPTIONS)} (-O3 by default); PTX for compute_{PTX_ARCH}; cubins for "
        f"{', '.join(f'sm_{a}' for a in CUBIN_ARCHS)}\n"
    ).encode()
    out.mkdir(parents=True, exist_ok=True)
    for file, data in written.items():
        (out / file).write_bytes(data)
    return set(written)


def summarize(committed, fresh, names):
    """One line per file that differs; a few diff lines for text."""
    problems = []
    for name in sorted(names | {p.name for p in committed.iterdir()} - set(NVCC_BLOBS)):
        old, new = committed / name, fresh / name
        if not new.exists():
            problems.append(f"  {name}: committed, but no longer generated")
        elif not old.exists():
            problems.append(f"  {name}: generated, but not committed")
        elif old.read_bytes() != new.read_bytes():
            a, b = old.read_bytes(), new.read_bytes()
            problems.append(f"  {name}: differs ({len(a)} bytes committed, {len(b)} generated)")
            if not name.endswith((".cubin", ".fatbin")):
                diff = difflib.unified_diff(
                    a.decode(errors="replace").splitlines(), b.decode(errors="replace").splitlines(),
                    "committed", "generated", n=0, lineterm="",
                )
                problems.extend(f"    {line}" for line in list(diff)[2:8])
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare kernels/gen/ with a fresh build")
    parser.add_argument("--out", type=Path, default=HERE / "gen", help="where to write (default kernels/gen)")
    parser.add_argument("--fetch", action="store_true", help="fetch the pinned NVRTC and print its path")
    args = parser.parse_args()
    try:
        if args.fetch:
            print(nvrtc_library())
            return 0
        if args.check:
            with tempfile.TemporaryDirectory() as fresh:
                names = build(Path(fresh))
                problems = summarize(args.out, Path(fresh), names)
            if problems:
                say(f"{args.out} differs from a fresh build; run python3 kernels/nvrtc.py and commit:")
                print("\n".join(problems), file=sys.stderr)
                return 1
            say(f"{args.out} is up to date ({len(names)} files)")
            return 0
        names = build(args.out)
        # Blobs this build no longer makes (a module removed, an architecture dropped) go too.
        stale = [
            p for p in args.out.iterdir()
            if p.name not in names and p.name not in NVCC_BLOBS and p.name.endswith(BLOB_SUFFIXES)
        ]
        for path in stale:
            path.unlink()
        removed = f", removed {', '.join(p.name for p in stale)}" if stale else ""
        say(f"wrote {len(names)} files to {args.out}{removed}")
        return 0
    except Failure as failure:
        say(str(failure))
        return 1


if __name__ == "__main__":
    sys.exit(main())
