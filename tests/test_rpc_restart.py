"""The tracker killed (SIGKILL) mid-batch and restarted: the client gets one result per candidate (the
lost jobs as `unknown` errors), the agent registers again by itself, and the next batch measures."""

from __future__ import annotations

import threading
from itertools import islice

from test_measure_kernels import FAST, TASK
from test_rpc import TOKEN

from schemas import MeasureErrorNo, MeasureResult
from stages.measure.builder import build_one
from stages.templates import matmul
from testing.cluster import Cluster


def builds(target, n: int, skip: int = 0):
    space = matmul.space(TASK, target)
    return [build_one(TASK, space.config(i), target) for i in islice(space.valid_indices(), skip, skip + 7 * n, 7)]


def test_a_tracker_killed_mid_batch_comes_back_and_serves(tmp_path, host):
    with Cluster(tmp_path, TOKEN, agent_timeout=1.0) as c:
        c.start("a")
        slow = FAST.model_copy(update={"min_repeat_ms": 250.0, "repeat": 2})
        results: list[MeasureResult] = []
        with c.runner(slow) as runner:
            worker = threading.Thread(target=lambda: results.extend(runner.run(builds(host, 3))))
            worker.start()
            c.wait(lambda s: any(d.busy for k in s.keys for d in k.devices), timeout=30)
            c.kill("tracker")
            c.start_tracker()
            worker.join(120)
            assert len(results) == 3
            lost = [r for r in results if r.error_no == MeasureErrorNo.unknown]
            assert lost and all("lost the job" in r.error_msg for r in lost)
            assert all(r.ok for r in results if r not in lost)
            c.devices(1)
            after = runner.run(builds(host, 2, skip=50))
        assert [r.error_no for r in after] == [MeasureErrorNo.no_error] * 2, [r.error_msg for r in after]
