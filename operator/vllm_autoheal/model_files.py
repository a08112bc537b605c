"""A model's config.json from a local folder (or the file itself) for the CLI, and ModelOpt's hf_quant_config.json
beside it: only regular files are read, at most MAX_CONFIG_BYTES of each."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from .model_config import MAX_CONFIG_BYTES, ModelConfigError, parse

CONFIG_FILE = "config.json"
HF_QUANT_FILE = "hf_quant_config.json"


def read_raw(path: Path, source: str) -> bytes:
    """A regular file's first bytes, past the cap: opened without blocking and checked as opened, so a FIFO
    (which no one may ever write), a device or a link to one is refused at once, never waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ModelConfigError(f"cannot read {source}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ModelConfigError(f"cannot read {source}: not a regular file")
        try:
            return f.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ModelConfigError(f"cannot read {source}: {exc.strerror or exc}") from None


def read_capped(path: Path, source: str) -> dict[str, Any]:
    return parse(read_raw(path, source), source)


def from_path(path: str | Path) -> dict[str, Any]:
    """A directory holding config.json, or the file itself; and beside it ModelOpt's hf_quant_config.json,
    which vLLM reads where config.json has no quantization_config (ModelOpt 0.29 and before wrote it so)."""
    p = Path(path)
    if p.is_dir():
        p = p / CONFIG_FILE
        if not p.is_file():
            raise ModelConfigError(f"{path} is a directory without a {CONFIG_FILE}")
    beside = p.parent / HF_QUANT_FILE
    quant = read_raw(beside, str(beside)) if beside.is_file() else None
    return parse(read_raw(p, str(p)), str(p), quant_raw=quant)
