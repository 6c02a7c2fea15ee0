"""Capture options are built once (issue 37 item 3): checked in cli/options.build_capture, carried
typed, one StreamOptions per worker share, and local processes vs Ray chosen in one function."""

from __future__ import annotations

import ast
import functools
import pickle
from pathlib import Path

import pytest

from itlaudit.capture.client import StreamOptions
from itlaudit.capture.environment import LocalProcesses, RayCluster, capture_environment
from itlaudit.cli.options import build_capture
from itlaudit.errors import ScenarioError
from itlaudit.model.access import Access
from itlaudit.model.vocabulary import StampMode

PACKAGE = Path(__file__).resolve().parent.parent / "itlaudit"
BUILDER = PACKAGE / "cli" / "options.py"
VOCABULARY = PACKAGE / "model" / "vocabulary.py"


@functools.cache
def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _defaults(tree: ast.Module) -> list[ast.expr]:
    """Every default written in a module: a parameter's, a class field's, an `x or DEFAULT`'s."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
        elif isinstance(node, ast.ClassDef):
            found += [f.value for f in node.body if isinstance(f, ast.AnnAssign) and f.value is not None]
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            found += node.values[1:]
    return found


def _is_kernel(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == StampMode.KERNEL.value
    return (
        isinstance(node, ast.Attribute) and node.attr == "KERNEL" and ast.unparse(node.value) == "StampMode"
    )


def test_capture_options_with_values_are_built_by_the_one_builder_only() -> None:
    """Outside cli/options.py a CaptureOptions is only ever the empty default (a command streaming
    without flags), and the stamp's default is written once, as model/vocabulary's DEFAULT_STAMP,
    which every other default names: the package's source parsed, ~1 s."""
    valued, empty, kernel_defaults = [], [], []
    for path, tree in _trees().items():
        where = f"{path.relative_to(PACKAGE.parent)}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called(node) == "CaptureOptions":
                (valued if node.args or node.keywords else empty).append(f"{where}:{node.lineno}")
        kernel_defaults += [f"{where}:{d.lineno}" for d in _defaults(tree) if _is_kernel(d)]
    assert [place.split(":")[0] for place in valued] == ["itlaudit/cli/options.py"], valued
    assert len(empty) <= 2, empty  # capture(options=None), a VariantPass given none
    assert kernel_defaults == []
    assert "DEFAULT_STAMP = StampMode.KERNEL" in VOCABULARY.read_text()


def test_the_builder_checks_each_value_once_in_the_flags_words() -> None:
    """~0 s."""
    built = build_capture(
        workers="3", stamp=StampMode.LOOP, timeouts={"stall_timeout_s": 5.0, "ttft_timeout_s": None}
    )
    assert (built.workers, built.stamp, built.timeouts, built.cluster) == (
        3,
        "loop",
        {"stall_timeout_s": 5.0},
        None,
    )
    assert build_capture().workers is None and build_capture().stamp is StampMode.KERNEL
    for workers in ("0", "many", "-1"):
        with pytest.raises(ScenarioError, match=f"^--workers '{workers}': give a positive number"):
            build_capture(workers=workers)
    with pytest.raises(ScenarioError, match=r"^--connect-timeout 0: must be"):
        build_capture(timeouts={"connect_timeout_s": 0.0})


def test_local_or_ray_is_chosen_in_one_place() -> None:
    """~0 s: no worker or Ray is started."""
    assert isinstance(capture_environment(None), LocalProcesses)
    assert isinstance(build_capture().environment(), LocalProcesses)
    ray = capture_environment("ray://head:10001")
    assert isinstance(ray, RayCluster) and ray.address == "ray://head:10001"
    for path, tree in _trees().items():
        if path.name == "environment.py":
            continue
        tested = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Compare) and "cluster" in ast.unparse(node.left).split(".")[-1:]
        ]
        assert not tested or path.parent.name == "bisect", (path, tested)  # bisect's own --cluster


def test_a_share_carries_one_stream_options_object_that_pickles_without_what_it_built() -> None:
    """The transport options (an SSL context) are made where the share runs, once: ~0 s."""
    options = StreamOptions(stamp=StampMode.LOOP, access=Access(insecure=True, headers=(("X-Team", "perf"),)))
    assert options.transport is options.transport and options.transport.ssl_context is not None
    assert options.headers == {"X-Team": "perf"}
    landed = pickle.loads(pickle.dumps(options))
    assert landed == options and "transport" not in vars(landed)
    assert landed.transport.stamp is StampMode.LOOP
