"""The model config as bounded input, and its one resolution module: local files, the Hub
(the real huggingface_hub client against a local Hub on 127.0.0.1), ConfigMaps, inline."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from vllm_autoheal import model_source
from vllm_autoheal.api import VLLMService
from vllm_autoheal.memory import ModelShape
from vllm_autoheal.model_config import (
    MAX_CONFIG_BYTES,
    ModelConfigError,
    check,
    parse,
    to_shape,
)
from vllm_autoheal.model_source import (
    HubSettings,
    for_service,
    from_hub,
    from_path,
    resolve_local,
)
from vllm_autoheal.shape_reader import shape_from_config

from hub_server import GATED_TOKEN, hub  # noqa: F401 - the fixture

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
LLAMA8 = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
SMALL = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.stem)
def test_every_real_config_passes_and_sizes_as_before(path):
    raw = json.loads(path.read_text())
    assert to_shape(parse(path.read_bytes(), path.name)) == shape_from_config(raw)


HOSTILE = [
    ({**SMALL, "num_hidden_layers": 1e12}, "num_hidden_layers is 1e+12; real models have 1 to 1,024"),
    ({**SMALL, "num_hidden_layers": -5}, "num_hidden_layers is -5"),
    ({**SMALL, "hidden_size": 0}, "hidden_size is 0"),
    ({**SMALL, "hidden_size": "big"}, 'hidden_size must be a whole number, got "big"'),
    ({**SMALL, "vocab_size": True}, "vocab_size must be a whole number"),
    ({**SMALL, "num_attention_heads": 32.5}, "num_attention_heads must be a whole number"),
    ({**SMALL, "intermediate_size": 1e308}, "intermediate_size is 1e+308"),
    ({**SMALL, "num_key_value_heads": 64}, "num_key_value_heads (64) exceeds num_attention_heads (32)"),
    ({**SMALL, "num_local_experts": 10**9}, "num_local_experts is 1000000000"),
    ({**SMALL, "num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok exceeds num_local_experts"),
    ({**SMALL, "max_position_embeddings": 10**12}, "max_position_embeddings is 1000000000000"),
    ({k: v for k, v in SMALL.items() if k != "vocab_size"}, "vocab_size is missing"),
    ({**SMALL, "quantization_config": [1]}, "quantization_config must be an object"),
    ({**SMALL, "text_config": "x"}, "text_config must be an object"),
    ({**SMALL, "architectures": "LlamaForCausalLM"}, "architectures must be a list"),
    ({**SMALL, "torch_dtype": "x" * 100}, "torch_dtype must be a string of at most 32"),
    ({"text_config": {**SMALL, "num_hidden_layers": 1e12}}, "num_hidden_layers is 1e+12"),
    ([1, 2], "must be a JSON object"),
    ({**SMALL, "quantization_config": {"quant_method": "gptq", "bits": 400}}, "quantization_config.bits is 400"),
    ({**SMALL, "quantization_config": {"quant_method": "awq", "w_bit": "4"}}, "quantization_config.w_bit must be"),
    (
        {
            **SMALL,
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 0.5}}},
            },
        },
        "config_groups.weights.num_bits must be a whole number",
    ),
    ({**SMALL, "interleave_moe_layer_step": 10**6}, "interleave_moe_layer_step is 1000000"),
    ({**SMALL, "expert_layer_period": 2, "expert_layer_offset": 2}, "expert_layer_offset must be below"),
]


@pytest.mark.parametrize("config, message", HOSTILE, ids=[m[:30] for _, m in HOSTILE])
def test_hostile_configs_are_refused_naming_the_field(config, message):
    with pytest.raises(ModelConfigError, match="^cm[: ]") as err:
        parse(json.dumps(config), "cm")
    assert message in str(err.value)


@pytest.mark.parametrize(
    "raw, message",
    [
        ('{"num_hidden_layers": NaN}', "NaN, which is not a number JSON allows"),
        ('{"num_hidden_layers": Infinity}', "Infinity"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"pad": "' + "x" * MAX_CONFIG_BYTES + '"}', "at most 1,048,576 are read"),
        ("{not json", "is not JSON"),
        ('{"num_hidden_layers": ' + "9" * 5000 + "}", "is not JSON"),
        (
            '{"num_hidden_layers": ' + "7" * 4000 + ', "hidden_size": 1, "num_attention_heads": 1, "vocab_size": 1}',
            r"num_hidden_layers is 77777777\.\.\. \(4000 digits\)",
        ),
    ],
)
def test_unparseable_configs_are_refused(raw, message):
    with pytest.raises(ModelConfigError, match=message):
        parse(raw, "cm")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_constant_python_reads_in_a_field_not_read_is_left_alone(constant):
    """Python's json and transformers read NaN and Infinity (Nemotron-3 Super's time_step_limit is [0.0, Infinity]):
    where no field the memory model reads holds one, the config is read as the same config without it."""
    plain = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}
    plain["intermediate_size"] = 128
    raw = json.dumps(plain)[:-1] + f', "time_step_limit": [0.0, {constant}], "rope_scaling": {{"beta": {constant}}}}}'
    assert parse(raw, "cm") == parse(json.dumps(plain), "cm")
    quant = json.dumps({**plain, "quantization_config": {"quant_method": "gptq", "bits": 4, "damp_percent": 0}})
    assert parse(quant.replace('"damp_percent": 0', f'"damp_percent": {constant}'), "cm") == parse(quant, "cm")


def test_the_memory_model_counts_layers_instead_of_iterating_them():
    """Whatever reaches it, the weight count is arithmetic: 10^12 layers is a multiplication."""
    shape = ModelShape(
        "x",
        layers=10**12,
        hidden=8192,
        heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate=28672,
        vocab=128256,
        experts=8,
        experts_per_token=2,
        moe_intermediate=14336,
        dense_layers=3,
    )
    per_layer = shape.layer_params(5)
    assert shape.stack_params(10**12) == 3 * shape.layer_params(0) + (10**12 - 3) * per_layer
    assert shape.params() > (10**12 - 3) * per_layer


def test_a_local_directory_or_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA8))
    assert from_path(tmp_path)["num_hidden_layers"] == 32
    assert resolve_local(str(tmp_path / "config.json"))[0]["hidden_size"] == 4096
    with pytest.raises(ModelConfigError, match="directory without a config.json"):
        from_path(tmp_path / "..")
    with pytest.raises(ModelConfigError, match="no such file"):
        resolve_local(str(tmp_path / "absent"))


def test_the_hub_through_the_real_client(hub):  # noqa: F811
    settings = HubSettings(endpoint=hub.url, cache_dir=hub.cache, timeout_s=5)
    fields = from_hub("meta-llama/Llama-3.1-8B-Instruct", None, settings, token=False)
    assert fields["num_hidden_layers"] == 32 and fields["num_key_value_heads"] == 8
    methods = [m for m, path, _ in hub.requests if "Llama-3.1-8B" in path]
    assert methods == ["HEAD", "HEAD", "GET"]  # our size check, hf_hub_download's own, the file
    from_hub("meta-llama/Llama-3.1-8B-Instruct", None, settings, token=False)
    assert [m for m, path, _ in hub.requests if "Llama-3.1-8B" in path].count("GET") == 1  # cached on disk
    assert resolve_local("Qwen/Qwen2.5-7B-Instruct", hub=settings)[0]["num_key_value_heads"] == 4


def test_hub_errors_say_what_to_do(hub):  # noqa: F811
    settings = HubSettings(endpoint=hub.url, cache_dir=hub.cache, timeout_s=5)
    with pytest.raises(ModelConfigError, match="Llama-3.1-70B-Instruct@main .* is gated: accept its terms"):
        from_hub("meta-llama/Llama-3.1-70B-Instruct", None, settings, token=False)
    with pytest.raises(ModelConfigError, match="is gated"):
        from_hub("meta-llama/Llama-3.1-70B-Instruct", None, settings, token="hf_wrong")
    assert from_hub("meta-llama/Llama-3.1-70B-Instruct", None, settings, GATED_TOKEN)["num_hidden_layers"] == 80
    with pytest.raises(
        ModelConfigError,
        match=r"acme/absent@main .*: no such model, or it is private or gated "
        r"and no token with access was given \(HTTP 401\)",
    ):
        from_hub("acme/absent", None, settings, token=False)
    with pytest.raises(ModelConfigError, match=r"no such model.*\(HTTP 404\)"):
        from_hub("acme/absent", None, settings, token="hf_some")
    with pytest.raises(ModelConfigError, match="has no config.json"):
        from_hub("acme/no-config", None, settings, token=False)
    with pytest.raises(ModelConfigError, match="no such revision"):
        from_hub("Qwen/Qwen2.5-7B-Instruct", "v9", settings, token=False)
    with pytest.raises(ModelConfigError, match="is 2,097,163 bytes; at most 1,048,576"):
        from_hub("acme/huge", None, settings, token=False)
    assert not [p for m, p, _ in hub.requests if m == "GET" and "huge" in p]  # refused before the download
    with pytest.raises(ModelConfigError, match="num_hidden_layers is 1e\\+12"):
        from_hub("acme/hostile", None, settings, token=False)
    with pytest.raises(ModelConfigError, match="neither a local path nor a Hugging Face repo id"):
        from_hub("s3://bucket/model", None, settings, token=False)
    with pytest.raises(ModelConfigError, match="Hub lookups are off"):
        from_hub("acme/hostile", None, HubSettings(), token=False)


def test_an_unreachable_hub_is_an_error_not_a_hang(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = HubSettings(endpoint=f"http://127.0.0.1:{port}", cache_dir=str(tmp_path), timeout_s=0.5)
    with pytest.raises(ModelConfigError, match="could not be reached within 2 s and no copy is cached"):
        from_hub("meta-llama/Llama-3.1-8B-Instruct", None, settings, token=False)


def service(spec: dict, annotations: dict | None = None) -> VLLMService:
    return VLLMService.model_validate(
        {
            "metadata": {"name": "s", "namespace": "ml", "annotations": annotations or {}},
            "spec": {"model": "meta-llama/Llama-3.1-8B-Instruct", **spec},
        }
    )


class Api:
    """The objects a Kubernetes GET would return, by path."""

    def __init__(self, objects: dict[str, dict]):
        self.objects, self.paths = objects, []

    def __call__(self, path: str):
        self.paths.append(path)
        return self.objects.get(path)


def test_for_service_sources_in_order(hub):  # noqa: F811
    model_source.configure(HubSettings(endpoint=hub.url, cache_dir=hub.cache, timeout_s=5))
    try:
        inline = for_service(service({"modelConfig": {"inline": SMALL}}), Api({}))
        assert inline.ok and inline.source == "spec.modelConfig.inline" and inline.shape.layers == 32
        cm = {"/api/v1/namespaces/ml/configmaps/llama": {"data": {"config.json": json.dumps(LLAMA8)}}}
        ref = for_service(service({"modelConfig": {"configMapRef": {"name": "llama"}}}), Api(cm))
        assert ref.ok and ref.shape.kv_heads == 8
        bad = for_service(service({"modelConfig": {"configMapRef": {"name": "llama", "key": "other"}}}), Api(cm))
        assert bad.error == "ConfigMap ml/llama key other: no such key"
        old = for_service(
            service({}, {"vllm.autoheal.dev/model-config": json.dumps({**SMALL, "hidden_size": -1})}), Api({})
        )
        assert "deprecated" in old.error and "hidden_size is -1" in old.error
        api = Api({})
        first = for_service(service({}), api)
        again = for_service(service({}), api)
        assert first.ok and again is first and api.paths == []  # one fetch, kept in memory
        assert [m for m, p, _ in hub.requests].count("GET") == 1
        secret = {"/api/v1/namespaces/ml/secrets/hf": {"data": {"token": "aGZfbG9jYWx0ZXN0dG9rZW4="}}}
        gated = service(
            {"model": "meta-llama/Llama-3.1-70B-Instruct", "hfTokenSecretRef": {"name": "hf", "key": "token"}}
        )
        assert for_service(gated, Api(secret)).shape.layers == 80  # the token from the Secret
        assert "is gated" in for_service(gated, Api({})).error  # no Secret: no token
        assert "not a Hub repo id" in for_service(service({"model": "/models/llama"}), Api({})).error
    finally:
        model_source.configure(HubSettings())
    assert "Hub lookups are off" in for_service(service({}), Api({})).error


def test_a_secret_ref_that_is_a_path_is_never_read(hub):  # noqa: F811
    # An object stored before the CRD checked the name: its "../" would reach another namespace's Secret.
    model_source.configure(HubSettings(endpoint=hub.url, cache_dir=hub.cache, timeout_s=5))
    try:
        gated = service({"model": "meta-llama/Llama-3.1-70B-Instruct", "hfTokenSecretRef": {"name": "hf", "key": "t"}})
        gated.spec.hf_token_secret_ref.name = "../../victim/secrets/hf"  # type: ignore[union-attr]
        victim = {"/api/v1/namespaces/ml/secrets/../../victim/secrets/hf": {"data": {"t": "aGZfbG9jYWx0ZXN0dG9rZW4="}}}
        api = Api(victim)
        assert "is gated" in for_service(gated, api).error and api.paths == []
    finally:
        model_source.configure(HubSettings())


def test_a_hanging_hub_costs_a_handler_the_timeout_at_most(hub):  # noqa: F811
    hub.stall = threading.Event()
    model_source.configure(HubSettings(endpoint=hub.url, cache_dir=hub.cache, timeout_s=1))
    try:
        waiting = for_service(service({}), Api({}))
        assert not waiting.ok and waiting.pending and "did not answer within 1 s; still trying" in waiting.error
        hub.stall.set()
        answered = next(r for r in (for_service(service({}), Api({})) for _ in range(30)) if not r.pending)
        assert answered.ok  # the late answer was kept: the next look has it
    finally:
        model_source.configure(HubSettings())


def test_check_drops_unknown_fields_and_keeps_what_sizes():
    out = check({**LLAMA8, "rope_scaling": {"factor": 8.0}, "id2label": {str(i): "x" for i in range(100)}})
    assert "rope_scaling" not in out and "id2label" not in out and out["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize(
    "quant, bits",
    [
        ({"quant_method": "gptq", "bits": 8}, 8),
        ({"quant_method": "awq", "w_bit": 4}, 4),
        ({"quant_method": "compressed-tensors", "config_groups": {"a": {"weights": {"num_bits": 4}}}}, 4),
        # mixed widths, or a group without its width: the method's usual width, never a guess
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"a": {"weights": {"num_bits": 4}}, "b": {"weights": {"num_bits": 8}}},
            },
            None,
        ),
        ({"quant_method": "compressed-tensors", "config_groups": {"a": {"targets": ["Linear"]}}}, None),
        ({"quant_method": "compressed-tensors", "config_groups": {str(i): {} for i in range(100)}}, None),
        ({"quant_method": "fp8"}, None),
    ],
)
def test_the_checkpoints_bits_per_weight_are_read_when_it_says_them(quant, bits):
    checked = check({**SMALL, "quantization_config": quant})
    assert checked["quantization_config"].get("bits") == bits
    assert to_shape(checked).quant_bits == bits


def test_moe_in_every_second_layer_counts_half_the_experts():
    """Llama 4 Maverick (interleave_moe_layer_step 2) and Jamba (expert_layer_period 2, offset 1):
    vLLM builds experts in every second layer only (llama4.py, jamba.py)."""
    moe = {**SMALL, "num_local_experts": 16, "moe_intermediate_size": 4096, "intermediate_size": 4096}
    every = to_shape(check(moe))
    llama4 = to_shape(check({**moe, "interleave_moe_layer_step": 2}))
    jamba = to_shape(check({**moe, "expert_layer_period": 2, "expert_layer_offset": 1}))
    expert = every.layer_params(1)
    assert llama4.stack_params(32) == jamba.stack_params(32) == 16 * expert + 16 * llama4.layer_params(0)
    assert (
        llama4.layer_params(1) == expert and llama4.layer_params(0) < expert and every.stack_params(32) == 32 * expert
    )
    assert sum(llama4.layer_params(i) for i in range(32)) == llama4.stack_params(32)


def test_an_inline_quantization_config_takes_every_skip_list_the_reader_reads():
    """spec.modelConfig.inline keeps the lists of layers a checkpoint leaves unquantized (one table:
    quant_config.ANY_SKIP_LIST), so a pasted config.json weighs as the same file read from the Hub."""
    from vllm_autoheal.api.config_json import QuantizationConfig
    from vllm_autoheal.quant_config import ANY_SKIP_LIST

    assert sorted(f for f in QuantizationConfig.model_fields if f in ANY_SKIP_LIST) == sorted(ANY_SKIP_LIST)
    too_many = {"quant_method": "fp8", "ignored_layers": ["x"] * 4097}
    with pytest.raises(ValueError, match="ignored_layers"):
        QuantizationConfig.model_validate(too_many)
