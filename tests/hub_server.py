"""A Hugging Face Hub on 127.0.0.1 that speaks the file route huggingface_hub uses,
/{repo_id}/resolve/{revision}/{filename} (HEAD, then GET), with the headers its client checks
(file_download.get_hf_file_metadata): X-Repo-Commit, ETag, Content-Length; and errors as the Hub
marks them (hf_raise_for_status reads X-Error-Code: RepoNotFound, GatedRepo, RevisionNotFound,
EntryNotFound). Tests drive the real client against it; nothing leaves the machine."""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROUTE = re.compile(r"^/(?P<repo>[^/]+/[^/]+|[^/]+)/resolve/(?P<revision>[^/]+)/(?P<filename>.+)$")


@dataclass
class Repo:
    files: dict[str, bytes]
    gated_token: str | None = None  # gated: only this token gets the files
    revisions: tuple[str, ...] = ("main",)
    commit: str = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[tuple[str, str, bool]] = field(default_factory=list)  # (method, path, had a token)
    stall: threading.Event | None = None  # set: answer; unset: hold the request (a Hub that hangs)
    url: str = ""
    cache: str = ""

    def serve(self) -> tuple[ThreadingHTTPServer, str]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _fail(self, status: int, code: str, message: str = "") -> None:
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                if message:
                    self.send_header("X-Error-Message", message)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _answer(self, body: bool) -> None:
                auth = self.headers.get("Authorization", "")
                hub.requests.append((self.command, self.path, auth.startswith("Bearer ")))
                if hub.stall is not None:
                    hub.stall.wait(30)
                m = ROUTE.match(self.path.split("?")[0])
                repo = hub.repos.get(m["repo"]) if m else None
                if repo is None:
                    return self._fail(404 if auth else 401, "RepoNotFound", "Repository not found")
                if repo.gated_token is not None and auth != f"Bearer {repo.gated_token}":
                    return self._fail(401 if not auth else 403, "GatedRepo", "Access to model is restricted")
                if m["revision"] not in repo.revisions and m["revision"] != repo.commit:
                    return self._fail(404, "RevisionNotFound", "Invalid rev id")
                data = repo.files.get(m["filename"])
                if data is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Repo-Commit", repo.commit)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id, as the Hub
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{blob}"')
                self.send_header("X-Repo-Commit", repo.commit)
                self.end_headers()
                if body:
                    self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_address[1]}"


CONFIGS = Path(__file__).parent / "fixtures" / "configs"
GATED_TOKEN = "hf_localtesttoken"


def default_repos() -> dict[str, Repo]:
    return {
        "meta-llama/Llama-3.1-8B-Instruct": Repo({"config.json": (CONFIGS / "llama-3.1-8b.json").read_bytes()}),
        "meta-llama/Llama-3.1-70B-Instruct": Repo(
            {"config.json": (CONFIGS / "llama-3.1-70b.json").read_bytes()}, gated_token=GATED_TOKEN
        ),
        "Qwen/Qwen2.5-7B-Instruct": Repo({"config.json": (CONFIGS / "qwen2.5-7b.json").read_bytes()}),
        "acme/no-config": Repo({"README.md": b"# nothing to see"}),
        "acme/huge": Repo({"config.json": b'{"pad": "' + b"x" * (2 << 20) + b'"}'}),
        "acme/hostile": Repo(
            {
                "config.json": b'{"num_hidden_layers": 1e12, "hidden_size": 4096, '
                b'"num_attention_heads": 32, "vocab_size": 32000}'
            }
        ),
    }


@pytest.fixture
def hub(tmp_path):
    """A local Hub with a few repos; `hub.url` is its endpoint, `hub.cache` a fresh cache dir."""
    h = Hub(repos=default_repos())
    server, h.url = h.serve()
    h.cache = str(tmp_path / "hub-cache")
    yield h
    if h.stall is not None:
        h.stall.set()
    server.shutdown()
    server.server_close()
