"""The cost guard's function, run against moto's CloudFormation and a real HTTP endpoint for its responses.

CloudFormation hands a custom resource a pre-signed S3 URL to PUT its answer to; here a server on loopback
stands in for S3 and records what the function sent.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

moto = pytest.importorskip("moto")
boto3 = pytest.importorskip("boto3")

from infra import guard_function  # noqa: E402
from infra.guard import INLINE_CODE_LIMIT, guard_source  # noqa: E402

TEMPLATE = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}})
SERVICE_ROLE = "arn:aws:iam::123456789012:role/cdk-hnb659fds-cfn-exec-role-123456789012-us-east-1"


class _Context:
    log_stream_name = "2026/11/21/[$LATEST]abc"


class _Recorder(http.server.BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []

    def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def response_url() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    bodies: list[dict[str, Any]] = []
    handler = type("Recorder", (_Recorder,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/presigned", bodies
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def cloudformation(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with moto.mock_aws():
        yield boto3.client("cloudformation")


def _stack(client: Any, monkeypatch: pytest.MonkeyPatch, *, role: str | None) -> str:
    extra = {"RoleARN": role} if role else {}
    stack_id = client.create_stack(StackName="scaletrain", TemplateBody=TEMPLATE, **extra)["StackId"]
    monkeypatch.setattr(guard_function, "STACK_ID", stack_id)
    return stack_id


def _event(request_type: str, url: str, stack_id: str, ttl_hours: str = "24") -> dict[str, Any]:
    event = {
        "RequestType": request_type,
        "ResponseURL": url,
        "StackId": stack_id,
        "RequestId": "req-1",
        "LogicalResourceId": "TtlClock",
        "ResourceType": "Custom::TtlClock",
        "ResourceProperties": {"ServiceToken": "arn:aws:lambda:...", "TtlHours": ttl_hours},
    }
    if request_type != "Create":
        event["PhysicalResourceId"] = "ttl-clock"
    return event


def test_clock_answers_the_expiry_computed_at_deploy_time(cloudformation: Any, monkeypatch, response_url) -> None:
    url, bodies = response_url
    stack_id = _stack(cloudformation, monkeypatch, role=SERVICE_ROLE)
    before = dt.datetime.now(dt.timezone.utc)
    guard_function.handler(_event("Create", url, stack_id, ttl_hours="1.5"), _Context())
    after = dt.datetime.now(dt.timezone.utc)

    (body,) = bodies
    assert (body["Status"], body["PhysicalResourceId"], body["RequestId"]) == ("SUCCESS", "ttl-clock", "req-1")
    expires = dt.datetime.strptime(body["Data"]["ExpiresAt"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    assert before + dt.timedelta(hours=1.5) <= expires <= after + dt.timedelta(hours=1.5, minutes=1)
    assert expires.second == 0
    assert set(body["Data"]) == {"ExpiresAt"}


def test_clock_refuses_a_stack_the_guard_could_not_delete(cloudformation: Any, monkeypatch, response_url) -> None:
    url, bodies = response_url
    stack_id = _stack(cloudformation, monkeypatch, role=None)
    guard_function.handler(_event("Create", url, stack_id), _Context())
    (body,) = bodies
    assert body["Status"] == "FAILED"
    assert "no CloudFormation service role" in body["Reason"] and body["Data"] == {}


def test_clock_update_recomputes_and_delete_just_answers(cloudformation: Any, monkeypatch, response_url) -> None:
    url, bodies = response_url
    stack_id = _stack(cloudformation, monkeypatch, role=SERVICE_ROLE)
    guard_function.handler(_event("Update", url, stack_id, ttl_hours="48"), _Context())
    guard_function.handler(_event("Delete", url, stack_id), _Context())
    update, delete = bodies
    assert update["Status"] == "SUCCESS" and update["PhysicalResourceId"] == "ttl-clock"
    expires = dt.datetime.strptime(update["Data"]["ExpiresAt"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    assert expires - dt.datetime.now(dt.timezone.utc) > dt.timedelta(hours=47)
    assert (delete["Status"], delete["Data"]) == ("SUCCESS", {})


def test_clock_reports_bad_properties_instead_of_hanging(cloudformation: Any, monkeypatch, response_url) -> None:
    url, bodies = response_url
    stack_id = _stack(cloudformation, monkeypatch, role=SERVICE_ROLE)
    guard_function.handler(_event("Create", url, stack_id, ttl_hours="soon"), _Context())
    (body,) = bodies
    assert body["Status"] == "FAILED" and body["Reason"].startswith("ValueError")


def test_expire_deletes_the_stack(cloudformation: Any, monkeypatch) -> None:
    stack_id = _stack(cloudformation, monkeypatch, role=SERVICE_ROLE)
    other = cloudformation.create_stack(StackName="someone-else", TemplateBody=TEMPLATE)["StackId"]
    assert guard_function.handler({"action": "expire"}, _Context()) == {"deleting": stack_id}
    (stack,) = cloudformation.describe_stacks(StackName=stack_id)["Stacks"]
    assert stack["StackStatus"] == "DELETE_COMPLETE"
    (untouched,) = cloudformation.describe_stacks(StackName=other)["Stacks"]
    assert untouched["StackStatus"] == "CREATE_COMPLETE"


def test_unknown_events_fail_loudly() -> None:
    with pytest.raises(ValueError, match="unexpected event"):
        guard_function.handler({"action": "extend"}, _Context())


@pytest.mark.parametrize(
    ("now", "hours", "expected"),
    [
        ("2026-11-21T10:00:00", 24, "2026-11-22T10:00:00"),
        ("2026-11-21T10:00:01", 24, "2026-11-22T10:01:00"),
        ("2026-11-21T23:59:30", 0.25, "2026-11-22T00:15:00"),
        ("2026-12-31T23:00:00", 1.5, "2027-01-01T00:30:00"),
    ],
)
def test_expiry_rounds_up_to_the_minute(now: str, hours: float, expected: str) -> None:
    start = dt.datetime.fromisoformat(now).replace(tzinfo=dt.timezone.utc)
    assert guard_function.expiry(start, hours) == dt.datetime.fromisoformat(expected).replace(tzinfo=dt.timezone.utc)


def test_function_fits_inline() -> None:
    assert len(guard_source().encode()) <= INLINE_CODE_LIMIT
