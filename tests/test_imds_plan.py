"""launcher/plans/imds: EC2's IMDSv2 (HttpTokens=required) answers, each rule on both sides, without a server."""

from __future__ import annotations

import json
import re
import time

import pytest

from launcher.plans import imds

NOW = 1_800_000_000.0
RNG = bytes(range(40))
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def node(n: int = 2, **kw) -> imds.Instance:
    base = dict(
        instance_id=f"i-0000000000000000{n}",
        instance_type="p4d.24xlarge",
        local_ipv4=f"10.213.0.{n}",
        hostname=f"ip-10-213-0-{n}.ec2.internal",
        region="us-east-1",
        availability_zone="us-east-1a",
        role="scaletrain-node",
        credentials=imds.Credentials("ASIAEXAMPLEKEY", "secret/key+x", "FwoGZXIvYXdz//token==", NOW + 21600, NOW - 60),
        public_keys=["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample scaletrain"],
        ami_id="ami-0123456789abcdef0",
        mac=f"0a:00:00:00:00:0{n}",
        launch_time=NOW - 600,
    )
    base.update(kw)
    return imds.Instance(**base)


def put(inst, tokens, ttl="300", now=NOW, extra=None):
    headers = {} if ttl is None else {"X-aws-ec2-metadata-token-ttl-seconds": ttl}
    return imds.answer("PUT", "/latest/api/token", {**headers, **(extra or {})}, inst, tokens, now, entropy=RNG)


def get(path, inst, tokens, token, now=NOW):
    headers = {} if token is None else {"X-aws-ec2-metadata-token": token}
    return imds.answer("GET", path, headers, inst, tokens, now)


@pytest.fixture
def session():
    inst, tokens = node(), imds.TokenStore()
    token = put(inst, tokens).body.decode()
    return inst, tokens, token


# --- the token PUT ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ttl, status", [("0", 400), ("1", 200), ("21600", 200), ("21601", 400), (None, 400),
                                         ("", 400), ("abc", 400), ("-5", 400), ("1.5", 400), ("99999999", 400)])
def test_token_ttl_must_be_1_to_21600(ttl, status):
    r = put(node(), imds.TokenStore(), ttl=ttl)
    assert r.status == status
    if status == 200:
        assert r.headers["X-aws-ec2-metadata-token-ttl-seconds"] == ttl
        assert r.body and re.fullmatch(rb"[A-Za-z0-9_=-]+", r.body)
    else:
        assert "X-aws-ec2-metadata-token-ttl-seconds" not in r.headers


def test_headers_are_case_insensitive():
    inst, tokens = node(), imds.TokenStore()
    token = put(inst, tokens).body.decode()
    r = imds.answer("PUT", "/latest/api/token", {"x-AWS-ec2-METADATA-token-ttl-seconds": "5"}, inst, tokens, NOW,
                    entropy=bytes(40))
    assert r.status == 200
    assert imds.answer("GET", "/latest/meta-data/instance-id", {"X-AWS-EC2-METADATA-TOKEN": token}, inst, tokens,
                       NOW).status == 200


def test_token_put_through_a_proxy_is_refused():
    inst, tokens = node(), imds.TokenStore()
    assert put(inst, tokens, extra={"X-Forwarded-For": "203.0.113.7"}).status == 403
    assert put(inst, tokens, extra={"x-forwarded-for": "203.0.113.7"}).status == 403
    assert put(inst, tokens).status == 200
    # no token was issued by the refused requests
    assert len(tokens._tokens) == 1


def test_a_fresh_token_per_put():
    inst, tokens = node(), imds.TokenStore()
    a = imds.answer("PUT", "/latest/api/token", {imds.TTL_HEADER: "60"}, inst, tokens, NOW).body
    b = imds.answer("PUT", "/latest/api/token", {imds.TTL_HEADER: "60"}, inst, tokens, NOW).body
    assert a != b and len(a) >= 40


# --- tokens on GET ------------------------------------------------------------------------------------------------


def test_get_without_token_is_401(session):
    inst, tokens, token = session
    assert get("/latest/meta-data/instance-id", inst, tokens, None).status == 401
    assert get("/latest/meta-data/instance-id", inst, tokens, "not-a-token").status == 401
    r = get("/latest/meta-data/instance-id", inst, tokens, token)
    assert (r.status, r.body) == (200, b"i-00000000000000002")


