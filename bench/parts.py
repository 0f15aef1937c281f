"""The bench's parts, one function each: the contenders of a part measured in turns, their
figures and ratios printed (``bench/run.py``'s docstring says what each part compares)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import time
import uuid
from typing import Any

from bench import graphs
from bench.measure import (
    CpuPerRun,
    Timing,
    chat_thread,
    compare,
    detached_line_runs,
    fresh_schema,
    graph_fanout,
    line_runs,
    paired_savers,
    process_cpu,
    raw_celery_fanout,
    raw_celery_round_trips,
    read_state,
    sequential,
    server_cpu,
    thread_bytes,
)
from bench.report import ratio, show
from bench.workers import CoordinatorProcess, Workers
from bulksync.settings import Settings


def run_fanout(args: argparse.Namespace, settings: Settings, app: Any) -> dict[str, Timing]:
    """Part 1: the fan-out, four ways."""
    from bulksync.checkpoint.postgres import PostgresSaver
    from bulksync.workers.celery.executor import CeleryExecutor
    from bulksync.workers.celery.publish import batch_size

    n = args.fanout
    lg_graph = graphs.fanout_builder(graphs.langgraph_api()).compile()
    per_message = batch_size(n, settings)
    print(f"\n1. fan-out of {n} trivial Send tasks: wall time of one run, median of {args.repeat}")
    print(
        f"   (bulksync tasks per message here: {per_message}, so "
        f"{math.ceil(n / per_message)} messages; raw Celery sends {n})"
    )
    with (
        fresh_schema(settings.database_url, f"bench_{uuid.uuid4().hex[:8]}_fanout") as url,
        PostgresSaver.from_conn_string(url) as saver,
        contextlib.ExitStack() as executors,
    ):
        saver.setup()
        durable = graphs.fanout_builder(graphs.BULKSYNC).compile(checkpointer=saver)
        executor, durable_ex = (
            executors.enter_context(CeleryExecutor(settings, "bench.graphs:fanout", g, app=app))
            for g in (graphs.fanout, durable)
        )
        timings = compare(
            {
                "bulksync (attached CeleryExecutor, no checkpointer)": graph_fanout(
                    graphs.fanout.with_executor(executor), n
                ),
                "bulksync, the same + PostgresSaver (durability=sync)": graph_fanout(
                    durable.with_executor(durable_ex), n, durability="sync"
                ),
                f"raw Celery group of {n} (RPUSH + BLPOP gather)": raw_celery_fanout(
                    app, settings.redis_url, n
                ),
                "LangGraph in-process (defaults, no checkpointer)": graph_fanout(lg_graph, n),
            },
            args.repeat,
            args.warmup,
        )
    show(timings)
    bs, bs_pg, raw, lg = timings.values()
    print("  ratios of medians (time; lower is better for bulksync):")
    ratio("bulksync / LangGraph in-process", bs, lg, "DESIGN §8 target at 10,000: <= 1.00")
    ratio("bulksync / raw Celery group", bs, raw, "DESIGN §8 target at 10,000: <= 0.33")
    ratio("bulksync + PostgresSaver / no checkpointer", bs_pg, bs, "issue 10 target: <= 1.30")
    return timings


def run_waiting(args: argparse.Namespace, settings: Settings, app: Any) -> dict[str, Timing]:
    """Part 3: a fan-out of tasks that wait (model and tool calls), sync and async nodes,
    on thread-pool workers of their own."""
    from bulksync.workers.celery.executor import CeleryExecutor

    n, seconds, threads = args.io, args.io_wait, args.io_concurrency
    limit = n * seconds / (args.workers * threads)
    given = graphs.waiting_input(n, seconds)
    lg = graphs.langgraph_api()
    lg_sync = graphs.waiting_builder(lg, graphs.wait).compile()
    lg_async = graphs.waiting_builder(lg, graphs.await_).compile()
    print(
        f"\n3. fan-out of {n} Send tasks that each wait {seconds * 1000:g} ms: wall time of one "
        f"run, median of {args.repeat}"
    )
    print(
        f"   ({args.workers} workers x --pool threads --concurrency {threads}; the physical "
        f"limit of one task per pool thread: {n} x {seconds:g} s / {args.workers * threads} "
        f"= {limit:.3f} s)"
    )
    with (
        CeleryExecutor(settings, "bench.graphs:io_fanout", graphs.io_fanout, app=app) as sync_ex,
        CeleryExecutor(settings, "bench.graphs:aio_fanout", graphs.aio_fanout, app=app) as async_ex,
    ):
        timings = compare(
            {
                "bulksync, sync nodes (time.sleep)": graph_fanout(
                    graphs.io_fanout.with_executor(sync_ex), n, given
                ),
                "bulksync, async nodes (asyncio.sleep)": graph_fanout(
                    graphs.aio_fanout.with_executor(async_ex), n, given
                ),
                "LangGraph in-process, defaults (sync nodes)": graph_fanout(lg_sync, n, given),
                "LangGraph in-process, max_concurrency=100": graph_fanout(
                    lg_sync, n, given, config={"max_concurrency": 100}
                ),
                "LangGraph in-process async (ainvoke)": graph_fanout(
                    lg_async, n, given, awaited=True
                ),
            },
            args.repeat,
            args.warmup,
        )
    show(timings)
    bs_sync, bs_async, _, lg_tuned, lg_aio = timings.values()
    bound = Timing("limit", [limit])
    print("  ratios of medians (time; lower is better for bulksync):")
    ratio("bulksync sync / physical limit", bs_sync, bound, "issue 10 target: <= 1.15")
    ratio("bulksync sync / LangGraph max_concurrency=100", bs_sync, lg_tuned, "target: <= 0.67")
    ratio("bulksync async / LangGraph async", bs_async, lg_aio, "target: < 1.00")
    return timings


def run_wide(args: argparse.Namespace, settings: Settings, app: Any) -> dict[str, Timing]:
    """Part 7: a fan-out of many async tasks that wait (model calls), on part 3's workers."""
    from bulksync.workers.celery.executor import CeleryExecutor

    n, seconds = args.wide, args.wide_wait
    given = graphs.waiting_input(n, seconds)
    lg_async = graphs.waiting_builder(graphs.langgraph_api(), graphs.await_).compile()
    print(
        f"\n7. fan-out of {n} async Send tasks that each wait {seconds:g} s: wall time of one "
        f"run, median of {args.repeat}\n   (part 3's workers)"
    )
    with CeleryExecutor(settings, "bench.graphs:aio_fanout", graphs.aio_fanout, app=app) as ex:
        timings = compare(
            {
                "bulksync, async nodes (asyncio.sleep)": graph_fanout(
                    graphs.aio_fanout.with_executor(ex), n, given
                ),
                "LangGraph in-process async (ainvoke)": graph_fanout(
                    lg_async, n, given, awaited=True
                ),
            },
            args.repeat,
            args.warmup,
        )
    show(timings)
    bs, lg = timings.values()
    print("  ratios of medians (time; lower is better for bulksync):")
    ratio("bulksync / the wait itself", bs, Timing("wait", [seconds]), "(context)")
    ratio("bulksync / LangGraph async", bs, lg, "(context)")
    target = "issue 10 target: <= 2.00 s" if (n, seconds) == (10_000, 1.0) else "(context)"
    print(f"  {'bulksync, median':<44} {bs.median:7.2f} s {target}")
    return timings


