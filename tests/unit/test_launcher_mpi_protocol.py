"""The messages between an mpi4py pilot's ranks (``agents/launcher/mpi_protocol.py``)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lodestream.agents.launcher.errors import ProtocolError
from lodestream.agents.launcher.mpi_protocol import (
    Assign,
    Bye,
    Exited,
    Message,
    Ping,
    Signal,
    Start,
    Started,
    StartRefused,
    Stop,
    decode,
    encode,
)
from lodestream.platform_adapters.compute.base import NodePlacement
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.packing import Allocation


def spec(**changes: object) -> TaskSpec:
    fields: dict[str, object] = {
        "job_id": "0193-job",
        "script": "cd w && printf '%s\\n' \"$X\" > out; exit 3",
        "workdir": Path("/site/data/w"),
        "env": {"PATH": "/usr/bin", "X": "é ünïcödé; rm -rf /"},
        "allocation": Allocation("0193-job", (NodePlacement("nid001", (0, 1), ("0", "MIG-a")),)),
        "stdout_path": Path("/site/data/w/job.out"),
        "stderr_path": Path("/site/data/w/job.err"),
        "ranks_per_node": 1,
        "threads_per_rank": 2,
        "threads_per_core": 2,
        "gpus_per_rank": 1,
        "launch_params": {"--cpu-bind": "none"},
        "argv": ("/bin/printf", "%s\\n", "x"),
        "argv_env": {"X": "1"},
    }
    return TaskSpec(**(fields | changes))  # type: ignore[arg-type]


MESSAGES: list[Message] = [
    Assign("nid001", 30.0, "ROCR_VISIBLE_DEVICES"),
    Assign(None, 2.5),
    Start(spec()),
    Start(spec(argv=None, argv_env={}, launch_params={}, env={})),
    Signal("0193-job", kill=False, grace_s=2.0),
    Signal("0193-job", kill=True),
    Stop("the pilot exits"),
    Started("0193-job", 4242),
    StartRefused("0193-job", "job 0193-job: could not start: [Errno 2] No such file"),
    Exited("0193-job", -9, "Traceback ...\n"),
    Exited("0193-job", 0),
    Bye(),
    Ping(),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_survives_the_wire(message: Message) -> None:
    assert decode(encode(message)) == message


@given(st.text(), st.dictionaries(st.text(), st.text(), max_size=5), st.integers(-255, 255))
def test_any_text_and_status_survive_the_wire(text: str, env: dict[str, str], code: int) -> None:
    assert decode(encode(Start(spec(script=text, env=env)))) == Start(spec(script=text, env=env))
    assert decode(encode(Exited(text or "j", code, text))) == Exited(text or "j", code, text)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"op": "ping"}',  # no version
        b'{"op": "ping", "v": 2}',
        b'{"op": "launch", "v": 1}',
        b'{"op": "started", "v": 1, "job_id": "j"}',  # no pid
        b'{"op": "started", "v": 1, "job_id": "j", "pid": "42"}',
        b'{"op": "started", "v": 1, "job_id": 7, "pid": 42}',
        b'{"op": "started", "v": 1, "job_id": "j", "pid": true}',
        b'{"op": "started", "v": 1, "job_id": "j", "pid": 42, "extra": 1}',
        b'{"op": "signal", "v": 1, "job_id": "j", "kill": 1, "grace_s": 0}',
        b'{"op": "assign", "v": 1, "node": "n", "timeout_s": "30", "gpu_env": "X"}',
        b'{"op": "start", "v": 1, "spec": {"job_id": "j"}}',
    ],
)
def test_what_is_not_a_message_of_ours_is_refused(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(data)


def test_a_start_whose_spec_has_the_wrong_types_is_refused() -> None:
    doc = orjson.loads(encode(Start(spec())))
    doc["spec"]["env"] = {"PATH": 1}
    with pytest.raises(ProtocolError):
        decode(orjson.dumps(doc))
    doc = orjson.loads(encode(Start(spec())))
    doc["spec"]["placements"][0]["cpu_ids"] = ["0"]
    with pytest.raises(ProtocolError):
        decode(orjson.dumps(doc))
