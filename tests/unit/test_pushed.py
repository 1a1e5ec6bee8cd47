"""The push feed's frames as ``lode events --follow`` reads them: event ids, nothing else."""

from __future__ import annotations

from lodestream.client.pushed import _event_ids

FRAMES = """retry: 1000
: lodestream event feed

id: 7
data: {"seq":7}

id: 9
: keepalive

id: 12
data: {"seq":12}

event: lagged
data: {"last_seq":12}

"""


def test_only_event_frames_give_their_id() -> None:
    assert list(_event_ids(iter(FRAMES.splitlines()))) == [7, 12]


def test_a_frame_cut_off_before_its_end_gives_nothing() -> None:
    assert list(_event_ids(iter(["id: 3", "data: {}"]))) == []