def run_sequential(args: argparse.Namespace, settings: Settings, app: Any) -> dict[str, Timing]:
    """Part 2: per-step time of the sequential graph with a Postgres commit each step."""
    from bulksync.workers.celery.executor import CeleryExecutor

    steps = args.steps
    print(f"\n2. sequential graph of {steps} steps: time per step, median of {args.repeat} runs")
    print("   (each saver in a fresh schema, each run on a fresh thread)")
    with (
        paired_savers(settings.database_url, uuid.uuid4().hex[:8]) as (saver, lg_saver, _, _),
        contextlib.ExitStack() as executors,
    ):
        local = graphs.loop_builder(graphs.BULKSYNC).compile(checkpointer=saver)
        attached, bare = (
            g.with_executor(
                executors.enter_context(CeleryExecutor(settings, "bench.graphs:loop", g, app=app))
            )
            for g in (local, graphs.loop)
        )
        lg_graph = graphs.loop_builder(graphs.langgraph_api()).compile(checkpointer=lg_saver)
        timings = compare(
            {
                "bulksync, CeleryExecutor + PostgresSaver (durability=sync)": sequential(
                    attached, steps, "sync"
                ),
                "LangGraph + its PostgresSaver (durability=sync)": sequential(
                    lg_graph, steps, "sync"
                ),
                "context: LangGraph + its PostgresSaver (default, async)": sequential(
                    lg_graph, steps, None
                ),
                "context: bulksync in-process LocalExecutor + PostgresSaver": sequential(
                    local, steps, "sync"
                ),
                "context: bulksync, CeleryExecutor, no checkpointer": sequential(bare, steps, None),
                "context: bulksync in-process LocalExecutor, no checkpointer": sequential(
                    graphs.loop, steps, None
                ),
                "context: raw Celery round trip, one task after another": raw_celery_round_trips(
                    app, settings.redis_url, steps
                ),
            },
            args.repeat,
            args.warmup,
        )
    show(timings, per=steps, unit="ms")
    bs, lg_sync, lg_async, local_pg, _, local, raw = timings.values()
    print("  ratios of medians (time; lower is better for bulksync):")
    ratio("bulksync Celery+PG / LangGraph PG sync", bs, lg_sync, "DESIGN §8 target: <= 2.00")
    ratio("bulksync Celery+PG / LangGraph PG default", bs, lg_async, "(context)")
    # The floor of a step on this cluster: one raw Celery round trip plus what the step's
    # Postgres commit adds in-process.
    floor = Timing("floor", [raw.median + max(0.0, local_pg.median - local.median)])
    ratio("bulksync Celery+PG / (raw round trip + commit)", bs, floor, "(context: the floor)")
    return timings


