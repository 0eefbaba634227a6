"""SASS opcode families and (later) static disassembly of cubins."""

from perfscope.sass.families import FAMILIES, FAMILY_BY_KEY, base_opcode, family_of, group_families

__all__ = ["FAMILIES", "FAMILY_BY_KEY", "base_opcode", "family_of", "group_families"]
