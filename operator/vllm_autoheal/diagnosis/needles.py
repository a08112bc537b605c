"""The literal needles of a regex: strings one of which is in every match, so a pattern runs
only on lines that hold one (str `in` is C speed; most lines hold none). Standard library only."""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable

_SPECIAL = set("\\.^$*+?{}[]()|")
_LITERAL_ESCAPES = set(".()[]{}*+?|^$/-'\" ")


def _top_level_alternatives(pattern: str) -> list[str]:
    parts, depth, cls, cur, i = [], 0, False, "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            cur += pattern[i : i + 2]
            i += 2
            continue
        if cls:
            cls = c != "]"
        elif c == "[":
            cls = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(cur)
            cur = ""
            i += 1
            continue
        cur += c
        i += 1
    return parts + [cur]


def _required_literal(alternative: str) -> str:
    """The longest run of literal characters that every match of this alternative contains."""
    runs, run, i, depth, cls = [], "", 0, 0, False
    while i < len(alternative):
        c = alternative[i]
        nxt = alternative[i + 1] if i + 1 < len(alternative) else ""
        if cls or depth:
            if cls:
                cls = c != "]" or alternative[i - 1] == "\\"
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "\\":
                i += 1
            elif c == "[":
                cls = True
            i += 1
            continue
        if c == "\\" and nxt in _LITERAL_ESCAPES:
            char, width = nxt, 2
        elif c in _SPECIAL:
            runs.append(run)
            run = ""
            depth += c == "("
            cls = c == "["
            i += 1 + (c == "\\")
            continue
        else:
            char, width = c, 1
        follow = alternative[i + width : i + width + 1]
        if follow in ("?", "*", "{"):
            runs.append(run)
            run = ""
        elif follow == "+":
            runs.append(run + char)
            run = ""
        else:
            run += char
        i += width
    runs.append(run)
    return max(runs, key=len)


def needles_of(pattern: str, flags: int = 0) -> tuple[str, ...]:
    found = []
    for alt in _top_level_alternatives(pattern):
        lit = _required_literal(alt).strip()
        if len(lit) < 3:
            return ()  # one alternative has no usable literal: always run the regex
        found.append(lit.lower() if flags & re.IGNORECASE else lit)
    return tuple(dict.fromkeys(found))


def trie(words: list[str]) -> str:
    """A regex matching the longest of `words` that starts where it is tried (a greedy trie)."""
    root: dict[str, dict] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, dict]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(root)


def any_of(needles: list[str]) -> Callable[[str], bool]:
    """Whether a text holds one of `needles`, in one pass of the regex engine (`n in text` for each
    costs a pass per needle, a step a character where the text is made of their characters)."""
    if not needles:
        return lambda text: False
    search = re.compile(trie(sorted(set(needles)))).search
    return lambda text: search(text) is not None


FEW_LEFT = 24  # needles left few enough to look for one by one with `in`
COMMON_CHARS = " .:_1acdeghilmnoprstuy"  # held by ~9 in 10 long lines of the corpus

# Needles closer than this on average (over the first few of a line): the regex pass at every position
# costs less than the tries inside each needle found (~1.5 us a needle, ~0.1 us a character)
DENSE_GAP = 20


def finder(needles: list[str]) -> Callable[[str], set[str]]:
    """Which of `needles` a text holds, without a pass per needle: `n in text` for each needle
    costs a pass per needle, and up to one step per character per needle when the text is made of
    characters the needles hold (str's search then cannot skip ahead). One regex pass finds the
    needles one after another, each the longest where it starts (the regex engine skips ahead to
    the characters they start with); a needle that starts inside one found is either inside it
    (known beforehand) or runs past its end, starting at one of the few places in it where a
    needle's opening is its ending (tried one by one)."""
    first = "".join(sorted({re.escape(n[0]) for n in needles}))  # (cheap test before the trie)
    every_start = re.compile(f"(?=[{first}])(?=({trie(needles)}))")
    longest = re.compile(trie(needles))
    inside = {n: frozenset(k for k in needles if k in n) for n in needles}
    openings = {n[:i] for n in needles for i in range(1, len(n))}
    # (with the characters that can follow the needle's end there: a needle starting inside one found that
    # does not run past its end is inside it, so the try is needed only where the next character is one of
    # those: most tries on a line of the engine's words were single letters, ~0.4 us each)
    runs_on = {
        n: [
            (i, frozenset(k[len(n) - i] for k in needles if len(k) > len(n) - i and k.startswith(n[i:])))
            for i in range(1, len(n))
            if n[i:] in openings
        ]
        for n in needles
    }
    # (a bit a needle: the needles that hold a character, by character)
    holding: dict[str, int] = {}
    for bit, needle in enumerate(needles):
        for ch in set(needle):
            holding[ch] = holding.get(ch, 0) | 1 << bit
    every = (1 << len(needles)) - 1
    # A line holding every character of more than FEW_LEFT needles leaves more than FEW_LEFT: the masks
    # are not worth it there (most long lines of a log hold the common characters: ~5 us a line less).
    common = [n for n in needles if set(n) <= set(COMMON_CHARS)]
    core = frozenset("".join(common)) if len(common) > FEW_LEFT else None

    def present(text: str) -> set[str]:
        chars = set(text) if len(text) > 256 else None
        if chars is not None and (core is None or not core <= chars):
            # A needle whose characters are not all in the line is not in it: on a long line
            # (a crafted one repeats a few characters) that leaves a few to look for with `in`.
            # (One OR of bit masks over the characters the line lacks, where a subset test a
            # needle cost 15 us a line.)
            lacked = functools.reduce(operator.or_, map(holding.__getitem__, holding.keys() - chars), 0)
            left = every & ~lacked
            if left.bit_count() <= FEW_LEFT:
                return {needles[bit] for bit in _bits(left) if needles[bit] in text}
        found: set[str] = set()
        for count, match in enumerate(longest.finditer(text), 1):
            if count > 8 and match.start() < count * DENSE_GAP:
                for rest in set(every_start.findall(text, match.start())):
                    found |= inside[rest]
                break
            word = match.group()
            found |= inside[word]
            following = text[match.end() : match.end() + 1]
            for offset, followers in runs_on[word]:
                if following in followers and (more := longest.match(text, match.start() + offset)) is not None:
                    found |= inside[more.group()]
        return found

    return present


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
