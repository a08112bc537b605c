"""A GPU out-of-memory that no traceback frame or start-up milestone places: what the numbers in
torch's own message, and what the deployment knows of the model, can still tell. Standard
library only.

Each rule follows from the order in which every vLLM version starts (load the weights; profile
with a dummy batch; allocate the KV cache; capture CUDA graphs; serve), never from a wording:
- one allocation larger than the whole GPU is no weight and no graph: it is an activation sized
  by the start-up dummy batch;
- weights stay allocated once loaded, so a process that held less than the model's weights on
  its GPU had not finished loading them; weights larger than the whole GPU never finish. (Weights
  that fit the whole GPU do finish unless something else holds memory: that is not placed.)
- a process that had been put to sleep (sleep mode) holds less than its weights while waking up,
  as vLLM puts them back: that is no first load, so the weights rules do not apply to it.
Anything else stays unplaced: each step wants a different change, and a wrong one is worse than
none. (CUDA-graph pools held before the server was ready do not mean capture: vLLM V1 warms the
sampler up after capture, and a real OOM there, prof-29049 in the corpus, held pools too.)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from . import model as m

# The memory model's estimate of the weights may be off by a few percent (buffers, a vision tower
# it does not count): only a clear shortfall says the weights were not yet all resident.
LOADING_SHARE = 0.85
LOADABLE_SHARE = 0.97  # weights above this share of the whole GPU cannot all be loaded (the CUDA context)
MAX_WEIGHTS_GIB = 1 << 20
# The engine's own signs of sleep mode: the worker's "Sleep mode freed X GiB memory" and a wake_up frame.
SLEPT = re.compile(r"Sleep mode freed|\bin wake_up\b|\.wake_up\(")


@dataclass(frozen=True)
class Placement:
    cause: m.Cause
    phase: m.EnginePhase
    subtype: str
    why: str


def plausible_weights(value: object) -> float | None:
    """The deployment's weights-per-GPU figure, or None when it is not a usable size."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 < value < MAX_WEIGHTS_GIB else None


def place(
    nums: dict, starting: bool, weights_gib: float | None, device_gib: float | None, slept: bool = False
) -> Placement | None:
    """`nums`: the figures of torch's out-of-memory message (already checked for plausibility);
    `starting`: the server had not been ready; `weights_gib`: the model's weights on one GPU, from
    the deployment (None when not known); `device_gib`: the GPU's total memory; `slept`: the log
    shows the engine in sleep mode (SLEPT)."""
    tried = nums.get("tried_gib")
    if starting and tried and device_gib and tried > device_gib:
        return Placement(
            m.PROFILING_OOM,
            m.PHASE_PROFILE,
            "allocation_larger_than_gpu",
            f"Before the server was ready, one allocation asked for {tried:g} GiB, more than the whole GPU "
            f"({device_gib:g} GiB): an activation of the start-up profiling run, sized by the dummy batch; "
            "a smaller batch shrinks it.",
        )
    weights = None if slept else plausible_weights(weights_gib)
    held = nums.get("torch_allocated_gib")
    # Weights that fit the GPU load whatever vLLM's utilization: an OOM while loading them says that
    # something else held the memory (another process, a WSL2 or vGPU limit), not that they do not fit.
    fits = weights is not None and device_gib is not None and weights <= LOADABLE_SHARE * device_gib
    if weights is not None and held is not None and held < LOADING_SHARE * weights and not fits:
        return Placement(
            m.WEIGHTS_LOAD_OOM,
            m.PHASE_LOAD,
            "weights_not_yet_resident",
            f"When it failed, the process held {held:g} GiB allocated by PyTorch, less than the model's "
            f"{weights:g} GiB of weights on one GPU (by the deployment's model): it was still loading "
            "them. The weights do not fit in what vLLM may use of this GPU.",
        )
    # (whatever the process held: weights that cannot all fit leave no start-up step to succeed)
    if weights is not None and device_gib and weights > LOADABLE_SHARE * device_gib:
        return Placement(
            m.WEIGHTS_LOAD_OOM,
            m.PHASE_LOAD,
            "weights_larger_than_gpu",
            f"The model's weights on one GPU ({weights:g} GiB, by the deployment's model) are more than "
            f"the whole GPU holds ({device_gib:g} GiB): loading them cannot finish.",
        )
    return None
