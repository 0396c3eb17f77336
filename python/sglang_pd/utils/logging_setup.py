"""One logging format for every sglang-pd process."""

from __future__ import annotations

import logging

_FORMAT = "[%(asctime)s %(processName)s] %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str = "info") -> None:
    """Configure the root logger; safe to call again (e.g. in a spawned child).

    uvicorn is started with ``log_config=None`` so its loggers propagate here and share
    the format instead of installing their own handlers.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"--log-level must be one of debug, info, warning, error; got {level!r}")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(numeric)
    # Third-party chatter stays at WARNING unless the user asked for DEBUG.
    quiet = logging.WARNING if numeric > logging.DEBUG else logging.DEBUG
    for name in ("asyncio", "httpx", "httpcore", "multipart"):
        logging.getLogger(name).setLevel(quiet)
