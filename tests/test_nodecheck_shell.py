"""The node check's pair measurement (launcher/execute/nodecheck.py) against a slow node, with no cluster: a real TCP
connection on loopback to a receiver that reads at a shaped rate, as a node under `launch local fault NODE --net
5mbit` does. A pair sends for at most its seconds, then the receiver's count comes back: the measurement ends soon
after those seconds and says the low rate, where sending all PAIR_BYTES at this rate would take minutes (srun's
SRUN_TIMEOUT_S would kill the task first, and the slow node would report no figure at all)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import launcher
from launcher.execute import nodecheck as run
from launcher.plans import nodecheck

RATE = 256 * 1024          # bytes a second the shaped receiver reads (2.1 Mbit/s): PAIR_BYTES would take 256 s
READ = 8 * 1024
SECONDS = 1.0              # the pair's --seconds
BOUND_S = SECONDS + 10     # generous: the machine is shared; the full send would take far longer
assert nodecheck.PAIR_BYTES / RATE > 60


class ShapedReceiver:
    """A listener whose one connection is read at RATE bytes a second (small reads, paced), counted, and answered as
    the check's receiver answers: the count, 8 bytes in network order, once the sender has shut down its side."""

    def __init__(self, family: int = socket.AF_INET, host: str = "127.0.0.1", port: int = 0):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET6:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        # A small receive buffer (the accepted socket inherits it): what the kernel queues for us stays small, as it
        # does on a shaped link, so the sender's calls block at about RATE.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        self.sock.bind((host, port))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        self.answered = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(1.0)
            start = time.monotonic()
            while not self._stop.is_set():
                try:
                    chunk = conn.recv(READ)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    self.answered = True  # before the answer: the sender may read it and go on before we do
                    with contextlib.suppress(OSError):
                        conn.sendall(struct.pack("!Q", self.count))
                    return
                self.count += len(chunk)
                ahead = start + self.count / RATE - time.monotonic()
                if ahead > 0:
                    self._stop.wait(ahead)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept
        self.sock.close()
        self._thread.join(10)
        assert not self._thread.is_alive()


@pytest.fixture
def shaped():
    made: list[ShapedReceiver] = []

    def make(*args) -> ShapedReceiver:
        made.append(ShapedReceiver(*args))
        return made[-1]

    yield make
    for r in made:
        r.close()


def assert_slow_pair(count: int, seconds: float, receiver: ShapedReceiver) -> None:
    """What the sender reports is what the slow receiver counted, over about the pair's seconds, at its low rate."""
    assert receiver.answered and count == receiver.count > 0
    assert SECONDS <= seconds < BOUND_S
    assert count < nodecheck.PAIR_BYTES / 10  # it stopped at its seconds, far short of all it may send
    pair = nodecheck.Pair("a", "b", count, seconds)
    assert pair.bps < 2 * 8 * RATE < 0.01 * nodecheck.LOCAL_EXPECTED_BPS  # the low rate, far below the floor


@pytest.mark.timeout(60)
def test_a_pair_to_a_slow_receiver_ends_at_its_seconds_and_says_the_low_rate(shaped):
    """The sender's side of one pair, on 127.0.0.1."""
    receiver = shaped()
    started = time.monotonic()
    deadline = started + run.CONNECT_WITHIN_S + SECONDS + 5  # as measure() gives it
    result: list = []

    def send() -> None:
        try:
            result.append(run._send("127.0.0.1", receiver.port, SECONDS, nodecheck.PAIR_BYTES, deadline))
        except OSError as e:
            result.append(e)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sender.join(BOUND_S)
    elapsed = time.monotonic() - started
    if sender.is_alive():
        receiver.close()  # the sender's next send fails: it ends, and with it this test
        sender.join(10)
    assert elapsed < BOUND_S and result, f"the pair still sent after {elapsed:.1f} s; its bound is {SECONDS} s"
    assert not isinstance(result[0], Exception), result[0]
    count, seconds = result[0]
    assert_slow_pair(count, seconds, receiver)


def _free_ipv4_port(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _answer_as_predecessor(port: int, within_s: float) -> bytes:
    """Be node a's predecessor in the ring: connect to its listener (once it listens), send nothing, read its count."""
    end = time.monotonic() + within_s
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=2)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)
    with conn:
        conn.settimeout(within_s)
        conn.shutdown(socket.SHUT_WR)
        got = b""
        while len(got) < 8 and (more := conn.recv(8 - len(got))):
            got += more
        return got


@pytest.mark.timeout(90)
def test_one_nodes_task_in_the_ring_ends_soon_after_its_seconds_against_a_slow_successor(shaped):
    """`python -m launcher.execute.nodecheck --hosts a,b --addresses ...` as srun starts it on node a: its listener
    and its send to b, whose link is slow. b here is the shaped receiver on ::1 (IPv6 only, so it and a's own
    listener, on every IPv4 address, share one port as two nodes' do); the test is a's predecessor too."""
    try:
        receiver = None
        for _ in range(20):
            candidate = shaped(socket.AF_INET6, "::1")
            if _free_ipv4_port(candidate.port):
                receiver = candidate
                break
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here ({e}); the sender's bound is tested above on 127.0.0.1")
    assert receiver is not None
    env = {**os.environ, "SLURMD_NODENAME": "a", "PYTHONPATH": str(Path(launcher.__file__).resolve().parents[1])}
    argv = [sys.executable, "-m", "launcher.execute.nodecheck", "--hosts", "a,b", "--addresses", "127.0.0.1,::1",
            "--port", str(receiver.port), "--seconds", str(SECONDS)]
    started = time.monotonic()
    task = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert _answer_as_predecessor(receiver.port, 20) == struct.pack("!Q", 0)
        out, err = task.communicate(timeout=BOUND_S + 5)
    finally:
        if task.poll() is None:
            task.kill()
            task.communicate()
    elapsed = time.monotonic() - started
    assert task.returncode == 0, err
    assert elapsed < BOUND_S, f"node a's task ran {elapsed:.1f} s, its pair's bound is {SECONDS} s"
    line = json.loads(out.strip().splitlines()[-1])
    assert (line["sender"], line["receiver"]) == ("a", "b") and "error" not in line, line
    assert_slow_pair(line["bytes"], line["seconds"], receiver)
