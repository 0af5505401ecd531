"""The model fingerprint: sha256 of the model source. Every run recomputes it and compares with the release."""

from __future__ import annotations

import hashlib
from pathlib import Path

import llmb.model

# The released model definition's sha256. Changing llmb/model.py changes this, and so the benchmark itself.
RELEASED_MODEL_FINGERPRINT = "ee9e9fed9c9601ee618f1c968bbddbb4086f6fee82f0fb490e7d736d24f9ce10"


def model_fingerprint() -> str:
    """sha256 of the model source as it is installed now."""
    return hashlib.sha256(Path(llmb.model.__file__).read_bytes()).hexdigest()


def fingerprint_holds() -> bool:
    return model_fingerprint() == RELEASED_MODEL_FINGERPRINT
