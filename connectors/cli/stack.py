"""``eos stack``: the local Kafka, PostgreSQL and Redis services (and a Spark cluster)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start the services (reuses running ones)")
    up.add_argument(
        "--spark-workers",
        type=int,
        default=0,
        metavar="N",
        help="also start a Spark standalone master and N one-core workers on loopback",
    )
    up.add_argument(
        "--hdfs",
        action="store_true",
        help="also start HDFS (a NameNode and a DataNode) on loopback, for checkpoints on "
        "shared storage; its URL is EOS_HDFS_URL in `eos stack env`",
    )
    up.add_argument(
        "--kafka-brokers",
        type=int,
        default=None,
        metavar="N",
        help="1 broker (the default), or a replicated KRaft cluster of N >= 3 brokers "
        "(replication factor N, min.insync.replicas N-1), nodes named kafka-1..kafka-N; "
        "kept until `eos stack down`",
    )
    for action, text in [
        ("down", "stop the services (and the Spark cluster) the stack started"),
        ("status", "show which services run (exit 3 unless all do)"),
        ("env", 'print EOS_* endpoint exports for a shell: eval "$(eos stack env)"'),
    ]:
        actions.add_parser(action, help=text)
    restart = actions.add_parser("restart", help="restart one service on the same port")
    restart.add_argument(
        "service", help="kafka, postgres, redis, or a cluster's node kafka-1..kafka-N"
    )


def run(args: argparse.Namespace) -> int:
    from eos_connectors.dev.stack import Stack

    stack = Stack()
    if args.action == "up":
        endpoints = stack.up(kafka_brokers=args.kafka_brokers)
        print(f"Stack up under {stack.root}:\n{endpoints.describe()}", end="")
        if args.spark_workers:
            master = stack.up_spark(args.spark_workers)
            print(f"Spark      {master} ({args.spark_workers} workers, one core each)")
        if args.hdfs:
            print(f"HDFS       {stack.up_hdfs()}")
        print('Use `eval "$(eos stack env)"` to export the endpoints.')
    elif args.action == "down":
        stopped = stack.down()
        print("Stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    elif args.action == "status":
        for status in stack.status():
            state = f"running (pid {status.pid})" if status.running else "stopped"
            print(f"{status.name:<9} {state}")
        return 0 if stack.is_up() else 3
    elif args.action == "env":
        print(stack.endpoints().exports(), end="")
        running = stack.spark_master()
        if running:
            print(f"export EOS_SPARK_MASTER={running}")
        hdfs = stack.hdfs_url()
        if hdfs:
            print(f"export EOS_HDFS_URL={hdfs}")
            print(f"export EOS_WEBHDFS_URL={stack.webhdfs_url()}")
    elif args.action == "restart":
        status = stack.restart(args.service)
        print(f"{status.name} restarted (pid {status.pid})")
    return 0
