"""The commit list from GitHub's compare API, for a machine with no vLLM clone.

`GET /repos/{owner}/{repo}/compare/{base}...{head}` returns every commit reachable from head and not
from base, oldest first, `per_page` (max 100) at a time over `page`s, with `total_commits` for the
whole comparison and each commit's `parents`. Nightlies are built from the first-parent chain only,
so the chain is rebuilt from the parents, walking back from the head exactly as
`git rev-list --first-parent base..head` does: follow first parents while the commit is in the range.

The answer for two full shas never changes, so it is cached in itlaudit's cache; a branch or tag can
move and is always asked afresh. The token (GITHUB_TOKEN) only ever goes into a request header.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlsplit

import msgspec

from itlaudit.bisect.build_range import Build, check_ends
from itlaudit.errors import BisectError, ServerAnswerError, ServerStatusError, ServerUnreachableError
from itlaudit.model.access import Access
from itlaudit.model.jsonvalue import JSONValue
from itlaudit.side.client import SIDE_TIMEOUT_S, BlockingSideClient, server_error_message

DEFAULT_API = "https://api.github.com"
TOKEN_ENV = "GITHUB_TOKEN"
PER_PAGE = 100  # the API's maximum page size
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# A sha (short or full) names one commit for good; a branch or tag may move.
_SHA = re.compile(r"^[0-9a-f]{7,40}$")
# A range the size of a few months of vLLM main; beyond it a local clone is the better tool.
MAX_PAGES = 100

Fetch = Callable[[str], tuple[JSONValue, dict[str, str]]]


def _access() -> Access:
    """The API's headers, the token (remembered as a secret, so it is masked wherever it is echoed)
    among them when GITHUB_TOKEN is set."""
    headers = [
        ("Accept", "application/vnd.github+json"),
        ("X-GitHub-Api-Version", "2022-11-28"),
        ("User-Agent", "itlaudit-bisect"),
    ]
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        headers.append(("Authorization", f"Bearer {token}"))
    return Access(tuple(headers))


def _error_line(exc: ServerStatusError, what: str, repo: str) -> str:
    """One line per way the API says no; the body's `message` is GitHub's own explanation."""
    message = server_error_message(exc.body, exc.status) if exc.body else ""
    code = exc.status
    remaining = exc.headers.get("x-ratelimit-remaining")
    if code == 404:
        return (
            f"GitHub compare API: {what} not found in {repo} (HTTP 404"
            f"{': ' + message if message else ''}); check the shas in --from/--to and --github-repo"
        )
    if code == 429 or (code == 403 and (remaining == "0" or "rate limit" in message.lower())):
        reset = exc.headers.get("x-ratelimit-reset")
        when = ""
        if reset and reset.isdigit():
            when = f" until {time.strftime('%H:%M UTC', time.gmtime(int(reset)))}"
        hint = "wait" if os.environ.get(TOKEN_ENV) else f"set {TOKEN_ENV}"
        return (
            f"GitHub API rate limit reached (HTTP {code}){when}: {hint}, or pass --repo with a local "
            "vLLM clone"
        )
    if code in (401, 403):
        return (
            f"GitHub compare API refused {what} (HTTP {code}{': ' + message if message else ''}); "
            f"check {TOKEN_ENV}, or pass --repo with a local vLLM clone"
        )
    return f"GitHub compare API failed for {what} (HTTP {code}{': ' + message if message else ''})"


def http_fetch(api: str, repo: str, what: str, timeout_s: float = SIDE_TIMEOUT_S) -> Fetch:
    """A GET of one API page; every failure becomes a BisectError with one line."""
    client = BlockingSideClient(_access(), timeout_s=timeout_s)

    def fetch(url: str) -> tuple[JSONValue, dict[str, str]]:
        try:
            answer = client.request("GET", url).checked()
            return answer.json(), dict(answer.headers)
        except ServerStatusError as exc:
            raise BisectError(_error_line(exc, what, repo)) from None
        except ServerUnreachableError as exc:
            raise BisectError(
                f"the GitHub API at {api} did not answer: {exc}; or pass --repo with a local vLLM clone, "
                "--commits-file, or --github-api for a mirror"
            ) from None
        except ServerAnswerError as exc:
            raise BisectError(f"the GitHub API answered something that is not JSON: {exc}") from None

    return fetch


class CommitRef(msgspec.Struct, frozen=True, kw_only=True):
    sha: str


class CompareCommit(msgspec.Struct, frozen=True, kw_only=True):
    """One commit of a compare answer: what the first-parent walk reads."""

    sha: str
    parents: list[CommitRef] = msgspec.field(default_factory=list)


class ComparePage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of the GitHub compare API's answer, the fields read of it (the rest is ignored)."""

    commits: list[CompareCommit]
    status: str | None = None
    total_commits: int | None = None
    base_commit: CommitRef | None = None


