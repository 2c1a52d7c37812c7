"""What EC2's Instance Metadata Service (IMDSv2, HttpTokens=required) answers a request: pure, no I/O.

The local backend's rehearsal nodes will reach a stand-in for IMDS at 169.254.169.254, so that a node's boot
(`curl` for its token, then its address and identity) and the AWS SDKs' credential chain (botocore's instance
metadata provider, hence the AWS CLI) run there as they run on EC2. This module is that stand-in's whole behaviour:
`answer` turns one HTTP request (method, path, headers), the instance the request came from and a token store into
a `Reply`; `launcher/local/imds.py` is the thin server around it, which maps a client's source address to its
`Instance` through the JSON that `instances_json` writes and `load_instances` reads.

The AWS pages behind the rules (cited again beside each):
- [retrieval] https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html
  (IMDSv2 session tokens, their TTL of 1..21600 seconds, the error codes 400/401/403/404);
- [categories] https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html
  (the metadata items and the dynamic instance identity document);
- [iam] https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/iam-roles-for-amazon-ec2.html#instance-metadata-security-credentials
  (the iam/security-credentials/<role> JSON);
- [versions] https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html
  (its example "Get the available versions of the instance metadata": GET / lists the dated versions and latest).

Choices where AWS has no counterpart (a request from an address that is no instance cannot happen on EC2): the
request is first checked as EC2 checks any request (405 for a method other than GET/PUT, 403 for a token PUT that
came through a proxy, 400 for a token PUT without a valid TTL), and then answered 404, with no token issued. Not
served (404): the identity document's signatures (pkcs7, signature, rsa2048: nothing here can sign as AWS),
network/interfaces/, and every other item the nodes do not read.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

__all__ = [
    "MAX_TTL_S",
    "MIN_TTL_S",
    "TOKEN_HEADER",
    "TTL_HEADER",
    "Credentials",
    "Instance",
    "Reply",
    "TokenStore",
    "Tokens",
    "answer",
    "instances_json",
    "load_instances",
]

# [retrieval] "X-aws-ec2-metadata-token-ttl-seconds" on the PUT that creates a session token, whose duration is "a
# minimum of one second and a maximum of six hours" (21,600 s); "X-aws-ec2-metadata-token" on every later request.
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MIN_TTL_S = 1
MAX_TTL_S = 21600
TOKEN_PATH = "/latest/api/token"
# [versions] "Get the available versions of the instance metadata": GET / lists these, then latest.
VERSIONS = ("1.0", "2007-01-19", "2007-03-01", "2007-08-29", "2007-10-10", "2007-12-15", "2008-02-01", "2008-09-01",
            "2009-04-04", "2011-01-01", "2011-05-01", "2012-01-12", "2014-02-25", "2014-11-05", "2015-10-20",
            "2016-04-19", "2016-06-30", "2016-09-02", "2018-03-28", "2018-08-17", "2018-09-24", "2019-10-01",
            "2020-10-27", "2021-01-03", "2021-03-23")
_ISO = "%Y-%m-%dT%H:%M:%SZ"
MAX_TOKENS = 4096  # live tokens kept; the oldest go first past it (a node asks a few per boot, not thousands)


@dataclass(frozen=True)
class Credentials:
    """The role's temporary credentials, as iam/security-credentials/<role> gives them. `expiration` and
    `last_updated` are seconds since the epoch (UTC); `last_updated` None reports the time of the request."""

    access_key_id: str
    secret_access_key: str
    token: str
    expiration: float
    last_updated: float | None = None


@dataclass(frozen=True)
class Instance:
    """One node as IMDS describes it. `hostname` is the local hostname (ip-10-213-0-2.ec2.internal style, or the
    node's name); `public_keys` are OpenSSH public key lines (a list is kept as a tuple); `role` None is an instance
    without an instance profile (no iam/ items); `user_data` None is an instance launched without user data."""

    instance_id: str
    instance_type: str
    local_ipv4: str
    hostname: str
    region: str
    availability_zone: str
    role: str | None
    credentials: Credentials | None
    public_keys: tuple[str, ...]
    ami_id: str
    mac: str
    account_id: str = "123456789012"
    launch_time: float = 0.0
    user_data: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "public_keys", tuple(self.public_keys))


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


class Tokens(Protocol):
    """What `answer` needs of a token store."""

    def issue(self, instance_id: str, ttl: int, now: float, rng_bytes: bytes) -> str: ...

    def valid(self, token: str, instance_id: str, now: float) -> bool: ...


@dataclass
class TokenStore:
    """The session tokens issued, each bound to the instance that asked for it and expiring `ttl` seconds after it
    was issued ([retrieval]: "After the specified duration expires, you must create a new session token"). Pure: the
    time and the randomness come in as arguments; a caller that shares one store between threads locks around it."""

    _tokens: dict[str, tuple[str, float]] = field(default_factory=dict)

    def issue(self, instance_id: str, ttl: int, now: float, rng_bytes: bytes) -> str:
        if len(rng_bytes) < 16:
            raise ValueError("a token needs at least 16 random bytes")
        for token in [t for t, (_, expires) in self._tokens.items() if expires <= now]:
            del self._tokens[token]
        while len(self._tokens) >= MAX_TOKENS:
            del self._tokens[next(iter(self._tokens))]
        token = base64.urlsafe_b64encode(rng_bytes).decode("ascii")
        self._tokens[token] = (instance_id, now + ttl)
        return token

    def valid(self, token: str, instance_id: str, now: float) -> bool:
        bound = self._tokens.get(token)
        return bound is not None and bound[0] == instance_id and now < bound[1]


# --- answering ---------------------------------------------------------------------------------------------------

_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
}


def _error(status: int) -> Reply:
    # EC2's IMDS answers errors with a small HTML page titled "<code> - <reason>".
    title = f"{status} - {_REASONS[status]}"
    body = (
        '<?xml version="1.0" encoding="iso-8859-1"?>\n'
        '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"\n'
        '\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
        '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n'
        f" <head>\n  <title>{title}</title>\n </head>\n <body>\n  <h1>{title}</h1>\n </body>\n</html>\n"
    )
    return Reply(status, {"Content-Type": "text/html"}, body.encode())


def _text(body: str, extra: Mapping[str, str] | None = None) -> Reply:
    # IMDS serves every item, the JSON ones included, as text/plain.
    return Reply(200, {"Content-Type": "text/plain", **(extra or {})}, body.encode())


def _iso(t: float) -> str:
    # [iam]: "LastUpdated" : "2012-04-26T16:39:16Z", "Expiration" : "2017-05-17T15:09:54Z" (UTC, seconds, Z).
    return datetime.fromtimestamp(int(t), timezone.utc).strftime(_ISO)


def _aws_json(obj: Mapping[str, Any]) -> str:
    # EC2 writes its JSON items with two-space indents and " : " between key and value.
    return json.dumps(obj, indent=2, separators=(",", " : "))


def _profile_id(inst: Instance) -> str:
    digest = base64.b32encode(hashlib.sha256(f"{inst.account_id}/{inst.role}".encode()).digest()).decode()
    return "AIPA" + digest[:17]


def _meta_data(inst: Instance, now: float) -> dict[str, Any]:
    """The items under /latest/meta-data/ ([categories]), as a tree: a dict is a category, a str an item."""
    tree: dict[str, Any] = {
        "ami-id": inst.ami_id,
        "hostname": inst.hostname,
        "instance-id": inst.instance_id,
        "instance-type": inst.instance_type,
        "local-hostname": inst.hostname,
        "local-ipv4": inst.local_ipv4,
        "mac": inst.mac,
        "placement": {"availability-zone": inst.availability_zone, "region": inst.region},
    }
    if inst.role is not None and inst.credentials is not None:
        # [categories] iam/ exists only for an instance with an IAM role; iam/security-credentials/ lists the role's
        # name, and iam/security-credentials/<role> holds its credentials in the [iam] format.
        c = inst.credentials
        updated = _iso(now if c.last_updated is None else c.last_updated)
        tree["iam"] = {
            "info": _aws_json({
                "Code": "Success",
                "LastUpdated": updated,
                "InstanceProfileArn": f"arn:aws:iam::{inst.account_id}:instance-profile/{inst.role}",
                "InstanceProfileId": _profile_id(inst),
            }),
            "security-credentials": {
                inst.role: _aws_json({
                    "Code": "Success",
                    "LastUpdated": updated,
                    "Type": "AWS-HMAC",
                    "AccessKeyId": c.access_key_id,
                    "SecretAccessKey": c.secret_access_key,
                    "Token": c.token,
                    "Expiration": _iso(c.expiration),
                }),
            },
        }
    if inst.public_keys:
        # [categories] public-keys/ lists "0=<key pair name>"; public-keys/0/openssh-key is the key itself.
        tree["public-keys"] = {
            f"{i}={'scaletrain' if i == 0 else f'scaletrain-{i}'}": {"openssh-key": key}
            for i, key in enumerate(inst.public_keys)
        }
    return tree


def _identity_document(inst: Instance) -> str:
    # [categories] dynamic/instance-identity/document: JSON with the instance's identity, as EC2 writes it.
    return _aws_json({
        "accountId": inst.account_id,
        "architecture": "x86_64",
        "availabilityZone": inst.availability_zone,
        "billingProducts": None,
        "devpayProductCodes": None,
        "marketplaceProductCodes": None,
        "imageId": inst.ami_id,
        "instanceId": inst.instance_id,
        "instanceType": inst.instance_type,
        "kernelId": None,
        "pendingTime": _iso(inst.launch_time),
        "privateIp": inst.local_ipv4,
        "ramdiskId": None,
        "region": inst.region,
        "version": "2017-09-30",
    })


def _tree(inst: Instance, now: float) -> dict[str, Any]:
    latest: dict[str, Any] = {
        "dynamic": {"instance-identity": {"document": _identity_document(inst)}},
        "meta-data": _meta_data(inst, now),
    }
    if inst.user_data is not None:
        latest["user-data"] = inst.user_data  # [categories] user-data: 404 when the instance has none
    # [versions]: each dated version is served beside latest, and cloud-init's Ec2 datasource reads a dated one (the
    # newest of 2021-03-23, 2018-09-24, 2016-09-02 that answers /VERSION/meta-data/instance-id, else 2009-04-04:
    # DataSourceEc2.get_metadata_api_version, cloud-init 22.4). Every version here serves latest's items: EC2's
    # older versions lack the categories added after them, which no reader of a dated version here asks for.
    return {version: latest for version in (*VERSIONS, "latest")}


def _lookup(tree: dict[str, Any], path: str) -> Reply:
    node: Any = tree
    parts = [p for p in path.split("/") if p]
    for part in parts:
        if not isinstance(node, dict):
            return _error(404)
        # public-keys/0/ is reached by the index alone, though the listing shows "0=name"
        key = next((k for k in node if k == part or k.split("=", 1)[0] == part and "=" in k), None)
        if key is None:
            return _error(404)
        node = node[key]
    if isinstance(node, str):
        return _text(node)
    # A category lists its entries one a line in name order, a sub-category with a trailing slash (public-keys/
    # shows 0=name, without one; / and /latest/ list theirs bare: "dynamic", "meta-data", "user-data").
    bare = len(parts) <= 1
    return _text("\n".join(k if bare or isinstance(v, str) or "=" in k else f"{k}/" for k, v in sorted(node.items())))


def _ttl(value: str | None) -> int | None:
    if value is None or not re.fullmatch(r"\s*[0-9]{1,6}\s*", value):
        return None
    ttl = int(value)
    return ttl if MIN_TTL_S <= ttl <= MAX_TTL_S else None


def answer(
    method: str,
    path: str,
    headers: Mapping[str, str],
    instance: Instance | None,
    tokens: Tokens,
    now: float,
    entropy: bytes | None = None,
) -> Reply:
    """EC2's answer to one IMDS request with HttpTokens=required. `headers` are looked up case-insensitively;
    `instance` is the instance whose address sent it (None: no instance has that address); `now` is seconds since
    the epoch. `entropy` (32 random bytes or more) makes a new token's value; None draws them from `secrets`."""
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    path = path.split("?", 1)[0].split("#", 1)[0] or "/"
    if method not in ("GET", "PUT"):
        # [retrieval]: items are read with GET and tokens made with PUT; any other method is refused with HTTP's
        # 405 Method Not Allowed (the page's list of error codes names none for it).
        return _error(405)
    if method == "PUT":
        if path.rstrip("/") != TOKEN_PATH:
            return _error(405)  # only the token resource takes a PUT
        if "x-forwarded-for" in lower:
            # [retrieval] (how IMDSv2 works): a token request carrying X-Forwarded-For went through a proxy, and
            # IMDSv2 refuses it ("403 - Forbidden: the request is not allowed"), so no proxy can obtain a token.
            return _error(403)
        ttl = _ttl(lower.get(TTL_HEADER.lower()))
        if ttl is None:
            # [retrieval] "400 - Missing or Invalid Parameters: The PUT request is not valid": the TTL header is
            # required, an integer from 1 to 21600 seconds.
            return _error(400)
        if instance is None:
            return _error(404)  # no instance has this address (module docstring): nothing to bind a token to
        rng = entropy if entropy is not None else secrets.token_bytes(40)
        token = tokens.issue(instance.instance_id, ttl, now, rng)
        # [retrieval] the PUT's answer is the token itself, with its TTL echoed in the same header.
        return _text(token, {TTL_HEADER: str(ttl)})
    if instance is None:
        return _error(404)
    if path.rstrip("/") == TOKEN_PATH:
        return _error(405)  # the token resource takes only a PUT
    token = lower.get(TOKEN_HEADER.lower())
    if token is None or not tokens.valid(token.strip(), instance.instance_id, now):
        # [retrieval] HttpTokens=required: a GET without a token, or with one that is invalid or expired, gets
        # "401 - Unauthorized: The GET request uses an invalid token". A token is valid only on the instance
        # (here: the address) it was issued to, as a token cannot leave the instance it was made on.
        return _error(401)
    return _lookup(_tree(instance, now), path)


# --- the instance map (the server's input file) -------------------------------------------------------------------

_FORMAT = 1


def _credentials_dict(c: Credentials) -> dict[str, Any]:
    return {
        "access_key_id": c.access_key_id,
        "secret_access_key": c.secret_access_key,
        "token": c.token,
        "expiration": _iso(c.expiration),
        "last_updated": None if c.last_updated is None else _iso(c.last_updated),
    }


def instances_json(instances: list[Instance]) -> str:
    """The instance map the server reads: every instance, keyed in `load_instances` by its local_ipv4. Times are
    written ISO 8601 UTC (2026-01-02T03:04:05Z), whole seconds; account_id, launch_time and user_data may be left
    out of a map written by other means (their defaults)."""
    rows = []
    for inst in instances:
        rows.append({
            "instance_id": inst.instance_id,
            "instance_type": inst.instance_type,
            "local_ipv4": inst.local_ipv4,
            "hostname": inst.hostname,
            "region": inst.region,
            "availability_zone": inst.availability_zone,
            "role": inst.role,
            "credentials": None if inst.credentials is None else _credentials_dict(inst.credentials),
            "public_keys": list(inst.public_keys),
            "ami_id": inst.ami_id,
            "mac": inst.mac,
            "account_id": inst.account_id,
            "launch_time": _iso(inst.launch_time),
            "user_data": inst.user_data,
        })
    return json.dumps({"format": _FORMAT, "instances": rows}, indent=1) + "\n"


def _field(row: Mapping[str, Any], name: str, kinds: tuple[type, ...], where: str) -> Any:
    if name not in row:
        raise ValueError(f"{where}: no {name!r}")
    value = row[name]
    if not isinstance(value, kinds):
        raise ValueError(f"{where}: {name!r} is {type(value).__name__}, not {' or '.join(k.__name__ for k in kinds)}")
    return value


def _time(text: str, where: str) -> float:
    try:
        return datetime.strptime(text, _ISO).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not an ISO 8601 UTC time like 2026-01-02T03:04:05Z") from None


def _instance(row: Any, where: str) -> Instance:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: not an object")
    s = (str,)
    opt = (str, type(None))
    creds = _field(row, "credentials", (dict, type(None)), where)
    credentials = None
    if creds is not None:
        cw = f"{where} credentials"
        updated = _field(creds, "last_updated", opt, cw)
        credentials = Credentials(
            access_key_id=_field(creds, "access_key_id", s, cw),
            secret_access_key=_field(creds, "secret_access_key", s, cw),
            token=_field(creds, "token", s, cw),
            expiration=_time(_field(creds, "expiration", s, cw), cw),
            last_updated=None if updated is None else _time(updated, cw),
        )
    keys = _field(row, "public_keys", (list,), where)
    if not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{where}: 'public_keys' must be strings")
    role = _field(row, "role", opt, where)
    if role is not None and (credentials is None or not role or "/" in role):
        raise ValueError(f"{where}: role {role!r} needs credentials and a name without '/'")
    return Instance(
        instance_id=_field(row, "instance_id", s, where),
        instance_type=_field(row, "instance_type", s, where),
        local_ipv4=_field(row, "local_ipv4", s, where),
        hostname=_field(row, "hostname", s, where),
        region=_field(row, "region", s, where),
        availability_zone=_field(row, "availability_zone", s, where),
        role=role,
        credentials=credentials,
        public_keys=tuple(keys),
        ami_id=_field(row, "ami_id", s, where),
        mac=_field(row, "mac", s, where),
        account_id=_field({"account_id": "123456789012", **row}, "account_id", s, where),
        launch_time=_time(_field({"launch_time": _iso(0), **row}, "launch_time", s, where), where),
        user_data=_field({"user_data": None, **row}, "user_data", opt, where),
    )


def load_instances(text: str) -> dict[str, Instance]:
    """The instance map `instances_json` wrote, keyed by each instance's local_ipv4. Raises ValueError, with one
    line saying what is wrong, for text that is not such a map (bad JSON, a missing or mistyped field, an address
    given twice)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or not isinstance(doc.get("instances"), list):
        raise ValueError(f'not an instance map: expected {{"format": {_FORMAT}, "instances": [...]}}')
    out: dict[str, Instance] = {}
    for i, row in enumerate(doc["instances"]):
        inst = _instance(row, f"instance {i}")
        if inst.local_ipv4 in out:
            raise ValueError(f"instance {i}: address {inst.local_ipv4} is also {out[inst.local_ipv4].instance_id}'s")
        out[inst.local_ipv4] = inst
    return out
