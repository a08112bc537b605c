#!/usr/bin/env bash
# Builds (once) and caches the real Kubernetes CRD API server (apiextensions-apiserver)
# and etcd from Debian's sid packages, without touching the system's apt state.
# Prints the cache folder holding bin/apiextensions-apiserver and bin/etcd.
# Why sid: it is the only suite that ships the apiextensions-apiserver Go sources
# and an etcd new enough for it.
set -euo pipefail
cache="${VLLM_AUTOHEAL_CACHE:-$HOME/.cache/vllm-autoheal}/crd-server"
bin="$cache/bin"
if [ -x "$bin/apiextensions-apiserver" ] && [ -x "$bin/etcd" ]; then
  echo "$cache"; exit 0
fi
mkdir -p "$bin"
apt="$cache/apt"
mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/etc/preferences.d" "$apt/etc/apt.conf.d"
# The same mirror the machine's own apt sources use (never a hard-coded host).
mirror=$(grep -hoE '^URIs:[[:space:]]*\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null \
          | awk '{print $2}' | grep -v -- '-security' | head -n1 || true)
if [ -z "$mirror" ]; then
  mirror=$(grep -hoE '^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?\S+' /etc/apt/sources.list 2>/dev/null \
           | awk '{print $NF}' | grep -v -- '-security' | head -n1 || true)
fi
[ -n "$mirror" ] || { echo "no Debian mirror found in the machine's apt sources" >&2; exit 3; }
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror sid main" > "$apt/etc/sources.list"
opts=(-o "Dir::State=$apt/state" -o "Dir::State::status=/var/lib/dpkg/status" -o "Dir::Cache=$apt/cache"
      -o "Dir::Etc::SourceList=$apt/etc/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
      -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$apt/etc/preferences.d"
      -o "APT::Architecture=$(dpkg --print-architecture)" -o "Debug::NoLocking=1")
echo "crd-server: apt-get update (sid, private state)" >&2
apt-get "${opts[@]}" -qq update >&2
debs="$cache/debs"; root="$cache/root"
mkdir -p "$debs" "$root"
pkgs=$(apt-cache "${opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
         --no-breaks --no-replaces --no-enhances golang-k8s-apiextensions-apiserver-dev golang-go \
       | grep -E '^golang-' | sort -u)
echo "crd-server: downloading $(echo "$pkgs" | wc -l) Go source packages and etcd-server" >&2
(cd "$debs" && apt-get "${opts[@]}" -qq download $pkgs etcd-server >&2)
for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done
goroot=$(ls -d "$root"/usr/lib/go-1.* | sort -V | tail -n1)
echo "crd-server: building apiextensions-apiserver with $(basename "$goroot") (a few minutes)" >&2
GOROOT="$goroot" GOPATH="$root/usr/share/gocode" GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local \
  CGO_ENABLED=0 GOCACHE="$cache/gocache" GOFLAGS= \
  "$goroot/bin/go" build -o "$bin/apiextensions-apiserver" k8s.io/apiextensions-apiserver >&2
cp "$root/usr/bin/etcd" "$bin/etcd"
# The sources and the build cache are 4 GB; only the two binaries are worth keeping.
rm -rf "$root" "$cache/gocache" "$debs" "$apt/cache/archives"
echo "$cache"
