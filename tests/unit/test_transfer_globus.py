"""The Globus backend against globus-sdk's own HTTP fixtures (``globus_sdk.testing``).

Every Globus answer starts from one globus-sdk recorded (tests/support/globus_answers.py)
and is registered with the ``responses`` library, which refuses any request nobody
registered: these tests never reach the network.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import responses
from globus_sdk import TransferClient
from globus_sdk.testing import (
    RegisteredResponse,
    get_last_request,
    get_response_set,
    load_response,
)
from globus_sdk.transport import RetryConfig

from lodestream.platform_adapters.transfers.base import (
    ConsentRequired,
    ItemOutcome,
    TransferBatch,
    TransferItem,
    TransferRefused,
    TransferUnavailable,
    UnknownTask,
)
from lodestream.platform_adapters.transfers.globus import (
    GlobusBackend,
    parse_globus_url,
    submission_id,
)
from lodestream.schemas.resources import Overwrite
from tests.support.globus_answers import sdk_answer, sdk_task_doc

SITE = "0d4a7c5e-1b2f-4c3d-8e9f-a0b1c2d3e4f5"  # the site's own collection
REMOTE = "6c54cade-bde5-45c1-bdea-f4bd71dba2cc"  # the location's collection
# The task id of the SDK's own registered "Accepted" answer to submit_transfer.
TASK: str = get_response_set(TransferClient.submit_transfer).lookup("default").metadata["task_id"]


@pytest.fixture(autouse=True)
def mocked_http() -> Iterator[None]:
    responses.start()
    yield
    responses.stop()
    responses.reset()


@pytest.fixture
def backend(tmp_path: Path) -> GlobusBackend:
    # No SDK-level retries: a 5xx must come back at once, without the SDK's backoff sleeps.
    client = TransferClient(retry_config=RetryConfig(max_retries=0))
    return GlobusBackend(client, site_collection=SITE, site_dir=tmp_path, site_root="/scratch")


def batch(*items: TransferItem, key: str = "b-1", direction: str = "in") -> TransferBatch:
    return TransferBatch(
        location="archive",
        url=f"globus://{REMOTE}/project/",
        direction=direction,  # type: ignore[arg-type]
        items=items,
        submission_key=key,
    )


INPUT = TransferItem("item-a", "/run1/in.h5", "/scratch/site/data/job1/in.h5")
CONFIG = TransferItem("item-b", "/run1/config.yml", "/scratch/site/data/job1/config.yml")
TREE = TransferItem("item-c", "/run1/tables", "/scratch/site/data/job1/tables", recursive=True)


def accepted() -> None:
    load_response(TransferClient.submit_transfer)  # the SDK's own "Accepted" answer


def refused(
    status: int, code: str, message: str, path: str = "/v0.10/transfer", **extra: Any
) -> None:
    """A Globus error answer: the SDK's recorded refusal of a transfer, with this code.

    ``POST`` to submit, ``GET`` for a task: the backend asks nothing else that can fail.
    """
    http_method: Literal["GET", "POST"] = "POST" if path == "/v0.10/transfer" else "GET"
    sdk_answer(TransferClient.submit_transfer, "failure", path=path, http_method=http_method,
               status=status, code=code, message=message, resource=path, **extra)  # fmt: skip


def task_is(status: str, **fields: Any) -> None:
    RegisteredResponse(
        service="transfer", path=f"/v0.10/task/{TASK}", json=sdk_task_doc(TASK, status, **fields)
    ).add()


def paths(kind: str, *entries: dict[str, Any]) -> None:
    """The last page of ``successful_transfers`` or ``skipped_errors``.

    Its envelope is the SDK's recorded page of successful transfers (the SDK records none
    of skipped errors, which Globus pages the same way).
    """
    page = TransferClient.endpoint_manager_task_successful_transfers
    sdk_answer(page, path=f"/v0.10/task/{TASK}/{kind}", DATA_TYPE=kind, next_marker=None,
               DATA=list(entries))  # fmt: skip


def sent() -> dict[str, Any]:
    request = get_last_request()
    assert request is not None
    assert isinstance(request.body, bytes | str)
    body: dict[str, Any] = json.loads(request.body)
    return body


# --- submit -----------------------------------------------------------------------------------


def test_submit_sends_one_task_with_every_item_and_the_key_s_submission_id(
    backend: GlobusBackend,
) -> None:
    accepted()
    assert backend.submit(batch(INPUT, TREE, key="b-1")) == TASK
    body = sent()
    assert body["submission_id"] == submission_id("b-1")
    assert (body["source_endpoint"], body["destination_endpoint"]) == (REMOTE, SITE)
    assert body.get("sync_level") is None  # overwrite: always copies every file
    assert body["verify_checksum"] is True
    assert body["skip_source_errors"] is True
    assert body["fail_on_quota_errors"] is True
    assert body["label"] == "lodestream archive in"
    assert [(d["source_path"], d["destination_path"], d["recursive"]) for d in body["DATA"]] == [
        ("/project/run1/in.h5", "/site/data/job1/in.h5", False),
        ("/project/run1/tables/", "/site/data/job1/tables/", True),
    ]


def test_submission_ids_are_uuids_fixed_by_the_key_alone() -> None:
    assert submission_id("b-1") == submission_id("b-1")
    assert submission_id("b-1") != submission_id("b-2")
    assert uuid.UUID(submission_id("b-1")).version == 5


def test_out_goes_from_the_site_collection_to_the_location(backend: GlobusBackend) -> None:
    accepted()
    result = TransferItem("item-r", "/scratch/site/data/job1/out.h5", "/results/out.h5")
    backend.submit(batch(result, direction="out"))
    body = sent()
    assert (body["source_endpoint"], body["destination_endpoint"]) == (SITE, REMOTE)
    assert body["DATA"][0]["source_path"] == "/site/data/job1/out.h5"
    assert body["DATA"][0]["destination_path"] == "/project/results/out.h5"


def test_a_retried_submit_is_answered_duplicate_with_the_first_task(
    backend: GlobusBackend,
) -> None:
    accepted()
    sdk_answer(TransferClient.submit_transfer, status=200, code="Duplicate")
    first = backend.submit(batch(INPUT, key="b-7"))
    first_id = sent()["submission_id"]
    again = backend.submit(batch(INPUT, key="b-7"))
    assert again == first == TASK
    assert sent()["submission_id"] == first_id
    assert len(responses.calls) == 2  # no GET /submission_id: the id is ours


def test_sync_level_is_configurable(tmp_path: Path) -> None:
    accepted()
    client = TransferClient(retry_config=RetryConfig(max_retries=0))
    checksum = GlobusBackend(client, site_collection=SITE, site_dir=tmp_path, sync_level="checksum")
    checksum.submit(batch(TransferItem("i", "/a", "/site/a")))
    assert sent()["sync_level"] == 3


@pytest.mark.parametrize(("overwrite", "level"), [("always", None), ("if-newer", 2), ("never", 3)])
def test_the_overwrite_policy_picks_the_sync_level(
    backend: GlobusBackend, overwrite: Overwrite, level: int | None
) -> None:
    accepted()
    backend.submit(batch(TransferItem("i", "/a", "/scratch/a", overwrite=overwrite)))
    assert sent().get("sync_level") == level


def test_an_expected_digest_goes_to_globus_as_the_external_checksum(
    backend: GlobusBackend,
) -> None:
    accepted()
    digest = "ab" * 32
    backend.submit(batch(TransferItem("i", "/a", "/scratch/a", sha256=digest)))
    item = sent()["DATA"][0]
    assert (item["external_checksum"], item["checksum_algorithm"]) == (digest, "SHA256")


def test_items_under_different_policies_are_refused_together(backend: GlobusBackend) -> None:
    mixed = [
        TransferItem("a", "/a", "/scratch/a"),
        TransferItem("b", "/b", "/scratch/b", overwrite="never"),
    ]
    with pytest.raises(TransferRefused, match="one overwrite policy"):
        backend.submit(batch(*mixed))


def test_bad_settings_are_refused_at_construction(tmp_path: Path) -> None:
    client = TransferClient()
    with pytest.raises(ValueError, match="sync_level"):
        GlobusBackend(client, site_collection=SITE, site_dir=tmp_path, sync_level="newest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a Globus collection id"):
        GlobusBackend(client, site_collection="polaris", site_dir=tmp_path)


@pytest.mark.parametrize(
    ("url", "base"),
    [
        (f"globus://{REMOTE}", "/"),
        (f"globus://{REMOTE}/", "/"),
        (f"globus://{REMOTE.upper()}/~/data", "/~/data"),
    ],
)
def test_globus_urls_name_a_collection_and_a_base_path(url: str, base: str) -> None:
    collection, path = parse_globus_url(url)
    assert (collection, str(path)) == (REMOTE, base)


@pytest.mark.parametrize(
    "url",
    [
        f"rsync://{REMOTE}/",
        "globus://archive/",
        f"globus://{REMOTE}/data?x=1",
        f"globus://me@{REMOTE}/",
        f"globus://{REMOTE}/data/../etc",
    ],
)
def test_malformed_urls_refuse_the_batch_without_a_request(
    backend: GlobusBackend, url: str
) -> None:
    bad = TransferBatch("archive", url, "in", (INPUT,), "b-1")
    with pytest.raises(TransferRefused):
        backend.submit(bad)
    assert len(responses.calls) == 0


@pytest.mark.parametrize(
    "item",
    [
        TransferItem("i", "/run1/../../etc/passwd", "/scratch/site/data/job1/x"),
        TransferItem("i", "run1/in.h5", "/scratch/site/data/job1/x"),
        TransferItem("i", "/run1/in.h5", "/home/other/x"),  # outside the collection's root
    ],
)
def test_paths_that_escape_are_refused(backend: GlobusBackend, item: TransferItem) -> None:
    with pytest.raises(TransferRefused):
        backend.submit(batch(item))
    assert len(responses.calls) == 0


@pytest.mark.parametrize(
    ("item", "words"),
    [
        (TransferItem("i", "p/typo.txt", "/scratch/site/data/job1/x"), "not an absolute path"),
        (TransferItem("i", "/run1/../in.h5", "/scratch/site/data/job1/x"), "without '..'"),
        (TransferItem("i", "/run1/in.h5", "/home/other/x"), "outside /scratch"),
    ],
)
def test_each_item_is_judged_alone_before_the_batch_is_submitted(
    backend: GlobusBackend, item: TransferItem, words: str
) -> None:
    """Globus refuses every '..' (even one the api lets through): the item alone is refused."""
    whole = batch(INPUT, item, CONFIG)
    backend.check_item(whole, INPUT)
    backend.check_item(whole, CONFIG)
    with pytest.raises(TransferRefused, match=words):
        backend.check_item(whole, item)
    assert len(responses.calls) == 0


def test_globus_refusing_the_batch_is_a_refusal_in_its_own_words(
    backend: GlobusBackend,
) -> None:
    load_response(TransferClient.submit_transfer, case="failure")
    with pytest.raises(TransferRefused, match="A transfer requires at least one item") as caught:
        backend.submit(batch(INPUT))
    assert "ClientError.BadRequest.NoTransferItems" in str(caught.value)
    assert not isinstance(caught.value, ConsentRequired)


def test_consent_required_names_the_collection_and_the_login_command(
    backend: GlobusBackend, tmp_path: Path
) -> None:
    scope = (
        "urn:globus:auth:scope:transfer.api.globus.org:all"
        f"[*https://auth.globus.org/scopes/{REMOTE}/data_access]"
    )
    # The SDK records no ConsentRequired from Transfer; the extra keys follow its Timer
    # fixture's (``get_job``, case ``inactive_gare``) authorization requirements.
    why = "Missing required data_access consent"
    needs = {"session_message": why, "required_scopes": [scope]}
    refused(403, "ConsentRequired", why, required_scopes=[scope], authorization_parameters=needs)
    with pytest.raises(ConsentRequired) as caught:
        backend.submit(batch(INPUT))
    message = str(caught.value)
    assert f"lode site globus-login {tmp_path} --collection {REMOTE}" in message
    assert scope in message
    assert "Missing required data_access consent" in message


def test_an_endpoint_needing_activation_asks_for_a_person(backend: GlobusBackend) -> None:
    refused(409, "ClientError.ActivationRequired", f"The endpoint '{REMOTE}' is not activated")
    with pytest.raises(ConsentRequired, match=r"is not activated.*lode site globus-login"):
        backend.submit(batch(INPUT))


def test_a_5xx_is_transient(backend: GlobusBackend) -> None:
    refused(503, "ServiceUnavailable", "Service is currently unavailable, please try again later")
    with pytest.raises(TransferUnavailable, match="503 ServiceUnavailable"):
        backend.submit(batch(INPUT))


def test_no_answer_at_all_is_transient(backend: GlobusBackend) -> None:
    # Nothing registered: ``responses`` refuses the connection, as a dead network would.
    with pytest.raises(TransferUnavailable, match="did not answer"):
        backend.submit(batch(INPUT))


def test_an_unknown_endpoint_refuses_the_batch(backend: GlobusBackend) -> None:
    refused(404, "EndpointNotFound", f"No such endpoint '{REMOTE}'")
    with pytest.raises(TransferRefused, match="No such endpoint"):
        backend.submit(batch(INPUT))


def test_an_answer_without_a_task_is_not_taken_for_one(backend: GlobusBackend) -> None:
    sdk_answer(TransferClient.submit_transfer, drop=("task_id",))
    with pytest.raises(TransferUnavailable, match="no task"):
        backend.submit(batch(INPUT))
    assert not (backend.site_dir / "globus-tasks").exists()


# --- poll -------------------------------------------------------------------------------------


def submitted(backend: GlobusBackend, *items: TransferItem) -> str:
    accepted()
    return backend.submit(batch(*items))


def test_an_active_task_is_not_final(backend: GlobusBackend) -> None:
    task_id = submitted(backend, INPUT, CONFIG)
    task_is("ACTIVE", nice_status="Queued", nice_status_short_description="Queued")
    status = backend.poll(task_id)
    assert not status.final
    assert status.items == {}
    assert "Queued" in status.detail


def test_a_succeeded_task_settles_every_item(backend: GlobusBackend) -> None:
    task_id = submitted(backend, INPUT, CONFIG, TREE)
    task_is("SUCCEEDED", bytes_transferred=5_000_000, nice_status=None)
    paths("skipped_errors")
    status = backend.poll(task_id)
    assert status.final
    # Globus counts bytes per task only: with three items, no item's share is known.
    assert status.items == {i.item_id: ItemOutcome(ok=True) for i in (INPUT, CONFIG, TREE)}


def test_a_sole_item_gets_the_task_s_bytes(backend: GlobusBackend) -> None:
    task_id = submitted(backend, INPUT)
    task_is("SUCCEEDED", bytes_transferred=5_000_000)
    paths("skipped_errors")
    assert backend.poll(task_id).items == {
        "item-a": ItemOutcome(ok=True, bytes_transferred=5_000_000)
    }


NOT_FOUND_DETAILS = (
    "Error (transfer)\nEndpoint: archive\nServer: gridftp.archive.example.org:2811\n"
    "File: /project/run1/config.yml\nCommand: RETR /project/run1/config.yml\n"
    "Message: Fatal FTP response\n---\n550-GlobusError: v=1 c=PATH_NOT_FOUND\n"
    "550-GridFTP-Errno: 2\n550-GridFTP-Reason: System error in open\n"
    "550-GridFTP-Error-String: No such file or directory\n550 End.\n"
)


def test_a_missing_source_fails_its_item_for_good_and_the_others_succeed(
    backend: GlobusBackend,
) -> None:
    task_id = submitted(backend, INPUT, CONFIG)
    task_is("SUCCEEDED", files_skipped=1, subtasks_skipped_errors=1)
    paths(
        "skipped_errors",
        {
            "DATA_TYPE": "skipped_error",
            "error_code": "FILE_NOT_FOUND",
            "error_details": NOT_FOUND_DETAILS,
            "error_time": "2024-05-01T10:00:00+00:00",
            "source_path": "/project/run1/config.yml",
            "destination_path": "/site/data/job1/config.yml",
            "is_directory": False,
            "is_delete_destination_extra": False,
        },
    )
    status = backend.poll(task_id)
    assert status.final
    assert status.items["item-a"] == ItemOutcome(ok=True)
    failed = status.items["item-b"]
    assert not failed.ok
    assert failed.permanent
    assert failed.reason.startswith("FILE_NOT_FOUND: ")
    assert "No such file or directory" in failed.reason


def test_a_file_missing_below_a_directory_fails_the_directory(backend: GlobusBackend) -> None:
    task_id = submitted(backend, TREE)
    task_is("SUCCEEDED")
    paths(
        "skipped_errors",
        {
            "error_code": "PERMISSION_DENIED",
            "error_details": "550 Permission denied",
            "source_path": "/project/run1/tables/t3.csv",
            "destination_path": "/site/data/job1/tables/t3.csv",
        },
    )
    assert backend.poll(task_id).items == {
        "item-c": ItemOutcome(
            ok=False, reason="PERMISSION_DENIED: 550 Permission denied", permanent=True
        )
    }


def test_a_failed_task_keeps_the_files_it_copied(backend: GlobusBackend) -> None:
    task_id = submitted(backend, INPUT, CONFIG)
    task_is(
        "FAILED",
        fatal_error={"code": "NO_SPACE_LEFT", "description": "No space left on device"},
    )
    paths("skipped_errors")
    paths(
        "successful_transfers",
        {"source_path": "/project/run1/in.h5", "destination_path": "/site/data/job1/in.h5"},
    )
    status = backend.poll(task_id)
    assert status.final
    assert status.items["item-a"].ok
    assert status.items["item-b"] == ItemOutcome(
        ok=False, reason="NO_SPACE_LEFT: No space left on device", permanent=True
    )


def test_an_expired_task_may_be_tried_again(backend: GlobusBackend) -> None:
    task_id = submitted(backend, INPUT)
    task_is("FAILED", fatal_error={"code": "EXPIRED", "description": "deadline passed"})
    paths("skipped_errors")
    paths("successful_transfers")
    outcome = backend.poll(task_id).items["item-a"]
    assert not outcome.ok
    assert not outcome.permanent
    assert outcome.reason == "EXPIRED: deadline passed"


def test_a_task_stuck_on_permission_denied_is_cancelled_and_fails_for_good(
    backend: GlobusBackend,
) -> None:
    task_id = submitted(backend, INPUT)
    task_is(
        "ACTIVE",
        nice_status="PERMISSION_DENIED",
        nice_status_short_description="Permission denied",
        nice_status_details="500 Command failed. : Path not allowed.",
    )
    sdk_answer(TransferClient.cancel_task, path=f"/v0.10/task/{task_id}/cancel")
    status = backend.poll(task_id)
    assert not status.final
    assert "Permission denied" in status.detail
    cancel = get_last_request()
    assert cancel is not None
    assert cancel.url == f"https://transfer.api.globus.org/v0.10/task/{task_id}/cancel"

    responses.reset()
    task_is("FAILED", fatal_error={"code": "CANCELED", "description": "The task was canceled"})
    paths("skipped_errors")
    paths("successful_transfers")
    assert backend.poll(task_id).items == {
        "item-a": ItemOutcome(
            ok=False,
            reason="PERMISSION_DENIED: Permission denied; 500 Command failed. : Path not allowed.",
            permanent=True,
        )
    }


def test_an_inactive_task_waits_for_a_person(backend: GlobusBackend, tmp_path: Path) -> None:
    task_id = submitted(backend, INPUT)
    task_is(
        "INACTIVE",
        nice_status="CREDENTIAL_EXPIRED",
        nice_status_short_description="Credentials expired",
    )
    with pytest.raises(ConsentRequired) as caught:
        backend.poll(task_id)
    assert "Credentials expired" in str(caught.value)
    assert f"lode site globus-login {tmp_path}" in str(caught.value)


def test_expired_consent_while_polling_says_how_to_renew_it(backend: GlobusBackend) -> None:
    task_id = submitted(backend, INPUT)
    poll = f"/v0.10/task/{task_id}"
    refused(401, "AuthenticationFailed", "Token is not active", path=poll)
    with pytest.raises(ConsentRequired, match=r"Token is not active.*lode site globus-login"):
        backend.poll(task_id)


def test_a_5xx_while_polling_is_transient(backend: GlobusBackend) -> None:
    task_id = submitted(backend, INPUT)
    refused(502, "ExternalError", "bad gateway", path=f"/v0.10/task/{task_id}")
    with pytest.raises(TransferUnavailable):
        backend.poll(task_id)


def test_task_ids_never_issued_here_are_unknown_without_asking_globus(
    backend: GlobusBackend,
) -> None:
    for task_id in (TASK, "not-a-task", "../../settings"):
        with pytest.raises(UnknownTask):
            backend.poll(task_id)
    assert len(responses.calls) == 0


def test_a_task_globus_has_forgotten_is_unknown(backend: GlobusBackend) -> None:
    task_id = submitted(backend, INPUT)
    refused(404, "TaskNotFound", f"Task {task_id} not found", path=f"/v0.10/task/{task_id}")
    with pytest.raises(UnknownTask, match="not found"):
        backend.poll(task_id)


def test_the_task_record_survives_a_new_backend(backend: GlobusBackend, tmp_path: Path) -> None:
    task_id = submitted(backend, INPUT)
    restarted = GlobusBackend(
        TransferClient(retry_config=RetryConfig(max_retries=0)),
        site_collection=SITE,
        site_dir=tmp_path,
        site_root="/scratch",
    )
    task_is("SUCCEEDED", bytes_transferred=12)
    paths("skipped_errors")
    assert restarted.poll(task_id).items == {"item-a": ItemOutcome(ok=True, bytes_transferred=12)}


def test_cancel_is_best_effort(backend: GlobusBackend) -> None:
    task_id = submitted(backend, INPUT)
    cancel = f"/v0.10/task/{task_id}/cancel"
    sdk_answer(TransferClient.cancel_task, path=cancel, status=409, code="Conflict",
               message="Task already completed", DATA_TYPE="error")  # fmt: skip
    backend.cancel(task_id)
    backend.cancel(task_id)
    backend.cancel("not-a-task")
    assert len(responses.calls) == 3  # submit, then two cancels; the bad id is not sent


def test_the_staging_helpers_locations_are_urls_their_backends_accept() -> None:
    # Issue 31.14: the helper's Globus URL was one parse_globus_url refuses.
    from lodestream.platform_adapters.transfers.rsync import RsyncLocation  # noqa: PLC0415
    from tests.support.staging import LOCATIONS  # noqa: PLC0415

    assert parse_globus_url(LOCATIONS["archive"])[0] == "5f2c0c4e-7a1b-4d6e-9f3a-2b8c1d0e4f6a"
    assert RsyncLocation.parse(LOCATIONS["dtn"]).host == "dtn.example.org"
