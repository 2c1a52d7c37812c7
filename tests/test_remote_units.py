"""Pure parts of the remote shell: how streamed node output is prefixed."""

import io

from launcher.execute.remote import PrefixWriter


def test_prefix_writer_joins_pty_lines_split_across_writes():
    target = io.StringIO()
    w = PrefixWriter("node0", target)
    for chunk in ["epoch 0 loss 2.1\r", "\nepoch 1", " loss 1.5\r\n", "tail without newline"]:
        w.write(chunk)
    w.flush()
    assert target.getvalue() == "[node0] epoch 0 loss 2.1\n[node0] epoch 1 loss 1.5\n[node0] tail without newline\n"
    assert w.lines == ["epoch 0 loss 2.1", "epoch 1 loss 1.5", "tail without newline"]


def _aws_cluster(tmp_path, ssh_config: str):
    from launcher.cluster import Cluster, Node

    (tmp_path / "ssh_config").write_text(ssh_config)
    (tmp_path / "known_hosts").touch()
    return Cluster(name="c", backend="aws", user="ubuntu", ssh_config=str(tmp_path / "ssh_config"),
                   known_hosts=str(tmp_path / "known_hosts"), python="/opt/scaletrain/venv/bin/python",
                   nodes=[Node(name="node0", address="i-0123456789abcdef0", port=22, role="worker", slots=8, cpus=96,
                               workdir="/home/ubuntu/scaletrain")])


def test_ssh_through_ssm_without_the_session_manager_plugin_is_one_line(tmp_path, monkeypatch):
    """Issue 37 item 4: the AWS CLI's "SessionManagerPlugin is not found" from inside a ProxyCommand is not what a
    user sees; connecting to an AWS cluster's node first says what to install."""
    import pytest

    from launcher.cluster.aws import access
    from launcher.errors import LaunchError
    from launcher.execute import remote

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    via_ssm = _aws_cluster(tmp_path, f"Host node0\n  ProxyCommand {access.ssm_proxy_command('us-east-1')}\n")
    with pytest.raises(LaunchError, match=r"^the AWS CLI's Session Manager plugin \(session-manager-plugin\) is not "
                                          r"on PATH, .*session-manager-working-with-install-plugin\.html says$"):
        remote.connect(via_ssm, via_ssm.nodes[0])
    direct = _aws_cluster(tmp_path, "Host node0\n  HostName 127.0.0.1\n")  # the tests' AWS clusters on local sshd
    remote.connect(direct, direct.nodes[0])  # not asked for: no SSM session is opened


def test_with_the_plugin_on_path_an_ssm_cluster_is_connected_as_before(tmp_path, ssm_plugin):
    from launcher.cluster.aws import access
    from launcher.execute import remote

    via_ssm = _aws_cluster(tmp_path, f"Host node0\n  ProxyCommand {access.ssm_proxy_command('us-east-1')}\n")
    assert remote.through_ssm(via_ssm)
    remote.connect(via_ssm, via_ssm.nodes[0])  # fabric connects lazily: nothing is opened here
