"""What ``LodeExecutor.map(..., chunksize=k)`` makes of a job's result: one value per call,
``CallFailed`` for a call that raised, and for a result the site garbled or forged (too
few outcomes, not outcomes at all) a clear ``CallFailed`` at that call, never a crash."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from lodestream.client.sdk import CallFailed, LodeFuture

# After the sdk, which imports the executor at its end (the executor needs the sdk's client).
_results = importlib.import_module("lodestream.client.executor")._results


def finished(result: Any, job_id: str = "j1") -> LodeFuture:
    future = LodeFuture(lambda _f: None)
    future.job_id = job_id
    future.set_result(result)
    return future


def ok(value: Any) -> dict[str, Any]:
    return {"ok": True, "result": value}


def test_values_in_order_across_jobs() -> None:
    jobs = [(finished([ok(1), ok(2)]), 2), (finished([ok(3)], "j2"), 1)]
    assert list(_results(jobs, None, calls=True)) == [1, 2, 3]


def test_a_call_that_raised_fails_where_the_iterator_reaches_it() -> None:
    failed = {
        "ok": False,
        "error": "ValueError: bad",
        "traceback": "Traceback ...\nValueError: bad",
    }
    results = _results([(finished([ok(1), failed, ok(3)]), 3)], None, calls=True)
    assert next(results) == 1
    with pytest.raises(CallFailed) as raised:
        next(results)
    assert (raised.value.index, raised.value.remote.type) == (1, "ValueError")
    assert raised.value.remote.message == "bad"


@pytest.mark.parametrize(
    "garbled",
    [[ok(1)], "not a list", None, {"ok": True}, [ok(1), 7], [ok(1), {"ok": "yes"}]],
)
def test_a_garbled_result_fails_the_call_it_lacks_with_a_clear_error(garbled: Any) -> None:
    results = _results([(finished(garbled), 2)], None, calls=True)
    values: list[Any] = []
    with pytest.raises(CallFailed) as raised:
        values.extend(results)
    assert raised.value.index == len(values)
    assert raised.value.job_id == "j1"
