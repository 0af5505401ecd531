"""Layers point one way: what reads records never imports what runs plugins (checked in fresh interpreters)."""

import json
import subprocess
import sys

import pytest

READERS = ("llmb.records", "llmb.verify", "llmb.report", "llmb.submission")
RUNNERS = ("llmb.runner", "llmb.plugins", "llmb.distributed", "llmb.device", "llmb.conformance", "llmb.sweep")


@pytest.mark.parametrize("module", READERS)
def test_readers_import_nothing_that_runs_a_plugin(module):
    code = f"import json, sys, {module}; print(json.dumps(sorted(m for m in sys.modules if m.startswith('llmb'))))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert module in loaded  # the probe imported what it says
    assert not set(RUNNERS) & set(loaded), f"{module} imports {sorted(set(RUNNERS) & set(loaded))}"


def test_importtime_of_verify_shows_no_runner():
    """The check the issue names: `python -X importtime -c "import llmb.verify"`."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import llmb.verify"], capture_output=True, text=True, check=True
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "llmb.verify" in imported
    assert not set(RUNNERS) & imported
