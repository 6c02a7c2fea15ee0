"""`itlaudit bisect`: find the vLLM build that introduced (or fixed) a serving regression.

One responsibility per module, as in mozregression: build_range lists the builds, providers turn one
into a launchable server, build_cache keeps installs under a size limit, search is the three-valued
binary search, verdict judges a probe, probe runs one, state persists the bisection so it can resume,
report writes the answer, bisector drives the loop.
"""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "bisector": (
            "Bisection",
            "probe_config",
            "probe_scenario",
        ),
        "build_range": (
            "Build",
            "fetch_versions",
        ),
        "dryrun": ("dry_run_report",),
        "prefetch": ("Prefetcher",),
        "probe": ("run_probe",),
        "providers": ("PROVIDERS",),
        "providers.pip": ("PipOptions",),
        "providers.wheels": ("WheelsOptions",),
        "report": (
            "REPORT_FILE",
            "write_report",
        ),
        "search": ("Search",),
        "settings": (
            "ProbeSetup",
            "Settings",
            "list_builds",
            "make_provider",
        ),
        "state": ("State",),
        "verdict": (
            "JUDGES",
            "TruncationJudge",
            "parse_regress",
        ),
    },
    modules=("state",),
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
