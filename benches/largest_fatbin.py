"""The largest fatbin of the `.nv_fatbin` section of an ELF file, written to a file: the input of
the model-load bench's `large_fatbin` case (`ATLAS_BENCH_FATBIN`).

    python3 benches/largest_fatbin.py /usr/local/cuda/lib64/libcusparse.so.12 /tmp/big.fatbin
"""
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50


def largest_fatbin(elf: bytes) -> bytes:
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    count, names_index = struct.unpack_from("<HH", elf, 0x3C)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * 64) for i in range(count)]
    names = headers[names_index][4]
    best = (0, 0)
    for name, _, _, _, offset, size, *_ in headers:
        if elf[names + name : names + name + 11] != b".nv_fatbin\0":
            continue
        at, end = offset, offset + size
        # Fatbins follow one another, each 8-byte aligned: a 16-byte header, then its body.
        while at + 16 <= end:
            magic, _, header_size, body = struct.unpack_from("<IHHQ", elf, at)
            if magic != FATBIN_MAGIC:
                at += 8
                continue
            best = max(best, (header_size + body, at))
            at = (at + header_size + body + 7) & ~7
    size, at = best
    return elf[at : at + size]


if __name__ == "__main__":
    source, target = sys.argv[1:3]
    fatbin = largest_fatbin(open(source, "rb").read())
    open(target, "wb").write(fatbin)
    print(f"the largest fatbin of {source}: {len(fatbin)} bytes, written to {target}")
