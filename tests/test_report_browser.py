"""The HTML report as a vendor sees it: rendered by a real headless Chromium, screenshotted, and the picture checked
(its size, and that it is not blank). CI installs Debian's chromium (.ci/run); without a browser the test is skipped
and says why."""

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from records_factory import make_result

from llmb.cli import cli

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no headless browser: install Debian's chromium (apt-get install chromium) to render the report")


def write_sweep_like_results(folder):
    """Seven series (methods and precisions) over a range of batch sizes, as a vendor's sweep folder holds them."""
    folder.mkdir()
    for precision, scale in (("FP32", 1.0), ("BF16", 1.6), ("FP16", 1.5)):
        for threads in (0, 1):
            for batch in (1, 2, 4, 8, 16, 24, 32, 48, 64):
                tps = scale * 100 * batch / (1 + batch / 16) * (1.1 if threads else 1.0)
                record = make_result(
                    tokens_per_second=tps,
                    precision=precision,
                    batch_size=batch,
                    settings={"threads": threads},
                    matmul_peak_efficiency=tps / 2000,  # made up, as the rest: what `llmb run` measures by roofline
                )
                (folder / f"{record.run_id}.json").write_text(json.dumps(record.to_dict()))
    extra = make_result(tokens_per_second=500.0, batch_size=4, plugin="acme", device_name="Acme X1")
    (folder / "acme.json").write_text(json.dumps(extra.to_dict()))


def test_html_report_renders_in_a_headless_browser(tmp_path):
    chrome = browser()
    results = tmp_path / "results"
    write_sweep_like_results(results)
    page = tmp_path / "report.html"
    # The Acme record as the reference: a ratio column, and its own plot panel (it would flatten the sweep's curves).
    args = ["report", str(results), "--out", str(page), "--reference", str(results / "acme.json")]
    made = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert made.exit_code == 0, made.output
    html = page.read_text()
    for expected in (
        "About these runs",
        "tiny (4.2M params)",
        "2.13.0+cpu",
        "3 + 1 warmup",
        "tflops_vs_batch.png",
        "efficiency_vs_batch.png",
        "x vs reference",
    ):
        assert expected in html, expected

    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
    profile.mkdir()
    command = [chrome, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1200,3000"]
    done = subprocess.run([*command, page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]

    from matplotlib.image import imread

    pixels = imread(shot)  # floats in [0, 1], rows x columns x channels
    assert pixels.shape[:2] == (3000, 1200)
    rgb = pixels[..., :3]
    ink = (rgb.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
    assert ink > 0.02, f"the page rendered almost blank ({ink:.2%} non-white)"
    colourful = ((rgb.max(axis=2) - rgb.min(axis=2)) > 0.2).mean()  # plot lines and markers are coloured
    assert colourful > 0.001, f"no plot drawn ({colourful:.3%} coloured pixels)"
