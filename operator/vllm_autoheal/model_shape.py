"""A model's shape as the memory model counts it: layers and widths, MoE layers and experts, attention
kind, dtype as served, quantization width, and the splits vLLM can load it in (shape_reader.py reads it
from a config.json). Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .quant_width import default_group, quantized_bytes

DTYPE_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "auto": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "fp8_inc": 1.0,
    "fp8_ds_mla": 1.0,
    "int8": 1.0,
    "nvfp4": 0.5625,  # (4 bits and an fp8 scale a 16: torch_utils.nvfp4_kv_cache_full_dim)
}
# Bytes per parameter of quantized linear layers, group scales included, where the checkpoint's width is
# not known: a group-quantized method at its usual 4 bits in its default group, as a declared fallback of
# those bits weighs (quant_width: GPTQ's 0.52, AWQ's 0.53 with fp16 zeros), so that `plan` and a heal agree.
GROUPED_AT_4_BITS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "bitsandbytes", "moe_wna16")
QUANT_BYTES = {
    **{method: quantized_bytes(4, default_group(method, 4), method) for method in GROUPED_AT_4_BITS},
    "gguf": 0.563,
    "fp8": 1.0,
    "fbgemm_fp8": 1.0,
    "ptpc_fp8": 1.0,
    "modelopt": 1.0,
    "compressed-tensors": 1.0,
    "experts_int8": 1.0,
    "mxfp4": 0.531,
    "modelopt_fp4": 0.563,
    "torchao": 1.0,
    "inc": 0.531,
    "quark": 1.0,
}


# Methods whose experts vLLM runs with moe_wna16, which halves a group until each rank's slice holds whole ones
GROUP_FITTING_MOE = ("awq", "gptq", "moe_wna16")


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    moe_latent: int = 0  # a latent MoE's (Nemotron-3 Super's moe_latent_size): its routed experts' input width
    shared_intermediate: int = 0
    dense_layers: int = 0  # leading dense layers in an MoE (DeepSeek first_k_dense_replace)
    kv_lora_rank: int = 0  # multi-latent attention (DeepSeek-V2/V3)
    index_head_dim: int = 0  # its sparse indexer's key width (DeepSeek-V3.2, GLM-5): a cache of its own a layer
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0  # layers that attend within sliding_window (the rest attend in full)
    state_layers: int = 0  # layers that keep a fixed state per request, no K and V per token (STATE_LAYER_TYPES)
    max_position_embeddings: int = 0  # (under the first of vLLM's names for it the config has)
    positions_scaled: bool = False  # RoPE scaling stretches them: vLLM's longest context is longer
    dtype: str = "bfloat16"
    quantization: str | None = None
    quant_bits: int | None = None  # bits per quantized weight, where the checkpoint's config says
    quant_group: int | None = None  # weights a scale of them serves (-1: one per output channel), where it says
    quant_float: bool = False  # float weights (NVFP4, MXFP4, FP8): a one-byte scale a group, no zero point
    quant_act_order: bool = False  # GPTQ's desc_act: its groups follow the activations' order
    auto_kv_dtype: str | None = None  # the cache vLLM runs under --kv-cache-dtype auto, where the config names one
    dense_attention: bool = False  # the checkpoint leaves its attention projections unquantized
    dense_mlp: float = 0.0  # ... the share of its MLP's weights it leaves so (all where the parts cannot be told)
    dense_mlp_spares_experts: bool = False  # ... of all but the routed experts, which stay quantized
    weight_block: tuple[int, int] | None = None  # block-wise fp8's [block_n, block_k]: each rank's slices divide
    # MoE in every `moe_period`-th layer only, at index % moe_period == moe_offset (Llama 4's
    # interleave_moe_layer_step, Qwen-MoE's decoder_sparse_step, Jamba's expert_layer_period)
    moe_period: int = 1
    moe_offset: int = 0
    # One block a layer (Nemotron-H's hybrid_override_pattern: "*" attention, "M" Mamba-2, "-" MLP,
    # "E" MoE), where a layer is not attention and MLP both; "" for the usual layer.
    blocks: str = ""
    gated_mlp: bool = True  # gate, up and down projections (SiLU); relu2's MLP has up and down only
    mamba_heads: int = 0  # a Mamba-2 mixer's heads, their width, groups, state and convolution
    mamba_head_dim: int = 0
    mamba_groups: int = 0
    mamba_state: int = 0
    mamba_conv: int = 0
    mamba_layers: int = 0  # Mamba-2 or Gated DeltaNet mixers (of the state layers), one state page a request
    gdn_key_heads: int = 0  # a Gated DeltaNet mixer's key and value heads, their widths, its convolution
    gdn_value_heads: int = 0
    gdn_key_dim: int = 0
    gdn_value_dim: int = 0
    gdn_conv: int = 0
    output_gate: bool = False  # attention's q_proj doubled by its output gate (Qwen3-Next, Qwen3.5)
    vision_params: int = 0  # a multimodal model's vision encoder (vision_tower.py), loaded beside it
    state_dtype: str | None = None  # the temporal state's dtype where vLLM does not use the model's

    @property
    def served_bytes(self) -> float:
        """Bytes of a weight (or KV element) under --dtype auto: vLLM downcasts a float32
        checkpoint to 16 bits (config/model.py _resolve_auto_dtype; float16 before 0.6)."""
        return min(DTYPE_BYTES.get(self.dtype, 2.0), 2.0)

    def kv_layers(self) -> tuple[int, int]:
        """(full-attention, sliding-window) layers as vLLM's hybrid KV cache counts them: where a
        model has both, its layers go in groups of one size (the fewer kind's count, or the more's
        when that is under 1.5 times it), the last group of each kind padded with layers that take
        memory too (v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size; Gemma 3 1B's
        22 windowed layers count as 24, as vLLM 0.25 measured on an H200)."""
        windowed = min(self.sliding_layers, self.layers) if self.sliding_window and self.sliding_window > 0 else 0
        full = max(0, self.attention_layers - windowed)
        return padded_layers(full, windowed), padded_layers(windowed, full)

    @property
    def attention_layers(self) -> int:
        """Layers that keep K and V per token."""
        return max(0, self.layers - self.state_layers)

    def splits(self, tp: int) -> bool:
        """vLLM's rule for a tensor-parallel size: the attention heads divide by it, and the KV heads
        too, or it by them (replicated) (QKVParallelLinear); a Mamba-2 mixer's heads, and its groups unless
        one (mamba_mixer2.py's asserts); each rank's slice of a quantized layer holds whole groups and blocks.
        Anything else fails at load, a failure no memory heal undoes."""
        kv = self.kv_heads or self.heads
        mamba = not self.mamba_heads or (
            self.mamba_heads % tp == 0 and (self.mamba_groups % tp == 0 or self.mamba_groups <= 1)
        )
        heads = self.heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)
        return heads and mamba and self._blocks_split(tp) and self._groups_split(tp)

    def _groups_split(self, tp: int) -> bool:
        """A checkpoint quantized in groups (AWQ, GPTQ, compressed-tensors' wNa16, NVFP4's 16, MXFP8's 32): the inputs
        of each rank's slice of a row-parallel layer (the MLP's down projection, attention's output) are whole
        groups; vLLM refuses the rest ("The input size is not aligned with the quantized weight shape", auto_awq.py;
        marlin_utils.verify_group_size_divides_partition), and under GPTQ's act order whole 128s too (Marlin's
        strict shape, the only kernel that takes such a slice). So are the experts' slices but where vLLM's
        moe_wna16 shrinks the group to fit (AWQ's, GPTQ's); compressed-tensors' and ModelOpt's refuse them. An MLP
        the checkpoint leaves partly unquantized is not judged: the part is not known, and the one left so for
        accuracy is mostly the down projection, which then has no groups (but its routed experts are, where the
        rest alone is left so)."""
        group = self.quant_group or 0
        if group <= 0 or tp == 1:
            return True
        granule = math.lcm(group, 128) if self.quant_act_order else group
        widths = []
        if self.dense_mlp == 0.0:
            dense = self.intermediate if not self.experts or self.dense_layers else 0
            widths += [dense, self.shared_intermediate]
        if self.dense_mlp == 0.0 or self.dense_mlp_spares_experts:
            if self.experts and not (self.quantization or "").startswith(GROUP_FITTING_MOE):
                widths.append(self.moe_intermediate)
        if not self.dense_attention and not self.state_layers:  # (a hybrid's mixers' widths are other)
            widths.append(self.heads * (self.v_head_dim if self.is_mla else self.head_dim))
        return all(w % tp == 0 and (w // tp) % granule == 0 for w in widths if w > group)

    def _blocks_split(self, tp: int) -> bool:
        """A block-wise fp8 checkpoint's rank slices of the MLP's and the experts' width are whole blocks:
        vLLM's validate_fp8_block_shape and Fp8MoEMethod.create_weights refuse the rest ("The output_size
        of gate's and up's weight = 192 is not divisible by weight quantization block_n = 128")."""
        if not self.weight_block or tp == 1:
            return True
        widths = (self.intermediate, self.moe_intermediate)
        return all(w % tp == 0 and all((w // tp) % b == 0 for b in self.weight_block) for w in widths if w)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def attention_params(self) -> int:
        h = self.hidden
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (
                h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.heads * qk
                if self.q_lora_rank
                else h * self.heads * qk
            )
            kv = (
                h * (self.kv_lora_rank + self.qk_rope_head_dim)
                + self.kv_lora_rank
                + self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            )
            return q + kv + self.heads * self.v_head_dim * h
        q_heads = self.heads * (2 if self.output_gate else 1)
        qkv = h * (q_heads + 2 * self.kv_heads) * self.head_dim
        bias = (q_heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return qkv + bias + self.heads * self.head_dim * h

    def gdn_params(self) -> int:
        """A Gated DeltaNet mixer (vLLM's QwenGatedDeltaNetAttention): in_proj to q, k, v and z, to b
        and a, the convolution over q, k and v, dt_bias and A_log, the gated norm, out_proj."""
        h, v_heads = self.hidden, self.gdn_value_heads
        keys, values = self.gdn_key_heads * self.gdn_key_dim, v_heads * self.gdn_value_dim
        conv = 2 * keys + values
        return (
            h * (conv + values) + h * 2 * v_heads + conv * self.gdn_conv + 2 * v_heads + self.gdn_value_dim + values * h
        )

    def mlp_params(self, moe: bool) -> int:
        h, m = self.hidden, 3 if self.gated_mlp else 2
        if not moe:
            return m * h * self.intermediate
        shared = m * h * self.shared_intermediate + (h if self.shared_intermediate else 0)
        return self.routed_expert_params() + h * self.experts + shared + self.latent_projection_params()

    @property
    def expert_width(self) -> int:
        """The width the routed experts take in and give back: hidden_size, or a latent MoE's own."""
        return self.moe_latent or self.hidden

    def routed_expert_params(self) -> int:
        """One MoE layer's routed experts (vLLM's FusedMoE: w13 and w2), without router and shared experts."""
        return self.experts * (3 if self.gated_mlp else 2) * self.expert_width * self.moe_intermediate

    def latent_projection_params(self) -> int:
        """One MoE layer's projections into and out of a latent MoE's width (nemotron_h.py's fc1_latent_proj and
        fc2_latent_proj): ReplicatedLinear, so every tensor-parallel rank holds them whole."""
        return 2 * self.hidden * self.moe_latent

    def mamba_params(self) -> int:
        """A Mamba-2 mixer (vLLM's MambaMixer2): in_proj to x, z, B, C and dt, the convolution, out_proj."""
        h, heads = self.hidden, self.mamba_heads
        inner = heads * self.mamba_head_dim or 2 * h
        conv = inner + 2 * self.mamba_groups * self.mamba_state
        return h * (inner + conv + heads) + conv * (self.mamba_conv + 1) + inner * h + 3 * heads + inner

    def state_page_bytes(self, tp: int = 1, dtype: str | None = None) -> int:
        """One request's state in one Mamba layer on one GPU, as vLLM shapes it (mamba_utils.py): the
        convolution's last kernel-1 inputs, and a matrix per head; the convolution in the model's
        dtype, the matrices in state_dtype where vLLM keeps them in another. Mamba-2
        (mamba2_state_shape): a head_dim x state matrix per head. Gated DeltaNet
        (gated_delta_net_state_shape): a value x key matrix per value head. 0 where the model has
        no such layers or its dims are not in its config. `dtype`: the engine's --dtype, where set (the
        model's dtype, so the state's under mamba_cache_dtype auto)."""
        if not self.mamba_layers:
            return 0
        if self.mamba_heads and self.mamba_state and self.mamba_conv:
            inner = self.mamba_heads * self.mamba_head_dim or 2 * self.hidden
            # each GPU holds every B and C group its heads need (extra_groups_for_head_shards)
            groups = self.mamba_groups + (0 if self.mamba_groups % tp == 0 else tp - self.mamba_groups)
            conv = (self.mamba_conv - 1) * math.ceil((inner + 2 * groups * self.mamba_state) / tp)
            temporal = math.ceil(self.mamba_heads / tp) * self.mamba_head_dim * self.mamba_state
        elif self.gdn_key_heads and self.gdn_value_heads and self.gdn_key_dim and self.gdn_value_dim and self.gdn_conv:
            width = 2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim
            conv = (self.gdn_conv - 1) * math.ceil(width / tp)
            temporal = math.ceil(self.gdn_value_heads / tp) * self.gdn_value_dim * self.gdn_key_dim
        else:
            return 0
        served = DTYPE_BYTES.get(dtype or "auto", 2.0) if dtype not in (None, "auto") else self.served_bytes
        state_bytes = DTYPE_BYTES.get(self.state_dtype or "", served)
        return int(conv * served + temporal * state_bytes)

    def _block(self, letter: str) -> int:
        by_letter = {
            "*": self.attention_params,
            "M": self.mamba_params,
            "-": lambda: self.mlp_params(False),
            "E": lambda: self.mlp_params(True),
        }
        part = by_letter.get(letter)
        return part() + self.hidden if part else self._layer(moe=False)  # an unknown letter: a whole layer

    def layer_params(self, index: int) -> int:
        moe = self.experts > 0 and index >= self.dense_layers and index % self.moe_period == self.moe_offset
        return self._layer(moe=moe)

    def _layer(self, moe: bool) -> int:
        return self.attention_params() + self.mlp_params(moe) + 2 * self.hidden

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def stack_params(self, layers: int) -> int:
        """Parameters of the first `layers` layers: counted, never iterated, so the work does not
        grow with a (possibly hostile) layer count (a block pattern is at most 1,024 letters)."""
        if self.blocks:
            named = self.blocks[:layers]
            return sum(named.count(c) * self._block(c) for c in set(named)) + (layers - len(named)) * self._layer(
                moe=False
            )
        moe_layers = self.moe_layer_count(layers)
        stack = (layers - moe_layers) * self._layer(moe=False) + moe_layers * self._layer(moe=True)
        mixers = round(self.mamba_layers * layers / self.layers) if self.layers else 0
        if self.gdn_key_heads and self.gdn_value_heads:  # Gated DeltaNet layers, not attention
            stack += mixers * (self.gdn_params() - self.attention_params())
        elif self.mamba_heads:  # Mamba-2 layers a layer list places (Granite-4.0-H's layer_types), not attention
            stack += mixers * (self.mamba_params() - self.attention_params())
        return stack

    def moe_layer_count(self, layers: int) -> int:
        """MoE layers among the first `layers` (counted, as stack_params counts them)."""
        if self.blocks:
            return self.blocks[:layers].count("E")
        return _congruent(self.dense_layers, layers, self.moe_period, self.moe_offset) if self.experts else 0

    def params(self) -> int:
        return self.embedding_params() + self.stack_params(self.layers) + self.hidden

    def kv_bytes_per_token(self, kv_dtype: str | None = None, tp: int = 1, pp: int = 1) -> int:
        """K and V of one token on one GPU (MLA keeps one compressed latent, replicated per rank)."""
        kv_dtype = self.auto_kv_dtype if kv_dtype in (None, "auto") and self.auto_kv_dtype else kv_dtype
        width = DTYPE_BYTES.get(kv_dtype or "auto", 2.0) if kv_dtype not in (None, "auto") else self.served_bytes
        layers = math.ceil(self.attention_layers / pp)
        if self.is_mla:  # (and the sparse indexer's keys: fp8 with a float32 scale a 128, whatever the cache's dtype)
            index = self.index_head_dim + self.index_head_dim // 128 * 4
            latent = (self.kv_lora_rank + self.qk_rope_head_dim) * width
            if kv_dtype == "fp8_ds_mla" or (self.index_head_dim and (kv_dtype or "").startswith("fp8")):
                # (sparse MLA's fp8 cache, which vLLM makes of any fp8 dtype for it on Hopper: the latent in
                # fp8 with a float32 scale a 128, the rotary part left in bf16; 656 B for DeepSeek-V3.2)
                latent = self.kv_lora_rank + self.kv_lora_rank // 128 * 4 + self.qk_rope_head_dim * 2
            return int(layers * (latent + index))
        kv_heads = max(1, math.ceil(self.kv_heads / tp))
        return int(2 * layers * kv_heads * self.head_dim * width)


def layer_group(count: int, others: int) -> int:
    """Layers a group of vLLM's hybrid KV cache holds, `count` of one kind beside `others` of
    another: the fewer kind's count (or the more's, under 1.5 times it); one pool block holds a page
    for each of them (kv_cache_utils: _get_kv_cache_groups_uniform_page_size)."""
    if not count or not others:
        return max(count, others, 1)
    fewer, more = min(count, others), max(count, others)
    return more if more < 1.5 * fewer else fewer


def padded_layers(count: int, others: int) -> int:
    """`count` layers of one kind as vLLM's hybrid KV cache groups them beside `others` of another
    kind: in groups of layer_group's size, the last padded."""
    if not count or not others:
        return count
    group = layer_group(count, others)
    return math.ceil(count / group) * group


def _congruent(low: int, high: int, period: int, offset: int) -> int:
    """How many indices in [low, high) are offset modulo period: counted, not iterated."""

    def below(x: int) -> int:
        return (x - offset + period - 1) // period if x > offset else 0

    return max(0, below(high) - below(low))
