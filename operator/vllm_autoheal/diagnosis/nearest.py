"""The engine's figures nearest a failure (arithmetic.numbers), indexed once a classification. Standard library only.

arithmetic.numbers walks every finding before the failure, nearest first, and keeps for each key the first
plausible figure (a KV budget: the smallest). That walk is the reference; a classification asks it for several
failures, and a line dense with the engine's figure wordings is 8+ findings (~30,000 in a 2 MiB log), so each
walk cost as much as the rest of the classification. Here the same answer comes from each message's findings
by offset: a key's nearest figure is a bisection and a few steps back, and a smallest-of-ranks key's minimum a
prefix table built once. The findings must be in offset order (findings_of's); else the walk itself answers.
"""

from __future__ import annotations

import heapq
import operator
from bisect import bisect_left
from collections.abc import Iterator
from itertools import chain, groupby, islice
from operator import attrgetter
from typing import Any

from . import arithmetic as ar
from . import figures
from . import messages as msg
from .findings import Finding

READ_KINDS = (msg.FIGURE, msg.MILESTONE, msg.BUDGET)  # read wherever they are before the failure
PROCESSES = "process_gib"  # what torch's `others` group gives: the first one nearest the failure
# A reading: (where the walk meets it, its key, the figure's text, its value, why it is implausible);
# where: (0, group) the failure's own, (1, finding, group) its line's, (2, -offset, finding, group) before it.
Reading = tuple[tuple[int, ...], str, str, Any, str | None]


def _key(name: str) -> str:
    return PROCESSES if name == "others" else name.rstrip("23")


