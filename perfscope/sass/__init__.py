"""Static disassembly of cubins (cuobjdump / nvdisasm): what a kernel compiles to.

The audit workflow that judges it (``perfscope sass``) is :mod:`perfscope.audit`; the
opcode vocabulary it groups by is :mod:`perfscope.families`.
"""
