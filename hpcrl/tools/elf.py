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


def _read_from(source):
    """read(offset, size) over bytes or a binary file."""
    if isinstance(source, (bytes, bytearray)):
        return lambda offset, size: bytes(source[offset:offset + size])

    def read(offset: int, size: int) -> bytes:
        source.seek(offset)
        return source.read(size)
    return read


def search_path_at(source) -> tuple[int, str] | None:
    """(file offset, value) of the RUNPATH (else RPATH) string of an ELF file (`source`: its bytes,
    or the file opened for binary reading: only its headers, dynamic section and that string are
    read), or None: not a 64-bit little-endian ELF file, or none written."""
    read = _read_from(source)
    ident = read(0, 64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", ident, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", ident, 0x36)
    headers = read(phoff, phentsize * phnum)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", headers, i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = read(p_offset, p_filesz)
    if dynamic is None:
        return None  # statically linked
    strtab, found = None, {}
    for offset in range(0, len(dynamic) - 15, 16):
        tag, value = struct.unpack_from("<qQ", dynamic, offset)
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
    start, value = file_offset + entry, b""
    while b"\0" not in value:
        chunk = read(start + len(value), 4096)
        if not chunk:
            return None
        value += chunk
    return start, value[:value.index(b"\0")].decode()


def search_path(source) -> str | None:
    """The library search path (RUNPATH, else RPATH) of an ELF file (its bytes or the open file), or None."""
    at = search_path_at(source)
    return None if at is None else at[1]


def with_search_path(image: bytes, path: str) -> bytes:
    """`image` with its library search path replaced by `path`. ValueError: none to replace, or
    `path` longer than the one there."""
    at = search_path_at(image)
    if at is None:
        raise ValueError("no RUNPATH or RPATH to replace")
    start, old = at
    new, length = path.encode(), len(old.encode())
    if len(new) > length:
        raise ValueError(f"{path!r} is longer than the {length} bytes of the search path there")
    return image[:start] + new + b"\0" * (length - len(new)) + image[start + length:]
