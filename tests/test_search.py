"""llmb sweep --search: the batch-size sweep over every combination of the searched plugin settings."""

import json
import subprocess
import sys

import pytest
from conftest import TINY_SWEEP

from llmb.api.errors import UsageError
from llmb.run import grid


def test_search_items_parse_into_a_grid_and_its_combinations():
    searched = grid.parse_search(["compile=none,default", "fused_adamw=true,false,true"], {"threads": 1})
    assert searched == {"compile": ["none", "default"], "fused_adamw": ["true", "false"]}
    combos = grid.combinations(searched)
    assert combos[0] == {"compile": "none", "fused_adamw": "true"} and len(combos) == 4
    assert [grid.folder_name(c) for c in combos][-1] == "compile=default,fused_adamw=false"


@pytest.mark.parametrize(
    "items, fixed, message",
    [
        (["compile"], {}, "expected KEY=V1,V2"),
        (["=none"], {}, "expected KEY=V1,V2"),
        (["compile="], {}, "comma-separated values"),
        (["compile=../x"], {}, "comma-separated values"),
        (["compile=none,,default"], {}, "comma-separated values"),
        (["compile=none", "compile=default"], {}, "given twice"),
        (["threads=1,2"], {"threads": 1}, "also fixed by -O threads"),
    ],
)
def test_bad_search_items_are_one_line_usage_errors(items, fixed, message):
    with pytest.raises(UsageError, match=message):
        grid.parse_search(items, fixed)


def test_a_search_sweeps_each_combination_and_names_the_best(tmp_path):
    out = tmp_path / "search"
    args = ["--plugin", "cpu", "--precision", "FP32", "--batch-sizes", "1", "--repeats", "1"]
    args += ["--search", "fused_adamw=true,false", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "llmb", "sweep", *TINY_SWEEP, *args], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / grid.SEARCH_SUMMARY_NAME).read_text())
    folders = [entry["folder"] for entry in summary["combinations"]]
    assert folders == ["fused_adamw=true", "fused_adamw=false"]
    for folder in folders:  # each combination is a whole sweep of its own
        assert json.loads((out / folder / "sweep-summary.json").read_text())["settings"]["fused_adamw"] == (
            folder.endswith("true")
        )
    headlines = {e["folder"]: e["precisions"]["FP32"]["tokens_per_second"] for e in summary["combinations"]}
    best = summary["best"]["FP32"]
    assert best["tokens_per_second"] == max(headlines.values()) and headlines[best["folder"]] == max(headlines.values())
    assert f"FP32: best {best['folder']} at batch 1" in proc.stdout
