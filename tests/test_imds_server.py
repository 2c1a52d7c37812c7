"""launcher/local/imds: the IMDS stand-in as a process on loopback, asked by real curl (as a node's boot asks) and by
botocore's own IMDS fetcher and credential chain (as the AWS CLI on a node asks)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.plans import imds

ROOT = Path(__file__).resolve().parent.parent
PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
ENV = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}


def node(addr: str, instance_id: str) -> imds.Instance:
    return imds.Instance(
        instance_id=instance_id,
        instance_type="p4d.24xlarge",
        local_ipv4=addr,
        hostname=f"ip-{addr.replace('.', '-')}.ec2.internal",
        region="us-east-1",
        availability_zone="us-east-1a",
        role="scaletrain-node",
        credentials=imds.Credentials(f"ASIA{instance_id[-4:].upper()}KEY", "s3cr3t/+key", "IQoJb3JpZ2luX2Vj//tok==",
                                     int(time.time()) + 21600, int(time.time()) - 5),
        public_keys=["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample scaletrain"],
        ami_id="ami-0123456789abcdef0",
        mac="0a:00:00:00:00:01",
    )


def write_map(path: Path, instances: list[imds.Instance] | str) -> None:
    """As the cluster writes it: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(instances if isinstance(instances, str) else imds.instances_json(instances))
    os.replace(tmp, path)


