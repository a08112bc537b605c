"""Start the real Kubernetes CRD API server (apiextensions-apiserver + etcd) on 127.0.0.1.

The binaries come from build.sh (Debian sid sources, cached). Authentication is a
client certificate in group system:masters, which the delegated authorizer always
allows.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class Unavailable(RuntimeError):
    """The server's prerequisites cannot be had on this machine (the reason says which)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build() -> Path:
    """Build or reuse the cached binaries; Unavailable with the build's own words if it fails."""
    proc = subprocess.run(["bash", str(HERE / "build.sh")], capture_output=True, text=True, timeout=3000)
    if proc.returncode != 0:
        raise Unavailable("building apiextensions-apiserver from Debian sid failed:\n" + proc.stderr[-3000:])
    return Path(proc.stdout.strip().splitlines()[-1]) / "bin"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass
class CRDServer:
    workdir: Path
    url: str
    kubeconfig: Path
    procs: list[subprocess.Popen]

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start(bin_dir: Path, timeout: float = 90) -> CRDServer:
    if not shutil.which("openssl"):
        raise Unavailable("openssl is not installed")
    work = Path(tempfile.mkdtemp(prefix="crd-server-"))
    certs = work / "certs"
    certs.mkdir()
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        cwd=certs,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=admin/O=system:masters",
        cwd=certs,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.crt",
        "-days",
        "2",
        cwd=certs,
    )
    etcd_port, peer_port, metrics_port, api_port = (_free_port() for _ in range(4))
    url = f"https://127.0.0.1:{api_port}"
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {{server: "{url}", insecure-skip-tls-verify: true}}
users:
- name: admin
  user: {{client-certificate: "{certs}/client.crt", client-key: "{certs}/client.key"}}
contexts:
- name: local
  context: {{cluster: local, user: admin}}
current-context: local
""")
    log = open(work / "server.log", "w")
    etcd = subprocess.Popen(
        [
            str(bin_dir / "etcd"),
            "--data-dir",
            str(work / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-cluster",
            f"default=http://127.0.0.1:{peer_port}",
            "--listen-metrics-urls",
            f"http://127.0.0.1:{metrics_port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = subprocess.Popen(
        [
            str(bin_dir / "apiextensions-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--cert-dir={certs}",
            f"--client-ca-file={certs}/ca.crt",
            "--authentication-skip-lookup",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--kubeconfig={kubeconfig}",
            "--disable-admission-plugins=NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
            "ValidatingAdmissionPolicy,MutatingAdmissionPolicy",
            "--enable-priority-and-fairness=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )
    srv = CRDServer(work, url, kubeconfig, [etcd, server])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None or etcd.poll() is not None:
            srv.stop()
            raise RuntimeError("CRD API server exited:\n" + (work / "server.log").read_text()[-3000:])
        try:
            with socket.create_connection(("127.0.0.1", api_port), timeout=1):
                pass
            if _answers(srv):
                return srv
        except OSError:
            pass
        time.sleep(0.5)
    text = (work / "server.log").read_text()[-3000:]
    srv.stop()
    raise RuntimeError("CRD API server did not answer in time:\n" + text)


def _answers(srv: CRDServer) -> bool:
    from kubernetes import client, config

    api = client.ApiextensionsV1Api(config.new_client_from_config(str(srv.kubeconfig)))
    try:
        api.list_custom_resource_definition(_request_timeout=2)
        return True
    except Exception:  # noqa: BLE001 - not up yet, whatever the reason
        return False


def install_crd(srv: CRDServer, timeout: float = 30) -> Any:
    """Create (or keep) the VLLMService CRD and wait until it is served; returns an ApiClient."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    from vllm_autoheal.crd import crd

    apic = config.new_client_from_config(str(srv.kubeconfig))
    ext = client.ApiextensionsV1Api(apic)
    body = crd()
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = ext.read_custom_resource_definition(body["metadata"]["name"])
        if any(c.type == "Established" and c.status == "True" for c in (got.status.conditions or [])):
            time.sleep(1)  # the CRD handler picks the new schema up asynchronously
            return apic
        time.sleep(0.2)
    raise RuntimeError("the VLLMService CRD was not established")
