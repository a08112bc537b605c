"""The model's config.json as a VLLMService carries it (inline, or a ConfigMap key) for pre-flight
and heals: the fields that size the model, typed and ranged from model_config.py's table."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from .. import model_config as mc
from ..quant_config import GROUP_FIELD, GROUP_RULE, MODELOPT_ALGOS
from ..quant_exclusions import MAX_NAME, MAX_NAMES
from .schema import Model, cel, rule

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class ConfigJsonBase(BaseModel):
    """config.json fields keep config.json's own spelling (snake_case), so a file pastes as is."""

    model_config = ConfigDict(extra="ignore")


SkipList = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_NAME)]] | None,
    Field(
        max_length=MAX_NAMES,
        description="Layers the checkpoint leaves unquantized, as its quantization_config lists them.",
    ),
]


class QuantizationConfig(ConfigJsonBase):
    model_config = cel(rule("!has(self.group_size) || self.group_size != 0", f"must be {GROUP_RULE}", ".group_size"))
    quant_method: str | None = Field(None, max_length=64, description="The checkpoint's quantization method.")
    bits: int | None = Field(
        None, ge=1, le=32, description="Bits per quantized weight (compressed-tensors: its weights' num_bits)."
    )
    group_size: int | None = Field(
        None,
        ge=GROUP_FIELD.low,
        le=GROUP_FIELD.high,
        description="Weights a quantization scale serves (compressed-tensors: its weights' group_size; -1: per channel).",
    )
    quant_algo: str | None = Field(
        None,
        max_length=64,
        description=f"ModelOpt's algorithm (its width, float weights: {', '.join(MODELOPT_ALGOS)}; others not weighed).",
    )
    # The layers the checkpoint leaves unquantized, in the lists each method reads (quant_config.ANY_SKIP_LIST):
    # weighed in the model's dtype, as the same config.json read from the Hub is
    ignore: SkipList = None
    exclude_modules: SkipList = None
    ignored_layers: SkipList = None
    modules_to_not_convert: SkipList = None
    llm_int8_skip_modules: SkipList = None


def _int_or_string(schema: dict[str, Any]) -> None:
    """sliding_window_pattern as the CRD takes it: a number in model_config's range or a few letters."""
    p = mc.PATTERN
    schema.clear()
    schema["x-kubernetes-int-or-string"] = True
    schema["description"] = p.description
    schema["x-kubernetes-validations"] = [
        rule(
            f"type(self) == string ? size(self) <= {mc.MAX_NAME} : (self >= {p.low} && self <= {p.high})",
            f"sliding_window_pattern must be {p.low} to {p.high} or at most {mc.MAX_NAME} letters",
        )
    ]


# A multimodal model's vision encoder, typed and ranged from model_config.VISION_FIELDS.
VisionConfigJson = create_model(  # type: ignore[call-overload]
    "VisionConfigJson",
    __base__=ConfigJsonBase,
    __doc__="The fields of config.json's vision_config that size the vision encoder.",
    **{
        name: (int | None, Field(None, ge=f.low, le=f.high, description=f.description))
        for f in mc.VISION_FIELDS
        for name in (f.name, *f.aliases)
    },
    hidden_act=(str | None, Field(None, max_length=mc.STRINGS["hidden_act"], description="The MLP's activation.")),
    mlp_ratio=(
        float | None,
        Field(None, gt=0, le=mc.MAX_MLP_RATIO, description="The MLP's width over the encoder's (Qwen2-VL)."),
    ),
    deepstack_visual_indexes=(
        list[Annotated[int, Field(ge=0, le=1024)]] | None,
        Field(None, max_length=mc.MAX_DEEPSTACK, description="Layers with a merger of their own (Qwen3-VL)."),
    ),
)

# The fields the memory model reads, typed and ranged from the one table in model_config.py.
ConfigJson = create_model(  # type: ignore[call-overload]
    "ConfigJson",
    __base__=ConfigJsonBase,
    __doc__="The fields of the model's config.json that size it.",
    **{
        f.name: (
            int if f.required else int | None,
            Field(... if f.required else None, ge=f.low, le=f.high, description=f.description),
        )
        for f in mc.FIELDS
    },
    # (each other spelling config.json files use, so that a pasted file loses none of them)
    **{
        alias: (int | None, Field(None, ge=f.low, le=f.high, description=f"{f.name}, as some models spell it."))
        for f in mc.FIELDS
        for alias in f.aliases
    },
    **{
        name: (str | None, Field(None, max_length=limit, description=f"config.json's {name}."))
        for name, limit in mc.STRINGS.items()
    },
    architectures=(
        list[str] | None,
        Field(
            None,
            max_length=mc.MAX_ARCHITECTURES,
            description="Architecture names.",
            json_schema_extra={"items": {"type": "string", "maxLength": mc.MAX_NAME}},
        ),
    ),
    **{name: (bool | None, Field(None, description=description)) for name, description in mc.BOOLEANS.items()},
    sliding_window_pattern=(
        int | Annotated[str, Field(max_length=mc.MAX_NAME)] | None,
        Field(None, description=mc.PATTERN.description, json_schema_extra=_int_or_string),
    ),
    **{
        name: (
            list[str] | None,
            Field(
                None,
                max_length=mc.MAX_LAYER_TYPES,
                description=description,
                json_schema_extra={"items": {"type": "string", "maxLength": mc.MAX_NAME}},
            ),
        )
        for name, description in mc.LAYER_LISTS.items()
    },
    attn_layer_indices=(
        list[Annotated[int, Field(ge=0, le=mc.MAX_LAYER_TYPES - 1)]] | None,
        Field(None, max_length=mc.MAX_LAYER_TYPES, description=mc.ATTENTION_INDICES),
    ),
    quantization_config=(QuantizationConfig | None, Field(None, description="The checkpoint's quantization.")),
    vision_config=(
        VisionConfigJson | None,
        Field(None, description="A multimodal model's vision encoder, weighed with the model."),
    ),
)
ConfigJson.model_config["json_schema_extra"] = {
    "x-kubernetes-validations": [
        rule(
            "!has(self.num_key_value_heads) || self.num_key_value_heads <= self.num_attention_heads",
            "num_key_value_heads must be <= num_attention_heads",
            ".num_key_value_heads",
        )
    ]
}
ConfigJson.model_rebuild(force=True)


class ConfigMapKeyRef(Model):
    name: str = Field(..., pattern=DNS_SUBDOMAIN, max_length=253, description="ConfigMap name.")
    key: str = Field(
        "config.json", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253, description="Key holding the config.json text."
    )


class ModelConfigSource(Model):
    """Where pre-flight and heals read the model's shape; unset = config.json from the Hub."""

    model_config = cel(
        rule("!(has(self.inline) && has(self.configMapRef))", "set inline or configMapRef, not both", ".inline")
    )
    inline: ConfigJson | None = Field(
        None,
        description=(
            "config.json's fields, as the file spells them (a multimodal model: its text_config's, and its "
            "vision_config)."
        ),
    )
    config_map_ref: ConfigMapKeyRef | None = Field(
        None, description="A ConfigMap key holding config.json (at most 1 MiB)."
    )
    revision: str | None = Field(
        None,
        pattern=r"^[\w./-]+$",
        max_length=128,
        description=("Hub revision (branch, tag or commit) of config.json; unset = main."),
    )
