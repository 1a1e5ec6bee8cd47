"""One rank of an mpi4py serial pilot: ``python -m lodestream.agents.launcher.mpi_worker``.

``lode launcher`` starts it one rank per node when the site's pilots run in serial mode with
``serial_workers: mpi4py`` on more than one node (:mod:`~lodestream.agents.launcher.workers`):

    mpiexec -n <nodes> -ppn 1 -hosts <nodes> ... python -m lodestream.agents.launcher.mpi_worker
        --site <dir> --wall-time-min <min> --log-name mpi-pilot-<stamp>

A batch script may start it so itself, with any number of ranks. Rank 0 plans the pilot as
``lode launcher`` does (the same refusals), pairs the allocation's nodes with the ranks
(:func:`~lodestream.agents.launcher.mpi_ranks.assign_nodes`) and runs the pilot, connected to
NATS over wss like any other; every other rank serves the node it was given, or none
(:mod:`~lodestream.agents.launcher.mpi_serve`), until rank 0 tells it to stop. Rank 0's exit
status, also written to ``log/<log name>.exit``: 0 when the pilot ended (idle, wall time,
stopped), 1 when it failed, 2 when it was refused, 77 when the site's credential was revoked.

What MPICH's ``mpiexec -disable-auto-cleanup`` does when a rank dies shapes the rest. It
signals SIGUSR1 to every other rank (its default action would end them too), and from then on
kills them all as soon as it has more output of theirs to forward. So each rank writes
nothing to mpiexec: its stdout and stderr are its own file in the site's ``log/``
(``<log name>-rank<r>.log``; ``lode launcher`` follows rank 0's), and it handles SIGUSR1.
Rank 0 then takes a worker silent for five beats as the dead one and reports its jobs. Once
a rank is gone, ``MPI_Finalize`` would wait for it forever: the others exit without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from lodestream import aio
from lodestream.agents.launcher.errors import PilotRefused, TagFilterError
from lodestream.agents.launcher.main import run
from lodestream.agents.launcher.mpi_channel import Channel, MpiChannel
from lodestream.agents.launcher.mpi_link import RankLauncher, RankLink
from lodestream.agents.launcher.mpi_protocol import Assign, Stop
from lodestream.agents.launcher.mpi_ranks import Assignment, assign_nodes
from lodestream.agents.launcher.mpi_serve import WorkerLoop
from lodestream.agents.launcher.plan import PilotPlan, plan_pilot
from lodestream.agents.launcher.tags import parse_tag_filter
from lodestream.agents.site.apps import AppError
from lodestream.agents.site.credential import EXIT_CREDENTIAL_REVOKED, CredentialRevoked
from lodestream.agents.site.settings import SiteSettingsError, load_site_settings
from lodestream.platform_adapters.launchers.local import LocalLauncher

log = logging.getLogger("lodestream.agents.launcher.mpi_worker")

LOG_DIR = "log"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    from mpi4py import MPI  # noqa: PLC0415 - importing it initialises MPI: ranks only

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    name: str = comm.bcast(args.log_name or f"mpi-pilot-{datetime.now(UTC):%Y%m%dT%H%M%S}")
    logs = args.site / LOG_DIR
    _output_to(logs / f"{name}-rank{rank}.log", rank)
    hosts: list[str] = comm.allgather(MPI.Get_processor_name())
    channel = MpiChannel(comm)
    if rank == 0:
        code, clean = _rank0(channel, hosts, args)
        _write_exit(logs / f"{name}.exit", code)
    else:
        code, clean = _worker(channel, rank)
    # The interpreter resets the signals it handles to their default as it shuts down; a
    # SIGUSR1 for another rank's exit must not end this one while it finalises.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if not clean:
        logging.shutdown()
        os._exit(code)  # no MPI_Finalize: a rank it would wait for is gone
    return code


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lodestream.agents.launcher.mpi_worker",
                                     description="One rank of an mpi4py serial pilot.")  # fmt: skip
    parser.add_argument("--site", type=Path, required=True, help="Site directory.")
    parser.add_argument("--wall-time-min", type=float, default=60.0, help="Wall time.")
    parser.add_argument("--log-name", default=None,
                        help="Stem of the ranks' log files in the site's log/.")  # fmt: skip
    parser.add_argument("--batch-job-id", type=uuid.UUID, default=None,
                        help="The batch job this pilot runs in.")  # fmt: skip
    parser.add_argument("--tag", action="append", default=[], dest="tags",
                        help="key:value: run only jobs with this tag (repeatable).")  # fmt: skip
    args = parser.parse_args(argv)
    try:  # lode launcher checked them already; a hand-made command line gets the same rule
        args.filter_tags = parse_tag_filter(args.tags)
    except TagFilterError as exc:
        parser.error(str(exc))
    return args


def _output_to(path: Path, rank: int) -> None:
    """Send this rank's stdout and stderr (logs and stray prints alike) to ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    fmt = f"%(asctime)s rank {rank} %(name)s %(levelname)s %(message)s"
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=fmt)


def _write_exit(path: Path, code: int) -> None:
    try:
        path.write_text(f"{code}\n")
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc)


