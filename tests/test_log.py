import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.log_records import TASK, log_with_a_torn_part, rec

from schemas import TuningRecord
from stages.log import LogError, TuningLog, merge
from stages.log.store import SCHEMA, VERSION_KEY, to_table
from testing.cli import tunaflow


def test_arrow_schema_is_derived_from_the_model():
    assert SCHEMA.names == list(TuningRecord.model_fields)
    assert SCHEMA.metadata[VERSION_KEY.encode()] == b"1"
    assert pa.types.is_timestamp(SCHEMA.field("result").type.field("timestamp").type)


def test_round_trip_preserves_records(tmp_path):
    log = TuningLog(tmp_path / "log")
    batch = [rec(0, 1e-3), rec(1, None), rec(2, 5e-4)]
    part = log.append(batch)
    assert part is not None and part.suffix == ".parquet"
    back = log.records()
    assert back == batch
    assert back[0].result.timestamp.tzinfo is not None
    assert list(back[0].config.knobs) == ["mr", "vw", "order"]


def test_append_many_batches_and_best(tmp_path):
    log = TuningLog(tmp_path / "log")
    log.append([rec(0, 3e-3), rec(1, None)])
    log.append([rec(2, 1e-3), rec(3, 2e-3)])
    log.append([rec(4, 1e-4, target="other")])
    assert len(log.parts()) == 3
    best = log.best(TASK.signature, "tk")
    assert best is not None and best.trial == 2
    assert log.best(TASK.signature, "nope") is None
    assert log.best("0" * 16, "tk") is None
    assert len(log.for_task(TASK.signature, "tk")) == 4


def test_failed_records_never_best(tmp_path):
    log = TuningLog(tmp_path / "log")
    log.append([rec(0, None), rec(1, None)])
    assert log.best(TASK.signature, "tk") is None


def test_other_schema_version_names_file_and_versions(tmp_path):
    log = TuningLog(tmp_path / "log")
    log.append([rec(0, 1e-3)])
    table = to_table([rec(1, 1e-3)]).replace_schema_metadata({VERSION_KEY: "99"})
    bad = tmp_path / "log" / "part-99999999-bad.parquet"
    pq.write_table(table, bad)
    with pytest.raises(LogError, match=r"part-99999999-bad\.parquet: schema version 99, this tunaflow reads version 1"):
        log.records()
    good, problems = log.read(strict=False)
    assert len(good) == 1 and len(problems) == 1 and problems[0].path == bad


