"""Classifying a log, and the checks that a client's text changed nothing: a crafted log is diagnosed as
the log without the client's text is, and the client's marker is nowhere in the diagnosis."""

from __future__ import annotations

import json

from vllm_autoheal.diagnosis import Signals, classify

from crafted.bases import MARKER, real_log, with_lines


def diagnose(log: str):
    return classify(Signals(log=log))


def cause_of(log: str) -> str:
    return diagnose(log).cause


def cause_and_subtype(d) -> tuple:
    return d.cause, d.subtype


def diagnosis_fields(d) -> dict:
    """What a diagnosis decides (its notes aside)."""
    return {"cause": d.cause, "subtype": d.subtype, "phase": d.phase, "evidence": d.evidence, "numbers": d.numbers}


def said(d) -> str:
    """A diagnosis in one line, for an assertion's message."""
    return f"{d.cause} {d.subtype} evidence={d.evidence[:1]} numbers={d.numbers}"


def client_text_absent(d) -> bool:
    return MARKER not in json.dumps(d.to_dict())


def assert_same(crafted, base) -> None:
    """Two diagnoses agree in everything but their notes."""
    got, want = crafted.to_dict(), base.to_dict()
    got.pop("notes"), want.pop("notes")
    assert got == want


def assert_same_diagnosis(crafted_log: str, real_log: str) -> None:
    crafted = diagnose(crafted_log)
    assert client_text_absent(crafted)
    assert_same(crafted, diagnose(real_log))


def assert_unchanged(base_name: str, extra: str, where: str = "end") -> None:
    """The real log `base_name` with `extra` put at `where` is diagnosed as the real log is."""
    base_log = real_log(base_name)
    crafted = diagnose(with_lines(base_log, extra, where))
    assert_same(crafted, diagnose(base_log))
    assert client_text_absent(crafted)


def assert_reads_like(crafted_log: str, harmless_log: str, what: str) -> None:
    """The crafted log is diagnosed as the same log with a harmless text in the client's place."""
    crafted, harmless = diagnose(crafted_log), diagnose(harmless_log)
    assert diagnosis_fields(crafted) == diagnosis_fields(harmless), (
        f"{what}: said {said(crafted)}; should say {said(harmless)}"
    )
    assert client_text_absent(crafted), f"{what}: the client's text is quoted"


def placed(base_log: str, crafted: str) -> list[str]:
    """`crafted` as the log's first line, in its middle and as its last line."""
    lines = base_log.splitlines()
    return [
        crafted + "\n" + base_log,
        "\n".join(lines[: len(lines) // 2] + [crafted] + lines[len(lines) // 2 :]) + "\n",
        base_log.rstrip("\n") + "\n" + crafted + "\n",
    ]