def compare_pages(
    api: str, repo: str, base: str, head: str, fetch: Fetch
) -> tuple[ComparePage, list[CompareCommit]]:
    """The first page's comparison fields and every commit of every page, in the API's order."""
    path = f"/repos/{repo}/compare/{quote(base, safe='')}...{quote(head, safe='')}"
    commits: list[CompareCommit] = []
    first: ComparePage | None = None
    for page in range(1, MAX_PAGES + 1):
        answer, _headers_seen = fetch(f"{api.rstrip('/')}{path}?per_page={PER_PAGE}&page={page}")
        try:
            data = msgspec.convert(answer, ComparePage)
        except msgspec.ValidationError as exc:
            raise BisectError(f"{api}{path}: not a compare answer ({exc})") from None
        first = first or data
        commits += data.commits
        total = len(commits) if first.total_commits is None else first.total_commits
        if not data.commits or len(commits) >= total:
            return first, commits
    raise BisectError(
        f"{base}...{head} holds more than {MAX_PAGES * PER_PAGE} commits; narrow the range or pass --repo"
    )


def first_parent_chain(base_sha: str, commits: list[CompareCommit]) -> list[str]:
    """First-parent commits base..head, oldest first, plus base itself, from the commits' parents.

    The head is the one commit no other commit in the range names as a parent; from it, first parents
    are followed while they stay in the range (`git rev-list --first-parent`'s stopping rule)."""
    parents = {c.sha: [p.sha for p in c.parents] for c in commits}
    referenced = {p for ps in parents.values() for p in ps}
    heads = [sha for sha in parents if sha not in referenced]
    if len(heads) != 1:
        raise BisectError(f"the compare answer has {len(heads)} heads, not one; is it a complete range?")
    chain: list[str] = []
    sha: str | None = heads[0]
    while sha is not None and sha in parents:
        chain.append(sha)
        sha = parents[sha][0] if parents[sha] else None
    return [base_sha, *reversed(chain)]


def _cache_path(cache_dir: Path, api: str, repo: str, base: str, head: str) -> Path | None:
    if not (_SHA.match(base) and _SHA.match(head)):
        return None
    host = urlsplit(api).netloc.replace(":", "_") or "api"
    return cache_dir / "github" / host / repo.replace("/", "+") / f"{base}...{head}.json"


def commits_from_github(
    api: str, repo: str, good: str, bad: str, cache_dir: Path, fetch: Fetch | None = None
) -> list[Build]:
    """First-parent builds good..bad from the compare API (or its cached answer)."""
    check_ends(good, bad)
    if not re.match(r"^[\w.-]+/[\w.-]+$", repo):
        raise BisectError(f"--github-repo {repo!r}: expected OWNER/NAME, e.g. vllm-project/vllm")
    cached = _cache_path(cache_dir, api, repo, good.lower(), bad.lower())
    if cached is not None and cached.is_file():
        try:
            shas = json.loads(cached.read_text(encoding="utf-8"))["first_parent"]
            return [Build(sha, "commit") for sha in shas]
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache entry is asked for again
    what = f"{good}...{bad}"
    data, commits = compare_pages(api, repo, good, bad, fetch or http_fetch(api, repo, what))
    status = data.status
    if status == "identical":
        raise BisectError(f"--from {good} and --to {bad} are the same commit in {repo}")
    if status == "behind":
        raise BisectError(
            f"{good} is newer than {bad} in {repo}: --from must be the older commit "
            "(swap them, or use --find-fix to look for a fix)"
        )
    if status != "ahead":
        raise BisectError(
            f"{good} is not an ancestor of {bad} in {repo} (compare status {status!r}): give a --from "
            "on --to's history"
        )
    base_sha = "" if data.base_commit is None else data.base_commit.sha
    if not _FULL_SHA.match(base_sha):
        raise BisectError(f"the compare answer for {what} names no base commit sha")
    shas = first_parent_chain(base_sha, commits)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(json.dumps({"api": api, "repo": repo, "first_parent": shas}) + "\n", encoding="utf-8")
        os.replace(tmp, cached)
    return [Build(sha, "commit") for sha in shas]
