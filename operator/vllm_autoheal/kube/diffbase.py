"""kopf's diffbase (the last handled spec, kept in an annotation) with large values kept as digests.

kopf copies the whole spec, labels and annotations into one annotation of the object, and the API server
refuses an object whose annotations exceed 256 KiB together. A spec the CRD admits can be larger than that
(spec.env alone takes 128 values of 32 KiB), and then every write of kopf's bookkeeping is refused: the
spec is never recorded as handled, and a handler's retry state is lost. The handlers never read kopf's
old/new/diff, only whether anything changed, so a digest of a large value serves as well as the value.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import kopf

# A string or list whose JSON is longer is kept as its digest; so is a mapping once its kept form is.
# The bound on the annotation follows for the spec (at most MAPPING_BYTES: tests/test_diffbase.py checks
# the largest the CRD admits); labels and annotations keep each key, their long values as digests.
VALUE_BYTES = 256
MAPPING_BYTES = 8192


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _digest(text: str) -> dict[str, str]:
    # (a mapping under a key no spec field, label or annotation key can be: no value it replaces looks the same)
    return {DIGEST_KEY: hashlib.sha256(text.encode()).hexdigest()}


DIGEST_KEY = "$sha256"


def kept(value: Any) -> Any:
    """The value as the diffbase keeps it: equal values give equal forms, different ones different."""
    if isinstance(value, dict):
        form = {key: kept(item) for key, item in value.items()}
        text = _json(form)
        return form if len(text) <= MAPPING_BYTES else _digest(text)
    if isinstance(value, (str, list)):
        text = _json(value)
        return value if len(text) <= VALUE_BYTES else _digest(text)
    return value


class DigestedDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation storage of the essence, each large value replaced by its digest. The metadata
    and its labels and annotations stay mappings (kopf's progress storage clears its own keys there)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        essence = dict(super().build(body=body, extra_fields=extra_fields))
        for key, value in essence.items():
            if key == "metadata" and isinstance(value, dict):
                essence[key] = {
                    k: {n: kept(v) for n, v in m.items()} if isinstance(m, dict) else kept(m) for k, m in value.items()
                }
            elif isinstance(value, dict):
                essence[key] = kept(value)
        return essence
