"""Where a model's config.json comes from, for `plan`, pre-flight and heals: one place.

Sources, first match wins: for a VLLMService, spec.modelConfig.inline, then its configMapRef,
then the deprecated annotation, then the Hugging Face Hub (spec.model as a repo id, the token
from spec.hfTokenSecretRef); for the CLI, a local path (a directory holding config.json, or the
file), else the Hub. Every config goes through model_config's bounded check.

The Hub is reached with huggingface_hub (config.json only, one HEAD to check its size, then
hf_hub_download into a cache), at the endpoint the operator was started with (read once; off
unless configured). A handler never waits longer than the Hub timeout: the fetch runs in a small
pool, one fetch per (endpoint, model, revision, token), and its result is kept in memory, so
many VLLMServices of one model cost one request (a full cache lets the namespace that stored the
most lose its oldest answer; on disk, each token has a cache of its own). One namespace has at most HUB_LOOKUPS_PER_NAMESPACE lookups under
way and as many handlers waiting: the Hub's slowness costs each tenant its own share, never
another's.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import hub_cache
from .api.config_json import DNS_SUBDOMAIN
from .model_config import MAX_CONFIG_BYTES, ModelConfigError, check, parse, to_shape
from .model_files import CONFIG_FILE, from_path, read_capped

DEFAULT_ENDPOINT = "https://huggingface.co"
DEPRECATED_ANNOTATION = "vllm.autoheal.dev/model-config"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")
MAX_TOKEN_CHARS = 512
SECRET_NAME = re.compile(DNS_SUBDOMAIN)  # as Kubernetes names objects (the CRD's own rule)
OK_TTL_S, ERROR_TTL_S, MAX_CACHED = 3600.0, 60.0, 512
# One namespace's share of the Hub: lookups it has started and not finished, and its handlers
# waiting for an answer. Beyond it a lookup answers "pending" at once (the reconcile asks again
# shortly), so a tenant naming many models while the Hub is slow neither holds the operator's
# workers nor queues its fetches ahead of everyone else's.
HUB_LOOKUPS_PER_NAMESPACE = 2
# Fetches at once, all namespaces: mostly threads waiting on the network, so room for 16 namespaces'
# shares (a tenant would need 16 namespaces whose models the Hub hangs on to fill it).
HUB_FETCHES = 32


@dataclass(frozen=True)
class HubSettings:
    endpoint: str | None = None  # None: never ask the Hub
    cache_dir: str | None = None  # huggingface_hub's cache; None: its default
    timeout_s: float = 5.0  # the longest a handler waits for an answer
    secret_tokens: bool = True  # the operator may read spec.hfTokenSecretRef for the Hub

    @property
    def request_timeout_s(self) -> float:
        """Per request: longer than a handler waits, so a slow answer still lands in the cache."""
        return 4 * self.timeout_s

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> HubSettings:
        env = dict(os.environ if env is None else env)
        return cls(
            endpoint=(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"), cache_dir=env.get("HF_HUB_CACHE") or None
        )


@dataclass
class Resolved:
    """A model's shape and where it came from, or why it could not be had."""

    source: str
    fields: dict[str, Any] | None = None
    error: str | None = None
    shape: Any = field(default=None, repr=False)
    pending: bool = False  # the Hub has not answered yet; asking again later will know

    @property
    def ok(self) -> bool:
        return self.shape is not None


