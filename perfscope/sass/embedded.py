"""The cubins an Nsight Compute report carries: the code that ran, for a static audit.

ncu stores the module of every kernel it profiles inside the report: the whole cubin, with
every function of the module, the ``.reuse`` flags of its instructions and its resource
tables, which the report's own SASS view (``IAction.sass_by_pc``) leaves out. The report
interface has no call that returns it, so this reads the report's bytes: each ELF image of
a CUDA cubin (64-bit, little-endian, machine EM_CUDA), its length taken from its own
section and program headers (an image whose headers point past the file is not one), and
its functions from the names of its ``.text.<function>`` sections.

    cubins = embedded_cubins(plain_report_bytes)
    candidates = cubins_for(cubins, "_Z14sgemm_pipe_dynIf...")   # () if no module holds it

Checked on the H200's reports: cuBLAS's SGEMM report carries libcublas's whole sm_90
module (14,007,616 bytes, the length its protobuf field gives too), a perfscope stage's
report its one-kernel NVRTC module.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
ELFCLASS64, ELFDATA2LSB = 2, 1
EM_CUDA = 190
SHT_NOBITS = 8
_EHDR = 64          # bytes of an ELF64 file header
_SHDR = 64          # bytes of an ELF64 section header
_TEXT = ".text."


@dataclass(frozen=True)
class EmbeddedCubin:
    """One cubin found in a report: its bytes and the functions its code sections hold."""

    data: bytes
    offset: int                      # where it starts in the plain report
    functions: frozenset[str]        # every NAME of a ".text.NAME" section

    @property
    def digest(self) -> str:
        """A short content hash, to tell two modules apart in file names and messages."""
        return hashlib.sha256(self.data).hexdigest()[:12]


def _elf_length(data: bytes, at: int) -> int | None:
    """The length of the CUDA ELF image starting at ``at``, or None when the bytes there
    are not one (another class, byte order or machine, or headers past the end)."""
    if at + _EHDR > len(data) or data[at + 4] != ELFCLASS64 or data[at + 5] != ELFDATA2LSB:
        return None
    if struct.unpack_from("<H", data, at + 0x12)[0] != EM_CUDA:
        return None
    phoff, shoff = struct.unpack_from("<QQ", data, at + 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, at + 0x36)
    if shnum == 0 or shentsize != _SHDR:
        return None
    end = max(_EHDR, shoff + shentsize * shnum, phoff + phentsize * phnum)
    if at + end > len(data):
        return None
    for i in range(shnum):
        h = at + shoff + i * shentsize
        sh_type = struct.unpack_from("<I", data, h + 4)[0]
        off, size = struct.unpack_from("<QQ", data, h + 0x18)
        if sh_type != SHT_NOBITS:
            end = max(end, off + size)
    for i in range(phnum):
        h = at + phoff + i * phentsize
        if h + 0x28 > len(data):
            return None
        off = struct.unpack_from("<Q", data, h + 0x08)[0]
        filesz = struct.unpack_from("<Q", data, h + 0x20)[0]
        end = max(end, off + filesz)
    return end if at + end <= len(data) else None


def _function_names(image: bytes) -> frozenset[str]:
    """NAME of every ``.text.NAME`` section: the functions whose code the image holds."""
    shoff = struct.unpack_from("<Q", image, 0x28)[0]
    shnum, shstrndx = struct.unpack_from("<HH", image, 0x3C)
    if shstrndx >= shnum:
        return frozenset()
    str_off, str_size = struct.unpack_from("<QQ", image, shoff + shstrndx * _SHDR + 0x18)
    names = image[str_off: str_off + str_size]
    out = set()
    for i in range(shnum):
        name_at = struct.unpack_from("<I", image, shoff + i * _SHDR)[0]
        end = names.find(b"\0", name_at)
        name = names[name_at: end if end >= 0 else None].decode("utf-8", "replace")
        if name.startswith(_TEXT) and len(name) > len(_TEXT):
            out.add(name[len(_TEXT):])
    return frozenset(out)


def embedded_cubins(data: bytes) -> tuple[EmbeddedCubin, ...]:
    """Every distinct CUDA cubin in a plain (decompressed) report's bytes, in file order."""
    out: list[EmbeddedCubin] = []
    seen: set[bytes] = set()
    at = data.find(ELF_MAGIC)
    while at >= 0:
        length = _elf_length(data, at)
        if length is None:
            at = data.find(ELF_MAGIC, at + len(ELF_MAGIC))
            continue
        image = data[at: at + length]
        key = hashlib.sha256(image).digest()
        if key not in seen:
            seen.add(key)
            out.append(EmbeddedCubin(image, at, _function_names(image)))
        at = data.find(ELF_MAGIC, at + length)
    return tuple(out)


def cubins_for(cubins: tuple[EmbeddedCubin, ...], function: str) -> tuple[EmbeddedCubin, ...]:
    """Every cubin whose code holds ``function`` (a mangled name), in file order: more than
    one where a program compiled the same kernel name several times (Triton's autotuner,
    one module per configuration); which one ran, only the report's SASS can tell."""
    return tuple(c for c in cubins if function in c.functions)
