"""The rehearsal nodes' Instance Metadata Service: a small HTTP server for EC2's IMDSv2 at 169.254.169.254.

On EC2 a node's boot and every AWS SDK on it ask IMDS who the node is and which role credentials it holds; the local
backend's nodes (network namespaces on a bridge) reach this server instead, which answers exactly as EC2 does with
HttpTokens=required (launcher/plans/imds.answer: the whole behaviour, pure). This shell only maps the client's source
address to its instance, from the JSON instance map the cluster writes (launcher/plans/imds.instances_json; replaced
atomically, and read again as soon as it changes, so a replacement node with a new address is answered at once), and
keeps the session tokens in memory. A map that cannot be read leaves the last good one in use, with one line logged.

Run as ``python -m launcher.local.imds --instances FILE --bind ADDR --port N``: it prints ``imds listening on
ADDR:PORT`` to stdout when it accepts requests (port 0 picks a free one, printed), logs one line per request to
stderr, and ends cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from launcher.plans import imds

MAX_BODY = 65536  # a token PUT carries no body; more than this is not read


def log(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}", file=sys.stderr, flush=True)


class InstanceMap:
    """The instance map file, read again whenever it is replaced or changed (inode, mtime or size differ)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.instances: dict[str, imds.Instance] = {}
        self._seen: tuple[int, int, int] | None = None
        self._problem: str | None = None

    def _complain(self, problem: str) -> None:
        if problem != self._problem:
            log(f"instance map {self.path}: {problem}; answering from the last good map "
                f"({len(self.instances)} instances)")
        self._problem = problem

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError as e:
            self._seen = None
            self._complain(e.strerror or "unreadable")
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._seen:
            return
        self._seen = key
        try:
            with open(self.path, encoding="utf-8") as f:
                loaded = imds.load_instances(f.read())
        except (OSError, UnicodeDecodeError) as e:
            self._complain(f"unreadable ({e})")
            return
        except ValueError as e:
            self._complain(str(e))
            return
        self.instances = loaded
        if self._problem is not None:
            log(f"instance map {self.path}: read again ({len(loaded)} instances)")
        self._problem = None


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], instances: InstanceMap) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.instances = instances
        self.tokens = imds.TokenStore()
        self.lock = threading.Lock()
        super().__init__(address, Handler)

    def handle_error(self, request, client_address) -> None:
        # one line, not socketserver's traceback (a client that hangs up mid-answer, say)
        kind, value = sys.exc_info()[:2]
        log(f"{client_address[0]} request failed: {kind.__name__ if kind else 'error'}: {value}")

    def answer(self, method: str, path: str, headers, client: str) -> imds.Reply:
        with self.lock:
            self.instances.refresh()
            instance = self.instances.instances.get(client)
            return imds.answer(method, path, headers, instance, self.tokens, time.time())


class Handler(BaseHTTPRequestHandler):
    server: Server

    def version_string(self) -> str:
        return "EC2ws"  # the Server header EC2's IMDS sends

    def __getattr__(self, name: str):
        # every method reaches answer(), which refuses the ones IMDS does not serve (405), not http.server (501)
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def _client(self) -> str:
        addr = self.client_address[0]
        return addr.removeprefix("::ffff:") if addr.startswith("::ffff:") and "." in addr else addr

    def _serve(self) -> None:
        length = self.headers.get("Content-Length", "0")
        if length.isdigit() and 0 < int(length) <= MAX_BODY:
            self.rfile.read(int(length))
        path = urlsplit(self.path).path if "://" in self.path else self.path
        reply = self.server.answer(self.command, path, self.headers, self._client())
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def log_request(self, code="-", size="-") -> None:
        log(f"{self._client()} {self.command} {self.path} {code}")

    def log_message(self, fmt: str, *args) -> None:
        log(f"{self._client()} {fmt % args}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.local.imds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", required=True, help="the instance map (JSON, launcher.plans.imds)")
    parser.add_argument("--bind", default="169.254.169.254", help="the address to listen on")
    parser.add_argument("--port", type=int, default=80, help="the port (0: a free one, printed)")
    args = parser.parse_args(argv)
    instances = InstanceMap(args.instances)
    instances.refresh()
    try:
        server = Server((args.bind, args.port), instances)
    except OSError as e:
        print(f"imds: cannot listen on {args.bind}:{args.port}: {e.strerror or e}", file=sys.stderr, flush=True)
        return 1

    def stop(signum, frame) -> None:
        # shutdown() waits for serve_forever to return, so it runs beside it, not in the signal handler's frame
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(f"imds listening on {host}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    log("imds stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
