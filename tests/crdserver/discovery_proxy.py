"""A front proxy that gives the bare CRD API server the discovery kubectl needs.

apiextensions-apiserver serves no /api or /apis (kube-aggregator does, in a cluster). This
serves /api, /api/v1 and an /apis group list built from the CRDs, and passes every other
request through to the server with the client certificate (shared/reference/k8s-testing.md §2).
"""
from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
from pathlib import Path

from aiohttp import ClientSession, TCPConnector, web


class DiscoveryProxy:
    def __init__(self, server_url: str, cert_dir: Path) -> None:
        self.server = server_url
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

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(f"apiVersion: v1\nkind: Config\nclusters:\n- name: p\n  cluster: {{server: '{self.url}'}}\n"
                        "contexts:\n- name: p\n  context: {cluster: p, user: u, namespace: default}\n"
                        "users:\n- name: u\n  user: {}\ncurrent-context: p\n")
        return path

    async def _fetch(self, session: ClientSession, request: web.Request, path: str) -> tuple[int, bytes, str]:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        async with session.request(request.method, self.server + path, data=body or None, headers=headers,
                                   params=request.query) as resp:
            return resp.status, await resp.read(), resp.headers.get("Content-Type", "application/json")

    async def _handle(self, request: web.Request) -> web.Response:
        path = request.path
        async with ClientSession(connector=TCPConnector(ssl=self.ssl)) as session:
            if path == "/api":
                return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
            if path == "/api/v1":
                return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": []})
            if path == "/apis":
                _, raw, _ = await self._fetch(session, request, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
                groups = {"apiextensions.k8s.io": ["v1"]}
                for crd in json.loads(raw).get("items", []):
                    groups.setdefault(crd["spec"]["group"], [v["name"] for v in crd["spec"]["versions"]])
                return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                    {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                     "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                    for g, vs in groups.items()]})
            status, raw, ctype = await self._fetch(session, request, request.path_qs.split("?")[0])
            return web.Response(status=status, body=raw, headers={"Content-Type": ctype})

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> "DiscoveryProxy":
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
