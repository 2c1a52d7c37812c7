import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


# --- Every AWS API call the launcher makes in the tests (tests/test_zz_launcher_iam_policy.py reads it) -------------
# A call counts when the nearest frame of the project's own code (infra/ aside: the launcher runs its idle check) is in
# launcher/: the tests' own set-up calls (moto stacks, buckets; the fake CDK a launcher test puts in place) and the
# nodes' calls (training/, the AWS CLI on a node) are another identity's. Recorded as IAM actions (service prefix:API
# operation), into one set for the session, and written to $SCALETRAIN_AWS_CALLS_OUT at its end when that is set.
import os  # noqa: E402

import botocore.client  # noqa: E402

LAUNCHER_AWS_CALLS: set[str] = set()
_ROOT = Path(__file__).resolve().parent.parent
_LAUNCHER_DIR = str(_ROOT / "launcher") + os.sep
_PROJECT_DIRS = tuple(str(_ROOT / d) + os.sep for d in ("tests", "training", "ami"))
_IAM_PREFIX = {"service-quotas": "servicequotas"}  # botocore's service name -> IAM's prefix, where they differ
_make_api_call = botocore.client.BaseClient._make_api_call


def _recording_api_call(self, operation_name, api_params):
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_LAUNCHER_DIR):
            service = self.meta.service_model.service_name
            LAUNCHER_AWS_CALLS.add(f"{_IAM_PREFIX.get(service, service)}:{operation_name}")
            break
        if name.startswith(_PROJECT_DIRS):
            break
        frame = frame.f_back
    return _make_api_call(self, operation_name, api_params)


botocore.client.BaseClient._make_api_call = _recording_api_call


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("SCALETRAIN_AWS_CALLS_OUT")
    if out:
        Path(out).write_text("".join(f"{call}\n" for call in sorted(LAUNCHER_AWS_CALLS)))
