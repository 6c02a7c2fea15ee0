"""The ordered list of builds to bisect over: commits from a git clone or a file, or released versions.

Listing is cheap and happens once; whether a build really exists is only found out when a probe needs
it (mozregression's lazy build lookup), because checking 600 nightlies up front would cost more than
the bisection. Builds are always oldest first; which end is "good" is the search's business.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Literal

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from itlaudit.errors import BisectError, ItlauditError
from itlaudit.side.client import SIDE_TIMEOUT_S, BlockingSideClient

BuildKind = Literal["commit", "version"]
SHORT_SHA = 9
_SHA_RE = re.compile(r"^[0-9a-fA-F]{4,40}$")
PYPI_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class Build:
    """One point of the range: `ref` is what providers consume (full sha or exact version)."""

    ref: str
    kind: BuildKind

    @property
    def label(self) -> str:
        return self.ref[:SHORT_SHA] if self.kind == "commit" else self.ref

    def to_json(self) -> dict[str, str]:
        return {"ref": self.ref, "kind": self.kind}

    @classmethod
    def from_json(cls, data: dict[str, str]) -> Build:
        return cls(ref=data["ref"], kind=data["kind"])  # type: ignore[arg-type]


def check_ends(good: str, bad: str) -> None:
    if good.strip().lower() == bad.strip().lower():
        raise BisectError(f"--from and --to are the same ({good}); give two different builds")


def _git(repo: Path, *args: str) -> str:
    try:
        result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise BisectError(f"cannot run git ({exc}); install git or use --commits-file") from None
    if result.returncode != 0:
        raise BisectError(f"git {' '.join(args)} failed in {repo}: {result.stderr.strip() or 'no output'}")
    return result.stdout


def is_vllm_clone(path: Path) -> bool:
    """A git work tree whose top holds the `vllm` package: where a user standing in their clone
    expects the commit list to come from."""
    try:
        result = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return False
    top = result.stdout.strip()
    return result.returncode == 0 and bool(top) and (Path(top) / "vllm" / "__init__.py").is_file()


def _resolve(repo: Path, ref: str) -> str:
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    except BisectError:
        raise BisectError(
            f"{ref!r} is not a commit in {repo}; fetch it (git fetch) or check the sha"
        ) from None


def commits_from_repo(repo: Path, good: str, bad: str) -> list[Build]:
    """First-parent commits good..bad plus good itself: merged branches' inner commits never built
    as nightlies, so following second parents would only add skips."""
    check_ends(good, bad)
    if not repo.is_dir():
        raise BisectError(f"--repo {repo} is not a directory; point it at a local vLLM clone")
    _git(repo, "rev-parse", "--git-dir")
    old, new = _resolve(repo, good), _resolve(repo, bad)
    if old == new:
        raise BisectError(f"--from {good} and --to {bad} are the same commit ({old[:SHORT_SHA]})")
    ancestor = subprocess.run(
        ["git", "-C", str(repo), "merge-base", "--is-ancestor", old, new], capture_output=True, check=False
    )
    if ancestor.returncode != 0:
        raise BisectError(
            f"{good} is not an ancestor of {bad} in {repo}: --from must be the older commit "
            "(swap them, or use --find-fix to look for a fix)"
        )
    between = _git(repo, "rev-list", "--first-parent", "--reverse", f"{old}..{new}").split()
    return [Build(old, "commit"), *(Build(sha, "commit") for sha in between)]


def _find_in(shas: list[str], ref: str, path: Path) -> int:
    wanted = ref.strip().lower()
    hits = [i for i, sha in enumerate(shas) if sha.lower().startswith(wanted)]
    if not _SHA_RE.match(wanted) or not hits:
        raise BisectError(f"{ref!r} is not in {path}; list it there or fix the sha")
    if len(hits) > 1:
        raise BisectError(f"{ref!r} matches {len(hits)} commits in {path}; give more digits")
    return hits[0]


def commits_from_file(path: Path, good: str, bad: str) -> list[Build]:
    """One sha per line, oldest first (`git log --first-parent --reverse --format=%H` output);
    anything after the sha on a line and lines starting with # are ignored."""
    check_ends(good, bad)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BisectError(f"cannot read --commits-file {path} ({exc})") from None
    shas = [line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith("#")]
    bad_lines = [sha for sha in shas if not _SHA_RE.match(sha)]
    if bad_lines:
        raise BisectError(f"{path}: {bad_lines[0]!r} is not a commit sha (one sha per line, oldest first)")
    start, end = _find_in(shas, good, path), _find_in(shas, bad, path)
    if start == end:
        raise BisectError(f"--from {good} and --to {bad} are the same commit in {path}")
    if start > end:
        raise BisectError(
            f"{good} comes after {bad} in {path}: the file is oldest first and --from must be older"
        )
    return [Build(sha, "commit") for sha in shas[start : end + 1]]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.names.append(data.strip())


def _version_of(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def parse_simple_index(body: str, content_type: str) -> list[Version]:
    """Versions on a PEP 503 (HTML) or PEP 691 (JSON) project page; yanked files do not count."""
    if "json" in content_type:
        data = json.loads(body)
        if data.get("versions"):
            return sorted({Version(v) for v in data["versions"] if _valid(v)})
        names = [f["filename"] for f in data.get("files", []) if not f.get("yanked")]
    else:
        parser = _Links()
        parser.feed(body)
        names = parser.names
    return sorted({v for v in map(_version_of, names) if v is not None})


def _valid(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def fetch_versions(
    package: str, index_url: str = PYPI_SIMPLE, timeout_s: float = SIDE_TIMEOUT_S
) -> list[Version]:
    """All versions of a package on a simple index (PyPI by default); JSON preferred, HTML accepted."""
    url = f"{index_url.rstrip('/')}/{package}/"
    accept = {"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}
    try:
        answer = BlockingSideClient(timeout_s=timeout_s).request("GET", url, headers=accept).checked()
    except ItlauditError as exc:
        raise BisectError(f"cannot list versions of {package} at {url} ({exc})") from None
    return parse_simple_index(answer.text(), answer.headers.get("content-type", ""))


def versions_between(available: list[Version], good: str, bad: str, *, pre: bool = False) -> list[Build]:
    """Releases from good to bad inclusive; pre-releases in between only with `pre` (the ends are
    always kept, since the user named them)."""
    check_ends(good, bad)
    try:
        old, new = Version(good), Version(bad)
    except InvalidVersion as exc:
        raise BisectError(f"{exc}; with a version range --from/--to must be versions like 0.11.0") from None
    if old == new:
        raise BisectError(f"--from {good} and --to {bad} are the same version")
    if old > new:
        raise BisectError(f"--from {good} is newer than --to {bad}; --from must be the older release")
    for end in (old, new):
        if end not in available:
            raise BisectError(f"version {end} is not on the package index; pick a listed release")
    picked = [v for v in available if old <= v <= new and (pre or not v.is_prerelease or v in (old, new))]
    return [Build(str(v), "version") for v in picked]
