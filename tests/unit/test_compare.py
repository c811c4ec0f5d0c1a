"""The comparison's arithmetic: per-record latency from what a reader saw, commit times,
the targets' verdicts, and the choice of pipelines."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.dev.compare import pipelines as pl
from eos_connectors.dev.compare import report, runner
from eos_connectors.dev.compare.command import _chosen
from eos_connectors.dev.compare.process import CpuClock


def test_a_record_is_visible_when_its_keys_count_reaches_it() -> None:
    stamps = {"a": [10.0, 10.1, 10.2], "b": [10.0]}
    seen = runner.Visibility()
    seen.note({"a": 2}, 11.0)  # a's first two records
    seen.note({"a": 2, "b": 1}, 11.5)  # a unchanged: nothing new for a
    seen.note({"a": 3}, 12.0)
    assert seen.total() == 4
    latencies = runner._latencies(stamps, seen, since=0.0, until=100.0)
    assert sorted(round(x) for x in latencies) == [900, 1000, 1500, 1800]


def test_latency_window_drops_warm_up_records_and_anything_seen_after_the_kill() -> None:
    stamps = {"a": [1.0, 5.0, 6.0]}
    seen = runner.Visibility()
    seen.note({"a": 2}, 5.5)
    seen.note({"a": 3}, 9.0)  # after the kill at 8.0: recovery, not steady state
    assert [round(x) for x in runner._latencies(stamps, seen, since=4.0, until=8.0)] == [500]


def test_a_count_that_goes_back_is_not_a_new_visibility() -> None:
    seen = runner.Visibility()
    seen.note({"a": 3}, 1.0)
    seen.note({"a": 2}, 2.0)  # an at-least-once replay re-publishing an older count
    assert seen.seen["a"] == [(3, 1.0)] and seen.total() == 3


def _target(tmp_path: Path, key: str) -> pl.Target:
    target = pl.Target(pl.BY_KEY[key], "in", "r1", tmp_path)
    return target


def test_spark_commit_time_is_the_slowest_task_commit_plus_the_commit_log(tmp_path: Path) -> None:
    target = _target(tmp_path, "eos-kafka")
    lines = [{"batch": 1, "ms": 5.0}, {"batch": 1, "ms": 9.0}, {"batch": 2, "ms": 4.0}]
    target.commit_times.write_text("".join(json.dumps(line) + "\n" for line in lines))
    batches = [
        {"batch": 1, "durations": {"commitOffsets": 50, "addBatch": 900}},
        {"batch": 2, "durations": {"commitOffsets": 40, "addBatch": 700}},
    ]
    assert runner._commit_times(batches, target) == [59.0, 44.0]
    stages = runner._stages(batches, target)
    assert stages["addBatch"] == 800 and stages["sink commit (part of addBatch)"] == 6.5


def test_other_engines_report_their_own_commit_time(tmp_path: Path) -> None:
    batches = [{"commit_ms": 3.5, "records": 10}, {"commit_ms": 4.5, "records": 10}]
    assert runner._commit_times(batches, _target(tmp_path, "raw")) == [3.5, 4.5]


def _result(key: str, records: int, seconds: float, **stages: float) -> runner.Result:
    result = runner.Result(pl.BY_KEY[key], records=records, seconds=seconds)
    result.stages_ms = dict(stages)
    return result


def test_targets_say_met_or_where_the_time_goes() -> None:
    results = [
        _result("eos-kafka", 1000, 1.0, addBatch=800.0, walCommit=50.0, triggerExecution=900.0),
        _result("eos-kafka-alo", 1000, 1.0),
        _result("spark-kafka", 2000, 1.0),
    ]
    rows = "\n".join(report.targets_table(results))
    assert "(1) >= 0.95x (2): Kafka | 1.00x | - | yes |" in rows
    assert "JVM Kafka connector | 0.50x | - | **no**: eos-kafka spends 800 of 900 ms" in rows
    assert "addBatch" in rows
    assert "Quix Streams | not measured | - | - |" in rows
    assert "p50 latency <= 1.3x (3)'s | not measured | - | - |" in rows


def test_latency_and_recovery_targets_compare_with_the_jvm_connector() -> None:
    eos, jvm = _result("eos-kafka", 1000, 1.0), _result("spark-kafka", 1000, 1.0)
    eos.latencies_ms, jvm.latencies_ms = [600.0] * 10, [500.0] * 10
    eos.recovery_s, jvm.recovery_s = 14.0, 10.0
    rows = "\n".join(report.targets_table([eos, jvm]))
    assert "| (1) p50 latency <= 1.3x (3)'s | 1.20x (600 vs 500 ms) | - | yes |" in rows
    assert "| (1) recovery <= (3)'s + 3 s | +4.0 s (14.0 vs 10.0 s) | - | **no**: see the" in rows
    eos.latencies_ms = [700.0] * 10
    assert "| 1.40x (700 vs 500 ms) | - | **no**" in "\n".join(report.targets_table([eos, jvm]))


def test_a_pipeline_reports_its_median_round_and_a_ratio_pairs_rounds() -> None:
    # Rounds of one pipeline: 1,000, 1,200 and 900 records/s; the median round's figures
    # stand for it. The baseline ran 1,000, 1,000 and 800 in the same rounds: the ratio is
    # the median of 1.00, 1.20 and 1.125, not 1,000 / 1,000.
    eo = runner.median_round([_result("eos-kafka", r, 1.0) for r in (1000, 1200, 900)])
    alo = runner.median_round([_result("eos-kafka-alo", r, 1.0) for r in (1000, 1000, 800)])
    assert (eo.rate, eo.round_rates) == (1000, [1000, 1200, 900])
    ratio, spread = report.paired_ratio(eo, alo)
    assert ratio == pytest.approx(1.125) and spread == " (1.00-1.20 in 3 rounds)"
    assert "| (1) >= 0.95x (2): Kafka | 1.12x (1.00-1.20 in 3 rounds) | - | yes |" in "\n".join(
        report.targets_table([eo, alo])
    )
    assert report.paired_ratio(_result("eos-kafka", 900, 1.0), alo) == (0.9, "")
    near = "\n".join(
        report.targets_table([_result("eos-kafka", 948, 1.0), _result("eos-kafka-alo", 1000, 1.0)])
    )
    assert "| (1) >= 0.95x (2): Kafka | 0.948x | - | **no**" in near  # not "0.95x ... no"


def test_the_results_table_has_a_row_per_pipeline_with_ratios_to_eos_kafka() -> None:
    failed = runner.Result(pl.BY_KEY["quix"], error="the pipeline exited (1) before start")
    rows = report.results_table(
        [_result("eos-kafka", 1000, 2.0), _result("raw", 3000, 2.0), failed]
    )
    assert len(rows) == 5
    assert "| (1) | eos_kafka -> count -> eos_kafka | exactly-once | 500 | 1.00x |" in rows[2]
    assert "| 1,500 | 3.00x |" in rows[3]
    assert "failed: the pipeline exited (1) before start" in rows[4]


def test_latency_quantiles() -> None:
    result = runner.Result(pl.BY_KEY["raw"], latencies_ms=[float(x) for x in range(1, 101)])
    assert result.latency(0.5) == pytest.approx(50.5, abs=0.6)
    assert result.latency(0.99) == pytest.approx(99, abs=1.1)
    assert runner.Result(pl.BY_KEY["raw"]).latency(0.5) is None


def test_unknown_pipelines_are_named_with_the_choices() -> None:
    assert [p.key for p in _chosen("raw, quix, raw")] == ["raw", "quix"]
    with pytest.raises(ConfigError, match=r"unknown flink.*choose from eos-kafka"):
        _chosen("raw,flink")


def test_every_pipeline_has_a_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eos_connectors.dev.compare import jars
    from eos_connectors.dev.endpoints import Endpoints
    from eos_connectors.dev.harness.spec import PipelineSpec

    monkeypatch.setattr(jars, "spark_kafka_jars", lambda: [Path("/jars/spark-sql-kafka.jar")])
    endpoints = Endpoints("127.0.0.1:9092", "postgresql://u:p@h/db", "redis://h/0")
    for pipeline in pl.PIPELINES:
        argv = pl.command(_target(tmp_path, pipeline.key), endpoints, 5000)
        assert argv and all(isinstance(a, str) for a in argv)
        assert "u:p@" not in " ".join(argv)  # credentials travel in the 0600 spec file
        if pipeline.spark:
            spec = PipelineSpec.read(Path(argv[-1]))
            (query,) = spec.queries
            assert spec.max_offsets == 5000
            assert query.source == ("eos_kafka" if pipeline.engine == "eos" else "kafka")
            if pipeline.engine == "eos":
                assert query.options["deliveryGuarantee"] == pipeline.guarantee
            else:
                assert "spark-sql-kafka" in spec.conf["spark.jars"]


def test_a_tasks_steps_add_up_to_its_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eos_connectors.core.timing import TaskSteps

    clock = iter([0.0, 1.0, 3.0, 3.25, 3.25, 3.5, 4.0, 10.0])
    monkeypatch.setattr("eos_connectors.core.timing.time.perf_counter", lambda: next(clock))
    monkeypatch.setenv("EOS_COMMIT_TIMES", str(tmp_path / "times.jsonl"))
    steps = TaskSteps("sink write", 4, rest="produce")  # began at 0
    steps.add("client set-up", steps.began)  # 1 s
    assert list(steps.pulled("waiting for rows", iter(["rows"]))) == ["rows"]  # 0.25 s twice
    steps.add("commit", 3.5)  # 4.0: 0.5 s
    steps.record()  # 10 s in all
    lines = [json.loads(line) for line in (tmp_path / "times.jsonl").read_text().splitlines()]
    seconds = {line["stage"]: line["ms"] / 1000 for line in lines}
    assert [line["stage"] for line in lines if "began" in line] == ["sink write"]  # a timeline
    assert seconds == {
        "sink write": 10.0,
        "sink write: client set-up": 1.0,
        "sink write: waiting for rows": 0.5,
        "sink write: commit": 0.5,
        "sink write: produce": 8.0,
    }
    target = _target(tmp_path, "eos-kafka")
    target.commit_times.write_text((tmp_path / "times.jsonl").read_text())
    stages = runner._task_stages(target)
    result = _result("eos-kafka", 1000, 1.0, **stages)
    table = "\n".join(report.steps_table([result, _result("spark-kafka", 1000, 1.0)]))
    assert "| sink write: client set-up | sink write: waiting for rows |" in table
    assert "| eos_kafka -> count -> eos_kafka | exactly-once | 1,000 | 500 | 500 | 8,000 |" in table
    assert "Spark kafka" not in table
    assert report.steps_table([_result("spark-kafka", 1000, 1.0)]) == []


def test_the_latency_phase_has_its_own_profile() -> None:
    paced = _result("eos-kafka", 1000, 1.0)
    paced.latency_stages_ms = {"batch interval": 1200.0, "addBatch": 700.0}
    table = "\n".join(report.profile_table([paced, _result("raw", 1, 1.0)], paced=True))
    assert "| pipeline | guarantee | batch interval | addBatch |" in table
    assert "| eos_kafka -> count -> eos_kafka | exactly-once | 1,200 | 700 |" in table
    assert "raw" not in table
    assert "batch interval" not in "\n".join(report.profile_table([paced]))


_SPIN_THEN_SLEEP = """
import sys, time
while time.process_time() < 0.5:
    pass
