"""A field of a model's config.json as bounded, untrusted input: its name, the range real models have, and
the checks that name it in a ModelConfigError (model_config and quant_config read through them)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any


class ModelConfigError(ValueError):
    """The config cannot be used; the message says which field and why."""


@dataclass(frozen=True)
class ConfigField:
    name: str  # as config.json spells it
    low: int
    high: int
    description: str
    aliases: tuple[str, ...] = ()  # older spellings the memory model also reads
    required: bool = False


class NonFinite:
    """NaN, Infinity or -Infinity where a config.json holds one (Python's json and transformers read them:
    Nemotron-3 Super's time_step_limit is [0.0, Infinity]). No number: a field the memory model reads that
    holds one is refused by name, and one it does not read is left alone."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def where(field: str, source: str) -> str:
    return f"{source}: {field}" if source else field


def integer(value: Any, field: ConfigField, key: str, source: str) -> int:
    if isinstance(value, NonFinite):
        raise ModelConfigError(f"{where(key, source)} holds {value.name}, which is not a number JSON allows")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelConfigError(
            f"{where(key, source)} must be a whole number, got {json.dumps(value, default=repr)[:40]}"
        )
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise ModelConfigError(f"{where(key, source)} must be a whole number, got {value!r}")
    if not field.low <= value <= field.high:
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        if len(shown) > 24:  # a number of a thousand digits is named, not quoted
            shown = f"{shown[:8]}... ({len(shown)} digits)"
        raise ModelConfigError(f"{where(key, source)} is {shown}; real models have {field.low} to {field.high:,}")
    return int(value)
