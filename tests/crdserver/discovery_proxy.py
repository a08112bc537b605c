"""A front proxy for the bare CRD API server: the discovery kubectl needs, and the split cluster.

apiextensions-apiserver serves no /api or /apis (kube-aggregator does, in a cluster). Alone,
this proxy serves /api, /api/v1 and an /apis group list built from the CRDs, and passes every
other request to the server with the client certificate.

With `core_url` (a kmock emulator) it is one cluster made of two servers: VLLMService
requests go to the real CRD API server (schema, defaults, pruning, resourceVersion,
generation, the status subresource), and everything else (discovery, pods, Deployments,
Services, Events) to the emulator. Responses stream through, so watches work both ways.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from vllm_autoheal.api import GROUP

PASSED_HEADERS = ("content-type", "accept", "user-agent")


class DiscoveryProxy:
    def __init__(self, server_url: str, cert_dir: Path, core_url: str | None = None) -> None:
        self.server = server_url
        self.core = core_url.rstrip("/") if core_url else None
        self.ssl = ssl.create_default_context()
        self.ssl.check_hostname, self.ssl.verify_mode = False, ssl.CERT_NONE
        self.ssl.load_cert_chain(cert_dir / "client.crt", cert_dir / "client.key")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._sessions: dict[bool, ClientSession] = {}

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            f"apiVersion: v1\nkind: Config\nclusters:\n- name: p\n  cluster: {{server: '{self.url}'}}\n"
            "contexts:\n- name: p\n  context: {cluster: p, user: u, namespace: default}\n"
            "users:\n- name: u\n  user: {}\ncurrent-context: p\n"
        )
        return path

    def _to_server(self, path: str) -> bool:
        if self.core is None:
            return True
        parts = path.strip("/").split("/")
        # /apis/<group>/<version>/<more>: a VLLMService request; shorter paths are discovery
        return len(parts) > 3 and parts[0] == "apis" and parts[1] in (GROUP, "apiextensions.k8s.io")

    async def _forward(self, request: web.Request, tls: bool) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in PASSED_HEADERS}
        base = self.server if tls else self.core
        async with self._sessions[tls].request(
            request.method, base + request.path, data=body or None, headers=headers, params=request.query
        ) as resp:
            out = web.StreamResponse(
                status=resp.status, headers={"Content-Type": resp.headers.get("Content-Type", "application/json")}
            )
            await out.prepare(request)
            async for chunk in resp.content.iter_any():  # a watch streams until either side closes
                await out.write(chunk)
            await out.write_eof()
            return out

    async def _server_json(self, path: str) -> dict:
        async with self._sessions[True].get(self.server + path) as resp:
            return await resp.json()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if not self._to_server(path):
            return await self._forward(request, tls=False)
        if path == "/api":
            return web.json_response(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
                }
            )
        if path == "/api/v1":
            return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": []})
        if path == "/apis":
            crds = await self._server_json("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
            groups = {"apiextensions.k8s.io": ["v1"]}
            for crd in crds.get("items", []):
                groups.setdefault(crd["spec"]["group"], [v["name"] for v in crd["spec"]["versions"]])
            return web.json_response(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                            "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                        }
                        for g, vs in groups.items()
                    ],
                }
            )
        return await self._forward(request, tls=True)

    async def _start(self) -> web.AppRunner:
        no_limit = ClientTimeout(total=None, sock_read=None)  # watches stay open
        self._sessions = {
            True: ClientSession(connector=TCPConnector(ssl=self.ssl), timeout=no_limit),
            False: ClientSession(timeout=no_limit),
        }
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, shutdown_timeout=1.0)  # open watches are cut at exit
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        return runner

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        runner = self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        for session in self._sessions.values():
            self._loop.run_until_complete(session.close())
        pending = asyncio.all_tasks(self._loop)  # watches still streaming when the test ended
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def __enter__(self) -> DiscoveryProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)
