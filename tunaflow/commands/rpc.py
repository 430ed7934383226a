"""`tunaflow tracker serve|status` and `tunaflow runner serve`: RPC measurement on other devices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tunaflow.console import fail, out

tracker_app = typer.Typer(help="The RPC tracker: devices by key, a job queue, requeue when a device vanishes.",
                          no_args_is_help=True)
runner_app = typer.Typer(help="Device agents that measure candidates for a tracker.", no_args_is_help=True)

TokenFile = Annotated[Path | None, typer.Option(help="file holding the shared secret (else $TUNAFLOW_RPC_TOKEN)")]
TrackerAddr = Annotated[str, typer.Option(help="tracker address, HOST:PORT")]


@tracker_app.command("serve")
def tracker_serve(
    host: Annotated[str, typer.Option(help="address to bind; anything else exposes the tracker")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 9190,
    token_file: TokenFile = None,
    agent_timeout: Annotated[float, typer.Option(help="seconds without a heartbeat before a device is dropped")] = 5.0,
    max_retries: Annotated[int, typer.Option(help="requeues of one job before it is recorded as an error")] = 2,
    max_body_mb: Annotated[int, typer.Option(help="largest request body accepted, in MiB")] = 64,
) -> None:
    """Serve the tracker until interrupted.

    Example: TUNAFLOW_RPC_TOKEN=... tunaflow tracker serve --host 127.0.0.1 --port 9190
    """
    from stages.rpc.auth import TokenError, load_token
    from stages.rpc.tracker import serve

    try:
        token = load_token(token_file)
    except TokenError as exc:
        raise fail(str(exc)) from exc
    out.print(f"tracker on http://{host}:{port} (agent timeout {agent_timeout:g} s, {max_retries} retries)")
    serve(token, host, port, agent_timeout, max_retries, max_body_mb * 1024 * 1024)


@tracker_app.command("status")
def tracker_status(
    tracker: TrackerAddr = "127.0.0.1:9190",
    token_file: TokenFile = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the status as JSON")] = False,
) -> None:
    """Devices per key (busy/free), queue lengths, and how many jobs were requeued."""
    from stages.rpc.auth import TokenError, load_token
    from stages.rpc.client import TrackerClient, TrackerError

    try:
        client = TrackerClient(_url(tracker), load_token(token_file))
        status = client.status()
    except (TokenError, TrackerError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if json_out:
        print(json.dumps(status.model_dump(mode="json")))
        return
    if not status.keys:
        out.print("no devices registered and no jobs queued")
    for ks in status.keys:
        target = ks.target.cpu if ks.target else "-"
        out.print(f"[bold]{ks.key}[/]  devices {len(ks.devices)} (free {ks.free}, busy {ks.busy})  "
                  f"queued {ks.queued}  target {target}")
        for d in ks.devices:
            state = f"busy ({d.job_id})" if d.busy else "free"
            out.print(f"  {d.agent_id}  {d.name}  {state}  measured {d.measured}  seen {d.last_seen_s:.1f} s ago")
    out.print(f"requeued {status.requeued}, failed after retries {status.failed_after_retries}")


@runner_app.command("serve")
def runner_serve(
    key: Annotated[str, typer.Option(help="device key clients ask for, e.g. android_device")],
    tracker: TrackerAddr = "127.0.0.1:9190",
    token_file: TokenFile = None,
    target: Annotated[str, typer.Option(help="what this device is: 'host' or a target string")] = "host",
    name: Annotated[str, typer.Option(help="name shown in the tracker status (default host:pid)")] = "",
) -> None:
    """Measure candidates for the tracker until interrupted. It runs machine code from whoever holds the token.

    Example: tunaflow runner serve --tracker 127.0.0.1:9190 --key android_device
    """
    import logging

    from pydantic import ValidationError

    from schemas import Target, TargetError
    from schemas.rpc import RegisterRequest
    from stages.rpc.agent import Agent
    from stages.rpc.auth import TokenError, load_token

    try:
        tgt = Target.parse(target)
        RegisterRequest(key=key, target=tgt, name=name)
        agent = Agent(_url(tracker), key, load_token(token_file), tgt, name)
    except (TokenError, TargetError, ValidationError, ValueError) as exc:
        raise fail(str(exc)) from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    out.print(f"agent for key {key!r} ({tgt.cpu}) pulling from {_url(tracker)}")
    try:
        agent.serve()
    except KeyboardInterrupt:
        agent.close()


def _url(addr: str) -> str:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"tracker address {addr!r} is not HOST:PORT")
    return f"http://{host}:{int(port)}"


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
    host, port = _url(tracker).removeprefix("http://").rsplit(":", 1)
    spec = RunnerSpec(kind="rpc", key=key or "", host=host, port=int(port),
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
