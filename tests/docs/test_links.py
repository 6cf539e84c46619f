"""Every link a reader follows resolves: Markdown links in the README, the docs and the repository's other READMEs
(files, and anchors in Markdown files), and the `docs/PAGE.md#anchor` references in source files and --help texts.

The docs are read on GitHub (its anchors) and on the MkDocs site (Python-Markdown's, which `mkdocs build --strict`
checks in test_site.py); a heading whose two anchors differ would work on one and not the other, so none may.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in tracked if (ROOT / f).is_file()]


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link inside code is code)."""
    out, code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            code = not code
            continue
        if not code:
            out.append(line)
    return "\n".join(out)


def headings(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", prose(text), re.M)]


def github_slug(heading: str) -> str:
    """GitHub's anchor: lower case, inline markup dropped, every character but letters, digits, '-', '_' and space
    dropped, each space a hyphen."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def site_slug(heading: str) -> str:
    """Python-Markdown's toc anchor (what MkDocs renders): ASCII, non-word characters dropped, runs of spaces and
    hyphens one hyphen."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for h in headings(path.read_text()):
        slug = github_slug(h)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_slugs_follow_both_renderers():
    assert github_slug("`draft_len=\"auto\"` for every method") == "draft_lenauto-for-every-method"
    assert github_slug("Load test: `benchmarks/bench_serving.py`") == "load-test-benchmarksbench_servingpy"
    assert site_slug("a - b") == "a-b" and github_slug("a - b") == "a---b"


def test_every_docs_heading_has_the_same_anchor_on_github_and_on_the_site():
    differ = [f"{p.relative_to(ROOT)}: {h!r} -> github #{github_slug(h)}, site #{site_slug(h)}"
              for p in sorted((ROOT / "docs").glob("*.md")) for h in headings(p.read_text()) if github_slug(h) != site_slug(h)]
    assert not differ, "rename these headings (a ' - ', an arrow or a symbol between spaces makes the anchors differ):\n" + "\n".join(differ)


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in markdown_files()])
def test_every_link_resolves(page):
    path = ROOT / page
    text = prose(path.read_text())
    broken = []
    for target in [m.group(2) for m in LINK.finditer(text)] + IMAGE.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("mailto:"):
            continue  # a web address: not checked offline
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page}:\n" + "\n".join(broken)


def source_references() -> list[tuple[str, str]]:
    """(file, 'docs/PAGE.md#anchor') for every docs reference in the package's sources, scripts and examples."""
    tracked = subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.toml", "*.c", "*.yml"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    refs = []
    for f in tracked:
        if f.startswith("tests/docs/"):
            continue
        for m in re.finditer(r"docs/([\w\-]+\.md)(#[\w\-]+)?", (ROOT / f).read_text(errors="replace")):
            refs.append((f, m.group(0)))
    return refs


def test_docs_references_in_the_code_resolve():
    assert source_references(), "the scan found no references: its pattern is wrong"
    broken = []
    for f, ref in source_references():
        page, _, anchor = ref.partition("#")
        if not (ROOT / page).is_file():
            broken.append(f"{f}: {ref}: no such page")
        elif anchor and anchor not in anchors(ROOT / page):
            broken.append(f"{f}: {ref}: no such heading")
    assert not broken, "\n".join(broken)
