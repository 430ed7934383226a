"""A process that takes the tracker's port and hands agents an object (tests and attacks).

It answers by the last segment of the path (`agents`, `next`, `heartbeat`, `result`, ...) with
canned answers from a JSON script, either plain (what a process without the token can make) or
captured earlier from the real tracker with their signature headers (a replay). Every request
it gets is appended to a log, one line `METHOD PATH`, so a test can see whether an agent ever
posted a result (which it only does after running the object). The payload is a canary object
whose kernel creates a marker file: if the file exists, an agent ran code it should have refused.
With `--sign` it holds the token (TUNAFLOW_RPC_TOKEN) and signs its answers as the tracker does: a
faulty or compromised tracker, to show what an agent does with a job no real tracker would queue.
Without it, it refuses to start while the token is in its environment.

    python -m testing.rogue_tracker --port 9190 --script script.json --log requests.log [--sign]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def canary_object(target, marker: Path) -> bytes:
    """An object exporting tf_main/tf_bench whose tf_main creates `marker` (via libc `creat`)."""
    from llvmlite import ir

    from stages.codegen.compile import compile_ir
    from stages.codegen.harness import add_harness
    from stages.codegen.irb import VOIDP

    mod = ir.Module(name="canary")
    mod.triple = target.triple
    path = bytearray(str(marker).encode() + b"\0")
    text = ir.GlobalVariable(mod, ir.ArrayType(ir.IntType(8), len(path)), name="marker")
    text.initializer = ir.Constant(ir.ArrayType(ir.IntType(8), len(path)), path)
    text.global_constant = True
    creat = ir.Function(mod, ir.FunctionType(ir.IntType(32), [ir.IntType(8).as_pointer(), ir.IntType(32)]),
                        name="creat")
    main = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP]), name="tf_main")
    b = ir.IRBuilder(main.append_basic_block("entry"))
    b.call(creat, [b.bitcast(text, ir.IntType(8).as_pointer()), ir.Constant(ir.IntType(32), 0o644)])
    b.ret_void()
    add_harness(mod, main)
    return compile_ir(mod, target).data


def lease(job_id: str, job) -> dict:
    """The body of a tracker's answer handing `job` (a MeasureJob) to an agent."""
    return {"job_id": job_id, "job": job.model_dump(mode="json")}


def plain(status: int, body: object) -> dict:
    """A canned answer without any signature."""
    return {"status": status, "headers": {"content-type": "application/json"}, "body": json.dumps(body)}


def captured(response) -> dict:
    """A canned answer copied from a real (signed) httpx response, signature header included."""
    keep = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "date", "server")}
    return {"status": response.status_code, "headers": keep,
            "body_b64": base64.b64encode(response.content).decode()}


def _handler(routes: dict, log: Path, token: str | None):
    from stages.rpc.auth import AUTH_HEADER, REPLY_HEADER, new_epoch, reply_mac

    epoch = new_epoch()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            sent = self.rfile.read(length) if length else b""
            with log.open("a") as f:
                f.write(f"{self.command} {self.path} {sent.decode(errors='replace')}\n")
            route = routes.get(self.path.rstrip("/").rsplit("/", 1)[-1], {"status": 204, "headers": {}, "body": ""})
            body = base64.b64decode(route["body_b64"]) if "body_b64" in route else route["body"].encode()
            self.send_response(route["status"])
            for k, v in route["headers"].items():
                self.send_header(k, v)
            fields = self.headers.get(AUTH_HEADER, "").split(" ")
            if token is not None and len(fields) == 5:
                self.send_header(REPLY_HEADER, f"{epoch} {reply_mac(token, epoch, route['status'], fields[2], body)}")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args) -> None:
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--sign", action="store_true", help="hold the token and sign answers as the tracker does")
    args = parser.parse_args()
    token = os.environ.get("TUNAFLOW_RPC_TOKEN") or None
    if token and not args.sign:
        raise SystemExit("the rogue tracker runs without the token unless --sign is given")
    if args.sign and not token:
        raise SystemExit("--sign needs TUNAFLOW_RPC_TOKEN")
    routes = json.loads(args.script.read_text())
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(routes, args.log, token if args.sign else None))
    server.daemon_threads = True
    with server, contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
