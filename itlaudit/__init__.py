"""itlaudit: a serving-benchmark auditor for vLLM.

Speculative decoding puts several tokens in one SSE chunk; itlaudit measures latency per token
from the server's own counts and says when an output was cut short.
"""

__version__ = "0.1.0"
