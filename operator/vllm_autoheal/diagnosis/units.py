"""Owns the byte units (KIB .. EIB, KB .. EB), defined once for the whole package.

Here, in the standard-library-only diagnosis package, because it is the base layer every other
module may import; quantity.py builds the Kubernetes and vLLM size grammars from these.
"""

from __future__ import annotations

KIB, MIB, GIB, TIB, PIB, EIB = (2 ** (10 * n) for n in range(1, 7))
KB, MB, GB, TB, PB, EB = (10 ** (3 * n) for n in range(1, 7))
