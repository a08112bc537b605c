"""Kubernetes resource quantities <-> bytes (the subset memory limits use)."""
from __future__ import annotations

import re
from fractions import Fraction

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": Fraction(1, 1000)}
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
    return f"{-(-value // 2**20)}Mi"  # round up to whole MiB
