"""Reliability and security figures: faulty candidates, kill -9 and resume, tracker and agent killed
mid-batch, hostile network input, mutated model files, and issue 21's attacks (benchmarks/attacks/: a
rogue tracker, self-vouching manifests, implausible device results, folding bombs, a full disk...).
Writes its two sections of benchmarks/RESULTS.md.

    flock /tmp/bench.lock .venv/bin/python benchmarks/faults.py [--trials 300] [--kills 20] [--fuzz 10000]
    .venv/bin/python benchmarks/faults.py --part attacks     # only the attacks (about 10 minutes)

Real parts throughout: faults are compiled into candidates (stages/measure/inject.py), processes
are killed with SIGKILL, requests go over sockets on 127.0.0.1 to a tracker in its own process.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import replace_section  # noqa: E402

from testing.cli import tunaflow  # noqa: E402
from testing.cluster import Cluster, free_port  # noqa: E402

TOKEN = "bench-faults-token-0123456789"
COMMAND = "flock /tmp/bench.lock .venv/bin/python benchmarks/faults.py"


# ---- 1. faulty candidates -------------------------------------------------------------------------------

def faulty_session(trials: int, rate: float, seed: int, log_dir: Path) -> dict:
    """A tuning session in which `rate` of the candidates carry a real fault."""
    from schemas import MeasureErrorNo, MeasureOptions, Target, TuningOptions, matmul_task
    from schemas.record import REMEASURE
    from stages.build.apply_best import choose
    from stages.log import TuningLog
    from stages.measure.inject import EXPECTED, fault_for
    from stages.measure.runner import LocalRunner
    from stages.tune.loop import tune_task

    task, target = matmul_task(48, 64, 32), Target.host()
    measure_opts = MeasureOptions(number=1, repeat=3, min_repeat_ms=2, timeout=1.0, memory_limit_mb=512,
                                  fault_rate=rate, fault_seed=seed)
    options = TuningOptions(n_trials=trials, batch_size=16, measure=measure_opts, seed=seed)
    log = TuningLog(log_dir / "faulty")
    start = time.perf_counter()
    with LocalRunner(measure_opts) as runner:
        summary = tune_task(task, target, options, log, runner=runner)
        restarts = runner.restarts
    records = log.records()
    trial_recs = [r for r in records if r.tuner != REMEASURE]
    kinds = {r.config.index: fault_for(r.config.index, rate, seed) for r in records}
    faulty = [r for r in trial_recs if kinds[r.config.index]]
    right = [r for r in faulty if r.result.error_no == EXPECTED[kinds[r.config.index]]]
    clean_errors = Counter(r.result.error_no.name for r in trial_recs if not kinds[r.config.index]
                           and r.result.error_no != MeasureErrorNo.no_error)
    chosen = choose([task], log, target, measure_opts.threads)[task.signature]
    wrongly = [what for what, rec in (("session best", summary.best), ("applied best", chosen.record))
               if rec is not None and kinds.get(rec.config.index)]
    ok_faulty = [r for r in records if kinds[r.config.index] and r.result.ok]
    return {"trials": len(trial_recs), "injected": len(faulty), "right": len(right),
            "by_kind": Counter(kinds[r.config.index] for r in faulty), "restarts": restarts,
            "wrongly_chosen": len(wrongly) + len(ok_faulty), "clean_errors": dict(clean_errors),
            "best_gflops": summary.best_gflops, "seconds": time.perf_counter() - start,
            "wrong": [(r.config.index, kinds[r.config.index], r.result.error_no.name) for r in faulty
                      if r not in right][:5]}


# ---- 2. kill -9 and resume ------------------------------------------------------------------------------

def kill_resume(kills: int, trials: int, batch: int, seed: int, log_dir: Path) -> dict:
    """SIGKILL `tunaflow tune-op --no-prefect` at random moments `kills` times, then let it finish."""
    from schemas.record import REMEASURE
    from stages.log import TuningLog

    log = log_dir / "killed"
    rng = random.Random(seed)
    args = [sys.executable, "-m", "tunaflow", "tune-op", "matmul", "--m", "24", "--n", "40", "--k", "32",
            "--trials", str(trials), "--batch-size", str(batch), "--log", str(log), "--no-prefect", "--json",
            "--seed", str(seed)]

    def read() -> tuple[list, int]:
        if not log.exists():
            return [], 0
        records, problems = TuningLog(log).read(strict=False)
        return [r for r in records if r.tuner != REMEASURE], len(problems)

    done, lost, dupes, partial, problems, finished_early, moments = 0, 0, 0, 0, 0, 0, []
    while done < kills:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        moment = rng.uniform(1.0, 7.0)
        deadline = time.monotonic() + moment
        before = 0
        while time.monotonic() < deadline and proc.poll() is None:
            before = len(read()[0])
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if proc.poll() is not None:
            finished_early += 1
            if len(read()[0]) >= trials:
                break
            continue
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        done += 1
        moments.append(moment)
        records, bad = read()
        problems += bad
        lost += max(0, before - len(records))
        partial += len(records) % batch != 0
        dupes += len(records) - len({r.config.index for r in records})
    final = subprocess.run(args, cwd=ROOT, capture_output=True, timeout=900)
    records, bad = read()
    return {"kills": done, "survived": done if final.returncode == 0 else 0, "lost": lost, "partial": partial,
            "dupes": dupes + len(records) - len({r.config.index for r in records}), "problems": problems + bad,
            "final_trials": len(records), "trials": trials, "finished_early": finished_early,
            "moments": (min(moments), max(moments)) if moments else (0, 0)}


# ---- 3. tracker and agent killed mid-batch --------------------------------------------------------------

def rpc_kills(trials: int, tmp: Path) -> dict:
    """An RPC session during which the tracker, then an agent, is SIGKILLed mid-batch and restarted."""
    from schemas import MeasureErrorNo, MeasureOptions, Target, TuningOptions, matmul_task
    from schemas.options import RunnerSpec
    from schemas.record import REMEASURE
    from stages.log import TuningLog
    from stages.tune.loop import tune_task

    (tmp / "token").write_text(TOKEN)
    cluster = Cluster(tmp, TOKEN)
    events: list[str] = []
    busy = lambda s: any(d.busy for k in s.keys for d in k.devices)  # noqa: E731

    def chaos() -> None:
        while not list((tmp / "rpc_log").glob("*.parquet")):  # past the default config: a trial batch is next
            time.sleep(0.05)
        cluster.wait(busy)
        cluster.kill("tracker")
        events.append("tracker killed")
        time.sleep(1.0)
        cluster.start_tracker()
        cluster.wait(lambda s: sum(len(k.devices) for k in s.keys) >= 2 and busy(s))
        events.append("tracker restarted, both agents re-registered")
        victim = next(d.name for k in cluster.status().keys for d in k.devices if d.busy)
        cluster.kill(victim)
        events.append(f"{victim} killed while measuring")
        cluster.start_agent(victim)
        events.append(f"{victim} restarted")

    measure_opts = MeasureOptions(number=1, repeat=3, min_repeat_ms=50, timeout=5.0)
    options = TuningOptions(n_trials=trials, batch_size=8, tuner="random", top_k_remeasure=0, measure=measure_opts,
                            runner=RunnerSpec(kind="rpc", key="dev", port=cluster.port, token_file=str(tmp / "token")))
    log = TuningLog(tmp / "rpc_log")
    thread = threading.Thread(target=chaos, daemon=True)
    with cluster:
        cluster.start("agent0", "agent1")
        start = time.perf_counter()
        thread.start()
        summary = tune_task(matmul_task(32, 48, 64), Target.host(), options, log)
        thread.join(60)
        final = cluster.devices(2)
    records = [r for r in log.records() if r.tuner != REMEASURE]
    errors = Counter(r.result.error_no.name for r in records if r.result.error_no != MeasureErrorNo.no_error)
    return {"trials": summary.trials, "target": trials, "events": events, "errors": dict(errors),
            "dupes": len(records) - len({r.config.index for r in records}), "requeued": final.requeued,
            "seconds": time.perf_counter() - start}


# ---- 4. hostile network input ---------------------------------------------------------------------------

def hostile(tmp: Path, burst_n: int, slow_n: int) -> dict:
    import psutil

    from schemas import MeasureErrorNo, MeasureOptions, Target, matmul_task
    from stages.measure.builder import build_one
    from stages.rpc.client import RPCRunner
    from stages.rpc.tracker import IDLE_S
    from stages.templates import matmul
    from testing.hostile_rpc import (
        SlowConnections,
        Tally,
        bad_credentials,
        burst,
        malformed,
        oversized,
        replayed,
    )

    cluster = Cluster(tmp, TOKEN, max_body_mb=1)
    url = cluster.url
    tally = Tally()
    with cluster:
        tracker = psutil.Process(cluster.start("agent0").procs["tracker"].pid)
        burst(url, TOKEN, Tally(), 200)  # warm-up: the baseline includes the server's steady state
        time.sleep(2.0)
        rss0, fds0 = tracker.memory_info().rss / 2**20, tracker.num_fds()
        bad_credentials(url, TOKEN, tally, n=50)
        replayed(url, TOKEN, tally, n=100)
        malformed(url, TOKEN, tally, n=10)
        oversized(url, TOKEN, 1024 * 1024, tally, n=5)
        slow = SlowConnections("127.0.0.1", cluster.port, slow_n)
        try:
            fds_slow = tracker.num_fds()
            start = time.perf_counter()
            dropped = slow.closed_by_server(timeout=IDLE_S + 10)
            dropped_s = time.perf_counter() - start
            burst_s = burst(url, TOKEN, tally, burst_n)
        finally:
            slow.close()
        time.sleep(1.0)
        rss1, fds1 = tracker.memory_info().rss / 2**20, tracker.num_fds()
        restarts = int(cluster.procs["tracker"].poll() is not None) + int(cluster.procs["agent0"].poll() is not None)
        task, target = matmul_task(32, 48, 64), Target.host()
        space = matmul.space(task, target)
        builds = [build_one(task, space.config(i), target) for i in list(space.valid_indices())[::499][:4]]
        with RPCRunner(MeasureOptions(number=1, repeat=3, min_repeat_ms=5), "dev", url, TOKEN) as runner:
            served = sum(r.error_no == MeasureErrorNo.no_error for r in runner.run(builds))
    env = {k: v for k, v in os.environ.items() if k != "TUNAFLOW_RPC_TOKEN"}
    refused = tunaflow("tracker", "serve", "--host", "0.0.0.0", "--port", free_port(), timeout=60, env=env)
    return {"sent": tally.total, "by_kind": dict(tally.sent), "wrong": tally.wrong, "restarts": restarts,
            "rss": (rss0, rss1), "fds": (fds0, fds_slow, fds1), "burst_s": burst_s, "slow": slow_n,
            "dropped": dropped, "dropped_s": dropped_s, "idle_s": IDLE_S,
            "served": served, "refused": refused.returncode == 2 and "no RPC token" in refused.stderr,
            "refused_msg": refused.stderr.strip().splitlines()[-1] if refused.stderr.strip() else ""}


# ---- 5. mutated model files -----------------------------------------------------------------------------

def _fuzz_child(seeds: range, workdir: str, conn) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a runaway allocation fails, not the machine
    import warnings

    warnings.simplefilter("ignore")
    from testing.mutate_onnx import run_seeds

    conn.send(run_seeds(seeds, Path(workdir), time_limit_s=10.0))
    conn.close()


def fuzz(cases: int, tmp: Path, chunk: int = 500) -> dict:
    """`cases` seeded mutations in child processes; a dead child is a crash, a silent one a hang (the
    in-process 10 s bound catches Python-level hangs; this one catches native ones). A failed chunk is
    re-run one case per process to pin the case down."""
    ctx = mp.get_context("spawn")
    outcomes: dict[int, tuple[str, float]] = {}
    start = time.perf_counter()
    pending = [range(i, min(i + chunk, cases)) for i in range(0, cases, chunk)]
    while pending:
        seeds = pending.pop(0)
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_fuzz_child, args=(seeds, str(tmp), child))
        proc.start()
        child.close()
        kind = "hang"
        if parent.poll(len(seeds) * 10 + 60):
            try:
                outcomes.update(parent.recv())
                proc.join()
                continue
            except EOFError:
                kind = "crash"
        proc.kill()
        proc.join()
        if len(seeds) == 1:
            outcomes[seeds[0]] = (kind, 0.0)
        else:
            pending[:0] = [range(s, s + 1) for s in seeds]
    counts = Counter(o if o in ("ok", "ModelError", "hang", "crash") else "unexpected" for o, _ in outcomes.values())
    return {"cases": len(outcomes), "counts": counts, "seconds": time.perf_counter() - start,
            "slowest": max(s for _, s in outcomes.values()),
            "unexpected": sorted({o for o, _ in outcomes.values() if o not in ("ok", "ModelError")})[:5]}


# ---- 6. issue 21's attacks ------------------------------------------------------------------------------

ATTACK_MODULES = ("rpc", "artifact", "imports", "log", "cli")


def attacks(tmp: Path) -> list:
    """Every attack module's outcomes; a module that raises is itself a failed row, not a dead benchmark."""
    import importlib

    from attacks import Outcome

    outcomes: list[Outcome] = []
    for name in ATTACK_MODULES:
        work = tmp / name
        work.mkdir()
        start = time.perf_counter()
        try:
            outcomes += importlib.import_module(f"attacks.{name}").run(work)
        except Exception as exc:  # noqa: BLE001 - a broken attack module is reported as a crash
            outcomes.append(Outcome(0, f"attacks/{name}.py", f"raised {type(exc).__name__}: {exc}"[:300],
                                    held=False, crashes=1))
        print(f"attacks.{name}: {time.perf_counter() - start:.0f} s", flush=True)
    return outcomes