print(time.time(), flush=True)
time.sleep(0.6)
"""


def test_the_cpu_clock_counts_a_process_tree_between_two_moments() -> None:
    # A real child spins for 0.5 s of CPU, says when, sleeps 0.6 s and exits; the clock
    # samples it throughout and after it exited.
    child = subprocess.Popen(
        [sys.executable, "-c", _SPIN_THEN_SLEEP], stdout=subprocess.PIPE, text=True
    )
    clock = CpuClock()
    tree = [psutil.Process(child.pid)]
    clock.sample(tree)
    began = clock.samples[0][0]
    spun: list[float] = []
    reader = threading.Thread(target=lambda: spun.append(float(child.stdout.readline())))  # type: ignore[union-attr]
    reader.start()
    while child.poll() is None:
        clock.sample(tree)
        time.sleep(0.02)
    for _ in range(3):
        clock.sample(tree)
        time.sleep(0.02)
    reader.join()
    ended = clock.samples[-1][0]
    spinning = clock.between(began, spun[0])
    sleeping = clock.between(spun[0] + 0.1, spun[0] + 0.5)
    assert spinning is not None and sleeping is not None
    assert 0.4 < spinning[0] < 0.7 and spinning[1] is None  # no broker on this clock
    assert sleeping[0] < 0.05
    whole = clock.between(began, ended)
    assert whole is not None and whole[0] >= 0.45  # the exited child keeps what it used
    assert clock.between(began - 10, ended) is None  # before the first sample: unknown
    assert clock.between(began, ended + 10) is None  # after the last one: unknown


def test_the_cpu_table_gives_milliseconds_per_thousand_records() -> None:
    eo = _result("eos-kafka", 2000, 2.0)
    eo.cpu_s = {"pipeline": 0.03, "broker": 0.01}
    alo = _result("eos-kafka-alo", 2000, 2.0)
    alo.cpu_s = {"pipeline": 0.02}  # the broker is not on this machine
    lines = report.cpu_table([eo, alo, _result("raw", 10, 1.0)])
    assert "| eos_kafka -> count -> eos_kafka | exactly-once | 15.0 | 5.0 | 20.0 |" in lines
    assert "| eos_kafka -> count -> eos_kafka | at-least-once | 10.0 | - | - |" in lines
    assert sum(line.startswith("| eos_kafka") for line in lines) == 2  # raw: not measured
    assert report.cpu_table([_result("raw", 10, 1.0)]) == []


def test_records_per_second_leaves_the_first_half_of_the_phase_out_as_warm_up() -> None:
    # After the start-up batch, ten batches of 100 records: batches 0-4 warm up; the
    # clock starts at batch 4's commit, and batches 5-9 are measured.
    batches = [{"batch": i, "records": 100, "t": float(i)} for i in range(10)]
    clock, *measured = runner.warmed_up(batches, "eos-kafka")
    assert clock["batch"] == 4 and [b["batch"] for b in measured] == [5, 6, 7, 8, 9]
    # Uneven batches (Quix's commits): the window starts at the first batch after half
    # of the records, whichever batch that is.
    uneven = [{"records": n, "t": float(i)} for i, n in enumerate((700, 100, 100, 100))]
    clock, *measured = runner.warmed_up(uneven, "quix")
    assert clock["t"] == 0.0 and len(measured) == 3
    with pytest.raises(AssertionError, match="too few to leave out a warm-up"):
        runner.warmed_up([{"records": 100, "t": 0.0}], "raw")


def test_the_targets_show_each_throughput_ratio_of_the_warm_up_half_too() -> None:
    # Three rounds each: measured 1,000/1,000/900 against 1,000 each (median 1.00x);
    # the warm-up halves ran 500, 450 and 400 against 600 (median 0.75x).
    def rounds(key: str, rates: tuple[int, ...], warm: tuple[int, ...]) -> runner.Result:
        results = [_result(key, r, 1.0) for r in rates]
        for result, w in zip(results, warm, strict=True):
            result.warmup_records, result.warmup_seconds = w, 1.0
        return runner.median_round(results)

    eo = rounds("eos-kafka", (1000, 1000, 900), (500, 450, 400))
    alo = rounds("eos-kafka-alo", (1000, 1000, 1000), (600, 600, 600))
    assert eo.round_warmup_rates == [500, 450, 400]
    assert report.paired_ratio(eo, alo, warmup=True) == (0.75, " (0.67-0.83 in 3 rounds)")
    rows = "\n".join(report.targets_table([eo, alo]))
    assert (
        "| (1) >= 0.95x (2): Kafka | 1.00x (0.90-1.00 in 3 rounds) | 0.75x (0.67-0.83 in "
        "3 rounds) | yes |" in rows
    )
