"""Property, against the real Slurm of tests/fixtures/slurm.py: sbatch reads from the
``#SBATCH`` block exactly the options the request asked for, with exactly its values.

Arbitrary strings as the job name, project and the values of ``comment`` and ``mail-user`` (the
options of the audit's exploit, issue 29) are rendered by the Slurm adapter. Either it refuses
(``InvalidSubmission``), or ``sbatch --verbose --test-only`` on the script alone (no option on
its command line) lists the options it parsed from the directives: those, and only those.
"""

from __future__ import annotations

import subprocess
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lodestream.platform_adapters.errors import InvalidSubmission
from lodestream.platform_adapters.schedulers.base import BatchRequest
from lodestream.platform_adapters.schedulers.slurm.render import render_sbatch_header
from lodestream.schemas.events.batch import SCHEDULER_VALUE_PATTERN
from tests.fixtures.slurm import PARTITION, SlurmCluster

NASTY = (
    " --export=ALL,BASH_ENV=$(id)", "\n#SBATCH --export=ALL", "'", '"', "\\", "#", "HetJob,x",
    "\t--hold", "-", "a b",
)  # fmt: skip
SAFE = st.from_regex(SCHEDULER_VALUE_PATTERN, fullmatch=True).map(lambda s: s[:30])
VALUES = st.one_of(
    SAFE.filter(bool),
    st.text(max_size=20),
    st.tuples(SAFE, st.sampled_from(NASTY), SAFE).map("".join),
)
EXTRA = frozenset({"test-only", "verbose"})  # sbatch's own, from its command line


def defined_options(stderr: str) -> dict[str, str]:
    """sbatch -v's table of the options it parsed: ``sbatch: comment             : x``."""
    lines = stderr.splitlines()
    start = lines.index("sbatch: defined options") + 2
    end = lines.index("sbatch: end of defined options") - 1
    table = {}
    for line in lines[start:end]:
        name, _, value = line.removeprefix("sbatch: ").partition(" : ")
        table[name.strip()] = value
    return table


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job_name=VALUES, project=VALUES, comment=VALUES, mail_user=VALUES)
@example(job_name="lode-x", project="p", comment="x --export=ALL,BASH_ENV=$(id)", mail_user="a")
@example(job_name="lode-x", project="p", comment="ok", mail_user="ada@example.org")
def test_sbatch_reads_the_directives_as_asked(
    slurm_cluster: SlurmCluster, job_name: str, project: str, comment: str, mail_user: str
) -> None:
    options = {"comment": comment, "mail-user": mail_user}
    try:
        request = BatchRequest(nodes=1, wall_time_min=5, queue=PARTITION, project=project,
                               job_name=job_name, options=options)  # fmt: skip
        header = render_sbatch_header(request)
    except InvalidSubmission:
        return  # which values must be refused is the unit property test's business
    script = slurm_cluster.root / "directives.sh"
    script.write_text("#!/bin/bash\n" + header + "true\n")
    done = subprocess.run(
        ["sbatch", "--verbose", "--test-only", str(script)], env=slurm_cluster.env,
        cwd=slurm_cluster.root, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    parsed = defined_options(done.stderr)
    asked: dict[str, Any] = {
        "account": project, "partition": PARTITION, "job-name": job_name, **options,
    }  # fmt: skip
    assert {k: parsed.get(k) for k in asked} == asked
    assert set(parsed) - set(asked) - EXTRA <= {"nodes", "time"}