def test_garbage_part_is_skipped_with_a_warning_naming_it(tmp_path, caplog):
    log = TuningLog(tmp_path / "log")
    log.append([rec(0, 1e-3)])
    (tmp_path / "log" / "part-zzz.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(LogError, match="part-zzz.parquet: not a readable Parquet file"):
        log.read(strict=True)
    assert [r.trial for r in log.records()] == [0]
    assert "part-zzz.parquet: not a readable Parquet file" in caplog.text and "skipped" in caplog.text
    assert [p.path.name for p in log.skipped] == ["part-zzz.parquet"]
    good, problems = log.read(strict=False)
    assert len(good) == 1 and "part-zzz" in problems[0].reason


def test_log_path_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(LogError, match="directory"):
        TuningLog(f)


WRITER = """
import sys
from tests.support.log_records import rec
from stages.log import TuningLog
log = TuningLog(sys.argv[1])
i = 0
while True:
    log.append([rec(i * 500 + j, 1e-3) for j in range(500)])
    i += 1
    print(i, flush=True)
"""


def test_killed_writer_leaves_a_readable_log(tmp_path):
    """kill -9 a process appending big batches in a loop: every committed part reads back whole."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "log")], cwd=root,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.readline()
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    log = TuningLog(tmp_path / "log")
    records = log.records()
    assert len(records) >= 1000
    assert len(records) % 500 == 0
    assert len(records) == 500 * len(log.parts())


def test_merge_skips_duplicates_and_export_jsonl(tmp_path):
    a, b = TuningLog(tmp_path / "a"), TuningLog(tmp_path / "b")
    a.append([rec(0, 1e-3), rec(1, 2e-3)])
    b.append([rec(0, 1e-3), rec(0, 5e-4, session="s2")])
    assert merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m") == 3
    assert merge([tmp_path / "b"], tmp_path / "m") == 0
    out = tmp_path / "m.jsonl"
    assert TuningLog(tmp_path / "m").export_jsonl(out) == 3
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(x["session_id"], x["trial"]) for x in lines} == {("s1", 0), ("s1", 1), ("s2", 0)}
    assert TuningRecord.model_validate(lines[0]).task_signature == TASK.signature


def test_check_and_repair_move_bad_parts_aside_and_keep_good_rows(tmp_path):
    root = tmp_path / "log"
    log = TuningLog(root)
    log.append([rec(0, 1e-3), rec(1, 2e-3)])
    (root / "part-zero.parquet").write_bytes(b"")
    table = to_table([rec(2, 1e-3), rec(3, 1e-3)])
    rows = table.to_pylist()
    rows[1]["trial"] = -5
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), root / "part-halfbad.parquet")
    records, problems = log.read(strict=False)
    assert len(records) == 3
    assert {p.path.name for p in problems} == {"part-zero.parquet", "part-halfbad.parquet"}
    assert any("row 1 fails validation: trial" in p.reason for p in problems)
    r = tunaflow("log", "check", root)
    assert r.returncode == 1 and "part-zero.parquet" in r.stdout
    r = tunaflow("log", "check", root, "--repair")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (root / "quarantine").iterdir()) == ["part-halfbad.parquet", "part-zero.parquet"]
    assert sorted(x.trial for x in log.records()) == [0, 1, 2]
    assert log.read(strict=False)[1] == []


def test_best_prefers_the_remeasured_top_k_over_a_lucky_single_trial(tmp_path):
    log = TuningLog(tmp_path / "log")
    lucky = rec(0, 1e-4, index=7)
    steady = rec(1, 5e-4, index=8)
    remeasured = steady.model_copy(update={"tuner": "remeasure", "trial": 2})
    log.append([lucky, steady])
    assert log.best(TASK.signature, "tk").config.index == 7
    log.append([remeasured])
    best = log.best(TASK.signature, "tk")
    assert best.tuner == "remeasure" and best.config.index == 8


def test_truncated_part_is_reported_and_the_rest_still_reads(tmp_path):
    log, part = log_with_a_torn_part(tmp_path / "log")
    good, problems = log.read(strict=False)
    assert [r.trial for r in good] == [0]
    assert len(problems) == 1 and problems[0].path == part and "not a readable Parquet file" in problems[0].reason


def test_parts_are_parsed_once_and_a_changed_or_damaged_part_is_read_again(tmp_path, monkeypatch):
    """Whole parts are kept parsed across reads (a tuning run reads its log once per task and round); a part
    rewritten in place, a new part and a damaged part are read from disk every time."""
    import stages.log.store as store

    log = TuningLog(tmp_path / "log")
    first = log.append([rec(0, 1e-3), rec(1, 2e-3)])
    log.append([rec(2, 3e-3)])
    assert [r.trial for r in log.records()] == [0, 1, 2]
    calls = []
    real = store._read_part
    monkeypatch.setattr(store, "_read_part", lambda part: calls.append(part.name) or real(part))
    assert [r.trial for r in log.records()] == [0, 1, 2] and calls == []  # nothing parsed again
    new = log.append([rec(3, 4e-3)])
    assert [r.trial for r in log.records()] == [0, 1, 2, 3] and calls == [new.name]
    pq.write_table(to_table([rec(7, 5e-3)]), first)  # the same name, other content
    assert [r.trial for r in log.records()] == [7, 2, 3] and calls == [new.name, first.name]
    torn = log.append([rec(4, 1e-3)])
    torn.write_bytes(torn.read_bytes()[:100])
    half = log.append([rec(5, 1e-3), rec(6, 1e-3)])
    table = pq.read_table(half)
    pq.write_table(table.set_column(table.schema.get_field_index("trial"), "trial", pa.array([5, -1])), half)
    for _ in range(2):
        records, problems = log.read(strict=False)
        assert [r.trial for r in records] == [7, 2, 3, 5] and [p.path for p in problems] == [torn, half]
    assert calls.count(torn.name) == 2 and calls.count(half.name) == 2