def _shaped(source: str, load: Callable[[], dict[str, Any]]) -> Resolved:
    try:
        fields = load()
        return Resolved(source=source, fields=fields, shape=to_shape(fields))
    except ModelConfigError as exc:
        return Resolved(source=source, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - never raise on untrusted input
        return Resolved(source=source, error=f"{source}: {type(exc).__name__}: {str(exc)[:200]}")


# --- the Hub ---------------------------------------------------------------------------------


def from_hub(
    repo_id: str,
    revision: str | None,
    hub: HubSettings,
    token: str | bool | None,
    wrote: Callable[[int], Any] | None = None,
    again: bool = False,
) -> dict[str, Any]:
    """config.json of a Hub repo through huggingface_hub; errors say what to do. `token`: a
    string, False for none, None for huggingface_hub's own lookup (HF_TOKEN, `hf auth login`).
    `wrote`: told the bytes a download put in the cache."""
    from huggingface_hub import errors, get_hf_file_metadata, hf_hub_download, hf_hub_url

    if not hub.endpoint:
        raise ModelConfigError("Hub lookups are off; give the model config another way")
    if not REPO_ID.match(repo_id) or ".." in repo_id:
        raise ModelConfigError(f"{repo_id!r} is neither a local path nor a Hugging Face repo id")
    where = f"{repo_id}@{revision or 'main'} on {hub.endpoint}"
    kwargs: dict[str, Any] = dict(revision=revision, endpoint=hub.endpoint, token=token)
    try:
        try:
            meta = get_hf_file_metadata(
                hf_hub_url(repo_id, CONFIG_FILE, revision=revision, endpoint=hub.endpoint),
                token=token,
                timeout=hub.request_timeout_s,
                endpoint=hub.endpoint,
            )
        except errors.HfHubHTTPError:
            raise
        except Exception:  # noqa: BLE001 - the Hub cannot be reached: a copy cached earlier still serves
            path = hf_hub_download(repo_id, CONFIG_FILE, cache_dir=hub.cache_dir, local_files_only=True, **kwargs)
        else:
            if meta.size is not None and meta.size > MAX_CONFIG_BYTES:
                raise ModelConfigError(
                    f"config.json of {where} is {meta.size:,} bytes; at most {MAX_CONFIG_BYTES:,} are read"
                )
            path = hf_hub_download(
                repo_id, CONFIG_FILE, cache_dir=hub.cache_dir, etag_timeout=hub.request_timeout_s, **kwargs
            )
            if wrote is not None:
                wrote(meta.size or 0)
    except ModelConfigError:
        raise
    except errors.GatedRepoError:
        raise ModelConfigError(
            f"{where} is gated: accept its terms on the Hub and give a token with access "
            "(spec.hfTokenSecretRef, or HF_TOKEN)"
        ) from None
    except errors.RepositoryNotFoundError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        hint = (
            "it is private or gated and no token with access was given"
            if status == 401 or not token
            else "the token has no access to it"
        )
        raise ModelConfigError(f"{where}: no such model, or {hint} (HTTP {status})") from None
    except errors.RevisionNotFoundError:
        raise ModelConfigError(f"{where}: no such revision") from None
    except errors.LocalEntryNotFoundError:  # (an EntryNotFoundError too: first)
        raise ModelConfigError(
            f"{where}: the Hub could not be reached within {hub.request_timeout_s:g} s and no copy is cached"
        ) from None
    except errors.RemoteEntryNotFoundError:
        raise ModelConfigError(f"{where} has no {CONFIG_FILE}") from None
    except errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        raise ModelConfigError(f"{where}: the Hub answered HTTP {status}") from None
    except Exception as exc:  # noqa: BLE001 - timeouts, refused connections, a cache dir that cannot be written
        raise ModelConfigError(f"{where}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not again and not Path(str(path)).exists():  # (the bounded cache let it go meanwhile: hub_cache)
        return from_hub(repo_id, revision, hub, token, wrote, again=True)
    return read_capped(Path(str(path)), f"config.json of {where}")


def resolve_local(
    model: str, revision: str | None = None, hub: HubSettings | None = None, token: str | bool | None = None
) -> tuple[dict[str, Any], str]:
    """For the CLI: a local path, else a Hub repo id. Returns (checked fields, source)."""
    try:
        local = Path(model).expanduser()
    except RuntimeError:  # (~user of no such user)
        raise ModelConfigError(f"{model}: no such user's home directory") from None
    if local.exists():
        return from_path(local), str(model)
    if model.startswith(("/", "./", "../", "~")):
        raise ModelConfigError(f"{model}: no such file or directory")
    hub = hub or HubSettings.from_env()
    return from_hub(model, revision, hub, token), f"{model}@{revision or 'main'} on {hub.endpoint}"


# --- the operator: settings read once, a bounded cache, a deadline ----------------------------

_hub = HubSettings()  # off until the operator's start-up configures it
_pool: ThreadPoolExecutor | None = None
# key -> (expires, answer, the namespace whose lookup stored it), in the order stored
_cache: dict[tuple, tuple[float, Resolved, str]] = {}
_inflight: dict[tuple, Future] = {}
_fetching: dict[str, int] = {}  # by namespace: lookups started and not finished
_waiting: dict[str, int] = {}  # by namespace: handlers waiting for the Hub
_guard = threading.RLock()  # a done-callback may run inside it


def configure(hub: HubSettings) -> None:
    """Called once at operator start-up (and by tests): where the Hub is, or None for off."""
    global _hub, _pool
    with _guard:
        _hub = hub
        _cache.clear()
        _inflight.clear()
        _fetching.clear()
        _waiting.clear()
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=HUB_FETCHES, thread_name_prefix="model-config")


def timeout_s() -> float:
    return _hub.timeout_s


def _store(key: tuple, result: Resolved, namespace: str) -> None:
    """Keep an answer. When the cache is full, expired answers go first, then the oldest answer of
    the namespace that stored the most: a tenant naming many models (or revisions) pushes out its own
    answers, never the few another tenant's services read (first-in-first-out across all did)."""
    with _guard:
        _cache.pop(key, None)
        if len(_cache) >= MAX_CACHED:
            now = time.monotonic()
            for old in [k for k, (expires, _, _) in _cache.items() if expires <= now]:
                _cache.pop(old)
        if len(_cache) >= MAX_CACHED:
            held = Counter(stored_by for _, _, stored_by in _cache.values())
            most = max(held, key=held.__getitem__)
            _cache.pop(next(k for k, (_, _, stored_by) in _cache.items() if stored_by == most))
        _cache[key] = (time.monotonic() + (OK_TTL_S if result.ok else ERROR_TTL_S), result, namespace)


def _finished(key: tuple, future: Future, namespace: str) -> None:
    """A fetch's end, whatever it was (a cancelled future has no result): its answer kept, its slot
    and its namespace's share freed. Only this fetch's slot: a reconfigure may have started another."""
    try:
        _store(key, future.result(), namespace)
    except BaseException:  # noqa: BLE001 - cancelled: nothing to keep
        pass
    finally:
        with _guard:
            if _inflight.get(key) is future:
                _inflight.pop(key)
        _count(_fetching, namespace, -1)


def _count(counts: dict[str, int], namespace: str, step: int) -> None:
    with _guard:
        left = counts.get(namespace, 0) + step
        if left > 0:
            counts[namespace] = left
        else:
            counts.pop(namespace, None)  # so the tables hold only namespaces with work under way


def _hub_cached(repo_id: str, revision: str | None, token: str | None, namespace: str) -> Resolved:
    hub = _hub
    source = f"{repo_id}@{revision or 'main'} on the Hub"
    if not REPO_ID.match(repo_id) or ".." in repo_id:
        return Resolved(
            source=source,
            error=f"spec.model {repo_id[:100]!r} is not a Hub repo id (a path inside "
            "the pod?); set spec.modelConfig to check memory before start",
        )
    if not hub.endpoint or _pool is None:
        return Resolved(
            source=source,
            error="the operator's Hub lookups are off (--hub-endpoint); "
            "set spec.modelConfig to check memory before start",
        )
    digest = hashlib.sha256(token.encode()).hexdigest()[:16] if token else None  # never the token itself
    key = (hub.endpoint, repo_id, revision, digest)
    busy = Resolved(
        source=source,
        pending=True,
        error=f"namespace {namespace}'s other Hub lookups are under way; asking again shortly",
    )
    with _guard:
        hit = _cache.get(key)
        if hit and hit[0] > time.monotonic():
            return hit[1]
        future = _inflight.get(key)
        if future is None:
            if _fetching.get(namespace, 0) >= HUB_LOOKUPS_PER_NAMESPACE:
                return busy
            fetch_hub = _cache_of(hub, digest)
            future = _pool.submit(lambda: _fetched(source, repo_id, revision, fetch_hub, token or False))
            # in flight before the callback is attached: a fetch already done runs it right here
            _inflight[key] = future
            _count(_fetching, namespace, +1)
            future.add_done_callback(lambda f: _finished(key, f, namespace))
        if _waiting.get(namespace, 0) >= HUB_LOOKUPS_PER_NAMESPACE:
            return busy
        _count(_waiting, namespace, +1)
    try:
        return future.result(timeout=hub.timeout_s)
    except FutureTimeout:
        return Resolved(
            source=source, pending=True, error=f"the Hub did not answer within {hub.timeout_s:g} s; still trying"
        )
    finally:
        _count(_waiting, namespace, -1)


def _fetched(source: str, repo_id: str, revision: str | None, hub: HubSettings, token: str | bool) -> Resolved:
    """A fetch in the pool; the on-disk caches of every token then kept within their bound (hub_cache)."""
    written: list[int] = []
    result = _shaped(source, lambda: from_hub(repo_id, revision, hub, token, written.append))
    hub_cache.wrote(Path(str(hub.cache_dir)).parent, sum(written))
    return result


def _cache_of(hub: HubSettings, digest: str | None) -> HubSettings:
    """The Hub settings with an on-disk cache of this token's own (by its digest; "anonymous" for none).
    When the Hub cannot be reached, a cached copy serves, and huggingface_hub's cache checks no access:
    a tenant with no token read the config of a gated repo another tenant's token had fetched."""
    from huggingface_hub import constants

    base = Path(hub.cache_dir or constants.HF_HUB_CACHE)
    return replace(hub, cache_dir=str(base / "by-token" / (digest or "anonymous")))


def _secret_token(namespace: str, ref: Any, get: Callable[[str], Any]) -> str | None:
    """The Hub token from the VLLMService's own Secret; never logged, only its hash is kept."""
    if len(ref.name) > 253 or not SECRET_NAME.match(
        ref.name
    ):  # a path ("../other/secrets/x") would leave the namespace
        return None
    try:
        secret = get(f"/api/v1/namespaces/{namespace}/secrets/{ref.name}") or {}
        value = base64.b64decode((secret.get("data") or {}).get(ref.key) or "", validate=True)
        token = value.decode("utf-8").strip()
        return token if 0 < len(token) <= MAX_TOKEN_CHARS else None
    except Exception:  # noqa: BLE001 - a missing or malformed Secret: ask without a token
        return None


def for_service(obj: Any, get: Callable[[str], Any]) -> Resolved:
    """The shape of a VLLMService's model, or why it cannot be had. `get(path)`: a GET on the
    Kubernetes API returning the object or None. Never raises."""
    try:
        return _for_service(obj, get)
    except Exception as exc:  # noqa: BLE001 - a bug here must cost a condition, never the reconcile
        return Resolved(source="model config", error=f"{type(exc).__name__}: {str(exc)[:200]}")


def _for_service(obj: Any, get: Callable[[str], Any]) -> Resolved:
    spec, meta = obj.spec, obj.metadata
    namespace = meta.get("namespace") or "default"
    source = spec.model_config_source
    if source is not None and source.inline is not None:
        return _shaped(
            "spec.modelConfig.inline",
            lambda: check(source.inline.model_dump(exclude_none=True), "spec.modelConfig.inline", declared=True),
        )
    if source is not None and source.config_map_ref is not None:
        ref = source.config_map_ref
        where = f"ConfigMap {namespace}/{ref.name} key {ref.key}"

        def load() -> dict[str, Any]:
            cm = get(f"/api/v1/namespaces/{namespace}/configmaps/{ref.name}")
            if cm is None:
                raise ModelConfigError(f"{where}: no such ConfigMap")
            raw = (cm.get("data") or {}).get(ref.key)
            if not isinstance(raw, str):
                raise ModelConfigError(f"{where}: no such key")
            return parse(raw, where)

        return _shaped(where, load)
    raw = (meta.get("annotations") or {}).get(DEPRECATED_ANNOTATION)
    if raw is not None:
        where = f"annotation {DEPRECATED_ANNOTATION} (deprecated: use spec.modelConfig)"
        return _shaped(where, lambda: parse(raw if isinstance(raw, str) else "", where))
    token = (
        _secret_token(namespace, spec.hf_token_secret_ref, get)
        if spec.hf_token_secret_ref and _hub.endpoint and _hub.secret_tokens and REPO_ID.match(spec.model)
        else None
    )
    revision = source.revision if source is not None else None
    return _hub_cached(spec.model, revision, token, namespace)