def run_end_to_end(
    args: argparse.Namespace, settings: Settings, app: Any, workers: Workers
) -> None:
    """Part 4: whole runs, attached and detached, one by one and at once (and the CPU each
    process of the cluster spends on a run, where ``/proc`` tells)."""
    from bulksync.client import Client
    from bulksync.workers.celery.executor import CeleryExecutor

    n, tag, db = args.e2e, uuid.uuid4().hex[:8], settings.database_url
    graph_id = "bench.graphs:line"
    with (
        paired_savers(db, tag) as (saver, lg_saver, _, _),
        fresh_schema(db, f"bench_{tag}_service") as service_url,
        CoordinatorProcess(settings, service_url) as coordinator,
        Client(dataclasses.replace(settings, database_url=service_url)) as client,
        contextlib.ExitStack() as executors,
    ):
        print("\n4. whole runs of START -> a -> b -> c -> END, each on a new thread")
        print(f"   coordinator: {coordinator.describe()} (its own schema)")
        local_pg = graphs.line_builder(graphs.BULKSYNC).compile(checkpointer=saver)
        executor = CeleryExecutor(settings, graph_id, local_pg, app=app)
        attached = local_pg.with_executor(executors.enter_context(executor))
        lg_line = graphs.line_builder(graphs.langgraph_api()).compile()
        lg_pg = graphs.line_builder(graphs.langgraph_api()).compile(checkpointer=lg_saver)
        print(f"   {n} runs one after another: time per run, median of {args.repeat}")
        timings = compare(
            {
                "bulksync attached (CeleryExecutor + PostgresSaver)": line_runs(attached, n),
                "bulksync detached (Client.submit + wait, coordinator)": detached_line_runs(
                    client, graph_id, n, at_once=False
                ),
                "LangGraph in-process (defaults, no checkpointer)": line_runs(lg_line, n),
                "context: raw Celery round trips, 3 one after another": raw_celery_round_trips(
                    app, settings.redis_url, 3 * n
                ),
                "context: bulksync in-process + PostgresSaver": line_runs(local_pg, n),
                "context: bulksync in-process, no checkpointer": line_runs(graphs.line, n),
            },
            args.repeat,
            args.warmup,
        )
        show(timings, per=n, unit="ms")
        bs, detached, lg, raw, in_pg, in_bare = timings.values()
        floor = Timing("floor", [raw.median + max(0.0, in_pg.median - in_bare.median)])
        print("  ratios of medians (time; lower is better for bulksync):")
        ratio("attached / (raw round trips + commits)", bs, floor, "issue 10 target: <= 1.30")
        ratio("detached / attached", detached, bs, "issue 10 target: <= 1.20")
        ratio("attached / LangGraph in-process", bs, lg, "(context)")
        ratio("detached / LangGraph in-process", detached, lg, "(context)")
        if args.runs:
            runs_at_once(
                args, settings, app, (workers, coordinator, client), (lg_line, lg_pg, local_pg)
            )


