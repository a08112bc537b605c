"""What a remedy is and what it is planned from: the Remedy (one change), the Inventory (what is
known about where the engine runs) and the Context every step reads."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..api import EngineArgs, HealPolicy, VLLMServiceSpec
from ..diagnosis import Diagnosis
from ..diagnosis.figures import MAX_GIB
from ..diagnosis.units import GIB
from ..engine import BY_FIELD
from ..engine_defaults import captures_graphs, default_max_num_batched_tokens, default_max_num_seqs
from ..extensible_kv import extensible_kv_cache, margin_gib
from ..gpu_catalog import GpuSpec, lookup
from ..memory import (
    CUDA_CONTEXT_GIB,
    CUDAGRAPH_GIB,
    Estimate,
    ModelShape,
    estimate,
    graphs_beside_budget,
)
from ..model_runner import offload_ignored
from ..model_weights import FIXED_WIDTH, same_method
from ..quant_width import default_group, quantized_bytes
from ..remedy_gate import Limits
from ..vllm_release import Release, facts

NO_CHANGE = "NoChange"
GIVE_UP = "GiveUp"


# vLLM's refusals that say the cache got no block: "No available memory for the cache blocks", "# GPU blocks: 0"
NO_BLOCK_SUBTYPES = frozenset({"no_cache_blocks", "zero_gpu_blocks"})


@dataclass
class Inventory:
    """What is known about where the engine runs; every field may be unknown."""

    gpu_total_gib: float | None = None
    gpu_name: str = ""  # the product the spec names (vLLM's defaults differ on an A100)
    gpu_free_gib: float | None = None  # free before vLLM starts (other processes excluded)
    shape: ModelShape | None = None
    memory_limit_bytes: int | None = None  # the container's limit (host RAM)
    entrypoint: str = "server"
    release: Release | None = None  # the vLLM release the image names (its defaults and profile)
    # vLLM's CPU backend, whose KV cache is host memory; on a GPU kv_cache_memory_bytes holds none of it
    host_kv_cache: bool = False


@dataclass
class Remedy:
    action: str
    changes: dict[str, Any] = field(default_factory=dict)  # EngineArgs field (or memory_limit/model) -> value
    reason: str = ""
    expected: str = ""
    # sized from this crash's own printed figures and strictly below what ran: another crash of the
    # same cause (another process grew) gets a new, smaller value, so the action may come again
    repeatable: bool = False

    @property
    def gives_up(self) -> bool:
        return self.action in (NO_CHANGE, GIVE_UP)

    def flags(self) -> str:
        out = []
        for key, value in self.changes.items():
            flag = BY_FIELD.get(key)
            if flag is None:
                out.append(f"{key}={value}")
            elif flag.kind is bool:
                out.append(flag.cli if value else f"--no-{flag.cli[2:]}")
            else:
                out.append(f"{flag.cli} {value}")
        return " ".join(out)

    def summary(self) -> str:
        if self.gives_up:
            return f"{self.action}: {self.reason}"
        text = f"{self.action}: {self.flags()} - {self.reason}"
        return text + (f" Expected: {self.expected}" if self.expected else "")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "repeatable"}  # (the planner's, not the user's)

    def apply(self, engine: EngineArgs) -> EngineArgs:
        return engine.model_copy(update={k: v for k, v in self.changes.items() if k in EngineArgs.model_fields})


def fallback_shape(policy: HealPolicy, shape: ModelShape | None, own: bool = False) -> ModelShape | None:
    """The quantized fallback as the memory model weighs it: the model's shape at the width its method
    fixes, or at the bits (and group) the policy declares for it; None where neither says (it is tried
    unweighed). `own`: the shape may be the fallback checkpoint's own config (it runs as spec.model), read
    where nothing is declared; a declaration comes first, as a PatchSpec switch keeps spec.modelConfig,
    which may be the config of the model it replaced."""
    fallback = policy.quantized_fallback
    if shape is None or not fallback.method:
        return None
    # (the cache vLLM runs under auto is the served checkpoint's own config's: not inherited by another one)
    keeps_cache = own and same_method(fallback.method, shape.quantization)
    shape = shape if keeps_cache else replace(shape, auto_kv_dtype=None)
    if fallback.method in FIXED_WIDTH:
        return shape
    if fallback.bits:
        method, bits, floats = fallback.method, fallback.bits, fallback.weight_type == "float"
        formats = [(fallback.group_size or default_group(method, bits, floats), floats)]
        if own and same_method(method, shape.quantization) and shape.quant_bits == bits:
            # (where the declaration is silent, the running config of that width may say more: an NVFP4
            # fallback declared only `bits: 4` is not weighed as integers in groups of 128. The heavier of the
            # two: that config may be the replaced model's, which a PatchSpec switch keeps)
            read = shape.quant_float if fallback.weight_type is None else floats
            formats.append((fallback.group_size or shape.quant_group or default_group(method, bits, read), read))
        group, floats = max(formats, key=lambda f: quantized_bytes(bits, f[0], method, None, f[1]))
        return replace(shape, quantization=method, quant_bits=bits, quant_group=group, quant_float=floats)
    return shape if own and same_method(fallback.method, shape.quantization) and shape.quant_bits else None


def running_shape(
    spec: VLLMServiceSpec, model: str, engine: EngineArgs, shape: ModelShape | None
) -> tuple[bool, ModelShape | None]:
    """Whether the quantized fallback runs (`model` and `engine` as the switch wrote them, in spec or in
    status), and the shape the memory model weighs what runs as: the fallback's (fallback_shape; None where
    it cannot be weighed), else `shape`."""
    fallback = spec.heal.quantized_fallback
    if not (model == fallback.model and engine.quantization == fallback.method):
        return False, shape
    return True, fallback_shape(spec.heal, shape, own=spec.model == fallback.model)


@dataclass
class Context:
    spec: VLLMServiceSpec
    engine: EngineArgs
    diag: Diagnosis
    inv: Inventory
    limits: Limits
    # why a step sized a change and declined it (no gate saw it): said where the plan gives up
    declined: list[str] = field(default_factory=list)

    @property
    def policy(self) -> HealPolicy:
        return self.spec.heal

    @property
    def floor(self) -> float:
        """The lowest utilization a heal may set (an explicit bound, else the model's need)."""
        return self.limits.floor

    def num(self, key: str) -> float | None:
        return printed_figure(self.diag, key)

    def gpu(self) -> GpuSpec:
        """The GPU as the memory model reads it: the total the crash or the inventory gives, with the
        product's name and compute capability where the inventory names it (vLLM's batch defaults and
        kernel tiles follow them)."""
        return lookup(self.inv.gpu_name or "gpu", self.total or 0.0)

    def estimate(
        self, engine: EngineArgs | None = None, free_gib: float | None = None, shape: ModelShape | None = None
    ) -> Estimate:
        """The memory model's verdict on these flags (the engine that ran, by default) on this GPU, under
        the image's release; only where the model's shape and the GPU's total are known. `shape`: another
        checkpoint's (fallback_shape's), else the model's."""
        assert self.inv.shape is not None and self.total
        gpu, entry, release = self.gpu(), self.inv.entrypoint, self.inv.release
        return estimate(shape or self.inv.shape, engine or self.engine, gpu, free_gib, entry, release)

    def fallback_shape(self) -> ModelShape | None:
        """The quantized fallback as the memory model weighs it before the switch (fallback_shape)."""
        return fallback_shape(self.policy, self.inv.shape)

    def printed_graphs(self) -> float | None:
        """The CUDA graphs' share vLLM printed it reserved inside the budget for this run: its estimate, else
        what its utilization less the one it says that equals without them leaves of the GPU."""
        if (graphs := self.num("graphs_gib")) is not None:
            return graphs
        now, without, total = self.num("util_with_graphs"), self.num("util_without_graphs"), self.total
        return (now - without) * total if now is not None and without is not None and total else None

    def graphs_outside(self) -> float:
        """GiB the CUDA graphs take beside the budget (memory.graphs_beside_budget)."""
        return graphs_beside_budget(self.inv.shape, self.engine, self.inv.release)

    def default_seqs(self) -> int:
        """vLLM's max_num_seqs for this GPU, under the image's release where it names one."""
        return default_max_num_seqs(self.total or 0, self.inv.gpu_name, self.engine.extra_args, self._tier())

    def default_batch(self) -> int:
        """vLLM's max_num_batched_tokens for this GPU (24 GiB where unknown), under the image's release."""
        return default_max_num_batched_tokens(self.total or 24, self.inv.entrypoint, self.inv.gpu_name, self._tier())

    def _tier(self) -> str:
        row = facts(self.inv.release)
        return row.batch if row else "160gib"

    def printed_kv_budget(self) -> float | None:
        """The KV cache's budget vLLM printed (its share of the GPU less all else it holds), which is
        negative where the rest took more than the share; None where not printed or implausible."""
        value = self._budget_figure()
        return value if value is not None and abs(value) <= (self.total or MAX_GIB) else None

    def kv_budget(self) -> float | None:
        """printed_kv_budget; where vLLM printed none but said it has no block at all, 0: at most one
        block's worth, nothing to halve."""
        if self._budget_figure() is None:
            return 0.0 if self.diag.subtype in NO_BLOCK_SUBTYPES else None
        return self.printed_kv_budget()

    def _budget_figure(self) -> float | None:
        for key in ("available_kv_gib", "kv_reserved_gib"):
            value = self.diag.numbers.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                # (less what 0.32's multimodal decoding takes out of it, where its refusal says so)
                return float(value) - (self.num("mm_reserved_gib") or 0.0)
        return None

    def fixed_kv_gib(self) -> float | None:
        """The KV cache's size in GiB where vLLM was told it (--kv-cache-memory-bytes, or the size 0.32's persisted
        startup plan sets and its line prints: vLLM then sizes it whatever the utilization); None elsewhere, and
        for a printed figure no device holds."""
        if self.engine.kv_cache_memory_bytes:
            return self.engine.kv_cache_memory_bytes / GIB
        printed = self.num("kv_fixed_gib")
        return printed if printed is not None and 0 < printed <= (self.total or MAX_GIB) else None

    def held_outside(self) -> float | None:
        """The weights another process holds for vLLM (0.32's IPC weight cache), which its utilization
        counts and its free figure does not: printed, or the share less the engine's budget beside them
        (utils.request_memory); None where not said, or nothing is held."""
        held = self.num("external_gib")
        util, budget, total = self.num("util"), self.num("engine_budget_gib"), self.num("total_gib") or self.total
        if held is None and util is not None and budget is not None and total:
            held = util * total - budget
        return held if held is not None and held > 0.01 else None

    @property
    def total(self) -> float | None:
        return device_total(self.diag, self.inv)

    def offload_ignored(self) -> bool:
        """Whether the image's release runs this model on a V2 runner that ignores --cpu-offload-gb
        (model_runner.offload_ignored): no offload change means anything there."""
        shape = self.inv.shape
        return shape is not None and offload_ignored(shape, self.inv.release, self.engine.extra_args)

    @property
    def context(self) -> int | None:
        """The max_model_len that ran: the flag, else the one vLLM printed; None where neither says."""
        return self.engine.max_model_len or int(self.num("max_seq_len") or 0) or None

    def free_for_vllm(self) -> float | None:
        """GPU memory vLLM can ask for: what is free, less its CUDA context and graph headroom."""
        free = self.inv.gpu_free_gib
        if free is None and self.total and self.diag.cause != "gpu_util_exceeds_free":
            free = self.total  # a Kubernetes GPU is the pod's alone
        elif free is not None:  # (the probe's figure: weights held for vLLM outside it count as used there)
            free = min(free + (self.held_outside() or 0.0), self.total or MAX_GIB)
        if free is None:
            return None
        return free - CUDA_CONTEXT_GIB - self.graphs_outside() - self.extensible_margin()

    def extensible_margin(self) -> float:
        """What vLLM 0.34's extensible KV cache keeps free beside the cache (extensible_kv.margin_gib), where
        it sizes this engine's cache: 0 elsewhere."""
        if not extensible_kv_cache(self.engine, self.inv.release):
            return 0.0
        reserve = printed_figure(self.diag, "warmup_peak_gib") or 0.0  # (the peak vLLM measured, where printed)
        if self.inv.shape is not None and self.total:
            est = self.estimate()
            reserve = max(reserve, est.activation_gib + est.cudagraph_gib)
        return margin_gib(self.inv.release, reserve)

    def warmup_loss(self) -> float:
        """GiB vLLM 0.34's extensible KV cache holds less after warm-up than the budget its first check
        refused (before warm-up): the captured graphs, beside the graph estimate it keeps free. 0 where the
        figures are already the size after warm-up ('Memory after warmup' read, or the memory model's)."""
        after = ("warmup_peak_gib", "gpu_blocks")  # (read off 'Memory after warmup', 0.34's size after it)
        if self.diag.source == "memory-model" or any(k in self.diag.numbers for k in after):
            return 0.0
        if not extensible_kv_cache(self.engine, self.inv.release):
            return 0.0
        return CUDAGRAPH_GIB if captures_graphs(self.engine.enforce_eager, self.engine.extra_args) else 0.0


Step = Callable[[Context], "Remedy | None"]


# No device is smaller: a total below it (a forged 1e-310 passes figures.check) would make every
# size divided by it infinite.
MIN_DEVICE_GIB = 0.5


def device_total(diag: Diagnosis, inv: Inventory) -> float | None:
    """The device's size. vLLM's own figure first: NVML's total (140.40 GiB on an H200) is not torch's (139.80)."""
    for total in (printed_figure(diag, "total_gib"), printed_figure(diag, "gpu_total_gib"), inv.gpu_total_gib):
        if total is not None and total >= MIN_DEVICE_GIB:
            return total
    return None


def printed_figure(diag: Diagnosis, key: str) -> float | None:
    """A figure vLLM printed, when it is a plausible one (finite, not negative)."""
    value = diag.numbers.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None
