"""Reading a log for `diagnose`: what is no log to read (a device, a compressed file), and of a huge regular
file only the bytes the classifier's windows can hold (its head and tail), sought, not read through."""

from __future__ import annotations

import io
import os
import stat
from typing import IO, Any

from .diagnosis.scan import HEAD_BYTES, TAIL_BYTES

# Raw bytes enough for each window in characters: UTF-8 takes up to 4 bytes a character, and a node's log
# format or vLLM's JSON records take more bytes than the text they decode to (a CRI prefix, JSON escapes).
RAW_PER_CHARACTER = 16
HEAD_RAW = RAW_PER_CHARACTER * HEAD_BYTES
TAIL_RAW = RAW_PER_CHARACTER * TAIL_BYTES
SOUGHT_ABOVE = 4 * (HEAD_RAW + TAIL_RAW)  # a smaller file is read whole, as a stream is


def no_log(stream: Any, name: str) -> str | None:
    """Why `stream` is no log to read, else None: a device (/dev/zero, /dev/urandom never end; a terminal
    is read as stdin is), or a compressed file (a rotated kubelet log, 0.log.<time>.gz)."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError):  # (no descriptor: a stream of the caller's)
        return None
    if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) and not stream.isatty():
        return f"{name} is a device, not a log file"
    peek = getattr(stream, "peek", None)
    if stat.S_ISREG(mode) and peek is not None and peek(2)[:2] == b"\x1f\x8b":
        return f"{name} is gzip-compressed: decompress it first (zcat {name} | vllm-autoheal diagnose -)"
    return None


def windows(f: IO[bytes], utf8: bool) -> IO[bytes]:
    """`f` itself, or for a regular UTF-8 file above SOUGHT_ABOVE its head and tail (a newline between: the
    cut lines stay apart), which is all the classifier would keep of it (the middle becomes its gap line).
    A 50 GB log cost 2.7 s a GB read through; a UTF-16 file is read whole (a seek may split a character)."""
    try:
        info = os.fstat(f.fileno())
    except (OSError, ValueError):
        return f
    if not utf8 or not stat.S_ISREG(info.st_mode) or info.st_size <= SOUGHT_ABOVE:
        return f
    head = f.read(HEAD_RAW)
    f.seek(info.st_size - TAIL_RAW)
    return io.BytesIO(head + b"\n" + f.read(TAIL_RAW))