def attacks_report(outcomes: list) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    held = sum(o.held for o in outcomes)
    crashes, lost, runs = (sum(getattr(o, f) for o in outcomes) for f in ("crashes", "records_lost", "code_runs"))
    ok = held == len(outcomes) and crashes == lost == runs == 0
    rows = ["| # | attack | outcome | held |", "|---|---|---|---|"]
    rows += [f"| {o.group} | {cell(o.attack)} | {cell(o.outcome)} | {'yes' if o.held else '**no**'} |"
             for o in sorted(outcomes, key=lambda o: o.group)]
    return (f"Command: `.venv/bin/python benchmarks/faults.py --part attacks`\n\n"
            f"Goal: every attack held, 0 crashes, 0 records lost, 0 code runs without the token or key. "
            f"This run: **{held} / {len(outcomes)} held, {crashes} crashes, {lost} records lost, {runs} code "
            f"runs** ({'met' if ok else '**not met**'}). `#` is the finding's number in issue 21.\n\n"
            + "\n".join(rows) + "\n")


# ---- report ---------------------------------------------------------------------------------------------

def report(f: dict, k: dict, r: dict, h: dict, z: dict, args) -> str:
    goal = lambda ok: "yes" if ok else "**no**"  # noqa: E731
    rows = [
        "| figure | value | goal | met |",
        "|---|---|---|---|",
        f"| faults injected / recorded with the right code | {f['injected']} / {f['right']} | all | "
        f"{goal(f['injected'] == f['right'] and f['injected'] > 0)} |",
        f"| faulty configs reported, applied or measured as good | {f['wrongly_chosen']} | 0 | "
        f"{goal(f['wrongly_chosen'] == 0)} |",
        f"| tuner kills (SIGKILL) survived / durable records lost / partial batches / duplicates | "
        f"{k['survived']}/{k['kills']} / {k['lost']} / {k['partial']} / {k['dupes']} | all / 0 / 0 / 0 | "
        f"{goal(k['survived'] == k['kills'] and k['lost'] == k['partial'] == k['dupes'] == 0)} |",
        f"| resumed session's trials / budget | {k['final_trials']} / {k['trials']} | equal | "
        f"{goal(k['final_trials'] == k['trials'])} |",
        f"| RPC session with tracker + agent killed: trials / budget, duplicates | {r['trials']} / {r['target']}, "
        f"{r['dupes']} | equal, 0 | {goal(r['trials'] == r['target'] and r['dupes'] == 0)} |",
        f"| hostile requests sent / wrong responses / server restarts | {h['sent']} / {len(h['wrong'])} / "
        f"{h['restarts']} | - / 0 / 0 | {goal(not h['wrong'] and h['restarts'] == 0)} |",
        f"| fuzz cases / crashes / hangs / unexpected exceptions | {z['cases']} / {z['counts']['crash']} / "
        f"{z['counts']['hang']} / {z['counts']['unexpected']} | - / 0 / 0 / 0 | "
        f"{goal(z['counts']['crash'] + z['counts']['hang'] + z['counts']['unexpected'] == 0)} |",
    ]
    by_kind = ", ".join(f"{n} {kind}" for kind, n in sorted(f["by_kind"].items()))
    hostile_kinds = ", ".join(f"{kind} {n}" for kind, n in h["by_kind"].items())
    notes = [
        "",
        f"1. **Faulty candidates**: {f['trials']} trials of matmul 48x64x32 (lgbm tuner, batches of 16), "
        f"`fault_rate={args.rate}`: {by_kind}. Runner worker restarted {f['restarts']} times; "
        f"errors among clean candidates: {f['clean_errors'] or 'none'}; best {f['best_gflops']:.1f} GFLOPS "
        f"(a clean config); {f['seconds']:.0f} s." + (f" Mis-recorded: {f['wrong']}" if f["wrong"] else ""),
        f"2. **kill -9 and resume**: `tunaflow tune-op matmul --m 24 --n 40 --k 32 --trials {k['trials']} "
        f"--batch-size {args.batch} --no-prefect` killed {k['kills']} times at {k['moments'][0]:.1f}-"
        f"{k['moments'][1]:.1f} s after start (start-up, build, measurement, log append, model retraining), "
        f"resumed each time; unreadable log parts {k['problems']}; runs that finished before their kill "
        f"{k['finished_early']}. Only the in-flight batch is lost: a batch is appended as one atomic Parquet part.",
        f"3. **Tracker and agent killed** during an RPC session ({r['target']} trials, 2 agents, batches of 8): "
        f"{'; '.join(r['events'])}. Errors recorded: {r['errors'] or 'none'} (jobs the dead tracker held come "
        f"back as `unknown` errors, recorded once; a rerun measures them again, and they do not count toward its "
        f"budget); tracker requeues after the restart "
        f"{r['requeued']}; {r['seconds']:.0f} s.",
        f"4. **Hostile input** to the tracker (HMAC-signed requests, 1 MiB body limit): {hostile_kinds}; "
        f"{h['slow']} slowloris connections (half a request, then nothing): {h['dropped']} closed by the tracker "
        f"within {h['dropped_s']:.1f} s (it drops a connection idle for {h['idle_s']:g} s; until then, past 256 "
        f"open connections, uvicorn answers new requests 503); then a {h['by_kind'].get('burst', 0)}-request burst "
        f"(64 concurrent, {h['burst_s']:.1f} s). Tracker RSS {h['rss'][0]:.0f} -> "
        f"{h['rss'][1]:.0f} MiB, file descriptors {h['fds'][0]} before -> {h['fds'][1]} with the slow connections "
        f"open -> {h['fds'][2]} after. Real work after: {h['served']}/4 candidates "
        f"measured. `tracker serve --host 0.0.0.0` without a token: "
        f"{'refused, exit 2' if h['refused'] else 'NOT refused'} ({h['refused_msg']})."
        + (f" Wrong: {h['wrong'][:5]}" if h["wrong"] else ""),
        f"5. **Mutated models**: {z['cases']} cases (bundled cnn/mlp/transformer; byte edits or message edits: "
        f"op types, wiring, attributes, initializers, I/O shapes and types, opset) through import, passes and "
        f"task extraction, 10 s bound per case, 4 GiB address-space limit: {z['counts']['ok']} imported, "
        f"{z['counts']['ModelError']} ModelError; slowest case {z['slowest'] * 1000:.0f} ms; {z['seconds']:.0f} s."
        + (f" Unexpected: {z['unexpected']}" if z["unexpected"] else ""),
    ]
    return f"Command: `{COMMAND}`\n\n" + "\n".join(rows) + "\n" + "\n".join(notes) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--kill-trials", type=int, default=400)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rpc-trials", type=int, default=48)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=500)
    parser.add_argument("--fuzz", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--part", choices=("all", "classic", "attacks"), default="all",
                        help="classic: sections 1-5 (faulty candidates ... mutated models); attacks: issue 21's")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    args = parser.parse_args()
    if args.part in ("all", "attacks"):
        with tempfile.TemporaryDirectory(prefix="tf-attacks-") as tmp:
            body = attacks_report(attacks(Path(tmp)))
        print(body)
        if not args.no_write:
            replace_section("faults:attacks", "Attacks: issue 21 (`benchmarks/faults.py --part attacks`)", body)
    if args.part == "attacks":
        return
    with tempfile.TemporaryDirectory(prefix="tf-faults-") as tmp:
        tmp = Path(tmp)
        for sub in ("session", "kill", "rpc", "hostile", "fuzz"):
            (tmp / sub).mkdir()
        f = faulty_session(args.trials, args.rate, args.seed, tmp / "session")
        print("faults", f, flush=True)
        k = kill_resume(args.kills, args.kill_trials, args.batch, args.seed, tmp / "kill")
        print("kills", k, flush=True)
        r = rpc_kills(args.rpc_trials, tmp / "rpc")
        print("rpc", r, flush=True)
        h = hostile(tmp / "hostile", args.burst, args.slow)
        print("hostile", {k: v for k, v in h.items() if k != "wrong"}, h["wrong"][:5], flush=True)
        z = fuzz(args.fuzz, tmp / "fuzz")
        print("fuzz", z, flush=True)
    body = report(f, k, r, h, z, args)
    print(body)
    if not args.no_write:
        replace_section("faults", "Reliability and security (`benchmarks/faults.py`)", body)


if __name__ == "__main__":
    main()
