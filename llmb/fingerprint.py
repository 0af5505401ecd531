"""The model fingerprint: sha256 of the model source. Every run recomputes it and compares with the release."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

# The released model definition's sha256. Changing llmb/model.py changes this, and so the benchmark itself.
RELEASED_MODEL_FINGERPRINT = "3df262fcde746fbf1b2a67c750089e624d981560645b01bf68dbd125eef1dc5b"


def model_fingerprint() -> str:
    """sha256 of the model source as it is installed now."""
    # Found, not imported: the model imports torch, and what checks records (manifest, verify) must not.
    return hashlib.sha256(Path(importlib.util.find_spec("llmb.model").origin).read_bytes()).hexdigest()


def fingerprint_holds() -> bool:
    return model_fingerprint() == RELEASED_MODEL_FINGERPRINT
