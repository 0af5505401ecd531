"""Known vendor libraries' process-wide replacements: accepted only from a listed release whose files are the wheel's.

A stand-in library is laid out here as pip would install it (package, dist-info, RECORD with sha256 hashes); the
real case, IPEX 2.8.0's `ipex.optimize`, is exercised in tests/test_xpu.py (tox -e ipex)."""

import base64
import hashlib
import importlib
import sys

import pytest

from llmb import vendor_libraries
from llmb.vendor_libraries import VendorLibrary

SOURCE = "def replacement(*args, **kwargs):\n    return None\n"
LIBRARY = VendorLibrary("fake-vendor", "fakevendor", ("1.0",), ("/build/fakevendor/csrc/",))


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


@pytest.fixture
def library(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "fakevendor").mkdir(parents=True)
    (site / "fakevendor" / "__init__.py").write_text(SOURCE)
    info = site / "fake_vendor-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-vendor\nVersion: 1.0\n")
    (info / "RECORD").write_text(record_line("fakevendor/__init__.py", SOURCE.encode()) + "\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(vendor_libraries, "KNOWN", (LIBRARY,))
    vendor_libraries.installed.cache_clear()
    module = importlib.import_module("fakevendor")
    yield site, module
    sys.modules.pop("fakevendor", None)
    vendor_libraries.installed.cache_clear()


def test_a_function_from_an_intact_known_release_is_the_librarys(library):
    _, module = library
    assert vendor_libraries.owner_of_object(module.replacement) == "fake-vendor 1.0"
    assert vendor_libraries.owner_of_kernels(["/build/fakevendor/csrc/Sum.cpp:83 :: (Tensor _0) -> Tensor _0"]) == (
        "fake-vendor 1.0"
    )


def test_code_from_elsewhere_is_nobodys(library):
    namespace: dict = {}
    exec(compile(SOURCE, "<plugin>", "exec"), namespace)
    assert vendor_libraries.owner_of_object(namespace["replacement"]) is None
    assert vendor_libraries.owner_of_object(len) is None  # a builtin has no code to place
    # A torch.library registration from Python reads /dev/null; one kernel of many from elsewhere is enough.
    assert vendor_libraries.owner_of_kernels(["/dev/null:241 :: (none)"]) is None
    assert vendor_libraries.owner_of_kernels(["/build/fakevendor/csrc/a.cpp:1", "/dev/null:2"]) is None
    assert vendor_libraries.owner_of_kernels([]) is None


def test_a_modified_library_or_an_unknown_release_is_not_trusted(library, monkeypatch):
    site, module = library
    (site / "fakevendor" / "__init__.py").write_text(SOURCE + "# edited after install\n")
    vendor_libraries.installed.cache_clear()
    found = vendor_libraries.installed(LIBRARY)
    assert not found.intact and "differs from the wheel's RECORD" in found.detail
    assert vendor_libraries.owner_of_object(module.replacement) is None
    (site / "fakevendor" / "__init__.py").write_text(SOURCE)
    monkeypatch.setattr(vendor_libraries, "KNOWN", (VendorLibrary("fake-vendor", "fakevendor", ("2.0",), ()),))
    vendor_libraries.installed.cache_clear()
    assert vendor_libraries.owner_of_object(module.replacement) is None


def test_the_guard_accepts_the_librarys_replacement_and_names_any_other(library):
    import torch

    from llmb import guard

    _, module = library
    baseline = guard.capture()
    saved = torch.embedding_bag
    try:
        torch.embedding_bag = module.replacement
        changed, accepted = guard.changes(baseline)
        assert changed == [] and accepted == {"fake-vendor 1.0": ["torch.embedding_bag was replaced"]}
        torch.embedding_bag = lambda *args, **kwargs: None
        changed, accepted = guard.changes(baseline)
        assert changed == ["torch.embedding_bag was replaced"] and accepted == {}
    finally:
        torch.embedding_bag = saved
