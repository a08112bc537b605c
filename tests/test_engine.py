from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_autoheal.api import EngineArgs
from vllm_autoheal.engine import EngineArgsError, parse_args, to_command
from vllm_autoheal.quantity import parse_size


def test_serve_form_and_api_server_form():
    engine = EngineArgs(max_model_len=4096, enforce_eager=True, extra_args=["--trust-remote-code"])
    serve = to_command("m", engine)
    assert serve[:3] == ["vllm", "serve", "m"]
    assert serve[serve.index("--max-model-len") + 1] == "4096"
    assert "--enforce-eager" in serve and serve[-1] == "--trust-remote-code"
    module = to_command("m", engine, api_server_module=True, python="/usr/bin/python3")
    assert module[:5] == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert module[5:] == serve[3:]


def test_parses_both_launch_forms_to_the_same_args():
    a = parse_args("vllm serve org/model --max-model-len 8192 --gpu-memory-utilization=0.85 -tp 2")
    b = parse_args(
        "python3 -m vllm.entrypoints.openai.api_server --model org/model "
        "--max-model-len=8192 --gpu-memory-utilization 0.85 --tensor-parallel-size 2"
    )
    assert a.model == b.model == "org/model"
    assert a.engine == b.engine
    assert a.engine.tensor_parallel_size == 2 and a.engine.gpu_memory_utilization == 0.85


def test_unknown_flags_are_kept_in_order_with_their_values():
    p = parse_args(
        [
            "--trust-remote-code",
            "--max-model-len",
            "10",
            "--served-model-name",
            "x",
            "--block-size=32",
            "--swap-space",
            "4",
        ]
    )
    assert p.engine.extra_args == [
        "--trust-remote-code",
        "--served-model-name",
        "x",
        "--block-size=32",
        "--swap-space",
        "4",
    ]
    assert p.engine.max_model_len == 10


@pytest.mark.parametrize(
    "argv,words",
    [
        ("--max-model-len 4 --max-model-len 5", "more than once"),
        ("--max-model-len 4 --max-model-len=5", "more than once"),
        ("--max-model-len x", "not a valid int"),
        ("--gpu-memory-utilization high", "not a valid float"),
        ("--gpu-memory-utilization 1.5", "--gpu-memory-utilization"),
        ("--max-model-len", "needs a value"),
        ("--max-model-len --enforce-eager", "needs a value"),
        ("--enforce-eager=maybe", "not true or false"),
        ("--tensor-parallel-size 0", "--tensor-parallel-size"),
    ],
)
def test_bad_command_lines_are_clear_errors(argv, words):
    with pytest.raises(EngineArgsError, match=words.replace("-", r"\-")):
        parse_args(argv)


def test_boolean_negation_and_sizes():
    assert parse_args("--no-enforce-eager").engine.enforce_eager is False
    assert parse_args("--kv-cache-memory-bytes 8Gi").engine.kv_cache_memory_bytes == 8 * 2**30
    assert parse_size("1.5g") == 1_500_000_000 and parse_size("1024") == 1024


engine_args = st.builds(
    EngineArgs,
    gpu_memory_utilization=st.floats(0.01, 1.0).map(lambda x: round(x, 4)),
    max_model_len=st.none() | st.integers(1, 10**7),
    max_num_seqs=st.none() | st.integers(1, 4096),
    tensor_parallel_size=st.integers(1, 16),
    pipeline_parallel_size=st.integers(1, 8),
    dtype=st.none() | st.sampled_from(["auto", "bfloat16", "float16"]),
    quantization=st.none() | st.sampled_from(["awq", "fp8", "gptq"]),
    kv_cache_dtype=st.none() | st.sampled_from(["auto", "fp8"]),
    kv_cache_memory_bytes=st.none() | st.integers(1, 2**40),
    cpu_offload_gb=st.none() | st.floats(0, 512).map(lambda x: round(x, 2)),
    enforce_eager=st.none() | st.booleans(),
    extra_args=st.lists(
        st.sampled_from(["--trust-remote-code", "--enable-prefix-caching", "--block-size=32", "--seed=7"]), max_size=4
    ),
)


