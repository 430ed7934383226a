"""Just enough of an ELF reader to vet a shared library before dlopen, which runs its constructors.

Two questions: the bytes of a named section (a library's embedded facts), and which other libraries
the dynamic loader would pull in with it (DT_NEEDED, DT_RPATH/DT_RUNPATH), read from the program
headers as the dynamic loader itself does, not from section headers a forger may make disagree.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

ET_DYN = 3
SHT_NOBITS = 8
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 15, 29


class ElfError(ValueError):
    """Not a well-formed ELF shared library; the message says what is wrong."""


@dataclass(frozen=True)
class _Layout:
    header: str
    section: str
    segment: str
    dynamic: str


_LAYOUTS = {1: _Layout("HHIIIIIHHHHHH", "IIIIIIIIII", "IIIIIIII", "iI"),
            2: _Layout("HHIQQQIHHHHHH", "IIQQQQIIQQ", "IIQQQQQQ", "qQ")}


class _Segment(NamedTuple):
    type: int
    offset: int
    vaddr: int
    filesz: int


@dataclass(frozen=True)
class Dynamic:
    needed: tuple[str, ...]
    search_paths: tuple[str, ...]  # DT_RPATH and DT_RUNPATH entries


class Elf:
    def __init__(self, data: bytes):
        self.data = data
        if data[:4] != b"\x7fELF" or len(data) < 64:
            raise ElfError("not an ELF file")
        cls, order = data[4], data[5]
        if cls not in _LAYOUTS or order not in (1, 2):
            raise ElfError(f"unknown ELF class {cls} / byte order {order}")
        self._end = "<" if order == 1 else ">"
        self._lay = _LAYOUTS[cls]
        (self.type, self.machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
         shstrndx) = self._unpack(self._lay.header, 16)
        if self.type != ET_DYN:
            raise ElfError(f"ELF type {self.type}, not a shared library")
        pick = (0, 1, 2, 4) if cls == 1 else (0, 2, 3, 5)  # type, offset, vaddr, filesz
        self._segments = [_Segment(*(raw[k] for k in pick))
                          for raw in (self._unpack(self._lay.segment, phoff + i * phentsize) for i in range(phnum))]
        self._sections = [self._unpack(self._lay.section, shoff + i * shentsize) for i in range(shnum)]
        if shnum and shstrndx >= shnum:
            raise ElfError("section name table index out of range")
        self._shstr = self._section_bytes(self._sections[shstrndx]) if shnum else b""

    def _unpack(self, fmt: str, offset: int) -> tuple:
        fmt = self._end + fmt
        size = struct.calcsize(fmt)
        if offset < 0 or offset + size > len(self.data):
            raise ElfError(f"a header at offset {offset} runs past the end of the file")
        return struct.unpack_from(fmt, self.data, offset)

    def _slice(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > len(self.data):
            raise ElfError(f"{size} bytes at offset {offset} run past the end of the file")
        return self.data[offset:offset + size]

    def _section_bytes(self, sh: tuple) -> bytes:
        _, sh_type, _, _, offset, size = sh[:6]
        return b"" if sh_type == SHT_NOBITS else self._slice(offset, size)

    def section(self, name: str) -> bytes | None:
        """The bytes of the one section called `name`; None if there is none; ElfError if there are two."""
        found = [sh for sh in self._sections if _cstr(self._shstr, sh[0]) == name]
        if len(found) > 1:
            raise ElfError(f"{len(found)} sections named {name}")
        return self._section_bytes(found[0]) if found else None

    def dynamic(self) -> Dynamic:
        """The libraries this one makes the dynamic loader open, and where it would look for them."""
        seg = next((p for p in self._segments if p.type == PT_DYNAMIC), None)
        if seg is None:
            return Dynamic((), ())
        size = struct.calcsize(self._end + self._lay.dynamic)
        entries = []
        for off in range(seg.offset, seg.offset + seg.filesz - size + 1, size):
            tag, val = self._unpack(self._lay.dynamic, off)
            if tag == DT_NULL:
                break
            entries.append((tag, val))
        tags = dict(entries)
        if DT_STRTAB not in tags:
            raise ElfError("dynamic section without a string table")
        strtab = self._slice(self._file_offset(tags[DT_STRTAB]), tags.get(DT_STRSZ, 0))
        needed = tuple(_cstr(strtab, v) for t, v in entries if t == DT_NEEDED)
        paths = tuple(_cstr(strtab, v) for t, v in entries if t in (DT_RPATH, DT_RUNPATH))
        return Dynamic(needed, paths)

    def _file_offset(self, vaddr: int) -> int:
        for seg in self._segments:
            if seg.type == PT_LOAD and seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                return vaddr - seg.vaddr + seg.offset
        raise ElfError(f"address {vaddr:#x} is in no loaded segment")


def _cstr(table: bytes, offset: int) -> str:
    if offset >= len(table):
        raise ElfError(f"string offset {offset} outside its table")
    end = table.find(b"\0", offset)
    return table[offset:end if end >= 0 else len(table)].decode("utf-8", "replace")