def test_token_is_bound_to_its_instance(session):
    a, tokens, token = session
    b = node(3)
    assert get("/latest/meta-data/instance-id", b, tokens, token).status == 401
    b_token = put(b, tokens).body.decode()
    assert get("/latest/meta-data/instance-id", b, tokens, b_token).body == b"i-00000000000000003"
    assert get("/latest/meta-data/instance-id", a, tokens, b_token).status == 401


def test_token_expires_after_its_ttl():
    inst, tokens = node(), imds.TokenStore()
    token = put(inst, tokens, ttl="300").body.decode()
    assert get("/latest/meta-data/local-ipv4", inst, tokens, token, now=NOW + 299).status == 200
    assert get("/latest/meta-data/local-ipv4", inst, tokens, token, now=NOW + 301).status == 401
    short = put(inst, tokens, ttl="1", now=NOW + 1000).body.decode()
    assert get("/latest/meta-data/local-ipv4", inst, tokens, short, now=NOW + 1000).status == 200
    assert get("/latest/meta-data/local-ipv4", inst, tokens, short, now=NOW + 1002).status == 401


def test_token_store_alone():
    store = imds.TokenStore()
    t = store.issue("i-a", 10, NOW, bytes(32))
    assert store.valid(t, "i-a", NOW + 9.9) and not store.valid(t, "i-a", NOW + 10)
    assert not store.valid(t, "i-b", NOW) and not store.valid("x", "i-a", NOW)
    store.issue("i-a", 10, NOW + 20, bytes([1]) * 32)  # issuing drops the expired ones
    assert t not in store._tokens
    with pytest.raises(ValueError):
        store.issue("i-a", 10, NOW, b"short")


def test_token_store_is_bounded():
    store = imds.TokenStore()
    first = store.issue("i-a", 100, NOW, (0).to_bytes(32, "big"))
    for i in range(1, imds.MAX_TOKENS + 1):
        store.issue("i-a", 100, NOW, i.to_bytes(32, "big"))
    assert len(store._tokens) == imds.MAX_TOKENS and not store.valid(first, "i-a", NOW)


# --- the items ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path, body", [
    ("/latest/meta-data/local-ipv4", "10.213.0.2"),
    ("/latest/meta-data/instance-id", "i-00000000000000002"),
    ("/latest/meta-data/instance-type", "p4d.24xlarge"),
    ("/latest/meta-data/ami-id", "ami-0123456789abcdef0"),
    ("/latest/meta-data/hostname", "ip-10-213-0-2.ec2.internal"),
    ("/latest/meta-data/local-hostname", "ip-10-213-0-2.ec2.internal"),
    ("/latest/meta-data/mac", "0a:00:00:00:00:02"),
    ("/latest/meta-data/placement/region", "us-east-1"),
    ("/latest/meta-data/placement/availability-zone", "us-east-1a"),
    ("/latest/meta-data/iam/security-credentials/", "scaletrain-node"),
    ("/latest/meta-data/public-keys/", "0=scaletrain"),
    ("/latest/meta-data/public-keys/0/", "openssh-key"),
    ("/latest/meta-data/public-keys/0/openssh-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample scaletrain"),
    ("/latest/meta-data/placement", "availability-zone\nregion"),
    ("/latest/meta-data/iam/", "info\nsecurity-credentials/"),
    ("/latest/dynamic/instance-identity/", "document"),
    ("/latest/meta-data/instance-id?x=1", "i-00000000000000002"),
])
def test_items(session, path, body):
    inst, tokens, token = session
    r = get(path, inst, tokens, token)
    assert (r.status, r.body.decode(), r.headers["Content-Type"]) == (200, body, "text/plain")


def test_listing(session):
    inst, tokens, token = session
    listing = get("/latest/meta-data/", inst, tokens, token).body.decode().split("\n")
    assert listing == sorted(listing)
    assert set(listing) == {"ami-id", "hostname", "iam/", "instance-id", "instance-type", "local-hostname",
                            "local-ipv4", "mac", "placement/", "public-keys/"}
    assert get("/latest/meta-data", inst, tokens, token).body.decode().split("\n") == listing
    assert get("/latest/", inst, tokens, token).body == b"dynamic\nmeta-data"