def runs_at_once(
    args: argparse.Namespace,
    settings: Settings,
    app: Any,
    cluster: tuple[Workers, CoordinatorProcess, Any],
    lines: tuple[Any, Any, Any],
) -> None:
    """Part 4, second half: runs submitted at once to the coordinator, in runs per second, and
    what each contender's processes spend on a run, the database and broker included (where
    they run on this machine): the budget the target leaves, and the floor under it."""
    workers, coordinator, client = cluster
    lg_line, lg_pg, local_pg = lines  # LangGraph's, without and with its saver; bulksync's
    m, graph_id = args.runs, "bench.graphs:line"
    print(f"\n   {m} runs submitted at once vs {m} in-process one after another, in runs")
    print(f"   per second (median of {args.repeat})")
    on_workers = {"workers": lambda: process_cpu([p.pid for p in workers.procs])}
    here = {"client (this process)": time.process_time}
    redis_server = {"redis": lambda: server_cpu("redis-server")}
    postgres = {"postgres": lambda: server_cpu("postgres")}
    coordinating = {"coordinator": lambda: process_cpu([p.pid for p in coordinator.procs])}
    cluster_wide = {**coordinating, **on_workers, **here, **redis_server, **postgres}
    cpu = {
        "bulksync": CpuPerRun(cluster_wide, m),
        "LangGraph": CpuPerRun({**here, **postgres}, m),
        "in-process": CpuPerRun({**here, **postgres}, m),
        "raw": CpuPerRun({**on_workers, **here, **redis_server}, m),
    }
    many = compare(
        {
            f"bulksync detached, {m} submitted at once": cpu["bulksync"].watch(
                detached_line_runs(client, graph_id, m, at_once=True)
            ),
            f"LangGraph in-process, {m} one after another": line_runs(lg_line, m),
            "context: the same with its PostgresSaver": cpu["LangGraph"].watch(line_runs(lg_pg, m)),
            # The Celery work of m runs and nothing else: no order, coordinator or commit.
            f"context: raw Celery group of {3 * m} (3 per run)": cpu["raw"].watch(
                raw_celery_fanout(app, settings.redis_url, 3 * m)
            ),
            # The loop's work of m runs and nothing else: no message, no service.
            "context: bulksync in-process + PostgresSaver": cpu["in-process"].watch(
                line_runs(local_pg, m)
            ),
        },
        args.repeat,
        args.warmup,
    )
    for label, t in many.items():
        print(f"  {label:<48}  {m / t.median:9.1f} runs/s  ({t.median:.3f} s)")
    at_once, lg_many, lg_durable, raw_group, _ = many.values()
    print("  ratios of medians (runs per second; higher is better for bulksync):")
    ratio("bulksync / LangGraph + PostgresSaver", lg_durable, at_once, "issue 10 target: >= 1.00")
    ratio("bulksync / LangGraph, no checkpointer", lg_many, at_once, "(context)")
    ratio("raw Celery group / LangGraph + PostgresSaver", lg_durable, raw_group, "(context)")
    cpu_budget({name: c.medians() for name, c in cpu.items()}, m / lg_durable.median)


