"""CDK entry point of the image stack: ``npx cdk deploy --app ".venv/bin/python ami/app.py"`` builds the image and
publishes its id where cluster stacks find it (ami.paths.image_id_parameter).

Context: ``base`` (ubuntu, dlami, or an AMI id), ``build_instance_types`` (comma-separated, one vCPU quota class;
default g5.xlarge,g6.xlarge,g4dn.xlarge: Image Builder takes one that has capacity),
``nvidia_kernel_modules`` (open, or proprietary for V100: p3, p3dn), ``root_volume_gib`` (default 200; cluster nodes
get the image's size), ``keep_images`` (default 3: the lifecycle policy deletes older images with their AMIs and
snapshots), ``region``, ``stack_name`` (default scaletrain-image, or scaletrain-image-proprietary).
Bad context ends with one ``error: ...`` line and exit status 1; so does a key the app does not read, other than
cdk.json's own entries (the cluster app's defaults, which this app receives too) left as cdk.json has them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == _ROOT / "ami":
    sys.path[0] = str(_ROOT)
elif str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from aws_cdk import App, Aspects, Environment  # noqa: E402
from cdk_nag import AwsSolutionsChecks  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from ami import render  # noqa: E402
from ami.stack import ImageSpec, ImageStack  # noqa: E402
from infra.spec import unknown_context_keys, unknown_key_line  # noqa: E402


class SpecError(ValueError):
    """Bad context; the message is one line."""


def spec_from_context(app: App) -> ImageSpec:
    given = app.node.get_all_context()
    project = json.loads((_ROOT / "cdk.json").read_text()).get("context", {})
    for key in unknown_context_keys(given, ImageSpec.model_fields, project=project):
        raise SpecError(unknown_key_line(key, given[key], ImageSpec.model_fields))
    values = {k: app.node.try_get_context(k) for k in ImageSpec.model_fields}
    values = {k: v for k, v in values.items() if v is not None}
    try:
        spec = ImageSpec.model_validate(values)
    except ValidationError as e:
        first = e.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else "context"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise SpecError(f"{key}={values.get(key)!r}: {message[:1].lower()}{message[1:]}") from None
    try:
        base = render.base_info(render.load_versions(), spec.base)
    except ValueError as e:
        raise SpecError(str(e)) from None
    if base.has_nvidia_driver and spec.nvidia_kernel_modules == "proprietary":
        # The driver component is left out on a base that has a driver, so the image would keep the base's open
        # modules while being published as the proprietary build V100 clusters resolve.
        raise SpecError(f"nvidia_kernel_modules='proprietary': base={spec.base!r} brings its own driver with the open "
                        "kernel modules; allowed: base=ubuntu or an AMI id without a driver, where the image installs "
                        "the proprietary one")
    return spec


def build(context: dict[str, Any] | None = None, *, outdir: str | None = None) -> tuple[App, ImageStack]:
    app = App(context=context, outdir=outdir)
    spec = spec_from_context(app)
    stack = ImageStack(app, spec.name, spec=spec, versions=render.load_versions(),
                       env=Environment(region=spec.region))
    Aspects.of(app).add(AwsSolutionsChecks())
    return app, stack


def main() -> int:
    try:
        app, _ = build()
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
