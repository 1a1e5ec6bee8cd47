"""Globus answers for the ``responses`` library, built from globus-sdk's recorded ones.

The SDK ships a recorded answer for most calls (``globus_sdk.testing``), each with ids of its
own. Tests here keep the recorded body, every key Globus sends, and change only the fields
they are about, so a test never rests on an answer shape someone typed from memory.
"""

from __future__ import annotations

import copy
from typing import Any, Literal, cast

from globus_sdk import TransferClient
from globus_sdk.testing import RegisteredResponse, get_response_set


def sdk_answer(
    method: Any,
    case: str = "default",
    *,
    path: str | None = None,
    http_method: Literal["GET", "POST"] | None = None,
    status: int | None = None,
    drop: tuple[str, ...] = (),
    **fields: Any,
) -> None:
    """Register the SDK's own recorded answer for ``method``, at ``path`` and with ``fields``.

    The SDK's fixtures carry task ids of their own; this keeps their bodies (every key
    Globus sends) and changes only what the test is about.
    """
    recorded = get_response_set(method).lookup(case)
    assert isinstance(recorded, RegisteredResponse)
    assert isinstance(recorded.json, dict)
    body: dict[str, Any] = copy.deepcopy(recorded.json)
    for key in drop:
        del body[key]
    body.update(fields)
    RegisteredResponse(
        service=recorded.service,
        method=http_method or cast(Literal["GET", "POST"], recorded.method),
        path=path or recorded.path,
        status=status or recorded.status,
        json=body,
    ).add()


def sdk_task_doc(task_id: str, status: str, **fields: Any) -> dict[str, Any]:
    """A task document: the first task of the SDK's recorded task list, as this task."""
    listing = get_response_set(TransferClient.task_list).lookup("default")
    assert isinstance(listing, RegisteredResponse)
    assert isinstance(listing.json, dict)
    doc: dict[str, Any] = copy.deepcopy(listing.json["DATA"][0])
    doc.update(DATA_TYPE="task", task_id=task_id, status=status, **fields)
    return doc
