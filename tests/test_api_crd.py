from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_autoheal import api
from vllm_autoheal.crd import crd, crd_yaml

ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = ROOT / "crds" / "vllmservices.vllm.autoheal.dev.yaml"


def test_committed_crd_is_the_generated_one_byte_for_byte():
    out = subprocess.run([sys.executable, "-m", "vllm_autoheal", "crd"], capture_output=True, check=True).stdout
    assert out == CRD_FILE.read_bytes(), (
        "crds/ is stale: run `vllm-autoheal crd > " + str(CRD_FILE.relative_to(ROOT)) + "`"
    )
    assert out.decode() == crd_yaml()


def _walk(node, path="openAPIV3Schema"):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural_and_every_field_described():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        for banned in ("$ref", "anyOf", "allOf", "oneOf", "title", "const"):
            assert banned not in node, f"{path} has {banned}"
        # (an int-or-string node is structural untyped: sliding_window_pattern, 6 or "LLLG")
        assert (
            "type" in node or node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        ), path
        if path.startswith("openAPIV3Schema.spec") or path.startswith("openAPIV3Schema.status"):
            if not path.endswith("[]") and not path.endswith("{}"):
                assert node.get("description"), f"{path} has no description (kubectl explain)"


def test_printer_columns_and_names():
    body = crd()
    assert body["spec"]["names"]["shortNames"] == ["vllmsvc", "vsvc"]
    cols = [c["name"] for c in body["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert cols == ["Model", "Phase", "GPUs", "Heals", "Last Cause", "Age"]
    assert body["spec"]["versions"][0]["subresources"] == {"status": {}}


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_parse(path):
    obj = api.VLLMService.model_validate(yaml.safe_load(path.read_text()))
    assert obj.spec.gpu_count() >= 1


def test_gpu_count_is_derived_from_parallelism():
    spec = api.VLLMServiceSpec(model="m", engine={"tensorParallelSize": 4, "pipelineParallelSize": 2})
    assert spec.gpu_count() == 8


def test_cli_help_lists_each_subcommand_with_help():
    out = subprocess.run(
        [sys.executable, "-m", "vllm_autoheal", "--help"], capture_output=True, text=True, check=True
    ).stdout
    from vllm_autoheal.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sub.choices, "no subcommands"
    for name, parser in sub.choices.items():
        assert name in out
        assert parser.description, name
