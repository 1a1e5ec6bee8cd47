"""``python -m services.api``: serve the API with uvicorn, settings from the environment."""

from __future__ import annotations

import logging

import uvicorn

from lodestream.settings import Settings
from services.api.main import create_app


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings()
    uvicorn.run(
        create_app(settings),
        host=settings.api.host,
        port=settings.api.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
