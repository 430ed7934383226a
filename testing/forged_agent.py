"""An agent holding the token that lies about its results (tests and attacks): it is the real agent, but
after measuring each job it posts, in turn, the honest result or one of FORGERIES.

    python -m testing.forged_agent --tracker http://127.0.0.1:9190 --key dev
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging

from schemas.measure import MeasureResult
from schemas.rpc import ResultPost
from schemas.target import Target
from stages.rpc.agent import Agent
from stages.rpc.auth import load_token

NAN, INF = float("nan"), float("inf")
FORGERIES: dict[str, dict] = {
    "nan": {"costs": [NAN, NAN, NAN]},
    "zero": {"costs": [0.0, 0.0, 0.0]},
    "negative": {"costs": [-1e-3, -1e-3, -1e-3]},
    "1e-12": {"costs": [1e-12, 1e-12, 1e-12]},
    "inf": {"costs": [INF]},
    "nan run_s": {"costs": [1e-3], "run_s": NAN},
    "malformed": {"costs": "fast", "error_no": 99},
    "success without timings": {"costs": []},
}


class ForgedAgent(Agent):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._kinds = itertools.cycle(["honest", *FORGERIES])

    def _post_result(self, job_id: str, result: MeasureResult) -> None:
        kind = next(self._kinds)
        if kind == "honest":
            return super()._post_result(job_id, result)
        raw = {**ResultPost.of(job_id, result).model_dump(mode="json")["result"], **FORGERIES[kind]}
        body = json.dumps({"job_id": job_id, "result": raw}).encode()  # NaN and Infinity as Python writes them
        self._http.post(f"/v1/agents/{self.agent_id}/result", content=body,
                        headers={"content-type": "application/json"}).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracker", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    agent = ForgedAgent(args.tracker, args.key, load_token(), Target.host(), "forger")
    with contextlib.closing(agent), contextlib.suppress(KeyboardInterrupt):
        agent.serve()


if __name__ == "__main__":
    main()
