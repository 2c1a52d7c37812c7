"""CDK entry point: context -> one ClusterSpec -> one ClusterStack, with cdk-nag's AwsSolutions checks.

The CLI runs ``.venv/bin/python infra/app.py`` from the repository root (cdk.json). Bad context ends with
one ``error: ...`` line on stderr and exit status 1, never a traceback; so does a context key the app does not read
(a misspelt ``instance_typ`` would otherwise deploy the default instance type).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
# Run as a script, sys.path[0] is infra/ itself; make it the repository root so `infra.*` imports work
# and nothing in infra/ shadows a top-level package.
if sys.path and Path(sys.path[0]).resolve() == _ROOT / "infra":
    sys.path[0] = str(_ROOT)
elif str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from aws_cdk import App, Aspects, Environment  # noqa: E402
from cdk_nag import AwsSolutionsChecks  # noqa: E402

from infra.spec import CONTEXT_KEYS, READ_KEYS, ClusterSpec, SpecError, unknown_context_keys, unknown_key_line  # noqa: E402
from infra.stack import ClusterStack  # noqa: E402


def build(context: dict[str, Any] | None = None, *, outdir: str | None = None) -> tuple[App, ClusterStack]:
    """The app and its one stack. ``context`` overrides what the CLI passes (tests use it)."""
    app = App(context=context, outdir=outdir)
    given = app.node.get_all_context()  # cdk.json's, the CLI's own and every -c key=value, merged
    for key in unknown_context_keys(given, READ_KEYS):
        raise SpecError(unknown_key_line(key, given[key], CONTEXT_KEYS))
    spec = ClusterSpec.from_context({key: app.node.try_get_context(key) for key in READ_KEYS})
    # Region only: the account stays agnostic, so synth needs no credentials and makes no AWS calls.
    stack = ClusterStack(app, spec.cluster_name, spec=spec, env=Environment(region=spec.region))
    Aspects.of(app).add(AwsSolutionsChecks())
    return app, stack


def main(context: dict[str, Any] | None = None) -> int:
    try:
        app, _ = build(context)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