@given(engine_args)
def test_round_trip(engine):
    parsed = parse_args(to_command("org/model", engine))
    assert parsed.model == "org/model"
    assert parsed.engine == engine


@pytest.mark.parametrize(
    "token,flag",
    [
        ("--max_model_len=999999", "--max-model-len"),
        ("-tp", "--tensor-parallel-size"),
        ("-tp=8", "--tensor-parallel-size"),
        ("--gpu_memory_utilization", "--gpu-memory-utilization"),
        ("--device-memory-utilization=0.5", "--gpu-memory-utilization"),
        ("--max-model", "--max-model-len"),
        ("--no-enforce-eager", "--enforce-eager"),
        ("-q", "--quantization"),
        ("-qawq", "--quantization"),
        ("--config", "--config"),
        ("--hf-token=hf_x", "--hf-token"),
        ("--api_key", "--api-key"),
        ("--served_model_name", "--served-model-name"),
        ("--port=1", "--port"),
        ("--trust-remote-code", None),
        ("--max-num-partial-prefills", None),
        ("--model-impl", None),
        ("--config-format", None),
        ("-1", None),
        ("vllm", None),
        ("--max-model-len.x", "--max-model-len"),  # vLLM hands the flag JSON: a refusal loses nothing
        ("--enforce-eager.x", "--enforce-eager"),  # a switch takes no value: vLLM switches it on
        ("--served-model-name.x", "--served-model-name"),  # vLLM serves under the JSON text
        ("--compilation-config.mode", None),
        ("-O3", None),
    ],
)
def test_extra_args_are_read_as_vllm_reads_them(token, flag):
    from vllm_autoheal.engine import forbidden

    entry = forbidden(token)
    assert (entry.cli if entry else None) == flag


def test_problems_name_the_field_or_the_secret():
    from vllm_autoheal.engine import extra_args_problems

    typed, secret = extra_args_problems(["--seed", "1", "--max_model_len=5", "--hf-token"])
    assert "use engine.maxModelLen" in typed and "spec.hfTokenSecretRef" in secret


@given(st.text(alphabet="-_=.abcdefghijklmnopqrstuvwxyzAPT0123456789", max_size=30))
def test_the_crd_rule_and_the_parser_agree_on_every_token(token):
    """The CEL rule's pattern (RE2, as the API server runs it) is generated from the same table
    and refuses exactly the tokens the parser refuses."""
    import re2

    from vllm_autoheal.engine import FLAGS, RESERVED
    from vllm_autoheal.flag_tokens import spelled_by, spelling_pattern

    for entry in (*FLAGS, *RESERVED):
        for spelling in entry.spellings:
            assert bool(re2.search(spelling_pattern(spelling), token)) == spelled_by(token, spelling), spelling


def test_other_spellings_of_typed_flags_parse_into_their_fields():
    p = parse_args("vllm serve m --max_model_len=4096 -tp 2 --gpu_memory_utilization 0.8 --seed 1")
    assert (p.engine.max_model_len, p.engine.tensor_parallel_size, p.engine.gpu_memory_utilization) == (4096, 2, 0.8)
    assert p.engine.extra_args == ["--seed", "1"]


@pytest.mark.parametrize(
    ("args", "value"),
    [
        ([], None),
        (["--enable-chunked-prefill"], True),
        (["--no-enable-chunked-prefill"], False),
        (["--enable_chunked_prefill=false"], False),
        (["--enable-chunked-prefill", "False"], False),
        (["--enable-chunked-prefill", "--max-model-len", "8"], True),
        (["--no-enable-chunked-prefill", "--enable-chunked-prefill"], True),
        (["--enable-chunked"], True),  # argparse's abbreviation
    ],
)
def test_an_on_off_flag_reads_as_vllms_parser_reads_it(args, value):
    from vllm_autoheal.flag_tokens import switched

    assert switched(args, "--enable-chunked-prefill") is value
