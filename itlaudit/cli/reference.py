"""docs/options.md, from the parser itself: every option of every command, one table, so that two
commands spelling one thing two ways shows up in review and a drift between the docs and the code
fails CI (tests/test_help.py compares the file with this module's output).

    .venv/bin/python -m itlaudit.cli.reference > docs/options.md
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer

from itlaudit.cli.app import app

_HEADER = """# Every option of every command

Generated from the command line's own parser by `python -m itlaudit.cli.reference` (do not edit by
hand: `tests/test_help.py` fails when this page and the code disagree). One name, one meaning: an
option that two commands share is declared once and reads the same in both.

| command | option | value | help |
|---|---|---|---|
"""


def _commands(command: Any, prefix: list[str]) -> Iterator[tuple[str, Any]]:
    """(the words that name it, the command) for every command that takes options, in name order
    (typer's groups and commands: click's shapes, from typer's own copy of click)."""
    context = type(command).context_class(command)
    for name in sorted(command.list_commands(context)):
        sub = command.get_command(context, name)
        if sub is None:
            continue
        if hasattr(sub, "list_commands"):
            yield from _commands(sub, [*prefix, name])
        else:
            yield " ".join([*prefix, name]), sub


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def option_table() -> str:
    """The page's Markdown."""
    rows = []
    for name, command in _commands(typer.main.get_command(app), ["itlaudit"]):
        context = type(command).context_class(command)
        for param in command.params:
            if param.param_type_name != "option" or param.hidden:
                continue
            spelled = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
            value = _cell(param.display_type_rich(context) or "")  # as --help shows it
            rows.append(f"| {name} | {spelled} | {value} | {_cell(param.help or '')} |")
    return _HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(option_table(), end="")
