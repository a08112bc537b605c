# The environment the H200 scripts run vLLM 0.25 in (sourced, after `set -u`): the payload in $SITE
# (tests/gpu/payload.sh), the model folders in $MODELS (tests/gpu/make_models.py), this repository's
# operator/ on the path where $CODE is set, offline, and never NVLink multicast.
SITE=${SITE:-/scratch/site}; MODELS=${MODELS:-/scratch/models}
export PYTHONPATH=$SITE${CODE:+:$CODE/operator} PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
