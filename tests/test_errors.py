"""The error tree: every type in errors.py is drawn in its docstring and is an ItlauditError, and the
CLI exits with whatever `exit_code` the raised class carries."""

from __future__ import annotations

import sys

import pytest

from itlaudit import errors
from itlaudit.cli import app as cli_app


def test_every_exported_error_is_in_the_documented_tree() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.ItlauditError), name
        assert f" {name} " in doc, f"{name} is missing from the tree in errors.py's docstring"


def test_every_error_class_in_errors_is_exported() -> None:
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == "itlaudit.errors"
    }
    assert defined == set(errors.__all__)


class _Unusual(errors.ScenarioError):
    exit_code = 7


@pytest.mark.parametrize(("raised", "code"), [(errors.BisectError("bad range"), 2), (_Unusual("odd"), 7)])
def test_cli_exits_with_the_class_exit_code(
    raised: errors.ItlauditError,
    code: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(cli_app, "app", fail)
    monkeypatch.setattr(sys, "argv", ["itlaudit", "run"])
    with pytest.raises(SystemExit) as exit_info:
        cli_app.main()
    assert exit_info.value.code == code
    assert capsys.readouterr().err == f"itlaudit: error: {raised}\n"
