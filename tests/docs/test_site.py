"""The docs site builds from docs/ with MkDocs (Material) in strict mode: every warning fails it, so a broken
internal link or anchor, a page missing from the nav, or a nav entry without its page fails here. The `docs`
extra (in `dev`) installs MkDocs; without it the test says so and is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def nav_pages(nav) -> list[str]:
    """The pages of mkdocs.yml's nav, in order."""
    out: list[str] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_the_nav_holds_every_page_once():
    pages = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert len(pages) == len(set(pages)), "a page is in the nav twice"
    assert sorted(pages) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="needs the docs extra (pip install -e '.[docs]'; dev has it)")
    pytest.importorskip("material", reason="needs mkdocs-material (the docs extra)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor, printed on every build
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    for page in ("index.html", "benchmarks/index.html", "serving-api/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
