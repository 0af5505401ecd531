"""Energy per token: the device's energy counter read at the measured windows' edges, and the record's figures.

A backend offers a counter (Backend.energy_counter: joules, never decreasing) or says why it has none. The worker
reads it twice per window, next to the device synchronisations that bound the window
(llmb.training.loop.Trainer.measure),
and hands both readings to the judge with the window's answer; the judge, which imports no plugin and so cannot read
the counter itself, computes the joules over its own clock's windows and refuses implausible figures: a counter that
ran backwards, or an average power above the device's limit (or above CEILING_WATTS, whatever the plugin says its
limit is). This module also reads Linux RAPL for the cpu plugin (`rapl_counter`). It imports no torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmb.api.backend import Backend, EnergyCounter
from llmb.api.errors import describe, text_of
from llmb.records.files import as_record_value

if TYPE_CHECKING:
    from llmb.records.parts import Energy
    from llmb.records.schemas import Result

# No single device sold draws more on average (a GB200 superchip: about 2.7 kW): a plugin that claims a higher limit,
# or none, is held to this one.
CEILING_WATTS = 3000.0
# Nor does any device train this model on less than a watt (a phone's NPU draws more): a counter that says it did
# would make tokens per joule whatever it likes (a counter advancing 1e-9 J a read gave 6.4e10 tokens/J).
FLOOR_WATTS = 1.0
# A window's average power may pass the device's enforced limit briefly (boost, the counter's update period), never
# by half again.
LIMIT_SLACK = 1.5
RAPL_ROOT = Path("/sys/class/powercap")


class Meter:
    """The backend's counter for one device, asked once, read by the trainer at each window's edges."""

    def __init__(self, backend: Backend, device: Any) -> None:
        try:
            offered = backend.energy_counter(device)
        except Exception as exc:  # a plugin's failure costs the run its energy figure, never the run
            offered = f"the backend's energy counter failed: {describe(exc)}"
        self.counter = offered if isinstance(offered, EnergyCounter) else None
        self.reason = None if self.counter is not None else _reason(offered)

    def read(self) -> float | None:
        """The counter in joules, or None (no counter, or it failed: the reason says so from then on)."""
        if self.counter is None:
            return None
        try:
            return float(self.counter.read())
        except Exception as exc:
            self.counter, self.reason = None, f"the energy counter failed during the run: {describe(exc)}"
            return None

    def describe(self) -> dict:
        """What the record says about the counter before the judge adds the figures."""
        if self.counter is None:
            return {"reason": self.reason}
        limit = _number(self.counter.limit_watts)  # the plugin's: text, NaN or an object is no limit
        return {
            "scope": as_record_value(text_of(self.counter.scope), 200),
            "limit_watts": limit if math.isfinite(limit) and limit > 0 else None,
        }


def _reason(offered: object) -> str:
    """Why there is no counter, as the record keeps it: the backend's reason (text), or what it gave instead of
    either (an int of 5,000 digits has no str(): it once ended the run here, its windows measured and lost)."""
    if isinstance(offered, str):
        return as_record_value(offered, 500)
    return f"the backend's energy_counter returned a {type(offered).__name__}, not an EnergyCounter or a reason"


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def summarise(
    counter: dict | None, readings: list, seconds: list[float], tokens_per_window: float
) -> tuple[dict, list[str]]:
    """The record's energy section over the measured windows, and the invalid reasons it gives.

    ``counter`` is Meter.describe() as the worker's record carries it; ``readings`` each window's [start, end] in
    joules (None where not read); ``seconds`` each window's length on the judge's clock; ``tokens_per_window`` the
    tokens one device trained in a window (the counter is one device's). Joules and watts cover every measured
    window, not only the headline one: a counter that updates every 10-100 ms is coarse against a short window."""
    counter = counter or {}
    if not counter.get("scope"):  # no counter: the reason is the backend's (a section with a scope is recomputed)
        return {"reason": str(counter.get("reason") or "the run recorded no energy counter")}, []
    section = {"scope": str(counter["scope"]), "limit_watts": counter.get("limit_watts")}
    pairs = [r if isinstance(r, (list, tuple)) and len(r) == 2 else (None, None) for r in readings]
    values = [(_number(a), _number(b)) for a, b in pairs]
    if not values or not all(math.isfinite(a) and math.isfinite(b) for a, b in values):
        return {**section, "reason": "the counter was not read at every measured window's edges"}, []
    window_joules = [b - a for a, b in values]
    section["window_joules"] = window_joules
    problems = [
        f"energy: the counter ran backwards in window {k + 1} ({a:.3f} J to {b:.3f} J)"
        for k, (a, b) in enumerate(values)
        if b < a
    ]
    joules, total_seconds = sum(window_joules), sum(seconds)
    if problems or not total_seconds > 0:
        return {**section, "reason": "no plausible energy figure"}, problems
    if joules == 0:
        return {**section, "reason": "the counter did not advance over the measured windows (it updates slower)"}, []
    watts = joules / total_seconds
    limit = _number(counter.get("limit_watts"))
    ceiling = min(CEILING_WATTS, limit * LIMIT_SLACK) if limit > 0 else CEILING_WATTS
    if watts > ceiling:
        problems.append(
            f"energy: {watts:.1f} W average over the measured windows, above the plausible {ceiling:.1f} W for one "
            "device"
        )
        return {**section, "reason": "no plausible energy figure"}, problems
    if watts < FLOOR_WATTS:
        problems.append(
            f"energy: {watts:.3g} W average over the measured windows, below the {FLOOR_WATTS:.0f} W any device "
            "training the model draws"
        )
        return {**section, "reason": "no plausible energy figure"}, problems
    section.update(
        joules=joules,
        seconds=total_seconds,
        watts=watts,
        tokens_per_joule=tokens_per_window * len(values) / joules,
    )
    return section, []


class RaplCounter:
    """The sum of the host's RAPL package counters in joules, each counter's wraparound undone (a counter wraps at
    max_energy_range_uj: at 100 W a 262 kJ range wraps every 44 minutes, so two reads must lie closer than that)."""

    def __init__(self, zones: list[Path]) -> None:
        self.files = [zone / "energy_uj" for zone in zones]
        self.ranges = [int((zone / "max_energy_range_uj").read_text()) for zone in zones]
        self.last = [int(f.read_text()) for f in self.files]
        self.total_uj = 0

    def read(self) -> float:
        for index, file in enumerate(self.files):
            raw = int(file.read_text())
            delta = raw - self.last[index]
            if delta < 0:  # wrapped around since the last read
                delta += self.ranges[index] + 1
            self.total_uj += delta
            self.last[index] = raw
        return self.total_uj / 1e6


def rapl_counter(root: Path = RAPL_ROOT) -> EnergyCounter | str:
    """The host's RAPL package energy (every CPU socket, every process on it), or why it cannot be read."""
    zones = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
    packages = []
    for zone in zones:
        try:
            name = (zone / "name").read_text().strip()
        except OSError:
            continue
        if name.startswith("package"):  # psys and dram zones overlap the packages or lie outside the CPU
            packages.append((name, zone))
    if not packages:
        return f"RAPL not exposed (no package zone under {root})"
    try:
        counter = RaplCounter([zone for _, zone in packages])
    except PermissionError:
        return "RAPL permission denied: energy_uj is readable by root only on this host (Linux 5.10 and later)"
    except (OSError, ValueError) as exc:
        return f"RAPL unreadable: {describe(exc)}"
    names = ", ".join(name for name, _ in packages)
    return EnergyCounter(counter.read, f"RAPL {names}: the whole CPU socket, every process on it")


def energy_cell(section: Energy | None) -> str:
    """A record's tokens per joule with its average power, or n/a and why: one wording for `llmb run`'s table,
    summary.md and the leaderboard. ``section`` is a Result's energy (records.Energy) or None (an older record)."""
    if section is None:
        return "n/a (recorded before llmb measured energy)"
    if section.tokens_per_joule is None or section.watts is None:
        return f"n/a ({section.reason or 'no figure'})"
    return f"{section.tokens_per_joule:,.4g} ({section.watts:,.1f} W)"


def record_problems(result: Result) -> list[str]:
    """A result's energy figures against its own windows (`llmb verify`): the judge's sums and ratios recomputed from
    each window's joules and the record's judged window times, with the same plausibility checks. A record with no
    figure (an older one, or one that says why) claims nothing to check."""
    section = result.energy
    if section is None or section.joules is None:
        return []
    seconds = result.timing.repeat_window_seconds
    if not section.scope or not section.window_joules or len(section.window_joules) != len(seconds):
        return ["energy: figures without the counter's scope or one joule figure per measured window"]
    world = max(1, result.world_size)
    tokens = (result.global_batch_size or result.batch_size * world) * result.sequence_length * result.steps / world
    counter = {"scope": section.scope, "limit_watts": section.limit_watts}
    expected, problems = summarise(counter, [[0.0, joules] for joules in section.window_joules], seconds, tokens)
    for key in ("joules", "seconds", "watts", "tokens_per_joule"):
        recorded, value = getattr(section, key), expected.get(key)
        if value is None or recorded is None or not math.isclose(recorded, value, rel_tol=1e-6):
            problems.append(f"energy: {key} recorded {recorded!r}, recomputed {value!r}")
    return problems
