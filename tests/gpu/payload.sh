#!/usr/bin/env bash
# Build the files that let vLLM 0.25.0 `vllm serve` run on the H200 machine (no network there), from this machine.
# Run from the repository root; writes .gpu/ (git-ignored):
#   .gpu/up1/part_aa, .gpu/up2/part_ab, .gpu/up2/site.sha256   one ~90 MB tar.xz of vLLM + dependencies, in 2 halves
# On the device: call 1 carries .gpu/up1 and copies part_aa to a work dir (e.g. /scratch); call 2 (machine still warm)
# carries .gpu/up2, joins the parts, checks the sha256, unpacks into /scratch/site, then
#   export PYTHONPATH=/scratch/site PATH=/scratch/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1
set -euo pipefail
PLAT="--python-version 3.12 --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any"
D=.gpu/dl
mkdir -p $D/vllm $D/whl
python3 -m pip download -q --no-deps --only-binary=:all: $PLAT -d $D/vllm vllm==0.25.0
for spec in pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection fastapi==0.136.3 starlette==1.10.0 \
  openai==2.54.0 jiter distro sniffio pyzmq==27.3.0 msgspec==0.23.0 cachetools blake3 cbor2 pybase64 ijson setproctitle \
  watchfiles python-json-logger diskcache==5.6.3 lark==1.2.2 outlines_core==0.2.14 xgrammar==0.2.9 apache-tvm-ffi==0.1.15 \
  llguidance==1.7.6 lm-format-enforcer==0.11.3 interegular mistral_common==1.13.1 pycountry pydantic-extra-types \
  compressed-tensors==0.17.0 depyf==0.20.0 astor dill gguf partial-json-parser jsonschema referencing rpds-py \
  jsonschema-specifications openai-harmony prometheus-fastapi-instrumentator loguru \
  uvicorn model-hosting-container-standards jmespath supervisor \
  cel-python==0.5.0 google-re2 pendulum pyyaml python-dateutil six tzdata; do  # (the last line: serve checks bounds with CEL)
  python3 -m pip download -q --no-deps --only-binary=:all: $PLAT -d $D/whl "$spec"
done
rm -rf $D/site && mkdir $D/site && (cd $D/site && unzip -q ../vllm/vllm-0.25.0-*.whl)
(
  cd $D/site
  rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs vllm/_moe_C_stable_libtorch.abi3.so \
        vllm/third_party/deep_gemm/_C.cpython-31[0134]-x86_64-linux-gnu.so
  rm -rf vllm/third_party/fmha_sm100/cutlass vllm/third_party/fmha_sm100/csrc vllm/third_party/deep_gemm/include \
         mistral_common/data/* pycountry/locales
)
python3 -m pip install -q --no-deps --no-index --no-compile --target $D/site $PLAT --only-binary=:all: $D/whl/*.whl
rm -rf $D/site/bin && mkdir $D/site/bin
printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' > $D/site/bin/vllm && chmod +x $D/site/bin/vllm
tar -cf - -C $D/site . | xz -9 -T2 > $D/site.tar.xz
rm -rf .gpu/up1 .gpu/up2 && mkdir -p .gpu/up1 .gpu/up2
split -n 2 -d -a 1 $D/site.tar.xz $D/part_ && mv $D/part_0 .gpu/up1/part_aa && mv $D/part_1 .gpu/up2/part_ab
sha256sum $D/site.tar.xz | cut -d' ' -f1 > .gpu/up2/site.sha256
ls -la .gpu/up1 .gpu/up2
