"""The model fingerprint: sha256 of the model source. Every run recomputes it and compares with the release."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import MappingProxyType

# Every release of the model definition by number, its sha256 (docs/rules.md's release table says what each changed;
# tests/test_model.py ties the table to this). Changing llmb/model.py makes a new one, and so a new benchmark.
MODEL_RELEASES = MappingProxyType(
    {
        1: "c8d3bd3c62147903185167fd5df11a82aaa38361a0a2f394ada7984401c7516a",
        2: "21fe039e1642c60afc2a30b6252c60ee689b357c4d80588a935efba1d29b951b",
        3: "ee9e9fed9c9601ee618f1c968bbddbb4086f6fee82f0fb490e7d736d24f9ce10",
        4: "3df262fcde746fbf1b2a67c750089e624d981560645b01bf68dbd125eef1dc5b",
    }
)
# The released model definition's sha256: the one a valid run today must have.
RELEASED_MODEL_FINGERPRINT = MODEL_RELEASES[max(MODEL_RELEASES)]


def model_fingerprint() -> str:
    """sha256 of the model source as it is installed now."""
    # Found, not imported: the model imports torch, and what checks records (manifest, verify) must not.
    return hashlib.sha256(Path(importlib.util.find_spec("llmb.model").origin).read_bytes()).hexdigest()


def fingerprint_holds() -> bool:
    return model_fingerprint() == RELEASED_MODEL_FINGERPRINT


def release_of(fingerprint: str) -> int | None:
    """The model release a recorded fingerprint is, or None for a model llmb never released."""
    return next((number for number, known in MODEL_RELEASES.items() if known == fingerprint), None)
