"""`llmb sweep --search KEY=V1,V2`: the batch-size sweep over every combination of the plugin settings searched.

The batch size is not the only choice that decides a device's best result: whether the model is compiled, which
AdamW kernel runs, activation checkpointing. Each combination of the searched settings gets a sweep of its own (a
sub-folder named after it, resumable like any sweep), and the search summary names, per precision, the combination
whose headline (the sweep's one headline rule: the median re-run at its best batch) is the highest among those whose
headline run has no invalid reason (a debug shape is debug for every combination alike).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmb.api.errors import UsageError, describe, shown
from llmb.records import envelope
from llmb.records.codec import SEARCH_SUMMARY_SCHEMA
from llmb.records.result_files import read_result, write_json_atomic
from llmb.registry.plugins import resolve_settings, select_backend
from llmb.run import sweep as sweeps
from llmb.terminal import console as term

if TYPE_CHECKING:
    from rich.console import Console

SEARCH_SUMMARY_NAME = "search-summary.json"
_VALUE = re.compile(r"^[A-Za-z0-9_.+-]+$")


def parse_search(items: tuple[str, ...] | list[str], fixed: dict) -> dict[str, list[str]]:
    """KEY=V1,V2 items as {key: [values]} in the order given; one-line usage errors naming the item."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--search {shown(item)}: expected KEY=V1,V2 (a plugin setting and the values to try)")
        if key in grid:
            raise UsageError(f"--search {key}: given twice")
        if key in fixed:
            raise UsageError(f"--search {key}: also fixed by -O {key}=...; give it in one of them")
        chosen = [v.strip() for v in values.split(",")]
        bad = [v for v in chosen if not _VALUE.match(v)]  # an empty item (none,,default) included
        if bad:
            raise UsageError(f"--search {key}: expected comma-separated values like none,default (got {shown(values)})")
        grid[key] = list(dict.fromkeys(chosen))
    return grid


def combinations(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the searched values, the first value of each setting first."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def folder_name(combination: dict[str, str]) -> str:
    """The sub-folder of one combination: `compile=default,fused_adamw=true` (values are checked plain words)."""
    return ",".join(f"{key}={value}" for key, value in combination.items())


def logged_folder(out: Path, grid: dict[str, list[str]]) -> Path | None:
    """For --resume: the first combination's sub-folder of ``out`` that holds a sweep log (the search's own options
    are in its header: a search keeps no log of its own), None where none does yet."""
    folders = (out / folder_name(combo) for combo in combinations(grid))
    return next((folder for folder in folders if (folder / sweeps.LOG_NAME).is_file()), None)


def search(options: sweeps.SweepOptions, grid: dict[str, list[str]], display: sweeps.Display | None = None) -> dict:
    """One sweep per combination in its own sub-folder of options.out; the search summary written beside them."""
    out = Path(options.out)
    combos = combinations(grid)
    backend = select_backend(options.run.plugin, options.run.device).backend
    for combo in combos:  # every searched value is checked before the first trial: a bad one is a usage error now,
        resolve_settings(backend, {**options.run.settings, **combo})  # not after hours of the combinations before it
    summary: dict = {
        **envelope(SEARCH_SUMMARY_SCHEMA),
        "searched": grid,
        "fixed_settings": dict(options.run.settings),
        "combinations": [],
        "best": {},
    }
    refusals: list[sweeps.FirstTrialRefused] = []
    for combo in combos:
        sub = replace(
            options, run=replace(options.run, settings={**options.run.settings, **combo}), out=out / folder_name(combo)
        )
        entry = {"settings": combo, "folder": folder_name(combo)}
        try:
            result = sweeps.sweep(sub, display)
        except sweeps.FirstTrialRefused as exc:
            # A refusal of one combination's first trial is most likely its settings (a compile mode this device
            # lacks): it ends that combination only, its one-line reason in the summary; --resume tries it again.
            entry["error"], result = f"refused: {exc}", None
            refusals.append(exc)
        except (sweeps.Interrupted, UsageError):
            raise
        except Exception as exc:  # one combination that cannot run (a compiler missing) does not stop the others
            entry["error"] = describe(exc)
            result = None
        if result is not None:
            entry["precisions"] = {
                name: {k: p.get(k) for k in ("status", "best_batch_size", "tokens_per_second", "headline_result")}
                for name, p in result["precisions"].items()
            }
        summary["combinations"].append(entry)
        summary["best"] = best_by_precision(out, summary["combinations"])
        write_json_atomic(out / SEARCH_SUMMARY_NAME, summary)  # after every combination: nothing finished is lost
    if len(refusals) == len(combos):
        # Every combination refused before measuring anything: the request they share (the device, say) is the
        # cause, and the search fails with the first one's reason, as a single sweep does.
        raise refusals[0]
    return summary


def best_by_precision(out: Path, entries: list[dict]) -> dict[str, dict]:
    """Per precision, the combination with the highest headline among headline runs with no invalid reason."""
    best: dict[str, dict] = {}
    for entry in entries:
        for name, point in (entry.get("precisions") or {}).items():
            if point.get("status") != "ok" or not point.get("tokens_per_second"):
                continue
            try:
                clean = not read_result(out / entry["folder"] / point["headline_result"]).invalid_reasons
            except Exception:
                clean = False
            if not clean:
                continue
            if name not in best or point["tokens_per_second"] > best[name]["tokens_per_second"]:
                best[name] = {
                    "settings": entry["settings"],
                    "folder": entry["folder"],
                    "best_batch_size": point["best_batch_size"],
                    "tokens_per_second": point["tokens_per_second"],
                }
    return best


def print_search(summary: dict, console: Console) -> None:
    """The combinations' headlines per precision, and the winner of each precision."""
    names = sorted({n for e in summary["combinations"] for n in (e.get("precisions") or {})})
    # The folders, statuses and errors are text from the sweeps (a plugin's exception): plain text, never markup.
    table = term.table("llmb sweep --search: headline tokens/s (best batch) per combination")
    term.column(table, "settings")
    for name in names:
        term.column(table, name, numeric=True)
    errors = any(entry.get("error") for entry in summary["combinations"])
    if errors:  # a combination that could not run says why in a column of its own, even when none ran
        term.column(table, "error")
    for entry in summary["combinations"]:
        cells = []
        for name in names:
            point = (entry.get("precisions") or {}).get(name) or {}
            tps = point.get("tokens_per_second")
            cells.append(f"{tps:,.1f} (b{point['best_batch_size']})" if tps else str(point.get("status", "-")))
        term.row(table, entry["folder"], *cells, *([entry.get("error") or ""] if errors else []))
    console.print(table)
    for name, best in summary["best"].items():
        line = f"{name}: best {best['folder']} at batch {best['best_batch_size']}, {best['tokens_per_second']:,.1f}"
        console.print(term.text(line + " tokens/s"), soft_wrap=True)
