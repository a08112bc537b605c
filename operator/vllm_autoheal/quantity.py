"""Owns size parsing: Kubernetes resource quantities <-> bytes, and vLLM's human-readable sizes."""

from __future__ import annotations

import re
from fractions import Fraction

from .diagnosis.units import EB, EIB, GB, GIB, KB, KIB, MB, MIB, PB, PIB, TB, TIB

_SUFFIX = {
    "": 1,
    "k": KB,
    "M": MB,
    "G": GB,
    "T": TB,
    "P": PB,
    "E": EB,
    "Ki": KIB,
    "Mi": MIB,
    "Gi": GIB,
    "Ti": TIB,
    "Pi": PIB,
    "Ei": EIB,
    "m": Fraction(1, 1000),
}
# vLLM's sizes are case-insensitive ("8g", "8GiB"): each lower-case suffix is the quantity's suffix.
_ANY_CASE = {s.lower(): s for s in _SUFFIX if s != "m"}
_SIZE = re.compile(r"^([0-9.]+)\s*([a-z]*)$")
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def exact_quantity(text: str) -> Fraction:
    """'1.5Gi' -> its exact value (quantities compare exactly, however large: 1000Ei)."""
    found = _QUANTITY.match(str(text).strip())
    if not found:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return Fraction(found.group(1)) * Fraction(_SUFFIX[found.group(2) or ""])


def parse_quantity(text: str | int) -> int:
    """'64Gi' -> 68719476736; a bad quantity is a ValueError naming it."""
    if isinstance(text, int):
        return text
    return int(exact_quantity(text))


def format_bytes(value: int) -> str:
    """Bytes as the largest binary unit that keeps a whole number of MiB: 3221225472 -> '3Gi'."""
    for unit in ("Ti", "Gi", "Mi"):
        size = _SUFFIX[unit]
        if value % size == 0:
            return f"{value // size}{unit}"
    return f"{-(-value // MIB)}Mi"  # round up to whole MiB


def parse_size(text: str) -> int:
    """vLLM's human-readable byte counts for --kv-cache-memory-bytes (8G, 8Gi, 1.5g, 8GiB): a quantity
    in any case with an optional trailing B; a bad one is a ValueError naming it."""
    found = _SIZE.match(str(text).strip().lower().removesuffix("b"))
    if not found or found.group(2) not in _ANY_CASE:
        raise ValueError(f"not a size: {text!r}")
    return int(exact_quantity(found.group(1) + _ANY_CASE[found.group(2)]))
