"""How `serve` asks the vLLM server it started: where (the loopback for a wildcard address, https where
vLLM serves TLS), whether it is healthy, and one completion with the server's API key."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from .engine_death import direct_opener, health_url
from .flag_tokens import flag_value


def base_url(host: str, port: int, extra_args: list[str]) -> str:
    """A wildcard address (all interfaces) is asked on the loopback, an IPv6 literal in brackets;
    https where the flags give vLLM a certificate (--ssl-certfile, --ssl-keyfile)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    tls = (health_url(extra_args) or "").startswith("https:")
    return f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"


def complete_one(url: str, model: str, extra_args: list[str]) -> tuple[bool, str]:
    """One short completion: (whether it came, its text or why not). The key is the flag's, else the
    VLLM_API_KEY vLLM reads (the flag wins, as in vLLM); never part of what is returned."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json"}
    if key := flag_value(extra_args, "--api-key") or os.environ.get("VLLM_API_KEY"):
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers=headers)
    try:
        with direct_opener(url.startswith("https:")).open(req, timeout=120) as answer:
            return True, repr(json.loads(answer.read())["choices"][0]["text"])
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        return False, str(exc)
