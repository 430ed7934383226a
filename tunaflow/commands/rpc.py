"""`tunaflow tracker serve|status` and `tunaflow runner serve`: RPC measurement on other devices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.text import Text

from tunaflow.console import err, out

tracker_app = typer.Typer(help="The RPC tracker: devices by key, a job queue, requeue when a device vanishes.",
                          no_args_is_help=True)
runner_app = typer.Typer(help="Device agents that measure candidates for a tracker.", no_args_is_help=True)

TokenFile = Annotated[Path | None, typer.Option(help="file holding the shared secret (else $TUNAFLOW_RPC_TOKEN)")]
TrackerAddr = Annotated[str, typer.Option(help="tracker address, HOST:PORT (https://HOST:PORT for a TLS tracker)")]
CaFile = Annotated[Path | None, typer.Option("--tls-ca", help="CA file to verify an https tracker's certificate "
                                                              "(else $TUNAFLOW_RPC_CA, else the system's store)")]
CA_ENV = "TUNAFLOW_RPC_CA"


def fail(msg: str) -> typer.Exit:
    """The commands' one-line error, printed as plain text: messages carry user strings (names, paths)."""
    err.print(Text.assemble(("error:", "bold red"), " ", msg), highlight=False, soft_wrap=True, emoji=False)
    return typer.Exit(2)


