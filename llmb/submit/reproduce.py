"""`llmb reproduce BUNDLE`: re-run each headline's configuration here and compare the headline.

No checker can prove a recorded time; a reproduction can refute one. For each precision's headline in the bundle,
the configuration of its median run (plugin, precision, mode, shape, batch, steps, warmup, repeats, seed, settings)
is run again by `llmb run` in a subprocess, with the plugin's *shipped* source first on the import path (its entry
points declared from the shipped pyproject.toml; the built-in cpu plugin is llmb's own). The bundle's headline is
refuted when it exceeds the reproduced median by more than the tolerance (default 5%: on the same hardware two
honest runs of the official shape differ by less; on a shared or different machine the comparison says so).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomllib

from llmb import verify
from llmb.api.errors import LlmbError, UsageError, describe
from llmb.bundle import reader as bundle_io
from llmb.records import Result, group_runs, headline
from llmb.records import files as record_files
from llmb.spec.presets import SHAPE_FIELDS
from llmb.terminal.progress import Pace

DEFAULT_TOLERANCE = 0.05
# A version, an entry point's name or its target (module:attribute): what a dist-info's files may hold from a bundle.
_ENTRY_TEXT = re.compile(r"^[A-Za-z0-9_.+-]+(:[A-Za-z0-9_.]+)?$")
RUNS = 3  # the reproduction's own median, as a bundle's headline is one


@dataclass
class Reproduction:
    label: str
    claimed: float
    reproduced: float | None
    ratio: float | None
    passed: bool
    detail: str


def run_arguments(record: dict) -> list[str]:
    """`llmb run` arguments for the configuration a result records."""
    args = [
        "--plugin",
        record["plugin"]["name"],
        "--device",
        record["device"]["type"],
        "--precision",
        record["precision"]["requested"],
        "--precision-mode",
        record["precision"]["mode"],
        "--batch-size",
        str(record["batch_size"]),
        "--steps",
        str(record["steps"]),
        "--warmup-steps",
        str(record["warmup_steps"]),
        "--repeats",
        str(record["repeats"]),
        "--seed",
        str(record["seed"]),
        "--preset",
        str(record["preset"]),
    ]
    for name in SHAPE_FIELDS:
        args += [f"--{name.replace('_', '-')}", str(int(record["config"][name]))]
    for key, value in (record["plugin"].get("settings") or {}).items():
        args += ["-O", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return args


def shipped_plugin_path(root: Path, distribution: str, site: Path) -> list[str]:
    """Import paths that make the shipped source of a plugin distribution the one `llmb run` loads: its package
    folder, and a dist-info declaring the entry points of its pyproject.toml."""
    try:  # the bundle's text (a distribution, a version, entry points) names a folder or a line only when plain
        source = root / "code" / "plugins" / bundle_io.check_part(str(distribution), "distribution")
    except ValueError as exc:
        raise LlmbError(f"the bundle's plugin: {exc}") from None
    pyproject = source / "pyproject.toml"
    if not pyproject.is_file():
        raise LlmbError(f"the bundle ships no pyproject.toml for plugin distribution {distribution!r}")
    try:
        project = tomllib.loads(bundle_io.read_regular(pyproject, 2**20).decode("utf-8")).get("project", {})
        points = (project.get("entry-points") or {}).get("llmb") or {}
        if not isinstance(project, dict) or not isinstance(points, dict):
            raise ValueError("[project] and its llmb entry points are no tables")
    except (ValueError, AttributeError) as exc:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise LlmbError(f"{distribution}'s shipped pyproject.toml does not read ({describe(exc)})") from None
    if not points:
        raise LlmbError(f"{distribution}'s shipped pyproject.toml declares no llmb entry point")
    version = str(project.get("version", "0"))
    plain = [version, *map(str, points), *map(str, points.values())]
    odd = next((text for text in plain if not _ENTRY_TEXT.match(text)), None)
    if odd is not None:
        raise LlmbError(f"{distribution}'s shipped pyproject.toml holds {odd[:80]!r} where a plain name belongs")
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in points.items())
    (info / "entry_points.txt").write_text(f"[llmb]\n{lines}")
    package_root = source / "src" if (source / "src").is_dir() else source
    return [str(site), str(package_root)]


def reproduce_one(root: Path, record: dict, runs: int, timeout: float) -> list[dict]:
    """Run a result's configuration `runs` times here; the records of the reproduction."""
    with tempfile.TemporaryDirectory(prefix="llmb-reproduce-") as tmp:
        env = dict(os.environ)
        env.pop("LLMB_IN_PROCESS", None)
        distribution = record["plugin"].get("distribution")
        if distribution and distribution != "llmb":
            paths = shipped_plugin_path(root, distribution, Path(tmp) / "site")
            env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        out = Path(tmp) / "out"
        for _ in range(runs):
            command = [sys.executable, "-m", "llmb", "run", *run_arguments(record), "--out", str(out)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise LlmbError(f"the reproduction run failed: {last}")
        return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def compare(label: str, claimed: float, reproduced: list[dict], tolerance: float, device: str) -> Reproduction:
    valid = [r for r in reproduced if not r["invalid_reasons"]]
    if not valid:
        reasons = reproduced[0]["invalid_reasons"][:1] if reproduced else ["no record"]
        return Reproduction(label, claimed, None, None, False, f"the reproduction is invalid: {reasons[0]}")
    median = statistics.median(r["tokens_per_second"] for r in valid)
    ratio = claimed / median
    here = valid[0]["device"]["name"]
    where = "" if here == device else f" (bundle ran on {device}, reproduced on {here}: not the same hardware)"
    passed = ratio <= 1 + tolerance
    verdict = "within" if passed else "beyond"
    detail = (
        f"claimed {claimed:,.1f} tokens/s, reproduced {median:,.1f} (median of {len(valid)}): {ratio:.3f}x, "
        f"{verdict} the +{tolerance:.0%} tolerance{where}"
    )
    return Reproduction(label, claimed, median, ratio, passed, detail)


def reproduce(
    path: Path,
    tolerance: float = DEFAULT_TOLERANCE,
    runs: int = RUNS,
    timeout: float = 3600,
    warn: Callable[[str], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> list:
    """Every headline of a bundle, reproduced here; a result file that does not read is named (``warn``, one line
    with why) and left out, the others reproduced. ``say`` gets a line before each headline's runs, with what is
    left from those done (a long command says where it is)."""
    if not 0 <= tolerance < float("inf") or runs < 1:  # NaN too: every comparison with it is false
        raise UsageError("--tolerance must be 0 or more and --runs at least 1")
    try:
        opened = bundle_io.open_bundle(Path(path), bundle_io.DEFAULT_LIMITS)
        root = opened.__enter__()
    except bundle_io.Refused as exc:
        raise LlmbError(f"bundle refused: {exc}") from None
    try:
        # A reproduction measures the bundle's configuration here; it does not make a bundle that fails its checks
        # valid. So where it does not verify (read only, no code of it runs; 0.05 s on the reference bundle), the
        # reviewer is told first, and `llmb verify` names each failing check.
        failing = [row.check for row in verify.verify_folder(root, accept_debug=True) if not row.passed]
        if failing and say is not None:
            say(
                f"this bundle does not verify ({len(failing)} checks fail: {', '.join(failing[:3])}"
                f"{', ...' if len(failing) > 3 else ''}); a reproduction measures its configuration here, it does not "
                f"make it valid (llmb verify {path} names each failure)"
            )
        results = []
        for file in record_files.under(root / "results", "*.json") if (root / "results").is_dir() else []:
            try:
                results.append(record_files.parse(Result, record_files.read_object(file)))
            except record_files.Unreadable as exc:
                if warn is not None:
                    warn(record_files.skipped_line(file.relative_to(root), exc))
        rows = []
        groups = group_runs([r for r in results if not r.invalid_reasons])
        pace = Pace(total=len(groups))
        for index, (group, members) in enumerate(groups.items()):
            median_run = headline(members).run.to_dict()
            label = f"{median_run['precision']['effective']} {group.plugin} b{median_run['batch_size']}"
            if say is not None:
                say(f"reproducing {label} ({index + 1} of {len(groups)}, {runs} runs){pace.left()}")
            reproduced = reproduce_one(root, median_run, runs, timeout)
            pace.done()
            claimed = median_run["tokens_per_second"]
            rows.append(compare(label, claimed, reproduced, tolerance, median_run["device"]["name"]))
        if not rows:
            raise LlmbError("the bundle has no valid headline to reproduce")
        return rows
    finally:
        opened.__exit__(None, None, None)
