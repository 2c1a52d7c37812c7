"""moto's server standing in for the local cluster's AWS account, with IAM enforced on the calls the nodes make.

Run as ``python -m launcher.local.account_server -H ADDRESS -p PORT`` (launcher/local/rehearsal_services.py), the
arguments moto.server takes. One change to moto: it authorizes Secrets Manager and SSM calls against resource "*"
only (moto 5.2.5, moto/core/responses.py: call_action asks ``_determine_resource``, which only IAM, SQS and STS
define; moto/iam/access_control.py says the Resource element is not yet supported), so no statement naming an ARN
would ever match and every call of the stack's roles would be refused. AWS authorizes GetSecretValue on the secret and
PutParameter on the parameter (Service Authorization Reference: "Actions defined by AWS Secrets Manager",
GetSecretValue, resource type Secret; "Actions defined by AWS Systems Manager", PutParameter, resource type
parameter), so here those calls name their resource the same way, and the roles' statements (infra/policies.py) are
evaluated as IAM evaluates them: the action and the resource.

tests/test_infra_head.py runs the synthesized stack's own statements against the same change, in process.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def determine_secret(self: Any) -> str:
    """The secret a Secrets Manager call names, as its ARN; "*" for calls that name none (CreateSecret, ListSecrets)."""
    secret_id = json.loads(self.body or "{}").get("SecretId")
    if secret_id is None:
        return "*"
    if secret_id.startswith("arn:"):
        return secret_id
    try:
        return self.backend.describe_secret(secret_id).arn
    except Exception:  # no such secret: moto answers the call itself with ResourceNotFoundException
        return "*"


def determine_parameter(self: Any) -> str:
    """The parameter an SSM call names, as its ARN (arn:aws:ssm:REGION:ACCOUNT:parameter/NAME-without-its-slash)."""
    name = json.loads(self.body or "{}").get("Name", "")
    return f"arn:aws:ssm:{self.region}:{self.current_account}:parameter/{name.lstrip('/')}" if name else "*"


def name_resources() -> list[tuple[type, str, Any]]:
    """Give moto's Secrets Manager and SSM responses the resource of each call; returns what was there before
    (class, attribute, value or None), for a test to put back."""
    from moto.secretsmanager.responses import SecretsManagerResponse
    from moto.ssm.responses import SimpleSystemManagerResponse

    before = []
    for cls, fn in ((SecretsManagerResponse, determine_secret), (SimpleSystemManagerResponse, determine_parameter)):
        before.append((cls, "_determine_resource", cls.__dict__.get("_determine_resource")))
        cls._determine_resource = fn
    return before


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main

    name_resources()
    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
