"""Issue 21, groups 1, 3, 4, 7 and 10 (RPC items): the RPC channel attacked with real processes on 127.0.0.1.

A rogue tracker without the token on the tracker's port, replayed signed answers and a request captured
before a tracker restart (group 1); an agent holding the token that posts NaN, 0, negative, 1e-12 s and
malformed results to RPCRunner and to `tune-op` (group 3); a job whose object is not base64, submitted
and handed out by a faulty tracker (group 4); 300 idle sockets while an agent measures (group 7); a
non-ASCII auth header, `wait_s: NaN`, out-of-range options and rich markup in an agent name (group 10).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from attacks import Outcome
from testing.cli import tunaflow
from testing.cluster import Cluster, free_port, wait_for_request

TOKEN = "attack-rpc-token-0123456789abcdef"


def run(tmp: Path) -> list[Outcome]:
    from schemas import MeasureOptions, Target, matmul_task

    target, task = Target.host(), matmul_task(32, 48, 40)
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=1, timeout=5.0)
    outcomes: list[Outcome] = []
    for attack in (rogue_and_replayed_answers, client_against_rogue, request_replayed_after_restart,
                   forged_results, forged_results_through_tune_op, malformed_jobs, idle_flood,
                   idle_flood_past_the_limit, odd_input):
        (tmp / attack.__name__).mkdir(parents=True, exist_ok=True)
        with _Context(tmp / attack.__name__, target, task, options) as ctx:
            try:
                outcomes += attack(ctx)
            except Exception as exc:  # an attack that cannot even be mounted is a crash of the defence under test
                outcomes.append(Outcome(0, attack.__name__, f"raised {type(exc).__name__}: {exc}"[:300], False, 1))
    return outcomes


class _Context(Cluster):
    """The processes of one attack (tracker, agents, rogues) and the task, target and options it measures."""

    def __init__(self, tmp: Path, target, task, options):
        super().__init__(tmp, TOKEN)
        self.target, self.task, self.options = target, task, options

    def builds(self, n: int, skip: int = 0):
        from stages.measure.builder import build_one
        from stages.templates import matmul

        space = matmul.space(self.task, self.target)
        indices = list(space.valid_indices())[skip::7][:n]
        return [build_one(self.task, space.config(i), self.target) for i in indices]


def _canary_job(ctx: _Context, marker: Path):
    from schemas.rpc import MeasureJob
    from stages.templates import matmul
    from testing.rogue_tracker import canary_object

    knobs = dict(matmul.default_config(ctx.task, ctx.target).knobs)
    return MeasureJob.of(ctx.task, ctx.target, knobs, canary_object(ctx.target, marker), ctx.options)


# ---- group 1 ---------------------------------------------------------------------------------------------

def rogue_and_replayed_answers(ctx: _Context) -> list[Outcome]:
    """The tracker dies; a process without the token takes its port and hands the agent a canary object (plain
    answers), then another serves answers captured from the real tracker, signatures included."""
    import httpx

    from schemas.rpc import SubmitRequest
    from stages.rpc.auth import RequestSigner
    from testing.rogue_tracker import captured, lease, plain

    marker = ctx.tmp / "canary-ran"
    job = _canary_job(ctx, marker)
    ctx.start_tracker()
    ctx.client.request("POST", "/v1/jobs", SubmitRequest(key="dev", jobs=[job]).model_dump(mode="json"))
    with httpx.Client(base_url=ctx.url, auth=RequestSigner(TOKEN)) as spy:  # what an eavesdropper records
        reg = spy.post("/v1/agents", json={"key": "dev", "target": ctx.target.model_dump(mode="json")})
        spy_id = reg.json()["agent_id"]
        nxt = spy.post(f"/v1/agents/{spy_id}/next", json={"wait_s": 1})
        spy.post(f"/v1/agents/{spy_id}/result", json={"job_id": nxt.json()["job_id"],
                                                      "result": {"error_no": 4, "error_msg": "not run"}})
        spy.delete(f"/v1/agents/{spy_id}")
    ctx.start_agent("agent0")
    ctx.devices(1)
    ctx.kill("tracker")
    outcomes = []
    forged = {"agents": plain(200, {"agent_id": "a1", "heartbeat_s": 0.5}), "next": plain(200, lease("j1", job))}
    for name, routes, what in (
            ("rogue", forged,
             "a process without the token takes the dead tracker's port and hands the agent a canary object"),
            ("replay", {"agents": captured(reg), "next": captured(nxt)},
             "answers captured from the real tracker (signed registration and a signed lease of a canary object) "
             "are replayed to the agent")):
        requests = ctx.rogue(name, routes)
        wait_for_request(requests, "/v1/agents")
        time.sleep(3)
        ctx.kill(name)
        seen = requests.read_text().splitlines()
        leased = [r for r in seen if r.split(" ")[1].endswith(("/next", "/result"))]
        refused = (ctx.tmp / "agent0.log").read_text().count("not signed by the tracker")
        crashes = ctx.crashes("agent0")
        ran = int(marker.exists())
        held = not leased and not ran and crashes == 0 and refused >= len(outcomes) + 1
        outcomes.append(Outcome(1, what, f"{len(seen)} requests reached it, none past registering; agent logged "
                                         f"{refused} refusal line(s) so far and kept running; canary ran: {bool(ran)}",
                                held, crashes=crashes, code_runs=ran + len(leased)))
        time.sleep(1.5)
    ctx.start_tracker()
    ctx.devices(1)
    with ctx.runner(ctx.options) as runner:
        ok = sum(r.ok for r in runner.run(ctx.builds(2)))
    outcomes[-1].outcome += f"; tracker restarted: the same agent measured {ok}/2"
    outcomes[-1].held = outcomes[-1].held and ok == 2
    return outcomes


def client_against_rogue(ctx: _Context) -> list[Outcome]:
    from testing.rogue_tracker import plain

    ctx.rogue("rogue-status", {"status": plain(200, {"keys": [], "requeued": 0, "failed_after_retries": 0})})
    time.sleep(1.0)
    cli = ctx.tracker_status()
    line = cli.stderr.strip().splitlines()[-1] if cli.stderr.strip() else cli.stdout.strip()[:200]
    held = cli.returncode == 2 and "refused an answer" in cli.stderr and "Traceback" not in cli.stderr
    return [Outcome(1, "`tracker status` asks a process without the token that answers on the tracker's port",
                    f"exit {cli.returncode}: {line[:240]}", held, crashes=int("Traceback" in cli.stderr))]


def request_replayed_after_restart(ctx: _Context) -> list[Outcome]:
    import httpx

    from schemas.rpc import MeasureJob, SubmitRequest
    from stages.rpc.auth import AUTH_HEADER, RequestSigner

    ctx.start_tracker()
    body = SubmitRequest(key="dev", jobs=[MeasureJob.of(ctx.task, ctx.target, {}, b"obj", ctx.options)],
                         queue_timeout_s=600).model_dump_json().encode()
    with httpx.Client(base_url=ctx.url, auth=RequestSigner(TOKEN)) as http:
        sent = http.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    replay = {AUTH_HEADER: sent.request.headers[AUTH_HEADER], "content-type": "application/json"}
    same = httpx.post(ctx.url + "/v1/jobs", content=body, headers=replay).status_code
    ctx.kill("tracker")
    ctx.start_tracker()
    after = httpx.post(ctx.url + "/v1/jobs", content=body, headers=replay)
    queued = sum(k.queued for k in ctx.status().keys)
    detail = after.json().get("detail", "")
    held = same == 401 and after.status_code == 401 and queued == 0
    return [Outcome(1, "a signed submit captured on the wire is replayed to the same tracker, then after a real "
                       "restart (SIGKILL, new process on the port)",
                    f"same start {same}; after the restart {after.status_code} ({detail}); jobs queued by the "
                    f"replay: {queued}", held, crashes=ctx.crashes("tracker"))]


# ---- group 3 ---------------------------------------------------------------------------------------------

def _forger(ctx: _Context, *extra: str) -> None:
    ctx.start_tracker()
    ctx.spawn("forger", "--tracker", ctx.url, "--key", "dev", *extra, module="testing.forged_agent")
    ctx.devices(1)


def forged_results(ctx: _Context) -> list[Outcome]:
    from schemas import MeasureErrorNo
    from testing.forged_agent import FORGERIES

    _forger(ctx)
    n = 1 + len(FORGERIES)
    with ctx.runner(ctx.options) as runner:
        results = runner.run(ctx.builds(n))
    implausible = [r for r in results[1:] if r.error_no == MeasureErrorNo.implausible_result]
    example = implausible[3].error_msg[:90] if len(implausible) > 3 else "-"
    crashes = ctx.crashes("forger", "tracker")
    held = len(results) == n and results[0].ok and len(implausible) == n - 1 and crashes == 0
    return [Outcome(3, f"an agent with the token posts {', '.join(FORGERIES)} results to RPCRunner (one honest "
                       "turn first)",
                    f"{len(results)}/{n} results kept; honest one ok: {results[0].ok}; {len(implausible)}/{n - 1} "
                    f"forgeries recorded as implausible_result (e.g. {example})",
                    held, crashes=crashes, records_lost=n - len(results))]


def forged_results_through_tune_op(ctx: _Context) -> list[Outcome]:
    from schemas import MeasureErrorNo
    from stages.log import TuningLog

    _forger(ctx)
    log = ctx.tmp / "forged-log"
    cli = tunaflow("tune-op", "matmul", "--m", "32", "--n", "48", "--k", "40", "--trials", "18", "--batch-size", "9",
                   "--tuner", "random", "--no-prefect", "--json", "--log", log, "--runner", "rpc",
                   "--tracker", f"127.0.0.1:{ctx.port}", "--key", "dev", "--remeasure-top-k", "0", env=ctx.env)
    records = TuningLog(log).records() if log.exists() else []
    bad = sum(r.result.error_no == MeasureErrorNo.implausible_result for r in records)
    crash = int(cli.returncode != 0 or "Traceback" in cli.stderr)
    best = json.loads(cli.stdout)["best_gflops"] if cli.returncode == 0 else None
    held = cli.returncode == 0 and len(records) == 18 and bad >= 14
    return [Outcome(3, "`tune-op --runner rpc` (18 trials) against the lying agent",
                    f"exit {cli.returncode}; {len(records)} records, {bad} implausible_result; best {best} GFLOPS "
                    "(an honest one)" + (f"; stderr: {cli.stderr.strip().splitlines()[-1][:160]}" if crash else ""),
                    held, crashes=crash, records_lost=max(0, 18 - len(records)))]


# ---- group 4 ---------------------------------------------------------------------------------------------

def malformed_jobs(ctx: _Context) -> list[Outcome]:
    import httpx

    from schemas import MeasureResult
    from schemas.rpc import MeasureJob, SubmitRequest
    from stages.rpc.auth import RequestSigner
    from stages.templates import matmul
    from testing.rogue_tracker import lease, plain

    knobs = dict(matmul.default_config(ctx.task, ctx.target).knobs)
    job = MeasureJob.of(ctx.task, ctx.target, knobs, b"o", ctx.options)
    ctx.start("agent0")
    raw = SubmitRequest(key="dev", jobs=[job]).model_dump(mode="json")
    raw["jobs"][0]["obj_b64"] = "this is not base64!"
    refused = httpx.post(ctx.url + "/v1/jobs", json=raw, auth=RequestSigner(TOKEN))
    good = ctx.builds(1)[0]
    broken = [job.model_copy(update={"obj_b64": "AAAA"}), job.model_copy(update={"knobs": {"bogus": "x"}}),
              MeasureJob.of(good.task, good.target, dict(good.config.knobs), good.obj, ctx.options)]
    client = ctx.client
    ids = client.request("POST", "/v1/jobs", SubmitRequest(key="dev", jobs=broken).model_dump(mode="json"))
    pending, results = ids.json()["job_ids"], {}
    deadline = time.monotonic() + 60
    while len(results) < len(pending) and time.monotonic() < deadline:
        results.update(client.request("POST", "/v1/jobs/results", {"job_ids": pending, "wait_s": 5}).json()["results"])
    codes = [MeasureResult.model_validate(results[j]).error_no.name if j in results else "lost" for j in pending]
    crashes = ctx.crashes("agent0", "tracker")
    first = Outcome(4, "a token holder submits a job whose object is not base64, then jobs the agent cannot run "
                       "(an object that is no object file, unknown knobs) before a good one",
                    f"submit {refused.status_code} ({refused.json().get('detail', '')[:80]}); then results "
                    f"{', '.join(codes)}; agent alive: {ctx.procs['agent0'].poll() is None}",
                    refused.status_code == 422 and codes == ["runtime_error"] * 2 + ["no_error"] and crashes == 0,
                    crashes=crashes, records_lost=codes.count("lost"))
    ctx.close()

    ctx.port = free_port()
    ctx.tmp = ctx.tmp / "faulty-tracker"
    ctx.tmp.mkdir()
    unreadable = lease("j1", job)
    unreadable["job"]["obj_b64"] = "this is not base64!"
    requests = ctx.rogue("faulty-tracker", {"agents": plain(200, {"agent_id": "a1", "heartbeat_s": 0.5}),
                                            "next": plain(200, unreadable)}, sign=True)
    ctx.start_agent("agent1")
    deadline = time.monotonic() + 60
    while requests.read_text().count("/result ") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    posted = [r for r in requests.read_text().splitlines() if "/result " in r]
    msg = json.loads(posted[0].split(" ", 2)[2])["result"]["error_msg"] if posted else "no result posted"
    crashes = ctx.crashes("agent1")
    second = Outcome(4, "a faulty tracker holding the token hands an agent, again and again, a job whose object is "
                        "not base64",
                     f"the agent answered {len(posted)} times with an error result ({msg[:90]}) and kept asking",
                     len(posted) >= 2 and "malformed job" in msg and crashes == 0, crashes=crashes)
    return [first, second]


# ---- group 7 ---------------------------------------------------------------------------------------------

def idle_flood_past_the_limit(ctx: _Context) -> list[Outcome]:
    return idle_flood(ctx, "--max-connections", "128")


def idle_flood(ctx: _Context, *tracker_args: str) -> list[Outcome]:
    from testing.hostile_rpc import IdleFlood

    ctx.tracker_args += tracker_args
    ctx.start("agent0")
    builds = ctx.builds(6, skip=30)
    start = time.perf_counter()
    with ctx.runner(ctx.options) as runner:
        quiet = sum(r.ok for r in runner.run(builds))
    quiet_s = time.perf_counter() - start
    flood = IdleFlood("127.0.0.1", ctx.port, 300)
    try:
        deadline = time.monotonic() + 20
        while flood.opened < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(3)
        start = time.perf_counter()
        with ctx.runner(ctx.options) as runner:
            results = runner.run(builds)
        took = time.perf_counter() - start
        status = ctx.status()
        opened = flood.opened
    finally:
        flood.stop()
    ok = sum(r.ok for r in results)
    devices = sum(len(k.devices) for k in status.keys) if status else 0
    held = ok == 6 and devices == 1 and status is not None and status.requeued == 0
    limit = f" on a tracker with {' '.join(tracker_args)}" if tracker_args else ""
    return [Outcome(7, f"300 idle sockets (no token){limit}, reopened as fast as the tracker closes them, while a "
                       "client submits 6 candidates to one agent",
                    f"{ok}/6 measured in {took:.1f} s ({quiet}/6 in {quiet_s:.1f} s without the flood); agent still "
                    f"registered: {devices == 1}; requeued "
                    f"{status.requeued if status else '-'}; {opened} idle sockets opened in all", held,
                    crashes=ctx.crashes("agent0", "tracker"), records_lost=6 - len(results))]


# ---- group 10 --------------------------------------------------------------------------------------------

def odd_input(ctx: _Context) -> list[Outcome]:
    import httpx

    from stages.rpc.auth import AUTH_HEADER, RequestSigner, signature
    from testing.hostile_rpc import current_epoch

    ctx.start_tracker()
    outcomes = []
    epoch = current_epoch(ctx.url, TOKEN)
    header = signature(TOKEN, "GET", "/v1/status", b"", epoch=epoch).encode()[:-2] + "é".encode()
    resp = httpx.get(ctx.url + "/v1/status", headers={AUTH_HEADER: header})
    outcomes.append(Outcome(10, "a non-ASCII auth header", f"{resp.status_code} {resp.json().get('detail')}",
                            resp.status_code == 401, crashes=int(resp.status_code >= 500)))
    resp = httpx.post(ctx.url + "/v1/jobs/results", content=b'{"job_ids": ["j1"], "wait_s": NaN}',
                      auth=RequestSigner(TOKEN), headers={"content-type": "application/json"})
    outcomes.append(Outcome(10, "`wait_s: NaN` in a signed request", f"{resp.status_code} {resp.json().get('detail')}",
                            resp.status_code == 422, crashes=int(resp.status_code >= 500)))
    for args in (["--port", "70000"], ["--max-body-mb", "-1"], ["--agent-timeout", "-5"]):
        cli = tunaflow("tracker", "serve", *args, timeout=60, env={**ctx.env, "COLUMNS": "200"})
        line = next((ln.strip(" │") for ln in cli.stderr.splitlines() if "Invalid value" in ln), cli.stderr[-160:])
        outcomes.append(Outcome(10, f"`tracker serve {' '.join(args)}`", f"exit {cli.returncode}: {line}",
                                cli.returncode == 2 and "Invalid value" in cli.stderr,
                                crashes=int("Traceback" in cli.stderr)))
    name = "[/]:a:[bold]"
    ctx.start_agent("marked", key="odd", shown=name)
    ctx.wait(lambda s: any(d.name == name for k in s.keys for d in k.devices))
    cli = ctx.tracker_status()
    outcomes.append(Outcome(10, f"an agent named `{name}` shown by `tracker status`",
                            f"exit {cli.returncode}; name printed verbatim: {name in cli.stdout}",
                            cli.returncode == 0 and name in cli.stdout, crashes=int("Traceback" in cli.stderr)))
    return outcomes
