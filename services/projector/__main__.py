"""``python -m services.projector``: run the live projector with settings from the environment."""

from __future__ import annotations

import logging

from lodestream import aio
from lodestream.settings import Settings
from services.projector.main import run


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    aio.run(run(Settings()))


if __name__ == "__main__":
    main()
