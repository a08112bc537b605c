"""Every row of the message tables can match: a row's regex runs only on lines that hold one of its
literal needles (diagnosis/needles.py), so an alternative written without one is dead code."""

from __future__ import annotations

import re

import pytest

from vllm_autoheal.diagnosis import messages as msg
from vllm_autoheal.diagnosis.needles import _top_level_alternatives

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
