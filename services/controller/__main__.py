"""``python -m lodestream.services.controller``: run the controller, settings from the env."""

from __future__ import annotations

import logging

from lodestream import aio
from lodestream.services.controller.main import run
from lodestream.settings import Settings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    aio.run_service(run(Settings()))


if __name__ == "__main__":
    main()
