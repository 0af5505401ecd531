"""llmb: a vendor-neutral benchmark of LLM training throughput."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("llmb")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

from llmb.hookspecs import hookimpl  # noqa: E402
from llmb.precision import PrecisionFact  # noqa: E402
from llmb.settings import Setting  # noqa: E402

__all__ = ["hookimpl", "Setting", "PrecisionFact", "__version__"]