def _worker(channel: Channel, rank: int) -> tuple[int, bool]:
    loop = WorkerLoop(channel, lambda gpu_env: LocalLauncher(gpu_env=gpu_env), rank=rank)
    peer_died = False

    def leave_it_to_rank_0(signum: int, _frame: object) -> None:
        log.info("worker rank %d: signal %d; rank 0 drains this node's jobs", rank, signum)

    def rank_exited(_signum: int, _frame: object) -> None:
        nonlocal peer_died
        if not loop.stopping:  # ranks leave one by one once told to stop
            peer_died = True
            log.warning("worker rank %d: a rank of the pilot died", rank)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave_it_to_rank_0)
    signal.signal(signal.SIGUSR1, rank_exited)
    done = loop.serve()
    log.info("worker rank %d exits: %s", rank, done.reason)
    return done.code, done.code == 0 and not peer_died


def _rank0(channel: Channel, hosts: list[str], args: argparse.Namespace) -> tuple[int, bool]:
    site: Path = args.site
    try:
        timeout_s, plan, assignment = _plan(site, hosts)
    except (PilotRefused, SiteSettingsError) as exc:
        log.error("launcher refused: %s", exc)  # noqa: TRY400 - the reason is the message
        for rank in range(1, len(hosts)):
            channel.post(rank, Stop(f"refused: {exc}"))
        while channel.progress():
            pass
        return 2, True
    _log_assignment(plan, assignment, hosts)
    nodes = plan.nodes
    workers = {r: nodes[n].hostname for n, r in assignment.rank_of.items() if r != 0}
    for rank in range(1, len(hosts)):  # a rank with no node idles until the end
        channel.post(rank, Assign(workers.get(rank), timeout_s, plan.machine.gpu_env))
    link = RankLink(channel, {r: workers.get(r) for r in range(1, len(hosts))},
                    timeout_s=timeout_s)  # fmt: skip

    def rank_exited(_signum: int, _frame: object) -> None:
        log.warning("a rank of the pilot exited (the process manager says so)")
        link.failure_reported()

    signal.signal(signal.SIGUSR1, rank_exited)
    launcher = RankLauncher(
        link, {nodes[n].hostname: r for n, r in assignment.rank_of.items()},
        LocalLauncher(gpu_env=plan.machine.gpu_env), start_timeout_s=timeout_s,
    )  # fmt: skip
    served = tuple(nodes[n] for n in sorted(assignment.rank_of))
    shape = plan.site_shape
    if len(served) < len(nodes):  # another pilot of the site may have all of them
        shape = dataclasses.replace(shape, same_nodes=False)
    pilot = dataclasses.replace(plan, nodes=served, app_launcher=launcher, site_shape=shape)
    link.start()
    code = 1
    try:
        report = aio.run_service(run(site, wall_time_min=args.wall_time_min, plan=pilot,
                                     batch_job_id=args.batch_job_id,
                                     filter_tags=args.filter_tags))  # fmt: skip
        log.info("launcher done (%s): %d finished, %d errored, %d timed out, %d fenced",
                 report.exit_reason, report.finished, report.errored, report.timed_out,
                 report.fenced)  # fmt: skip
        code = 0
    except (AppError, PilotRefused, SiteSettingsError) as exc:
        log.error("launcher refused: %s", exc)  # noqa: TRY400 - the reason is the message
        code = 2
    except CredentialRevoked as exc:  # its tasks were killed: nothing could be reported
        log.error("launcher: %s", exc)  # noqa: TRY400 - the reason is the message
        code = EXIT_CREDENTIAL_REVOKED
    except Exception:
        log.exception("launcher failed")
    finally:
        link.close("the pilot exits")
    return code, not link.lost


def _plan(site: Path, hosts: list[str]) -> tuple[float, PilotPlan, Assignment]:
    """The worker timeout, the pilot as ``lode launcher`` plans it, and who serves what."""
    settings = load_site_settings(site)
    plan = plan_pilot(settings, mode="serial")
    assignment = assign_nodes(node_hosts(plan, hosts[0]), hosts)
    if not assignment.rank_of:
        raise PilotRefused(f"no rank runs on a node of the allocation (ranks on {hosts})")
    return settings.launcher.worker_timeout_s, plan, assignment


def node_hosts(plan: PilotPlan, rank0_host: str) -> list[str]:
    """The host each node is on: the local machine's nodes are all rank 0's host."""
    if plan.machine.scheduler == "local":
        return [rank0_host] * len(plan.nodes)
    return [node.hostname for node in plan.nodes]


def _log_assignment(plan: PilotPlan, assignment: Assignment, hosts: list[str]) -> None:
    for node, rank in sorted(assignment.rank_of.items()):
        note = " (names differ)" if node in assignment.renamed else ""
        log.info("node %s: rank %d on %s%s", plan.nodes[node].hostname, rank, hosts[rank], note)
    for node in assignment.unserved:
        log.warning("node %s: no rank runs there; its jobs go to the other nodes "
                    "(start one rank per node)", plan.nodes[node].hostname)  # fmt: skip
    for rank in assignment.idle:
        if rank != 0:
            log.warning("rank %d on %s serves no node; it waits for the end", rank, hosts[rank])


if __name__ == "__main__":
    raise SystemExit(main())
