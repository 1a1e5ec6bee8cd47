"""The pure parts of the real-Slurm fixture: its slurm.conf, its jobcomp parser, its skip."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.fixtures.slurm import parse_jobcomp, render_slurm_conf, skip_reason

# A line jobcomp/filetxt wrote on Slurm 22.05, its WorkDir and Name given spaces.
JOBCOMP_LINE = (
    "JobId=7 UserId=root(0) GroupId=root(0) Name=my job JobState=TIMEOUT Partition=debug "
    "TimeLimit=1 StartTime=2026-11-23T16:52:33 EndTime=2026-11-23T16:53:41 NodeList=n[1-2] "
    "NodeCnt=2 ProcCnt=2 WorkDir=/tmp/a dir ReservationName= Tres=cpu=2,mem=2G,node=2,billing=2 "
    "Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-23T16:52:31 "
    "EligibleTime=2026-11-23T16:52:31 DerivedExitCode=0:0 ExitCode=0:15 "
)


def test_jobcomp_lines_parse_into_records_keyed_by_job_id() -> None:
    records = parse_jobcomp(JOBCOMP_LINE + "\n\n" + JOBCOMP_LINE.replace("JobId=7", "JobId=8"))

    assert sorted(records) == ["7", "8"]
    record = records["7"]
    assert record["Name"] == "my job"
    assert record["WorkDir"] == "/tmp/a dir"
    assert record["JobState"] == "TIMEOUT"
    assert record["NodeList"] == "n[1-2]"
    assert record["ExitCode"] == "0:15"
    assert record["ReservationName"] == ""
    assert record["Tres"] == "cpu=2,mem=2G,node=2,billing=2"


def test_every_file_of_the_rendered_conf_lives_under_its_root(tmp_path: Path) -> None:
    conf = render_slurm_conf(
        tmp_path, cluster="lodetest", ctld_port=6817, node_ports={"n1": 7001, "n2": 7002}
    )

    paths = re.findall(r"(?:Location|Loc|Dir|File)=(\S+)", conf)
    assert len(paths) == 7
    assert all(Path(path).is_relative_to(tmp_path) for path in paths)
    assert "NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=7002" in conf
    assert "PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP" in conf


def test_the_cluster_is_skipped_with_a_reason_when_not_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    reason = skip_reason()

    assert reason is not None
    assert "need root" in reason
