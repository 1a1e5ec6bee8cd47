"""Property: the pilot script's body hands every value to its commands as one word of data.

The site agent fills its job template (agents/site/scheduler/template.py) with values a user
(queue, project, filter tags) or a site (its name, its directory, the interpreter) controls.
Arbitrary strings in each are rendered into the default template, beneath a line that prints
the others; then bash runs the script for real, with ``cd`` and the interpreter replaced by
stubs that print the words they were given: the words must be exactly the values, one each,
and nothing else may run.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lodestream.agents.site.scheduler.template import (
    DEFAULT_TEMPLATE,
    LODE_MODULE,
    pilot_values,
    render,
)
from lodestream.schemas.events.batch import BatchRequestData
from lodestream.schemas.resources import TAG_KEY_PATTERN

# Anything a shell argument can hold: no NUL, and text that encodes (no lone surrogates).
TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=24)
NASTY = st.sampled_from(["$(touch pwned)", "'", '"; id; "', "\n", "-x", "--site", "`id`", "*"])
VALUES = st.one_of(TEXT, NASTY, st.tuples(TEXT, NASTY).map("".join))
TAGS = st.dictionaries(
    st.from_regex(TAG_KEY_PATTERN, fullmatch=True), VALUES.map(lambda v: v[:256]), max_size=3
)
PROLOGUE = "printf '%s\\0' q {{ queue }} p {{ project }} s {{ site }}\n"


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 'interpreter' that prints its arguments, NUL-separated, and does nothing else."""
    path = tmp_path_factory.mktemp("stub") / "python"
    path.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\"\n")
    path.chmod(0o755)
    return path


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(site_dir=VALUES.filter(bool), site=VALUES, queue=VALUES, project=VALUES, tags=TAGS)
def test_every_value_reaches_its_command_as_one_word(
    stub: Path, site_dir: str, site: str, queue: str, project: str, tags: dict[str, str]
) -> None:
    batch_id = uuid.uuid4()
    request = BatchRequestData(num_nodes=1, wall_time_min=7, job_mode="serial")
    request = request.model_copy(update={"filter_tags": tags})
    values = pilot_values(
        batch_id=batch_id, site=site, site_dir=Path(site_dir), request=request, queue=queue,
        project=project, scheduler="slurm", python=str(stub),
    )  # fmt: skip
    body = render(PROLOGUE + DEFAULT_TEMPLATE.read_text(), values)
    shell = "cd() { printf '%s\\0' cd \"$@\"; }\n" + body
    assert subprocess.run(["bash", "-n"], input=shell.encode(), check=False).returncode == 0
    done = subprocess.run(["bash"], input=shell.encode(), capture_output=True, check=False)

    assert done.returncode == 0, done.stderr
    words = done.stdout.decode().split("\0")[:-1]
    # Path() normalises (a trailing '/', '//'): the script carries the path as given to it.
    where = str(Path(site_dir))
    assert words == [
        "q", queue, "p", project, "s", site, "cd", where,
        "-m", LODE_MODULE, "launcher", "--site", where, "--mode", "serial",
        "--wall-time-min", "7", "--batch-job-id", str(batch_id),
        *(word for key, value in tags.items() for word in ("--tag", f"{key}:{value}")),
    ]  # fmt: skip
