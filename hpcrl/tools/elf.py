"""The library search path written into an ELF executable (its DT_RUNPATH or DT_RPATH), read and
rewritten in place: `hpcrl stage` makes a staged interpreter find its libpython beside it
(`$ORIGIN/../lib`) rather than at the absolute path it was built for, which lies on the shared
file system. Standard library only: this runs in `hpcrl stage pack`.

Only 64-bit little-endian ELF files are read (x86-64, aarch64); the new path is written over the
old one in the string table, so it must be no longer than the old (it is padded with NULs).
"""
from __future__ import annotations

import struct

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 5, 15, 29


def _search_path_at(image: bytes) -> tuple[int, int] | None:
    """(file offset, length) of the executable's RUNPATH (else RPATH) string, or None: not a
    64-bit little-endian ELF file, or none written."""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", image, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", image, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", image, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None  # statically linked
    strtab, found = None, {}
    for offset in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", image, offset)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = value
        elif tag in (DT_RPATH, DT_RUNPATH):
            found[tag] = value
    entry = found.get(DT_RUNPATH, found.get(DT_RPATH))
    if strtab is None or entry is None:
        return None
    # the string table is named by its address once loaded: the file offset is the loaded segment's
    file_offset = next((p_offset + strtab - p_vaddr for p_vaddr, p_offset, p_filesz in loads
                        if p_vaddr <= strtab < p_vaddr + p_filesz), None)
    if file_offset is None:
        return None
    start = file_offset + entry
    return start, image.index(b"\0", start) - start


def search_path(image: bytes) -> str | None:
    """The executable's library search path (RUNPATH, else RPATH), or None."""
    at = _search_path_at(image)
    return None if at is None else image[at[0]:at[0] + at[1]].decode()


def with_search_path(image: bytes, path: str) -> bytes:
    """`image` with its library search path replaced by `path`. ValueError: none to replace, or
    `path` longer than the one there."""
    at = _search_path_at(image)
    new = path.encode()
    if at is None:
        raise ValueError("no RUNPATH or RPATH to replace")
    start, length = at
    if len(new) > length:
        raise ValueError(f"{path!r} is longer than the {length} bytes of the search path there")
    return image[:start] + new + b"\0" * (length - len(new)) + image[start + length:]