class Figures:
    """arithmetic.numbers over one list of findings, for any failure, at the cost of a few look-ups a key."""

    def __init__(self, findings: list[Finding], device_gib: float | None) -> None:
        self.findings, self.device_gib = findings, device_gib
        self.offsets = offsets = list(map(attrgetter("line.offset"), findings))
        self.in_order = all(map(operator.le, offsets, islice(offsets, 1, None)))
        # per message the walk reads: its findings (indices) and their offsets (grouped by a stable sort on
        # the message's id: no Python step a finding, ~30,000 on a log dense with figure wordings)
        self.by_message: dict[int, tuple[msg.Message, list[int], list[int]]] = {}
        ids = list(map(id, map(attrgetter("message"), findings)))
        for key_id, group in groupby(sorted(range(len(findings)), key=ids.__getitem__), key=ids.__getitem__):
            indices = list(group)
            message = findings[indices[0]].message
            if self._walked(message, True):
                self.by_message[key_id] = (message, indices, list(map(offsets.__getitem__, indices)))
        self.groups: dict[int, dict[str, list[tuple[int, str]]]] = {}
        for key_id, (message, _, _) in self.by_message.items():
            names = sorted(message.regex.groupindex.items(), key=lambda kv: kv[1])
            for name, number in names:
                self.groups.setdefault(key_id, {}).setdefault(_key(name), []).append((number, name))
        self.reads: dict[tuple[int, str], tuple[Any, str | None] | None] = {}
        self.tables: dict[tuple[str, bool], tuple[list[int], list[Any]]] = {}

    def numbers(self, first: Finding | None, notes: list[str]) -> dict[str, Any]:
        if not self.in_order:
            return ar.numbers(self.findings, first, self.device_gib, notes)
        end = first.line.offset if first is not None else None
        with_oom = first is not None and first.message.kind == msg.MEMORY
        head = self._head(first, end, with_oom)
        keys = {r[1] for r in head} | {
            key
            for key_id, (message, _, offsets) in self.by_message.items()
            if self._walked(message, with_oom) and (end is None or offsets[0] < end)
            for key in self.groups.get(key_id, {})
        }
        taken: list[tuple[tuple[int, ...], str, Any]] = []
        noted: list[tuple[tuple[int, ...], str]] = []
        for key in keys:
            smallest = key in ar.SMALLEST_OF_RANKS
            best: tuple[tuple[int, ...], Any] | None = None
            bad: Reading | None = None
            rest = self._smallest(key, end, with_oom) if smallest else self._nearest(key, end, with_oom)
            for reading in chain((r for r in head if r[1] == key), rest):
                where, _, text, value, why = reading
                if why is not None:
                    bad = bad or reading
                elif best is None:
                    best = (where, value)
                elif value < best[1]:  # (only a smallest-of-ranks key reads on: min() keeps the first of equals)
                    best = (best[0], value)
                if best is not None and not smallest:
                    break
            if best is not None:
                taken.append((best[0], key, best[1]))
            if bad is not None:
                noted.append((bad[0], f"ignored {key}={bad[2][:40]}: {bad[4]}"))
        for _, note in sorted(noted):
            if not any(n.startswith(note.split("=", 1)[0] + "=") for n in notes):
                notes.append(note)
        return {key: value for _, key, value in sorted(taken, key=lambda t: t[0])}

    @staticmethod
    def _walked(message: msg.Message, with_oom: bool) -> bool:
        return message.kind in READ_KINDS or (with_oom and message.kind == msg.OOM)

    def _head(self, first: Finding | None, end: int | None, with_oom: bool) -> list[Reading]:
        """The failure's own readings, then those of the other findings on its line, in the walk's order."""
        if first is None or end is None:
            return []
        out = [r for _, name in self._names(first) if (r := self._reading((0,), first, name)) is not None]
        at = bisect_left(self.offsets, end)
        while at < len(self.findings) and self.offsets[at] == end:
            f = self.findings[at]
            if f is not first and (self._walked(f.message, with_oom) or f.line is first.line):
                out += [r for _, name in self._names(f) if (r := self._reading((1, at), f, name)) is not None]
            at += 1
        return sorted(out, key=lambda r: r[0])

    def _names(self, f: Finding) -> list[tuple[int, str]]:
        return sorted((number, name) for name, number in f.message.regex.groupindex.items())

    def _reading(self, where: tuple[int, ...], f: Finding, name: str) -> Reading | None:
        """A figure as the walk reads it: None where its group is empty or its text no number."""
        text = f.match.group(name)
        if text is None:
            return None
        key = _key(name)
        if (id(f), name) not in self.reads:  # (each figure parsed once a classification)
            value: Any = figures.process_sizes(text) if key == PROCESSES else figures.parse(key, text)
            why = (
                None
                if value is None or key == PROCESSES
                else ar.implausible(key, value, text, f.match.groupdict(), self.device_gib)
            )
            self.reads[(id(f), name)] = None if value is None else (value, why)
        read = self.reads[(id(f), name)]
        if read is None:
            return None
        number = f.message.regex.groupindex[name]
        return (*where, number), key, text, read[0], read[1]

    def _before(self, key: str, end: int | None, with_oom: bool) -> Iterator[Iterator[Reading]]:
        """Per message read at `key`: its readings before `end`, nearest first (a line's in group order)."""
        for key_id, (message, indices, offsets) in self.by_message.items():
            names = self.groups.get(key_id, {}).get(key)
            if names and self._walked(message, with_oom):
                yield self._back(message, indices, offsets, names, end)

    def _back(
        self,
        message: msg.Message,
        indices: list[int],
        offsets: list[int],
        names: list[tuple[int, str]],
        end: int | None,
    ) -> Iterator[Reading]:
        j = len(offsets) if end is None else bisect_left(offsets, end)
        while j > 0:
            block = bisect_left(offsets, offsets[j - 1], 0, j)  # (one line's findings: in their order)
            for t in range(block, j):
                f = self.findings[indices[t]]
                for _, name in names:
                    if f.match.group(name) is not None and (r := self._reading((2, -offsets[t], indices[t]), f, name)):
                        yield r
            j = block

    def _nearest(self, key: str, end: int | None, with_oom: bool) -> Iterator[Reading]:
        return heapq.merge(*self._before(key, end, with_oom), key=lambda r: r[0])

    def _smallest(self, key: str, end: int | None, with_oom: bool) -> list[Reading]:
        """What the walk takes of a smallest-of-ranks key before `end`: its first implausible reading, and the
        smallest plausible value (the first of equals) where the first plausible reading stands."""
        offsets, prefix = self._table(key, with_oom)
        j = len(offsets) if end is None else bisect_left(offsets, end)
        bad, ok, best = prefix[j]
        out = [r for r in (bad, ok) if r is not None]
        if ok is not None and best is not None:
            out.append((ok[0], key, best[2], best[3], None))  # (after the first: only its value counts)
        return sorted(out, key=lambda r: r[0])

    def _table(self, key: str, with_oom: bool) -> tuple[list[int], list[Any]]:
        """The key's readings in offset order; at each count, the walk's first implausible and first
        plausible reading among them, and the smallest value (min() in the walk's order keeps its first)."""
        if (key, with_oom) not in self.tables:
            # (in offset order, as the findings are: by finding, then group)
            readings = sorted((r for walk in self._before(key, None, with_oom) for r in walk), key=lambda r: r[0][2:])
            offsets = [-r[0][1] for r in readings]
            prefix: list[Any] = [(None, None, None)]
            bad = ok = best = None
            for r in readings:  # (r[0] < x[0]: the walk meets r first)
                if r[4] is not None:
                    bad = r if bad is None or r[0] < bad[0] else bad
                else:
                    ok = r if ok is None or r[0] < ok[0] else ok
                    if best is None or r[3] < best[3] or (r[3] == best[3] and r[0] < best[0]):
                        best = r
                prefix.append((bad, ok, best))
            self.tables[(key, with_oom)] = (offsets, prefix)
        return self.tables[(key, with_oom)]
