"""Every row of the message tables can match: a row's regex runs only on lines that hold one of its
literal needles (diagnosis/needles.py), so an alternative written without one is dead code."""

from __future__ import annotations

import random
import re

import pytest

from vllm_autoheal.diagnosis import messages as msg
from vllm_autoheal.diagnosis.corpus import load
from vllm_autoheal.diagnosis.findings import _NEEDLES as NEEDLES
from vllm_autoheal.diagnosis.needles import _top_level_alternatives, finder
from vllm_autoheal.diagnosis.scan import scan

from crafted.bases import ROOT

_LOOKBEHIND = re.compile(r"\(\?<[=!][^()]*(?:\([^()]*\)[^()]*)*\)")
_SMALL_CLASS = re.compile(r"\[(?!\w-\w)([^\]\\^]{2,3})\]")  # [-_], [Ee]: no ranges


def _spellings(alternative: str) -> list[str]:
    """The alternative's text without lookbehinds and escapes, once per letter of each small class
    (`oom[-_]kill` is `oom-kill` and `oom_kill`)."""
    texts, done = [_LOOKBEHIND.sub("", alternative)], []
    while texts:
        text = texts.pop()
        cls = _SMALL_CLASS.search(text)
        if cls is None:
            done.append(text.replace("\\", ""))
        else:
            texts += [text[: cls.start()] + letter + text[cls.end() :] for letter in cls.group(1)]
    return done


@pytest.mark.parametrize("row", [m for m in msg.MESSAGES if m.needles], ids=lambda m: m.subtype or m.kind)
def test_every_alternative_of_a_row_holds_one_of_its_needles(row):
    """A row runs only on lines holding one of its needles: an alternative written without one is
    never tried (the Triton OutOfResources and 'Registering N cuda graph addresses' rows were dead)."""
    for alternative in _top_level_alternatives(row.regex.pattern):
        for text in _spellings(alternative):
            hay = text.lower() if row.ignores_case else text
            assert any(n in hay for n in row.needles), (alternative, row.needles)


SHARES = (256, 512, 1024, 2048)  # what a row sees of a line past findings.ROW_CHAR_BUDGET


def test_a_match_of_a_case_sensitive_row_holds_one_of_its_needles():
    """Past the per-line budget a row is tried only where one of its needles is in its share of the
    line (findings._rows_seeing_a_needle): that is no row's match left out only where every match of
    the row holds one of its needles. On every line of the corpus, and each share of it."""
    rows = [m for m in msg.MESSAGES if m.needles and not m.ignores_case]
    matched = 0
    for sample in load(ROOT / "tests" / "corpus" / "corpus.jsonl"):
        for line in scan(sample["log"]).lines:
            for share in {line.match_text[:n] for n in SHARES}:
                for row in rows:
                    if row.regex.search(share):
                        matched += 1
                        assert any(n in share for n in row.needles), (row.subtype or row.kind, share)
    assert matched > 1000


def _texts(alphabet: str, seed: int) -> list[str]:
    rnd = random.Random(seed)
    return ["".join(rnd.choice(alphabet) for _ in range(rnd.choice([3, 40, 300, 2048]))) for _ in range(300)]


# (bench/diagnosis_speed.py's lines of needles: the shortest of every row, every needle, backwards)
SHORTEST = " ".join(min(m.needles, key=len) for m in msg.MESSAGES if m.needles)
SMALL = ["abcd", "cdef", "bc", "defg", "efgh", "fgh", "xyz", "zzz", "hxa"]


@pytest.mark.parametrize(
    "needles, texts",
    [
        (SMALL, ["abcdefgh", "abcdefg", "zzzz", "xyzzz", "abcdefgh" * 60, (" " * 30 + "abcdefghxa") * 60]),
        (SMALL, _texts("abcdefghxyz", 1) + _texts("abcdefghxyz" + " " * 30, 2)),
        (NEEDLES, [SHORTEST, " ".join(NEEDLES), " ".join(NEEDLES[::-1]), "".join(NEEDLES), "".join(NEEDLES[::-1])]),
        (NEEDLES, ["".join(random.Random(k).choices(NEEDLES + [" ", "x", "(("], k=400))[:2048] for k in range(40)]),
    ],
)
def test_the_finder_finds_every_needle_a_text_holds(needles, texts):
    """needles.finder finds needles one after another, each the longest where it starts, and tries
    inside each the places where another may start and run past its end (or, where they lie close,
    reads every position): what it finds is what `in` finds, needle by needle."""
    present = finder(needles)
    for text in texts:
        assert present(text) == {n for n in needles if n in text}, text
