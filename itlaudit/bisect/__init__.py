"""`itlaudit bisect`: find the vLLM build that introduced (or fixed) a serving regression.

One responsibility per module, as in mozregression: build_range lists the builds, providers turn one
into a launchable server, build_cache keeps installs under a size limit, search is the three-valued
binary search, verdict judges a probe, probe runs one, state persists the bisection so it can resume,
report writes the answer, bisector drives the loop.
"""
