"""Which carried wheels to install: those whose package the interpreter lacks or has older.
A wheel never shadows a newer copy in the image (typing-extensions, say, which torch uses too).

    python wheels.py WHEEL...   -> prints the wheels to install, one a line; the rest on stderr
Standard library only (runs before anything is installed)."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path


def _key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in re.findall(r"\d+|[a-z]+", version.lower()))


def needed(wheel: str) -> tuple[bool, str]:
    name, version = Path(wheel).name.split("-")[:2]
    try:
        have = metadata.version(name.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return True, f"{name} {version}: absent"
    if _key(have) < _key(version):
        return True, f"{name} {version}: image has older {have}"
    return False, f"{name} {version}: image has {have}, not installed"


# pydantic pins pydantic-core exactly: the two travel together or not at all
TOGETHER = ("pydantic-", "pydantic_core-")


def main(argv: list[str]) -> int:
    decided = {w: needed(w) for w in argv}
    pair = [w for w in argv if Path(w).name.startswith(TOGETHER)]
    if any(decided[w][0] for w in pair):
        decided.update({w: (True, decided[w][1] + " (installed with its pair)") for w in pair})
    for wheel in argv:
        keep, why = decided[wheel]
        print(wheel) if keep else None
        print(f"  wheel {why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