def test_security_credentials_as_ec2_writes_them(session):
    inst, tokens, token = session
    r = get("/latest/meta-data/iam/security-credentials/scaletrain-node", inst, tokens, token)
    assert r.status == 200
    doc = json.loads(r.body)
    assert list(doc) == ["Code", "LastUpdated", "Type", "AccessKeyId", "SecretAccessKey", "Token", "Expiration"]
    assert doc["Code"] == "Success" and doc["Type"] == "AWS-HMAC"
    assert (doc["AccessKeyId"], doc["SecretAccessKey"], doc["Token"]) == (
        "ASIAEXAMPLEKEY", "secret/key+x", "FwoGZXIvYXdz//token==")
    assert ISO.fullmatch(doc["Expiration"]) and ISO.fullmatch(doc["LastUpdated"])
    assert doc["Expiration"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW + 21600))
    assert doc["LastUpdated"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 60))
    assert r.body.startswith(b'{\n  "Code" : "Success",\n')
    assert get("/latest/meta-data/iam/security-credentials/other-role", inst, tokens, token).status == 404


def test_iam_info(session):
    inst, tokens, token = session
    info = json.loads(get("/latest/meta-data/iam/info", inst, tokens, token).body)
    assert info["Code"] == "Success" and ISO.fullmatch(info["LastUpdated"])
    assert info["InstanceProfileArn"] == "arn:aws:iam::123456789012:instance-profile/scaletrain-node"
    assert re.fullmatch(r"AIPA[A-Z2-7]{17}", info["InstanceProfileId"])


def test_identity_document(session):
    inst, tokens, token = session
    doc = json.loads(get("/latest/dynamic/instance-identity/document", inst, tokens, token).body)
    assert doc["accountId"] == "123456789012" and doc["architecture"] == "x86_64"
    assert (doc["availabilityZone"], doc["region"]) == ("us-east-1a", "us-east-1")
    assert (doc["imageId"], doc["instanceId"], doc["instanceType"]) == (
        "ami-0123456789abcdef0", "i-00000000000000002", "p4d.24xlarge")
    assert doc["privateIp"] == "10.213.0.2" and ISO.fullmatch(doc["pendingTime"])


def test_user_data(session):
    inst, tokens, token = session
    assert get("/latest/user-data", inst, tokens, token).status == 404
    with_data = node(user_data="#!/bin/sh\necho hi\n")
    t = put(with_data, tokens).body.decode()
    assert get("/latest/user-data", with_data, tokens, t).body == b"#!/bin/sh\necho hi\n"
    assert "user-data" in get("/latest/", with_data, tokens, t).body.decode().split("\n")


def test_no_role_no_keys():
    inst, tokens = node(role=None, credentials=None, public_keys=[]), imds.TokenStore()
    token = put(inst, tokens).body.decode()
    listing = get("/latest/meta-data/", inst, tokens, token).body.decode().split("\n")
    assert "iam/" not in listing and "public-keys/" not in listing
    for path in ("/latest/meta-data/iam/security-credentials/", "/latest/meta-data/iam/info",
                 "/latest/meta-data/public-keys/"):
        assert get(path, inst, tokens, token).status == 404


def test_dated_versions_serve_what_latest_serves_and_the_root_lists_them(session):
    """What cloud-init's Ec2 datasource reads: /2021-03-23/meta-data/instance-id to pick its version, then that
    version's user-data, meta-data and identity document; the root lists EC2's versions, latest last."""
    inst, tokens, token = session
    root = get("/", inst, tokens, token).body.decode().split("\n")
    assert root[0] == "1.0" and root[-2:] == ["2021-03-23", "latest"] and "2009-04-04" in root and len(root) == 26
    for version in ("2021-03-23", "2016-09-02", "2009-04-04"):
        for item in ("meta-data/instance-id", "meta-data/", "meta-data/public-keys/0/openssh-key",
                     "dynamic/instance-identity/document", ""):
            dated, latest = (get(f"/{v}/{item}", inst, tokens, token) for v in (version, "latest"))
            assert (dated.status, dated.body) == (latest.status, latest.body) and dated.status == 200, (version, item)
        assert get(f"/{version}/meta-data/instance-id", inst, tokens, None).status == 401  # a token all the same


