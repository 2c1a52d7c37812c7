"""What a rehearsal node's failed boot says, and what a failed `launch local up` keeps of it: cloud-init's result,
the user data's own last lines in cloud-init-output.log, and the logs copied out before the cluster is removed.

Pure: launcher/local/rehearsal_nodes.py and rehearsal_cluster.py read the files and execute.
"""

from __future__ import annotations

import re

from launcher.plans.rehearsal import CLOUD_OUTPUT_LOG, SERVICES_LOG

# What a failed `launch local up` keeps of the cluster it removes, relative to the cluster's directory: each node's
# console (systemd, cloud-init, the host keys) and cloud-init's own logs, and the services' log (IMDS, the account,
# the storage host). The error names files here; kept under FAILED_DIR/NAME with the same relative paths.
FAILED_DIR = "failed"                    # under the state root (~/.scaletrain), beside clusters/
KEPT_LOGS = ("nodes/*/console.log", f"nodes/*/upper{CLOUD_OUTPUT_LOG}", "nodes/*/upper/var/log/cloud-init.log",
             SERVICES_LOG)


def kept_path(message: str, cluster: str, kept: str) -> str:
    """The error's paths in the cluster's directory, which the failed `up` removes, rewritten to where their logs
    were kept."""
    return message.replace(cluster.rstrip("/") + "/", kept.rstrip("/") + "/")


def cloud_failure(result: dict) -> str | None:
    """What cloud-init's final result (result.json: {"v1": {"errors": [...]}}) says went wrong, or None."""
    errors = (result.get("v1") or {}).get("errors") or []
    return "; ".join(str(e) for e in errors) or None


_CLOUD_INIT_OWN = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - \S+\[[A-Z]+\]: "
                             r"|Cloud-init v\. \S+ finished at )")
_FINAL_STAGE = re.compile(r"^Cloud-init v\. \S+ running 'modules:final' ", re.M)


def user_data_output(log: str, count: int = 3) -> str:
    """The user data's own last lines in cloud-init-output.log: what it printed in the final stage (scripts-user runs
    there), without cloud-init's own lines after it (its module warnings, its "finished at"), which are the same for
    every failure and used to be all the one-line error said."""
    final = list(_FINAL_STAGE.finditer(log))
    ran = log[final[-1].end():].partition("\n")[2] if final else log  # after the banner's own line
    return last_lines("\n".join(ln for ln in ran.splitlines() if not _CLOUD_INIT_OWN.match(ln)), count)


def last_lines(text: str, count: int = 5) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-count:]) or "(no output)"
