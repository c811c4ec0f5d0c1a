"""One run of a batch job version into ``eos_kafka``, as a Spark application of its own (a
scheduler's attempt): 400 rows ``(k<i>, v<i>|<rand()>)`` repartitioned into
``--partitions`` tasks, each row taking ``--row-ms`` in a Python UDF, the first row of
each task waiting until the file ``--wait-for`` exists (the test's go-ahead). Exits 0
once the write returned, 3 with ``RUN-FAILED <why>`` when it failed. The run A of the
two-runs tests (tests/spark/test_batch_write.py, tests/system/test_cluster_job_runs.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--options", required=True, help="the eos_kafka options, as JSON")
    parser.add_argument("--master", default=None, help="spark://... (default: local[1])")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--row-ms", type=float, default=15)
    parser.add_argument("--wait-for", default="", help="a file each task waits for first")
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from eos_connectors.ops.session import local_session

    go, pause = args.wait_for, args.row_ms / 1000

    def slowly(value: str) -> str:
        deadline = time.time() + 120
        while go and not os.path.exists(go) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(pause)
        return value

    conf = {"spark.cores.max": "1"}  # on a cluster: leave the other core to the other run
    spark = local_session("eos-version-run", cores=1, conf=conf, master=args.master)
    rows = [(f"k{i}", f"v{i}") for i in range(400)]
    df = spark.createDataFrame(rows, "key string, value string")
    noisy = F.concat(F.col("value"), F.lit("|"), F.rand().cast("string"))
    out = df.repartition(args.partitions).select(
        "key", F.udf(slowly, "string")(noisy).alias("value")
    )
    try:
        out.write.format("eos_kafka").options(**json.loads(args.options)).mode("append").save()
    except Exception as exc:  # the run that lost: the test reads why
        print("RUN-FAILED", exc, flush=True)
        sys.exit(3)
    finally:
        spark.stop()
    print("RUN-WROTE", flush=True)


if __name__ == "__main__":
    main()