@pytest.mark.parametrize("path", ["/latest/meta-data/nope", "/latest/meta-data/local-ipv4/more", "/2009-04-05/",
                                  "/latest2/",
                                  "/latest/dynamic/instance-identity/pkcs7", "/latest/meta-data/public-keys/1/"])
def test_unknown_paths_are_404(session, path):
    inst, tokens, token = session
    assert get(path, inst, tokens, token).status == 404
    assert get(path, inst, tokens, None).status == 401  # the token comes first


@pytest.mark.parametrize("method", ["POST", "DELETE", "HEAD", "PATCH", "OPTIONS", "FOO"])
def test_other_methods_are_405(session, method):
    inst, tokens, token = session
    for path in ("/latest/meta-data/", "/latest/api/token"):
        r = imds.answer(method, path, {"X-aws-ec2-metadata-token": token, imds.TTL_HEADER: "5"}, inst, tokens, NOW)
        assert r.status == 405 and b"405 - Method Not Allowed" in r.body
    assert imds.answer("PUT", "/latest/meta-data/", {imds.TTL_HEADER: "5"}, inst, tokens, NOW).status == 405
    assert get("/latest/api/token", inst, tokens, token).status == 405


def test_unknown_source_address():
    tokens = imds.TokenStore()
    assert put(None, tokens).status == 404  # a valid PUT, but no instance to bind a token to
    assert put(None, tokens, ttl="0").status == 400
    assert put(None, tokens, extra={"X-Forwarded-For": "1.2.3.4"}).status == 403
    assert not tokens._tokens
    assert get("/latest/meta-data/", None, tokens, "anything").status == 404
    assert get("/latest/meta-data/", None, tokens, None).status == 404
    assert imds.answer("POST", "/latest/meta-data/", {}, None, tokens, NOW).status == 405


def test_errors_are_ec2s_html_pages(session):
    inst, tokens, _ = session
    r = get("/latest/meta-data/", inst, tokens, None)
    assert r.headers["Content-Type"] == "text/html" and b"<title>401 - Unauthorized</title>" in r.body


# --- the instance map -----------------------------------------------------------------------------------------------


def test_instance_map_round_trip():
    a = node(2)
    b = node(3, role=None, credentials=None, public_keys=[], user_data="data")
    c = node(4, credentials=imds.Credentials("K", "S", "T", NOW + 3600))  # last_updated None
    loaded = imds.load_instances(imds.instances_json([a, b, c]))
    assert loaded == {"10.213.0.2": a, "10.213.0.3": b, "10.213.0.4": c}


def test_instance_map_defaults_for_optional_fields():
    row = json.loads(imds.instances_json([node()]))
    for name in ("account_id", "launch_time", "user_data"):
        del row["instances"][0][name]
    inst = imds.load_instances(json.dumps(row))["10.213.0.2"]
    assert (inst.account_id, inst.launch_time, inst.user_data) == ("123456789012", 0.0, None)


@pytest.mark.parametrize("text, says", [
    ("{", "not JSON"),
    ("[]", "not an instance map"),
    ('{"format": 2, "instances": []}', "not an instance map"),
    ('{"format": 1, "instances": [5]}', "instance 0: not an object"),
])
def test_bad_instance_maps(text, says):
    with pytest.raises(ValueError, match=says):
        imds.load_instances(text)


@pytest.mark.parametrize("change, says", [
    (lambda r: r.pop("local_ipv4"), "no 'local_ipv4'"),
    (lambda r: r.update(instance_id=7), "'instance_id' is int"),
    (lambda r: r.update(public_keys=[1]), "public_keys"),
    (lambda r: r.update(credentials=None), "needs credentials"),
    (lambda r: r["credentials"].update(expiration="tomorrow"), "ISO 8601"),
    (lambda r: r["credentials"].pop("token"), "no 'token'"),
])
def test_bad_instance_rows(change, says):
    doc = json.loads(imds.instances_json([node()]))
    change(doc["instances"][0])
    with pytest.raises(ValueError, match=says):
        imds.load_instances(json.dumps(doc))


def test_an_address_given_twice():
    with pytest.raises(ValueError, match="10.213.0.2 is also"):
        imds.load_instances(imds.instances_json([node(2), node(2, instance_id="i-other")]))
