#!/usr/bin/env bash
# vLLM 0.25's own memory figures for quantized checkpoints whose width the method's name leaves open (device
# tool, one H100 or H200): Llama-3.1-8B as AWQ 4-bit and GPTQ 4- and 8-bit (groups of 128) and 4-bit in groups of 32, and compressed-tensors W4A16 and W8A16 (llm-compressor's, groups of 128), and the float 4-bit formats
# (llm-compressor's NVFP4, NVFP4A16 and MXFP4, ModelOpt's NVFP4) (dummy weights, the packed layers
# vLLM builds from the config's quantization_config). What spec.heal.quantizedFallback.bits lets the memory
# model weigh; tests/test_quantized_fallback_gpu.py replays them (the session-38 skip-list runs:
# tests/test_skipped_layers_gpu.py, from tests/fixtures/gpu/skip-runs/). Logs in $OUT/NAME.log, one line per run
# in $OUT/summary.txt.
#   bash tests/gpu/quantized_runs.sh [NAME...]      (default: every run below)
# Needs vLLM 0.25 in $SITE (tests/gpu/payload.sh) and the model folders of
# `tests/gpu/make_models.py DIR llama-3.1-8b-awq4 llama-3.1-8b-gptq4 llama-3.1-8b-gptq8 llama-3.1-8b-gptq4-g32 llama-3.1-8b-w4a16
# llama-3.1-8b-w8a16 llama-3.1-8b-nvfp4 llama-3.1-8b-nvfp4a16 llama-3.1-8b-mxfp4 llama-3.1-8b-modelopt-nvfp4
# llama-3.1-8b-modelopt-nvfp4-nested llama-3.1-8b-modelopt-mxfp8 llama-3.1-8b-modelopt-nvfp4-kvfp8
# llama-3.1-8b-gptq4-attn-only llama-3.1-8b-modelopt-nvfp4-mlp-skipped llama-3.1-8b-fp8-down-skipped
# llama-3.1-8b-w4a16-down-skipped` in $MODELS.
set -u
. "$(dirname "$0")/vllm_env.sh"
export CUDA_VISIBLE_DEVICES=0
. "$(dirname "$0")/serve_run.sh"
record_device
ALL="awq4 gptq4 gptq8 gptq4-g32 w4a16 w8a16 nvfp4 nvfp4a16 mxfp4 modelopt-nvfp4 modelopt-nvfp4-nested modelopt-mxfp8 modelopt-nvfp4-kvfp8"
ALL="$ALL gptq4-attn-only modelopt-nvfp4-mlp-skipped fp8-down-skipped w4a16-down-skipped"
for name in ${@:-$ALL}; do
  case $name in  # (float16: the dtype AutoAWQ and AutoGPTQ checkpoints are saved in)
    awq4) run awq4 llama-3.1-8b-awq4 --max-model-len 8192 --enforce-eager --dtype float16 ;;
    gptq4) run gptq4 llama-3.1-8b-gptq4 --max-model-len 8192 --enforce-eager --dtype float16 ;;
    gptq8) run gptq8 llama-3.1-8b-gptq8 --max-model-len 8192 --enforce-eager --dtype float16 ;;
    gptq4-g32) run gptq4-g32 llama-3.1-8b-gptq4-g32 --max-model-len 8192 --enforce-eager --dtype float16 ;;
    w4a16) run w4a16 llama-3.1-8b-w4a16 --max-model-len 8192 --enforce-eager --dtype float16 ;;
    w8a16) run w8a16 llama-3.1-8b-w8a16 --max-model-len 8192 --enforce-eager --dtype float16 ;;
    # (float 4-bit formats, session 37: bfloat16, the dtype llm-compressor and ModelOpt save in)
    nvfp4) run nvfp4 llama-3.1-8b-nvfp4 --max-model-len 8192 --enforce-eager ;;
    nvfp4a16) run nvfp4a16 llama-3.1-8b-nvfp4a16 --max-model-len 8192 --enforce-eager ;;
    mxfp4) run mxfp4 llama-3.1-8b-mxfp4 --max-model-len 8192 --enforce-eager ;;
    modelopt-nvfp4) run modelopt-nvfp4 llama-3.1-8b-modelopt-nvfp4 --max-model-len 8192 --enforce-eager ;;
    modelopt-nvfp4-nested) run modelopt-nvfp4-nested llama-3.1-8b-modelopt-nvfp4-nested --max-model-len 8192 --enforce-eager ;;
    modelopt-mxfp8) run modelopt-mxfp8 llama-3.1-8b-modelopt-mxfp8 --max-model-len 8192 --enforce-eager ;;
    modelopt-nvfp4-kvfp8) run modelopt-nvfp4-kvfp8 llama-3.1-8b-modelopt-nvfp4-kvfp8 --max-model-len 8192 --enforce-eager ;;
    # (session 38: layers the checkpoint skips, read from each method's own list)
    gptq4-attn-only) run gptq4-attn-only llama-3.1-8b-gptq4-attn-only --max-model-len 8192 --enforce-eager --dtype float16 ;;
    modelopt-nvfp4-mlp-skipped) run modelopt-nvfp4-mlp-skipped llama-3.1-8b-modelopt-nvfp4-mlp-skipped --max-model-len 8192 --enforce-eager ;;
    fp8-down-skipped) run fp8-down-skipped llama-3.1-8b-fp8-down-skipped --max-model-len 8192 --enforce-eager ;;
    w4a16-down-skipped) run w4a16-down-skipped llama-3.1-8b-w4a16-down-skipped --max-model-len 8192 --enforce-eager --dtype float16 ;;
    *) echo "unknown run $name" >&2 ;;
  esac
done
