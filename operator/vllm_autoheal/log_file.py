"""Reading a log for `diagnose`: what is no log to read (a device, a compressed file), and of a huge regular
file only the bytes the classifier's windows can hold (its head and tail), sought, not read through."""

from __future__ import annotations

import io
import os
import stat
from typing import IO, Any

from .diagnosis.candidates import MAX_LINE
from .diagnosis.container_log import unpacked
from .diagnosis.log_records import decoded
from .diagnosis.scan import HEAD_BYTES, TAIL_BYTES

# Raw bytes first read for each window, in characters: UTF-8 takes up to 4 bytes a character, and a node's log
# format or vLLM's JSON records take more bytes than the text they decode to (a CRI prefix, JSON escapes).
# Where what was read decodes to less than the window, four times as much is read, once (what is held and
# decoded at once stays below 80 MiB); where that is short too, the file is read through, as a stream is.
RAW_PER_CHARACTER = 16
HEAD_RAW = RAW_PER_CHARACTER * HEAD_BYTES
TAIL_RAW = RAW_PER_CHARACTER * TAIL_BYTES
GROWTH = 4
SOUGHT_ABOVE = GROWTH * (HEAD_RAW + TAIL_RAW)  # a smaller file (from where it is read) is read whole, as a stream is


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
    """`f` itself, or for a regular UTF-8 file holding more than SOUGHT_ABOVE from where it stands (a stream
    left at an offset is read from there, as a pipe is) its head and tail, a newline between (the cut lines
    stay apart): all the classifier's windows would keep of it (the middle becomes its gap line). Each is read
    on (once, GROWTH times as much) until it decodes, as the classifier decodes the file, to more than its
    window; else the file is read through. A 50 GB log cost 2.7 s a GB read through; a UTF-16 file is read
    whole (a seek may split a character)."""
    try:
        info, start = os.fstat(f.fileno()), f.tell()
    except (OSError, ValueError):
        return f
    end = info.st_size
    if not utf8 or not stat.S_ISREG(info.st_mode) or end - start <= SOUGHT_ABOVE:
        return f
    head_raw, tail_raw = HEAD_RAW, TAIL_RAW
    while head_raw + tail_raw < end - start and head_raw + tail_raw <= GROWTH * (HEAD_RAW + TAIL_RAW):
        f.seek(start)
        head = f.read(head_raw)
        f.seek(end - tail_raw)
        tail = f.read(tail_raw)
        short_head = _decoded_length(head, head) < HEAD_BYTES + MAX_LINE
        cut, _, lines = tail.partition(b"\n")  # (the cut line, left as it is: the window's own cut line is skipped)
        short_tail = len(cut) + _decoded_length(head, lines) < TAIL_BYTES + MAX_LINE
        if not short_head and not short_tail:
            return io.BytesIO(head + b"\n" + tail)
        head_raw, tail_raw = head_raw * (GROWTH if short_head else 1), tail_raw * (GROWTH if short_tail else 1)
    f.seek(start)
    return f


def _decoded_length(head: bytes, part: bytes) -> int:
    """The characters `part` decodes to as the classifier reads the file: a node's log format or vLLM's JSON
    records, as the head's first line says."""
    first = head.lstrip().partition(b"\n")[0]
    text = (first + b"\n" + part).decode("utf-8", errors="replace")
    return sum(len(chunk) for chunk in decoded(unpacked([text]))) - len(first) - 1
