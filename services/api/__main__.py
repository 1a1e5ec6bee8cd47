"""``python -m lodestream.services.api``: serve the API with uvicorn, settings from the env."""

from __future__ import annotations

import logging

import uvicorn

from lodestream.services.api.main import create_app, tune_gc
from lodestream.settings import Settings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings()
    app = create_app(settings)
    tune_gc()
    uvicorn.run(
        app,
        host=settings.api.host,
        port=settings.api.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