def cpu_budget(spent: dict[str, dict[str, float]], lg_rate: float) -> None:
    """Print the CPU per run of each contender, and what the cores allow: a cluster run repeats
    at least a raw Celery run's work (three tasks) and the in-process loop's (its steps and
    commits), so the cores can run at most ``cores / (the two)`` of them a second."""
    if not all(spent.values()):  # /proc cannot tell here
        return
    print("  CPU per run, medians (servers counted where they run on this machine):")
    for name, groups in spent.items():
        shares = ", ".join(f"{g} {1000 * s:.2f}" for g, s in groups.items())
        print(f"    {name:<10} {1000 * sum(groups.values()):6.2f} ms  ({shares})")
    cores = os.cpu_count() or 1
    floor = sum(spent["raw"].values()) + sum(spent["in-process"].values())
    ceiling = cores / floor
    print(
        f"  floor of a cluster run: raw Celery's + the in-process loop's = {1000 * floor:.2f} ms;"
        f"\n  {cores} cores run at most {ceiling:.1f} runs/s of it = {ceiling / lg_rate:.2f} x "
        f"LangGraph + PostgresSaver; bulksync spends {sum(spent['bulksync'].values()) / floor:.2f}"
        " x the floor"
    )


def run_computing(args: argparse.Namespace, settings: Settings, app: Any) -> None:
    """Part 6: a fan-out of CPU-bound tasks on the prefork workers."""
    from bulksync.workers.celery.executor import CeleryExecutor

    n, work = args.cpu, args.cpu_work
    limit = n * work / args.workers
    lg_graph = graphs.waiting_builder(graphs.langgraph_api(), graphs.burn).compile()
    given = graphs.waiting_input(n, work)
    print(f"\n6. fan-out of {n} Send tasks that each compute {work * 1000:g} ms of CPU: wall time")
    print(f"   of one run, median of {args.repeat} (the physical limit of one task per worker")
    print(f"   process: {n} x {work:g} s / {args.workers} = {limit:.3f} s)")
    with CeleryExecutor(settings, "bench.graphs:cpu_fanout", graphs.cpu_fanout, app=app) as ex:
        graph = graphs.cpu_fanout.with_executor(ex)
        timings = compare(
            {
                f"bulksync, {args.workers} prefork workers": graph_fanout(graph, n, given),
                "LangGraph in-process (defaults)": graph_fanout(lg_graph, n, given),
            },
            args.repeat,
            args.warmup,
        )
    show(timings)
    bs, lg = timings.values()
    print("  ratios of medians:")
    ratio("speed-up: LangGraph / bulksync", lg, bs, "issue 10 target: >= 1.80")
    ratio("bulksync / physical limit", bs, Timing("limit", [limit]), "(context)")


def run_storage(args: argparse.Namespace, settings: Settings) -> None:
    """Part 5: what a long conversation's checkpoints take, and what reading its state costs."""
    n = args.chat
    print(f"\n5. checkpoints of a {n}-message conversation, one {graphs.MESSAGE_BYTES}-byte")
    print("   message a step (operator.add), durability sync, each saver in a fresh schema")
    with paired_savers(settings.database_url, uuid.uuid4().hex[:8]) as saved:
        saver, lg_saver, bs_url, lg_url = saved
        contenders = {
            "bulksync PostgresSaver": (
                graphs.chat_builder(graphs.BULKSYNC).compile(checkpointer=saver),
                bs_url,
                ("bulksync_checkpoints", "bulksync_checkpoint_blobs", "bulksync_checkpoint_writes"),
            ),
            "LangGraph PostgresSaver": (
                graphs.chat_builder(graphs.langgraph_api()).compile(checkpointer=lg_saver),
                lg_url,
                ("checkpoints", "checkpoint_blobs", "checkpoint_writes"),
            ),
        }
        reads = {}
        for label, (graph, url, tables) in contenders.items():
            # Thread ids of one length: every row stores its thread's id.
            chat_thread(graph, "chat-a", n - 1)
            chat_thread(graph, "chat-b", n)
            total = thread_bytes(url, tables, "chat-b")
            last = total - thread_bytes(url, tables, "chat-a")
            print(
                f"  {label:<24} step {n} added {last / 1024:8.1f} KB; "
                f"{total / n / 1024:6.1f} KB per step on average ({total / 2**20:.1f} MB)"
            )
            reads[f"read the latest state, {label}"] = read_state(graph, "chat-b", n)
        timings = compare(reads, max(args.repeat, 5), args.warmup)
        show(timings, unit="ms")
        bs_read, lg_read = timings.values()
        print("  ratio of medians (time; lower is better for bulksync):")
        ratio("read: bulksync / LangGraph", bs_read, lg_read, "issue 10 target: <= 2.00")