@tracker_app.command("serve")
def tracker_serve(
    host: Annotated[str, typer.Option(help="address to bind; anything else exposes the tracker")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=1, max=65535)] = 9190,
    token_file: TokenFile = None,
    agent_timeout: Annotated[float, typer.Option(help="seconds without a heartbeat before a device is dropped",
                                                 min=0.5, max=3600)] = 5.0,
    max_retries: Annotated[int, typer.Option(help="requeues of one job before it is recorded as an error",
                                             min=0, max=100)] = 2,
    max_body_mb: Annotated[int, typer.Option(help="largest request body accepted, in MiB", min=1, max=1024)] = 64,
    tls_cert: Annotated[Path | None, typer.Option(help="serve https with this certificate (PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="the certificate's private key (PEM)")] = None,
    max_connections: Annotated[int, typer.Option(help="open connections at once; past it, idle ones that never "
                                                      "authenticated are closed first", min=32,
                                                 max=65536)] = 1024,
) -> None:
    """Serve the tracker until interrupted.

    Example: TUNAFLOW_RPC_TOKEN=... tunaflow tracker serve --host 127.0.0.1 --port 9190
    """
    from stages.rpc.auth import TokenError, load_token
    from stages.rpc.tracker import serve

    if (tls_cert is None) != (tls_key is None):
        raise fail("--tls-cert and --tls-key go together")
    for opt, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None and not path.is_file():
            raise fail(f"{opt} {path}: no such file")
    try:
        token = load_token(token_file)
    except TokenError as exc:
        raise fail(str(exc)) from exc
    scheme = "https" if tls_cert else "http"
    out.print(f"tracker on {scheme}://{escape(host)}:{port} (agent timeout {agent_timeout:g} s, {max_retries} retries)")
    try:
        serve(token, host, port, agent_timeout, max_retries, max_body_mb * 1024 * 1024,
              str(tls_cert) if tls_cert else None, str(tls_key) if tls_key else None, max_connections)
    except OSError as exc:
        raise fail(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from exc


@tracker_app.command("status")
def tracker_status(
    tracker: TrackerAddr = "127.0.0.1:9190",
    token_file: TokenFile = None,
    tls_ca: CaFile = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the status as JSON")] = False,
) -> None:
    """Devices per key (busy/free), queue lengths, and how many jobs were requeued."""
    from stages.rpc.auth import TokenError, load_token
    from stages.rpc.client import TrackerClient, TrackerError

    try:
        client = TrackerClient(_url(tracker), load_token(token_file), ca_file=_ca(tls_ca))
        status = client.status()
    except (TokenError, TrackerError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if json_out:
        print(json.dumps(status.model_dump(mode="json")))
        return
    if not status.keys:
        out.print("no devices registered and no jobs queued")
    for ks in status.keys:
        target = escape(ks.target.cpu) if ks.target else "-"
        out.print(f"[bold]{escape(ks.key)}[/]  devices {len(ks.devices)} (free {ks.free}, busy {ks.busy})  "
                  f"queued {ks.queued}  target {target}", emoji=False)
        for d in ks.devices:
            state = f"busy ({escape(str(d.job_id))})" if d.busy else "free"
            out.print(f"  {escape(d.agent_id)}  {escape(d.name)}  {state}  measured {d.measured}  "
                      f"seen {d.last_seen_s:.1f} s ago", emoji=False, highlight=False)
    out.print(f"requeued {status.requeued}, failed after retries {status.failed_after_retries}")


@runner_app.command("serve")
def runner_serve(
    key: Annotated[str, typer.Option(help="device key clients ask for, e.g. arm64")],
    tracker: TrackerAddr = "127.0.0.1:9190",
    token_file: TokenFile = None,
    target: Annotated[str, typer.Option(help="what this device is: 'host' or a target string")] = "host",
    cpu: Annotated[str | None, typer.Option(help="the device's real CPU (LLVM name, e.g. cortex-a76) when it "
                                                 "reads as generic, as under emulation; with --target host")] = None,
    caches: Annotated[str | None, typer.Option(help="the device's L1 data, L2 and L3 sizes, e.g. 64K,512K,2M, when "
                                                    "sysfs does not show them (emulation); with --target host")] = None,
    name: Annotated[str, typer.Option(help="name shown in the tracker status (default host:pid)")] = "",
    tls_ca: CaFile = None,
) -> None:
    """Measure candidates for the tracker until interrupted. It runs machine code from whoever holds the token.

    Example: tunaflow runner serve --tracker 127.0.0.1:9190 --key arm64
    (an arm64 userland under qemu reads its CPU as generic: add --cpu cortex-a76)
    """
    import logging

    from pydantic import ValidationError

    from schemas import Target, TargetError
    from schemas.rpc import RegisterRequest
    from stages.rpc.agent import Agent, device_target
    from stages.rpc.auth import TokenError, load_token
    from stages.rpc.client import TrackerError, tls_verify

    try:
        if (cpu is not None or caches is not None) and target != "host":
            raise ValueError("--cpu and --caches correct the detected target: give them with --target host, or put "
                             "-mcpu= in the --target string")
        tgt = device_target(cpu, caches) if target == "host" else Target.parse(target)
        RegisterRequest(key=key, target=tgt, name=name)
        url = _url(tracker)
        agent = Agent(url, key, load_token(token_file), tgt, name, verify=tls_verify(url, _ca(tls_ca)))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise fail(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from exc
    except (TokenError, TargetError, TrackerError, ValueError) as exc:
        raise fail(str(exc)) from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    out.print(f"agent for key {escape(repr(key))} ({escape(tgt.triple)}, {escape(tgt.cpu)}) pulling from "
              f"{escape(url)}", emoji=False)
    try:
        agent.serve()
    except KeyboardInterrupt:
        agent.close()
        out.print(f"agent {escape(agent.name)} stopped (interrupted)", emoji=False, highlight=False)
        raise typer.Exit(130) from None


def _url(addr: str) -> str:
    """`http://HOST:PORT` for HOST:PORT, or the https URL given; ValueError for anything else."""
    scheme, _, rest = addr.rpartition("://")
    host, sep, port = rest.rpartition(":")
    if scheme not in ("", "http", "https") or not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"tracker address {addr!r} is not HOST:PORT (or https://HOST:PORT) with a port 1-65535")
    return f"{scheme or 'http'}://{host}:{int(port)}"


def _ca(option: Path | None) -> str | None:
    import os

    return str(option) if option is not None else os.environ.get(CA_ENV) or None


RunnerKind = Annotated[str, typer.Option("--runner", help="where candidates are measured: local, or rpc (devices "
                                                          "under --key at --tracker)")]
DeviceKeyOpt = Annotated[str | None, typer.Option("--key", help="device key at the tracker (with --runner rpc)")]
TrackerOpt = Annotated[str, typer.Option("--tracker", help="tracker HOST:PORT (with --runner rpc)")]


def runner_choice(kind: str, key: str | None, tracker: str, token_file: Path | None, target, target_text: str):
    """(RunnerSpec, target to compile for) for the tune commands; with rpc and target 'host', the target
    the devices under the key registered with. ValueError says what is wrong."""
    from schemas.options import RunnerSpec
    from stages.rpc.client import RPCRunner, TrackerError

    if kind not in ("local", "rpc"):
        raise ValueError(f"unknown runner {kind!r}; use local or rpc")
    if kind == "local":
        if key:
            raise ValueError("--key selects devices at a tracker: add --runner rpc")
        return RunnerSpec(), target
    scheme, _, address = _url(tracker).partition("://")
    host, port = address.rsplit(":", 1)
    spec = RunnerSpec(kind="rpc", key=key or "", host=host, port=int(port), scheme=scheme, tls_ca=_ca(None),
                      token_file=str(token_file) if token_file else None)
    if target_text != "host":
        return spec, target
    from schemas import MeasureOptions

    try:
        with RPCRunner.from_spec(spec, MeasureOptions()) as runner:
            device = runner.device_target()
    except TrackerError as exc:
        raise ValueError(str(exc)) from exc
    if device is None:
        raise ValueError(f"no device under key {spec.key!r} at {tracker}: start one with "
                         f"`tunaflow runner serve --tracker {tracker} --key {spec.key}`, or give --target")
    return spec, device.model_copy(update={"name": spec.key})
