"""`llmb verify`: check a submission bundle without trusting its submitter.

A bundle is untrusted input: nothing in it is imported or run, an archive is unpacked only into a temporary folder
and only if every member is a plain file or folder of sane size and name, and malformed content gives a failing row,
never a crash. Every figure of every result is recomputed from what the run recorded.
"""

from __future__ import annotations

from pathlib import Path

from llmb.api.errors import describe
from llmb.bundle import reader as bundle_io
from llmb.bundle.reader import DEFAULT_LIMITS, Limits, Refused
from llmb.verify.bundle import Bundle, ResultFiles, Row, headline_view  # noqa: F401 - verify's public names
from llmb.verify.bundle_checks import (  # noqa: F401 - evidence_problems importable from here as before
    check_clones,
    check_code,
    check_conformance,
    check_debug,
    check_evidence,
    check_manifest,
    check_plugin_source,
    check_replay,
    check_results_schema,
    check_runs,
    check_submission,
    check_summary,
    check_system,
    evidence_problems,
)
from llmb.verify.result_checks import (  # noqa: F401 - the per-result checks, importable from here as before
    check_energy,
    check_fingerprint,
    check_losses,
    check_official_shape,
    check_optimizer,
    check_peaks,
    check_precision,
    check_throughput,
    check_timing,
    check_validity,
    fingerprint_problems,
    loss_problems,
    optimizer_record_problems,
    peak_problems,
    precision_problems,
    throughput_problems,
    timing_problems,
)


def verify(path: Path, accept_debug: bool = False, limits: Limits = DEFAULT_LIMITS, replay_steps: int = 0) -> list[Row]:
    """Every check on a bundle folder or a .tar.gz of one; all rows must pass. The bundle is opened under
    llmb.bundle.reader's limits (an archive unpacked in a limited child process into a temporary folder)."""
    path = Path(path)
    kind = "bundle" if path.is_dir() else "archive"
    try:
        with bundle_io.open_bundle(path, limits) as root:
            rows = verify_folder(root, accept_debug, limits, replay_steps)
    except Refused as exc:
        return [Row(kind, False, f"refused: {exc}")]
    return [Row(kind, True, "every member a plain file or folder within the limits, nothing importable"), *rows]


def verify_folder(
    root: Path, accept_debug: bool = False, limits: Limits = DEFAULT_LIMITS, replay_steps: int = 0
) -> list[Row]:
    return check_bundle(root, accept_debug, limits, replay_steps).rows


def check_bundle(
    root: Path, accept_debug: bool = False, limits: Limits = DEFAULT_LIMITS, replay_steps: int = 0
) -> Bundle:
    """Every check on a bundle folder; the Bundle keeps its rows and the results it read (the leaderboard's pages
    show them without reading them again)."""
    bundle = Bundle(Path(root), accept_debug, limits=limits, replay_steps=replay_steps)
    for check in CHECKS + ([check_replay] if replay_steps > 0 else []):
        try:
            check(bundle)
        except Exception as exc:  # malformed content in a place a check did not foresee: a failing row, no crash
            bundle.rows.append(
                Row(check.__name__.removeprefix("check_").replace("_", " "), False, f"malformed: {describe(exc)}")
            )
    return bundle


# The checks, in the order of the table.
CHECKS = [
    check_manifest,
    check_submission,
    check_system,
    check_debug,
    check_results_schema,
    check_throughput,
    check_peaks,
    check_optimizer,
    check_timing,
    check_energy,
    check_official_shape,
    check_validity,
    check_fingerprint,
    check_precision,
    check_losses,
    check_runs,
    check_code,
    check_plugin_source,
    check_conformance,
    check_evidence,
    check_clones,
    check_summary,
]
