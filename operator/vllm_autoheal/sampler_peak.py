"""The dummy sampler run of vLLM's start-up profile (profile_run: _dummy_run(max_num_batched_tokens),
then _dummy_sampler_run on its last hidden states): what it holds on the GPU at its peak, which the
profile counts in "peak activation" when it exceeds the forward pass's own peak.

The sampler runs over one row of logits a dummy request, min(max_num_seqs, max_num_batched_tokens)
rows (_dummy_run: num_reqs = min(num_tokens, max_num_reqs)), each of the full vocabulary (with TP the
logits are gathered onto every rank). What it holds a logit depends on the model runner and its
top-k/top-p path, so on the vLLM release; each figure is bytes per logit:

- "v2": the V2 model runner (vllm/v1/worker/gpu/model_runner.py): the bf16 logits and the sampler's
  float32 copy (gpu/sample/sampler.py apply_sampling_params); the dummy batch skips top-k/top-p, and
  the Gumbel kernel keeps per-block maxima only. vLLM runs dense models on it in 0.25 and every model
  in 0.32 (config/vllm.py use_v2_model_runner).
- "v1-triton": the V1 runner (gpu_model_runner.py _dummy_sampler_run, top_k = vocab - 1, top_p 0.9)
  with the Triton top-k/top-p kernel, in place (PR #33538, merged 2026-02): bf16 logits, the float32
  copy, the softmax probabilities and the exponential noise of random_sample (2 + 4 + 4 + 4).
  vLLM 0.25 runs MoE and hybrid models (Qwen3-Next) on it.
- "v1-sort": the V1 runner before that kernel, on PyTorch's sort (apply_top_k_top_p: logits.sort
  gives float32 values and int64 indices, and the sort's own workspace), wherever FlashInfer's
  sampler was not used (not installed, as in the Qwen3-Next log of test_moe_profile_peak.py, or off:
  its default then, PR #32558). Measured on an H200 (torch 2.11): 36 bytes a logit over the bf16
  logits, for 128 to 2,048 rows and vocabularies of 32,000 to 201,088; 38 with them. Every model ran
  on the V1 runner in 0.10-0.1x.

Which path a release runs for a model is vllm_release.py's (the V1 runner's path from 0.11.1, where the
model runs on it; before, an image with FlashInfer took FlashInfer's sampler or the sort, not pinned);
without a release, or where it is not pinned, the estimate counts the "v2" floor, which every path
holds. Pure: plain numbers in, bytes out.
"""

from __future__ import annotations

SAMPLER_BYTES_PER_LOGIT = {"v2": 6, "v1-triton": 14, "v1-sort": 38}
HIDDEN_BYTES = 2  # the dummy run's hidden states (bf16), held while the sampler runs


def sampler_rows(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Rows of logits the dummy sampler run samples: one a dummy request."""
    return max(min(max_num_seqs, max_num_batched_tokens), 0)


def sampler_peak_bytes(
    vocab: int, hidden: int, max_num_seqs: int, max_num_batched_tokens: int, path: str = "v2"
) -> int:
    """The profile's allocation while the dummy sampler runs: the forward pass's hidden states
    ([max_num_batched_tokens, hidden]) and the sampler's tensors over [rows, vocab]."""
    rows = sampler_rows(max_num_seqs, max_num_batched_tokens)
    held = HIDDEN_BYTES * hidden * max_num_batched_tokens
    return SAMPLER_BYTES_PER_LOGIT[path] * rows * vocab + held
