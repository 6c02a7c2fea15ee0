"""`bisect --dry-run` where the wheel index cannot be reached (no network): the reason is said once, not
once per commit, and a dry run that found no build at all exits 2 instead of 0."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from itlaudit.cli import app as cli


def _closed_port() -> int:
    """A loopback port nothing listens on: every lookup there is refused, as without a network."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dry_run_without_the_wheel_index_says_no_network_once_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shas = [os.urandom(20).hex() for _ in range(4)]
    (tmp_path / "commits.txt").write_text("".join(f"{sha}\n" for sha in shas))
    index = f"http://127.0.0.1:{_closed_port()}"
    argv = ["itlaudit", "bisect", "--from", shas[0], "--to", shas[-1], "--commits-file"]
    argv += [str(tmp_path / "commits.txt"), "--wheels-url", index, "--dry-run"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    captured = capsys.readouterr()
    assert exited.value.code == 2
    assert captured.out.count("no network?") == 1, captured.out
    assert f"4 builds missing: cannot reach {index} (" in captured.out
    assert not any(sha[:12] in captured.out for sha in shas[1:-1])  # no line per commit
    assert "0 of 4 builds found" in captured.out
    error = captured.err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("itlaudit: error: none of the 4 builds was found"), error
    assert "no network?" in error[0] and "Traceback" not in captured.err
