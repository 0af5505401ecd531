import pytest

from llmb.plugins import load_plugins, pm


@pytest.fixture
def register_plugin(monkeypatch):
    """Register in-memory plugin objects for one test, unregister them afterwards (llm/datasette style). A plugin
    in memory exists in this process only, so `llmb run` runs in process (its records are never valid)."""
    monkeypatch.setenv("LLMB_IN_PROCESS", "1")
    load_plugins()
    names = []

    def register(plugin, name: str) -> None:
        pm.register(plugin, name=name)
        names.append(name)

    yield register
    for name in names:
        pm.unregister(name=name)


# A finished sweep shared by tests/test_sweep.py and tests/test_report.py (it takes six `llmb run` subprocesses).
# The out-of-memory points are simulated (the cpu plugin's oom_above_batch_size): the CPU has no device memory limit.
TINY_SWEEP = ["--preset", "tiny", "--device", "cpu", "--steps", "2", "--warmup-steps", "1"]


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("sweep")
    args = ["--precision", "all", "--batch-sizes", "auto", "--max-batch-size", "4", "--repeats", "0"]
    args += ["-O", "oom_above_batch_size=1", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "llmb", "sweep", *TINY_SWEEP, *args], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out
