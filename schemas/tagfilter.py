"""A pilot's tag filter as words of its command line: ``--tag key:value``, once per pair.

Two writers render a pilot's command line, and both must say a filter the same way: the
launcher when it starts warm workers, and the site's job template when it submits a batch
job with ``filter_tags``. Parsing the words back is the launcher's
(:mod:`lodestream.agents.launcher.tags`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

TAG_OPTION: Final = "--tag"


def tag_options(filter_tags: Mapping[str, str]) -> list[str]:
    """The launcher's command-line words for ``filter_tags``: ``--tag key:value`` each, the
    one tag syntax of every surface."""
    return [word for key, value in filter_tags.items() for word in (TAG_OPTION, f"{key}:{value}")]
