"""docs/cli.md's specdec-build table lists every flag the command has, each choice flag with its choices, and no flag
it lacks (the table once said there was no --lowering)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from specdec.cli.build import main as build_main

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def build_table() -> dict[str, list[str]]:
    """The specdec-build section's flag table: flag -> the backticked values of its 'value' cell."""
    text = PAGE.read_text()
    section = text[text.index("## specdec-build"): text.index("## specdec-run")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and cells[0].startswith("`-"):
            rows[re.findall(r"`([^`]+)`", cells[0])[0]] = re.findall(r"`([^`]+)`", cells[2])
    return rows


def test_every_specdec_build_flag_is_documented_with_its_choices():
    table = build_table()
    options = {max(p.opts, key=len): p for p in build_main.params if isinstance(p, click.Option)}
    documented = {f for f in table if f not in ("-h", "--help")}
    assert documented == set(options) - {"--help"}, f"missing: {sorted(set(options) - documented - {'--help'})}, extra: {sorted(documented - set(options))}"
    for flag, param in options.items():
        if isinstance(param.type, click.Choice):
            assert table[flag] == list(param.type.choices), flag
