"""How vLLM's argument parser reads a command-line token: which option it names (underscores, `=value`,
argparse's abbreviations, one-letter aliases), and what a list of tokens sets a flag to. Plain strings in
and out, so the flag table (engine.py), the memory model and the launcher's neighbours read flags alike."""

from __future__ import annotations


def flag_name(token: str) -> str | None:
    """The option a command-line token names, as vLLM's parser reads it; None for a value.

    vLLM (FlexibleArgumentParser) accepts `--flag value`, `--flag=value` and underscores for
    dashes before the first dot; argparse also takes any unambiguous prefix of a long flag, and
    a single-dash option followed by its value (`-q8`)."""
    if not token.startswith("-") or token == "-" or is_number(token):
        return None
    name = token.split("=", 1)[0]
    if name.startswith("--"):
        head, dot, tail = name.partition(".")
        return head.replace("_", "-") + dot + tail
    return name


def spelled_by(token: str, spelling: str) -> bool:
    """Whether vLLM would read `token` as `spelling`: the full flag or a prefix of it (argparse's
    abbreviations), with underscores, `=value`, or a dotted key (`--enforce-eager.x 1`: vLLM's parser
    passes the flag a JSON value, and a switch takes none, so it is set). A one-letter short alias
    (`-q`) in any token that starts with it (argparse takes its value attached: `-qawq`), and after
    the `=` of any single-dash token (`-ep=qawq`: argparse before Python 3.12.7 reads what follows
    a switch's `=` as more one-letter options, `-q awq`). A longer one (`-tp`) as itself or a shorter
    prefix (`-t`), alone, with `=value` (`-t=8` is `-tp 8` from Python 3.12.7 and 3.13 on) or a dotted
    key; `-tp8`, `-pp2` and another flag that starts alike (`-pcp`, vLLM's prefill context
    parallelism) are not it."""
    name = flag_name(token)
    if name is None:
        return False
    head = name.partition(".")[0]
    if spelling.startswith("--"):
        return head.startswith("--") and len(head) > 2 and spelling.startswith(head)
    if name.startswith("--"):
        return False
    if len(spelling) == 2:
        return name[:2] == spelling or (len(name) >= 2 and token.partition("=")[2].startswith(spelling[1]))
    return len(head) >= 2 and spelling.startswith(head)


def switched(args: list[str], spelling: str) -> bool | None:
    """What command-line tokens set an on/off flag to (`--flag`, `--flag=false`, `--flag false`,
    `--no-flag`; the last spelling wins, as in argparse), or None where none names it."""
    value: bool | None = None
    negated = "--no-" + spelling.removeprefix("--")
    for i, token in enumerate(args):
        if spelled_by(token, negated):
            value = False
        elif spelled_by(token, spelling):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            given = token.partition("=")[2] if "=" in token else nxt if nxt and flag_name(nxt) is None else "true"
            value = given.strip().lower() not in ("false", "0", "no", "off")
    return value


def flag_value(args: list[str], spelling: str) -> str | None:
    """The value command-line tokens give a flag that takes one (`--flag value`, `--flag=value`; the
    last wins, as in argparse), or None where none names it."""
    value: str | None = None
    for i, token in enumerate(args):
        if spelled_by(token, spelling):
            value = token.partition("=")[2] if "=" in token else args[i + 1] if i + 1 < len(args) else ""
    return value


def spelling_pattern(spelling: str) -> str:
    """An RE2 pattern (no backslashes, so it sits in a CEL string as is) matching exactly the
    tokens `spelled_by` accepts for this spelling: the CRD's rule and this module agree."""
    if not spelling.startswith("--"):
        if len(spelling) == 2:
            return f"^{spelling}|^-[^-=][^=]*={spelling[1]}"
        return "|".join(f"^{spelling[:n]}([=.]|$)" for n in range(len(spelling), 1, -1))
    chars = ["[-_]" if c == "-" else c for c in spelling[2:]]
    nested = ""
    for c in reversed(chars[1:]):
        nested = f"({c}{nested})?"
    return f"^--{chars[0]}{nested}([=.]|$)"


def is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