class Imds:
    def __init__(self, tmp_path: Path, instances: list[imds.Instance]) -> None:
        self.map = tmp_path / "instances.json"
        self.err = tmp_path / "imds.err"
        write_map(self.map, instances)
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "launcher.local.imds", "--instances", str(self.map), "--bind", "127.0.0.1",
                 "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=err, env=ENV)
        ready, _, _ = select.select([self.proc.stdout], [], [], 10)
        line = self.proc.stdout.readline().decode() if ready else ""
        assert line.startswith("imds listening on 127.0.0.1:"), (line, self.log())
        self.url = f"http://127.0.0.1:{int(line.rsplit(':', 1)[1])}"

    def log(self) -> str:
        return self.err.read_text()

    def stop(self) -> int:
        """SIGTERM by its pid; SIGKILL if it has not ended in 5 s (the test then fails on its exit status)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc.stdout.close()
        return self.proc.returncode


@pytest.fixture
def server(tmp_path):
    started: list[Imds] = []

    def start(instances: list[imds.Instance]) -> Imds:
        started.append(Imds(tmp_path, instances))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def curl(*args: str, source: str = "127.0.0.1") -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "--interface", source, *args], capture_output=True, text=True, env=ENV,
                          timeout=10)


def token(url: str, source: str = "127.0.0.1") -> str:
    # exactly as a node's boot asks for its token
    r = curl("-sSf", "-X", "PUT", "-H", "X-aws-ec2-metadata-token-ttl-seconds: 300", f"{url}/latest/api/token",
             source=source)
    assert r.returncode == 0, r.stderr
    return r.stdout


def status(url: str, path: str, *headers: str, source: str = "127.0.0.1", method: str = "GET") -> str:
    hs = [a for h in headers for a in ("-H", h)]
    return curl("-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", method, *hs, f"{url}{path}",
                source=source).stdout


def test_curl_as_a_node_boots(server):
    s = server([node("127.0.0.1", "i-0000000000000aaaa"), node("127.0.0.2", "i-0000000000000bbbb")])
    t = token(s.url)
    r = curl("-sSf", "-H", f"X-aws-ec2-metadata-token: {t}", f"{s.url}/latest/meta-data/instance-id")
    assert (r.returncode, r.stdout) == (0, "i-0000000000000aaaa")
    r = curl("-sSf", "-H", f"X-aws-ec2-metadata-token: {t}", f"{s.url}/latest/dynamic/instance-identity/document")
    assert json.loads(r.stdout)["privateIp"] == "127.0.0.1"
    assert status(s.url, "/latest/meta-data/instance-id") == "401"  # no token
    assert status(s.url, "/latest/meta-data/instance-id", f"X-aws-ec2-metadata-token: {t}", source="127.0.0.2") == "401"
    assert status(s.url, "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 0", method="PUT") == "400"
    assert status(s.url, "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 5", "X-Forwarded-For: 1.2.3.4",
                  method="PUT") == "403"
    assert status(s.url, "/latest/meta-data/", method="POST") == "405"
    assert status(s.url, "/latest/meta-data/nope", f"X-aws-ec2-metadata-token: {t}") == "404"
    assert status(s.url, "/latest/meta-data/", source="127.0.0.3") == "404"  # no instance there
    head = curl("-sSi", "-H", f"X-aws-ec2-metadata-token: {t}", f"{s.url}/latest/meta-data/local-ipv4").stdout
    assert "Server: EC2ws" in head and head.endswith("\n\n127.0.0.1")
    assert "127.0.0.1 GET /latest/meta-data/instance-id 200" in s.log()


def test_botocore_fetches_the_role_credentials(server, monkeypatch):
    from botocore.session import Session
    from botocore.utils import InstanceMetadataFetcher

    inst = node("127.0.0.1", "i-0000000000000aaaa")
    s = server([inst])
    fetcher = InstanceMetadataFetcher(timeout=2, num_attempts=1, base_url=f"{s.url}/",
                                      config={"ec2_metadata_v1_disabled": True}, env=ENV)
    creds = fetcher.retrieve_iam_role_credentials()
    assert creds == {
        "role_name": "scaletrain-node",
        "access_key": inst.credentials.access_key_id,
        "secret_key": "s3cr3t/+key",
        "token": "IQoJb3JpZ2luX2Vj//tok==",
        "expiry_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(inst.credentials.expiration)),
    }

    # the whole chain the AWS CLI runs, with IMDS the only source it can find
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_ROLE_ARN",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_EC2_METADATA_DISABLED", *PROXY_VARS):
        monkeypatch.delenv(var, raising=False)
    for var in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "BOTO_CONFIG"):
        monkeypatch.setenv(var, str(s.map.parent / "absent"))
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"{s.url}/")
    monkeypatch.setenv("AWS_EC2_METADATA_V1_DISABLED", "true")
    chain = Session().get_credentials()
    assert chain is not None and chain.method == "iam-role"
    frozen = chain.get_frozen_credentials()
    assert (frozen.access_key, frozen.secret_key, frozen.token) == (
        inst.credentials.access_key_id, "s3cr3t/+key", "IQoJb3JpZ2luX2Vj//tok==")


def test_a_replaced_node_is_answered_at_once(server):
    s = server([node("127.0.0.2", "i-0000000000000bbbb")])
    assert status(s.url, "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 300", method="PUT") == "404"
    old = token(s.url, source="127.0.0.2")
    write_map(s.map, [node("127.0.0.1", "i-0000000000000cccc")])  # .2 is gone, its replacement is .1
    t = token(s.url)
    r = curl("-sSf", "-H", f"X-aws-ec2-metadata-token: {t}", f"{s.url}/latest/meta-data/instance-id")
    assert r.stdout == "i-0000000000000cccc"
    assert status(s.url, "/latest/meta-data/instance-id", f"X-aws-ec2-metadata-token: {old}", source="127.0.0.2") \
        == "404"

    write_map(s.map, '{"format": 1, "instances": [')  # a bad map: the last good one stays, one line logged
    for _ in range(2):
        r = curl("-sSf", "-H", f"X-aws-ec2-metadata-token: {t}", f"{s.url}/latest/meta-data/instance-id")
        assert r.stdout == "i-0000000000000cccc"
    bad = [line for line in s.log().splitlines() if "last good map" in line]
    assert len(bad) == 1 and "not JSON" in bad[0], s.log()
    write_map(s.map, [node("127.0.0.1", "i-0000000000000dddd")])
    t = token(s.url)
    assert curl("-sSf", "-H", f"X-aws-ec2-metadata-token: {t}",
                f"{s.url}/latest/meta-data/instance-id").stdout == "i-0000000000000dddd"


def test_sigterm_ends_it_cleanly(server):
    s = server([node("127.0.0.1", "i-0000000000000aaaa")])
    token(s.url)
    assert s.stop() == 0
    assert "imds stopped" in s.log() and "Traceback" not in s.log()
    assert curl("-sS", f"{s.url}/latest/meta-data/").returncode != 0  # nothing listens any more


def test_bad_command_lines_say_so(tmp_path):
    busy = Imds(tmp_path, [])
    try:
        port = busy.url.rsplit(":", 1)[1]
        r = subprocess.run([sys.executable, "-m", "launcher.local.imds", "--instances", str(busy.map), "--bind",
                            "127.0.0.1", "--port", port], cwd=ROOT, capture_output=True, text=True, timeout=10)
        assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        assert busy.stop() == 0
