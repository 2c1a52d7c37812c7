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
