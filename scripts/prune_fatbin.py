"""Keeps one GPU architecture's code in a shared library's fatbins, for carrying it compressed.

A CUDA library built for many architectures holds, per module, one cubin (ELF) per architecture
and PTX for some. A GPU of architecture N (sm_90: N = 90) runs a cubin of its own major version
no newer than N, and otherwise compiles PTX no newer than N. This keeps, in each fatbin, the
cubins it can run, or, where there is none, the PTX it can compile, and overwrites with zeros the
payload of every other entry, in place: the file keeps its size and every offset (nothing to
relink), and the zeros vanish under xz.

    python scripts/prune_fatbin.py --arch 90 LIB.so [LIB.so ...]      # prints what it cleared
    python scripts/prune_fatbin.py --arch 90 --relocatable libnccl.so.2

A library built with relocatable device code (NCCL 2.29 and later) also keeps each object's
fatbin in the section `__nv_relfatbin`, for device linking; half of NCCL 2.32's wheel. Its
modules are registered beside the linked ones of `.nv_fatbin`, so --relocatable prunes it by the
same rule rather than dropping it (scripts/nccl_payload.sh).

The fatbin layout read here (the ELF section `.nv_fatbin`): fatbins one after another, each a
16-byte header (magic 0xBA55ED50, version u16, header size u16, entries' size u64) followed by
entries, each a header (kind u16: 1 PTX, 2 cubin; u16; header size u32; payload size u64; ...;
architecture u32 at byte 28) and its payload. The result was checked on the GPU it is for: the
library loads and its kernels run (scripts/vllm_gpu_payload.sh, docs/development.md).
"""

from __future__ import annotations

import argparse
import mmap
import struct
import sys

MAGIC = 0xBA55ED50
PTX, CUBIN = 1, 2


def section(data, wanted: str) -> tuple[int, int] | None:
    """(offset, size) of an ELF64 little-endian file's section `wanted`, or None."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    for name, _type, _flags, _addr, offset, size in headers:
        end = data.find(b"\0", names + name)
        if data[names + name:end].decode() == wanted:
            return offset, size
    return None


def fatbins(data, offset: int, size: int):
    """Each fatbin of the section: a list of its entries (kind, arch, payload offset, payload size)."""
    position, end = offset, offset + size
    while position + 16 <= end:
        magic, _version, header, total = struct.unpack_from("<IHHQ", data, position)
        if magic != MAGIC:
            position += 8   # fatbins are 8-byte aligned, padding between them
            continue
        entries, entry, stop = [], position + header, position + header + total
        if stop > end:
            raise ValueError(f"fatbin at {position:#x} runs past its section")
        while entry + 32 <= stop:
            kind, _unknown, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            if entry_header == 0:
                break
            arch, = struct.unpack_from("<I", data, entry + 28)
            entries.append((kind, arch, entry + entry_header, payload))
            entry += entry_header + payload
        yield entries
        position = stop


def prune(path: str, arch: int, relocatable: bool = False) -> tuple[int, int]:
    """Zeroes the entries a GPU of `arch` cannot use, in `.nv_fatbin` (and `__nv_relfatbin` with
    `relocatable`); returns (bytes cleared, bytes kept)."""
    def runs(kind, entry_arch):
        return kind == CUBIN and entry_arch // 10 == arch // 10 and entry_arch <= arch

    cleared = kept = 0
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 0) as data:
        for name in (".nv_fatbin", "__nv_relfatbin") if relocatable else (".nv_fatbin",):
            where = section(data, name)
            for entries in list(fatbins(data, *where)) if where else ():
                has_cubin = any(runs(kind, entry_arch) for kind, entry_arch, _, _ in entries)
                for kind, entry_arch, start, size in entries:
                    usable = runs(kind, entry_arch) if has_cubin else (kind == PTX and entry_arch <= arch)
                    if usable:
                        kept += size
                    else:
                        data[start:start + size] = bytes(size)
                        cleared += size
        data.flush()
    return cleared, kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, required=True, help="the architecture kept, e.g. 90 for Hopper")
    parser.add_argument("--relocatable", action="store_true",
                        help="also prune the relocatable device code kept for device linking (__nv_relfatbin)")
    parser.add_argument("libraries", nargs="+")
    args = parser.parse_args(argv)
    for path in args.libraries:
        cleared, kept = prune(path, args.arch, args.relocatable)
        print(f"{path}: cleared {cleared / 2**20:.1f} MiB of other architectures, kept {kept / 2**20:.1f} MiB "
              f"that sm_{args.arch} runs or compiles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
