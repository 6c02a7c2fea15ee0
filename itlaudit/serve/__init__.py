"""Servers whose send times are known: the measuring stick for itlaudit's own capture fidelity."""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "environment": (
            "commit_of",
            "gpus",
            "host_environment",
            "non_default_args",
            "server_env",
        ),
        "launch_config": ("launch_spec",),
        "launcher": (
            "LaunchedServer",
            "engine_error",
            "fill_placeholders",
            "launch",
            "local_model_config",
        ),
        "logged": ("run_logged",),
        "orphans": ("die_with_parent",),
        "sim": (
            "SimConfig",
            "serve",
        ),
        "sim.config": (
            "DIALECTS",
            "DRAFT_SAMPLERS",
            "MODEL",
            "VLLM",
        ),
        "testbed": (
            "DEFAULT_VERSION",
            "UNWANTED",
            "build_model",
            "build_real_model",
            "default_cache_dir",
            "default_real_model_dir",
            "install",
            "installed",
        ),
        "truth": ("TruthConfig",),
    },
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
