"""Red team, class 5 of the second round: a vendor library known by its own word. A look-alike
`intel-extension-for-pytorch 2.8.0` (a real release llmb accepts replacements from) is installed beside the plugin,
its files matching its own RECORD, and its `optimize()` swaps `LlamaModel.forward` on the class for one that skips
half the layers. The plugin names the library, as the xpu plugin does; llmb knows the release by the hashes of its
official wheels' files (llmb/audit/vendor_releases/), so the swap is the plugin's code, not the library's. Stage:
run; reason: the identity check names the replaced forward."""

import base64
import hashlib
import textwrap

import pytest
from redteam_kit import install, reasons, run
from test_redteam_plugins import SKIP_LAYERS

# The layer skip of test_redteam_plugins.SKIP_LAYERS (caught there from the plugin's own file), moved into the
# look-alike's optimize(): what changes is only whose file the swap comes from.
SWAP = "llmb.model.LlamaModel.forward = _forward\n"
LOOKALIKE = (
    textwrap.dedent(SKIP_LAYERS.code).replace(SWAP, "")
    + f"""

def optimize(model, optimizer=None, **kwargs):
    {SWAP.strip()}
    return model, optimizer
"""
)

PLUGIN = """
def _vendor_libraries():
    return ["intel-extension-for-pytorch"]  # named, as the xpu plugin names it: the guard may accept its changes


def _process_model(model, optimizer, device, precision, settings):
    import intel_extension_for_pytorch as ipex

    return ipex.optimize(model, optimizer=optimizer)[0]
"""


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


@pytest.mark.parametrize("version", ["2.8.0", "2.9.0"])  # a pinned release; a real-looking one llmb holds no pins for
def test_a_lookalike_release_whose_record_matches_its_files_is_not_the_vendor_library(tmp_path, version):
    name = f"lookalike{version.replace('.', '')}"
    site = install(tmp_path / "site", name, PLUGIN)
    (site / "intel_extension_for_pytorch").mkdir()
    (site / "intel_extension_for_pytorch" / "__init__.py").write_text(LOOKALIKE)
    info = site / f"intel_extension_for_pytorch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: intel-extension-for-pytorch\nVersion: {version}\n")
    (info / "RECORD").write_text(record_line("intel_extension_for_pytorch/__init__.py", LOOKALIKE.encode()) + "\n")
    proc, record = run(site, tmp_path, "--plugin", name)
    assert record is not None, proc.stderr[-2000:]
    assert not record["valid"]
    assert reasons(record, "identity after post-processing: llmb.model.LlamaModel.forward was replaced")
    assert not record["facts"].get("vendor_library_replacements")
