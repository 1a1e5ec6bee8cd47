"""Reading rsync's output and exit status, on output captured from real runs
(``tests/data/transfers/capture_rsync.py``), and the command lines it is given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lodestream.platform_adapters.transfers.base import ItemOutcome
from lodestream.platform_adapters.transfers.paths import ItemPaths
from lodestream.platform_adapters.transfers.rsync import (
    PARTIAL_DIR,
    RsyncLocation,
    render_rsync_argv,
)
from lodestream.platform_adapters.transfers.rsync_output import (
    RSYNC_EXIT_CODES,
    Retry,
    error_words,
    item_outcome,
    skipped_directories,
    transferred_bytes,
)

DATA = Path(__file__).parents[1] / "data" / "transfers" / "rsync"


def captured(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{case}.json").read_text())
    return data


def outcome_of(case: str) -> ItemOutcome:
    run = captured(case)
    return item_outcome(run["returncode"], run["stdout"], run["stderr"])


def test_a_copied_file_reports_its_size() -> None:
    assert outcome_of("file_copied") == ItemOutcome(ok=True, bytes_transferred=6)
    assert outcome_of("ssh_file_copied") == ItemOutcome(ok=True, bytes_transferred=6)


def test_a_copied_tree_reports_the_sum_of_its_files() -> None:
    assert outcome_of("tree_copied") == ItemOutcome(ok=True, bytes_transferred=4 + 8)


def test_digit_group_separators_are_read() -> None:
    stdout = captured("human_readable_stats")["stdout"]
    assert "2,097,152" in stdout
    assert transferred_bytes(stdout) == 2 * 1024 * 1024


def test_stats_missing_reads_as_unknown() -> None:
    assert transferred_bytes("") is None
    assert transferred_bytes(captured("interrupted")["stdout"]) is None


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("missing_source", "No such file or directory"),
        ("ssh_missing_source", "No such file or directory"),
        ("permission_denied", "Permission denied"),
        ("no_space", "No space left on device"),
        ("recursive_on_a_file", "Not a directory"),
    ],
)
def test_failures_no_retry_can_mend_are_permanent_in_rsyncs_words(case: str, words: str) -> None:
    outcome = outcome_of(case)
    assert not outcome.ok
    assert outcome.permanent
    assert words in outcome.reason
    assert outcome.reason.startswith("rsync: ")  # its own first line, not our paraphrase


def test_a_missing_source_names_the_path() -> None:
    assert 'link_stat "' in outcome_of("missing_source").reason
    assert "no-such-file" in outcome_of("missing_source").reason


@pytest.mark.parametrize(
    ("case", "codes"),
    [
        ("interrupted", {20}),
        # rsync exits 12 or 255 here, depending on whether it reaped ssh before it noticed
        # the closed connection: both were seen.
        ("ssh_refused", {12, 255}),
        ("ssh_key_refused", {255}),
        ("ssh_unknown_host_key", {255}),
        ("ssh_no_remote_rsync", {127}),
        ("ssh_timeout", {30}),
    ],
)
def test_connection_and_interruption_failures_are_retried(case: str, codes: set[int]) -> None:
    assert captured(case)["returncode"] in codes
    outcome = outcome_of(case)
    assert not outcome.ok
    assert not outcome.permanent
    assert outcome.reason


def test_ssh_words_stay_in_the_reason() -> None:
    # "Permission denied" here is ssh refusing the key: the site's to mend, not the item's.
    assert "Permission denied (publickey)" in outcome_of("ssh_key_refused").reason
    assert "Host key verification failed" in outcome_of("ssh_unknown_host_key").reason
    assert "Connection refused" in outcome_of("ssh_refused").reason


def test_a_directory_without_recursive_is_a_permanent_failure_though_rsync_exits_0() -> None:
    run = captured("directory_not_recursive")
    assert run["returncode"] == 0
    assert skipped_directories(run["stdout"]) == ["tree"]
    outcome = outcome_of("directory_not_recursive")
    assert (outcome.ok, outcome.permanent) == (False, True)
    assert outcome.reason == "rsync: skipping directory tree: the item is not recursive"


def test_a_signal_and_an_unlisted_status_are_retried() -> None:
    assert item_outcome(-9, "", "") == ItemOutcome(ok=False, reason="rsync was killed by signal 9")
    unlisted = item_outcome(99, "", "")
    assert (unlisted.ok, unlisted.permanent) == (False, False)
    assert unlisted.reason == "rsync exited 99 (an exit status rsync does not list)"


def test_usage_errors_are_permanent_even_without_words() -> None:
    assert item_outcome(1, "", "rsync: --bogus: unknown option").permanent
    assert RSYNC_EXIT_CODES[2][0] == "protocol incompatibility"
    assert item_outcome(2, "", "").permanent


def test_partial_transfer_with_other_words_is_retried() -> None:
    stderr = 'rsync: [sender] read errors mapping "/x": Input/output error (5)\n'
    assert not item_outcome(23, "", stderr).permanent
    vanished = 'file has vanished: "/data/x"\n'
    assert not item_outcome(24, "", vanished).permanent


def test_error_words_are_joined_and_bounded() -> None:
    assert error_words("a\n\n  b  \n") == "a; b"
    long = error_words("x" * 5000)
    assert len(long) == 1000
    assert long.endswith("...")


LOCAL = RsyncLocation.parse("rsync:/base")
REMOTE = RsyncLocation.parse("rsync://alice@hpc.example.org:2222/scratch")


def test_a_local_file_item_is_one_rsync_with_its_paths_last() -> None:
    argv = render_rsync_argv(
        "rsync", LOCAL, ItemPaths("/base/a b.txt", "/work/x/a.txt", True), recursive=False
    )
    assert argv[0] == "rsync"
    assert argv[-3:] == ["--", "/base/a b.txt", "/work/x/a.txt"]
    for option in ("--stats", "--mkpath", "--times", "--copy-links", "--no-human-readable"):
        assert option in argv
    assert f"--partial-dir={PARTIAL_DIR}" in argv
    assert "--recursive" not in argv
    assert "--rsh" not in argv


def test_a_tree_copies_its_contents_into_the_destination_directory() -> None:
    argv = render_rsync_argv(
        "rsync", LOCAL, ItemPaths("/base/tree", "/work/tree/", True), recursive=True
    )
    assert argv[-2:] == ["/base/tree/", "/work/tree/"]
    assert {"--recursive", "--links"} <= set(argv)
    assert "--copy-links" not in argv


def test_over_ssh_the_remote_side_names_the_host_and_ssh_is_quoted() -> None:
    ssh = ["ssh", "-p", "2222", "-i", "/keys/my key"]
    stage_in = render_rsync_argv(
        "rsync", REMOTE, ItemPaths("/scratch/in.dat", "/work/in.dat", True),
        recursive=False, ssh_argv=ssh, rsync_options=["--bwlimit=1m"],
    )  # fmt: skip
    assert stage_in[-2:] == ["alice@hpc.example.org:/scratch/in.dat", "/work/in.dat"]
    assert stage_in[stage_in.index("--rsh") + 1] == "ssh -p 2222 -i '/keys/my key'"
    assert stage_in.index("--bwlimit=1m") < stage_in.index("--")
    stage_out = render_rsync_argv(
        "rsync", REMOTE, ItemPaths("/work/out", "/scratch/out", False),
        recursive=True, ssh_argv=ssh,
    )  # fmt: skip
    assert stage_out[-2:] == ["/work/out/", "alice@hpc.example.org:/scratch/out/"]


def test_an_ipv6_host_is_bracketed() -> None:
    location = RsyncLocation.parse("rsync://[::1]/")
    assert location.host == "::1"
    assert location.user is None
    assert location.operand("/x", remote=True, directory=False) == "[::1]:/x"


@pytest.mark.parametrize("code", sorted(RSYNC_EXIT_CODES))
def test_every_listed_status_follows_its_table_entry(code: int) -> None:
    # The words of a missing file: they decide only where the table says so.
    words = 'rsync: link_stat "/x" failed: No such file or directory (2)\n'
    outcome = item_outcome(code, "", words)
    retry = RSYNC_EXIT_CODES[code][1]
    assert not outcome.ok
    assert outcome.permanent is (retry is not Retry.TRANSIENT)
    assert not item_outcome(code, "", "").permanent or retry is Retry.PERMANENT
