"""How the command line is put together and how its help reads, at the cost of typer alone.

`itlaudit --help` lists every command without importing one (issue 24 item 6: each command's module
pulls in its stage's stack, and the whole list cost half a second before typer drew a line): the root
is a `LazyRoot` over a table of `Entry` rows (name, where the command is, panel, one-line summary) and
imports a command's module only when that command is the one run or its own help is asked for. The
help style (Unix spellings for every parameter) is applied to each command as it loads.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast, get_args

import typer
import typer.main
from rich.markup import escape
from typer._click import Command  # typer vendors click; its commands are this class
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

# --- Help style ------------------------------------------------------------------------------------
# typer (>= 0.29) labels every parameter with its Python annotation (`<bool>`, `<list[str]>`, `<path>`)
# and writes a required argument as `{name}` in the usage line; a metavar replaces the label of an
# option only. `restyle` gives each parameter the spelling a Unix tool uses instead: the metavar where
# one is declared, else TEXT, INTEGER, FLOAT, PATH or the choices as [a|b]; nothing for an on/off flag;
# arguments as NAME / [NAME] / NAME... in the usage line.


def _label(param: TyperOption) -> str | None:
    if param.metavar is not None:
        return param.metavar or None
    if param.is_flag or param.count:
        return None
    desc = param.type_descriptor
    if desc.choices is not None:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in desc.choices) + "]"
    if desc.is_path:
        return "PATH"
    annotation = get_args(desc.annotation)[0] if desc.is_list else desc.annotation
    return {int: "INTEGER", float: "FLOAT"}.get(annotation, "TEXT")


class _Option(TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        return _label(self)


class _Argument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        return None  # the name column already shows it in capitals

    def get_usage_pieces(self, ctx: Any) -> list[str]:
        name = self.metavar or (self.name or "").upper()
        name = name if self.required else f"[{name}]"
        return [name + ("..." if self.nargs != 1 else "")]


def _one_line_paragraphs(text: str | None) -> str | None:
    """A docstring's paragraphs without their hard line breaks (the help wraps to the terminal), and
    with brackets shown as typed (`[workload]`), not read as Rich markup."""
    if text is None:
        return None
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return escape("\n\n".join(" ".join(p.split()) for p in paragraphs))


def restyle(command: Any) -> None:
    """A command, its parameters and every command below it, in the help style above."""
    command.help = _one_line_paragraphs(command.help)
    help_option = command.get_help_option(typer.Context(command))
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        param.help = _one_line_paragraphs(param.help)
        if type(param) is TyperOption:
            param.__class__ = _Option
        elif type(param) is TyperArgument:
            if param.metavar is None:
                param.metavar = (param.name or "").upper()
            param.__class__ = _Argument
    for sub in getattr(command, "commands", {}).values():
        restyle(sub)


# --- The lazy root ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One command of the root: `target` is "module:attribute", a command function or a typer.Typer
    (a group of commands); `summary` is its line in `itlaudit --help` (its docstring stays its own
    --help), so the list is drawn without importing the module."""

    name: str
    target: str
    panel: str
    summary: str


def _load(entry: Entry) -> Command:
    """The click command `entry` names, built by typer as `app.command()`/`app.add_typer()` would, in
    the help style."""
    module, attribute = entry.target.split(":")
    obj = getattr(importlib.import_module(module), attribute)
    holder = typer.Typer(add_completion=False)
    holder.callback()(_no_options)  # a group, so typer keeps the command's own name
    if isinstance(obj, typer.Typer):
        holder.add_typer(obj, name=entry.name, rich_help_panel=entry.panel)
    else:
        holder.command(name=entry.name, rich_help_panel=entry.panel)(obj)
    command = typer.main.get_group(holder).commands[entry.name]
    command.short_help = _one_line_paragraphs(entry.summary)
    restyle(command)
    return command


def _no_options() -> None:
    """The holder group's callback: nothing of its own."""


class _Commands(Mapping[str, Command]):
    """The root's commands by name, in the table's order, each imported the first time it is read."""

    def __init__(self, entries: tuple[Entry, ...]) -> None:
        self._entries = {entry.name: entry for entry in entries}
        self._loaded: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded:
            self._loaded[name] = _load(self._entries[name])
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries  # Mapping's would load the command to answer

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def listed(self, name: str) -> Any:
        """What the root's own --help shows for `name`: the command if it is loaded, else a stand-in
        with its panel and summary."""
        if name in self._loaded:
            return self._loaded[name]
        entry = self._entries[name]
        return TyperCommand(
            name=entry.name, short_help=_one_line_paragraphs(entry.summary), rich_help_panel=entry.panel
        )


class LazyRoot(TyperGroup):
    """The root group (`typer.Typer(cls=...)`, a subclass naming its `entries`): commands come from
    the table and load when resolved; its own --help lists them from the table."""

    entries: ClassVar[tuple[Entry, ...]] = ()

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        if self.commands:  # registered with app.command(): it would not be listed nor found
            raise TypeError(f"{sorted(self.commands)}: a root command is a row of the table (Entry)")
        restyle(self)  # before the table goes in: restyling walks every command, and would load them
        self.commands = cast(MutableMapping[str, Any], _Commands(self.entries))  # read, never added to
        self._listing = False

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands:
            return None
        if self._listing:
            return cast(_Commands, self.commands).listed(cmd_name)
        return self.commands[cmd_name]

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # typer's reads `commands.items()`, which would load every command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False
