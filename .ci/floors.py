"""Print a pip constraints file that pins every direct dependency of specdec[dev] to its floor's release.

pyproject.toml gives each dependency a lowest version (">=X"); .ci/run installs
the newest ones allowed, .ci/floors the lowest (what uv calls lowest-direct):
"X.*", the floor's own release with its newest patch (a floor of 10.15 means
10.15.1.29 where no 10.15.0 was published). Dependencies of dependencies are
left to pip. Usage: python3 .ci/floors.py > floors.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirements(project: dict, extra: str | None, seen: set[str]) -> list[str]:
    """The requirement strings of the base dependencies or of ``extra``, following specdec[...] self-references."""
    reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    out: list[str] = []
    for req in reqs:
        spec = req.split(";")[0].strip()
        own = re.fullmatch(r"specdec\[([\w,\- ]+)\]", spec)
        if own:
            for name in (e.strip() for e in own.group(1).split(",")):
                if name not in seen:
                    seen.add(name)
                    out += requirements(project, name, seen)
        else:
            out.append(spec)
    return out


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def main() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins: dict[str, str] = {}
    for req in requirements(project, None, set()) + requirements(project, "dev", {"dev"}):
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(.*)", req)
        name, spec = m.group(1).lower().replace("_", "-"), m.group(2)
        exact = re.search(r"==\s*([0-9][^,\s]*)", spec)
        floor = re.search(r">=\s*([0-9][^,\s]*)", spec)
        if not (exact or floor):
            sys.exit(f"{req!r} in pyproject.toml has no floor (>=) or pin (==): every dependency needs one")
        version = exact.group(1) if exact else floor.group(1) + ".*"  # an exact pin is its own floor
        # named twice (transformers: >=5.3 in hf, >=5.24 in gguf): the lowest version every extra allows is the highest floor
        if name not in pins or _numbers(version) > _numbers(pins[name]):
            pins[name] = version
    for name, version in sorted(pins.items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
