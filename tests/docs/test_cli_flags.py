"""Each command's reference page lists every flag the command has (its --help), each choice flag with its choices
where the table has a value column, and no flag the command lacks (a table once said there was no --lowering)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from specdec.cli.bench import main as bench_main
from specdec.cli.build import main as build_main
from specdec.cli.eval import main as eval_main
from specdec.cli.run import main as run_main
from specdec.cli.serve import main as serve_main
from specdec.cli.train import main as train_main

DOCS = Path(__file__).resolve().parents[2] / "docs"

# command, its page, and the heading of the section whose table (or tables) lists its flags
REFERENCES = [
    ("specdec-build", build_main, "cli-build.md", "Flags"),
    ("specdec-run", run_main, "cli-run.md", "Flags"),
    ("specdec-bench prepare-dataset", bench_main.commands["prepare-dataset"], "bench.md", "prepare-dataset"),
    ("specdec-bench run", bench_main.commands["run"], "bench.md", "run"),
    ("specdec-eval", eval_main, "eval.md", "Usage"),
    ("specdec-serve", serve_main, "serving-api.md", "Flags"),
    ("specdec-train prepare-data", train_main.commands["prepare-data"], "train-heads.md", "Flags"),
    ("specdec-train run", train_main.commands["run"], "train-heads.md", "Flags"),
]


def section(page: str, heading: str) -> str:
    """The text of ``## heading`` up to the next ``## `` heading."""
    text = (DOCS / page).read_text()
    start = re.search(rf"^## {re.escape(heading)}\s*$", text, re.M)
    assert start, f"{page} has no '## {heading}' section"
    end = re.search(r"^## ", text[start.end():], re.M)
    return text[start.end(): start.end() + end.start() if end else len(text)]


def tables(text: str) -> list[list[list[str]]]:
    found, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|[\s:|-]+\|", line.strip()):
                current.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif current:
            found.append(current)
            current = []
    return found


def documented(command: str, page: str, heading: str) -> list[tuple[set[str], list[str]]]:
    """The flag rows of the command's table: (every flag spelled in its flag and aliases cells, the backticked values
    of its value cell, if the table has one). Two commands in one section ('specdec-train prepare-data', '... run')
    each own the table after the line that names them."""
    text = section(page, heading)
    if command.startswith("specdec-train"):
        sub = command.split()[-1]
        text = text[text.index(f"`specdec-train {sub}`:"):]
        text = text[: text.index("`specdec-train run`:")] if sub == "prepare-data" else text
    rows = []
    for table in [t for t in tables(text) if t[0][0] == "flag"][:1]:
        header = table[0]
        value_col = header.index("value") if "value" in header else None
        for cells in table[1:]:
            flags = set(re.findall(r"`(-[-\w]+)", cells[0] + " " + (cells[1] if header[1] == "aliases" else "")))
            if flags:
                rows.append((flags, re.findall(r"`([^`]+)`", cells[value_col]) if value_col is not None else []))
    return rows


def test_the_table_reader_takes_flags_aliases_and_values():
    text = ("## Flags\n\n| flag | aliases | value | default | meaning |\n|---|---|---|---|---|\n"
            "| `--dtype` | `--d` | `auto`, `float32` | | x |\n| `-h` | `--help` | | | |\n")
    assert tables(text)[0][1][:3] == ["`--dtype`", "`--d`", "`auto`, `float32`"]


@pytest.mark.parametrize("command,cmd,page,heading", REFERENCES, ids=[r[0] for r in REFERENCES])
def test_every_flag_is_documented(command, cmd, page, heading):
    rows = documented(command, page, heading)
    spelled = set().union(*(flags for flags, _ in rows))
    options = [p for p in cmd.params if isinstance(p, click.Option)]
    known = {o for p in options for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
    missing = [max(p.opts, key=len) for p in options if not p.hidden and not set(p.opts) & spelled]
    assert not missing, f"{page} does not list these flags of {command}: {missing}"
    assert spelled <= known, f"{page} lists flags {command} does not have: {sorted(spelled - known)}"
    for flags, values in rows:
        for p in options:
            if set(p.opts) & flags and isinstance(p.type, click.Choice) and values:
                assert values[: len(p.type.choices)] == list(p.type.choices), \
                    f"{command} {p.opts[0]}: choices {list(p.type.choices)}, page says {values}"
