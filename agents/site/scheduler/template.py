"""The pilot's batch script: a per-site template with ``{{ name }}`` placeholders, filled in.

The template is a file in the site directory (``job-template.sh``, written by
``lode site init`` from :data:`DEFAULT_TEMPLATE`); the agent reads it at every submission, so
an edit takes effect for the next pilot. Placeholders are ``{{ name }}`` rather than
``string.Template``'s ``$name`` because a shell script is full of ``$``; every value is
quoted for the shell before it goes in (:func:`pilot_values`), and nothing else in the
template is touched. A placeholder this module does not know, or a ``{{`` that is not one,
is a :class:`TemplateError` naming it and its line: the submission fails with that reason.

A request with ``filter_tags`` needs a template that passes them on (``{{ tag_options }}``):
one written before they existed would start a pilot that runs jobs of any tags, so it is
refused instead (:func:`check_passes_filter`).
"""

from __future__ import annotations

import re
import shlex
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from lodestream.schemas.events.batch import BatchRequestData
from lodestream.schemas.tagfilter import tag_options

DEFAULT_TEMPLATE: Final = Path(__file__).with_name("job-template.sh.tmpl")
PLACEHOLDER: Final = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_OPENING: Final = re.compile(r"\{\{")
LODE_MODULE: Final = "lodestream.client.cli.main"
TAG_OPTIONS: Final = "tag_options"


class TemplateError(ValueError):
    """The template cannot be rendered; the message names the file, line and placeholder."""


def pilot_values(
    *,
    batch_id: uuid.UUID,
    site: str,
    site_dir: Path,
    request: BatchRequestData,
    queue: str,
    project: str,
    scheduler: str,
    python: str = sys.executable,
) -> dict[str, str]:
    """What a template may name, each value quoted for the shell.

    ``lode`` runs the ``lode`` command with the agent's own interpreter, so a pilot on a
    compute node uses the same installation (on the shared filesystem) as the agent.
    """
    raw = {
        "batch_job_id": str(batch_id),
        "site": site,
        "site_dir": str(site_dir),
        "mode": request.job_mode,
        "wall_time_min": str(request.wall_time_min),
        "num_nodes": str(request.num_nodes),
        "queue": queue,
        "project": project,
        "scheduler": scheduler,
        "python": python,
    }
    values = {name: shlex.quote(value) for name, value in raw.items()}
    values["lode"] = shlex.join([python, "-m", LODE_MODULE])
    # Words, each quoted: `--tag beam:A --tag 'run:7 b'`; nothing when the request has none.
    values[TAG_OPTIONS] = shlex.join(tag_options(request.filter_tags))
    return values


def check_passes_filter(
    template: str, request: BatchRequestData, *, name: str = "the job template"
) -> None:
    """:class:`TemplateError` if ``request`` filters its pilot's jobs by tag and ``template``
    would not pass the filter on: its pilot would run every job of the site."""
    if request.filter_tags and TAG_OPTIONS not in {
        m.group(1) for m in PLACEHOLDER.finditer(template)
    }:
        raise TemplateError(
            f"{name} has no {{{{ {TAG_OPTIONS} }}}}, so its pilot would run jobs of any tags, "
            f"not only those of this request's filter_tags; add it to the template's "
            f"`lode launcher` line (see {DEFAULT_TEMPLATE.name})"
        )


def render(template: str, values: Mapping[str, str], *, name: str = "the job template") -> str:
    """``template`` with each ``{{ key }}`` replaced by ``values[key]``; pure.

    A leading ``#!`` line is dropped: the scheduler adapter writes the script's own shebang
    and directives above the body.
    """
    lines = template.splitlines(keepends=True)
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    out = []
    for number, line in enumerate(lines, 1):
        unknown = [m.group(1) for m in PLACEHOLDER.finditer(line) if m.group(1) not in values]
        if unknown:
            known = ", ".join(sorted(values))
            raise TemplateError(
                f"{name}, line {number}: unknown placeholder {{{{ {unknown[0]} }}}} "
                f"(known: {known})"
            )
        rendered = PLACEHOLDER.sub(lambda m: values[m.group(1)], line)
        # A `{{` left over after substitution is a placeholder with a typo ({{ x y }}, {{x).
        leftover = _OPENING.search(PLACEHOLDER.sub("", line))
        if leftover is not None:
            raise TemplateError(
                f"{name}, line {number}: '{{{{' that is no placeholder {{{{ name }}}}: "
                f"{line.strip()[:120]!r}"
            )
        out.append(rendered)
    return "".join(out)


def read_template(path: Path) -> str:
    """The template's text; :class:`TemplateError` if it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise TemplateError(
            f"job template {path} not found (lode site init writes one; "
            f"copy {DEFAULT_TEMPLATE} there)"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"job template {path} cannot be read: {exc}") from exc
