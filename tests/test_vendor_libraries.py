"""Vendor libraries' process-wide replacements: accepted only from a library the running backend names
(Backend.vendor_libraries), a release whose files are one of the official wheels pinned in llmb
(llmb/audit/vendor_releases/), never by the RECORD a wheel brings.

A stand-in library is built here as a wheel, pinned with llmb's own `pin` command, and laid out as pip would install
it; the real case, IPEX 2.8.0's `ipex.optimize`, is exercised in tests/test_xpu.py (tox -e ipex), and a look-alike
IPEX against the shipped pins in tests/redteam/test_redteam_vendor_lookalike.py."""

import base64
import hashlib
import importlib
import json
import sys
import zipfile

import pytest

from llmb.audit import vendor_libraries
from llmb.audit.vendor_libraries import VendorLibrary

SOURCE = "def replacement(*args, **kwargs):\n    return None\n"
LIBRARY = VendorLibrary("fake-vendor", "fakevendor", ("1.0",), ("/build/fakevendor/csrc/",))


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def install(site, files: dict[str, str], name="fake_vendor", version="1.0") -> None:
    """Lay the files out as pip would, with a dist-info whose RECORD matches them (a look-alike's own word)."""
    for path, text in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(record_line(p, t.encode()) + "\n" for p, t in files.items()))


@pytest.fixture
def library(tmp_path, monkeypatch):
    wheel = tmp_path / "fake_vendor-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fakevendor/__init__.py", SOURCE)
        archive.writestr("fake_vendor-1.0.dist-info/RECORD", "")
    monkeypatch.setattr(vendor_libraries, "RELEASES_DIR", tmp_path / "pins")
    assert vendor_libraries.main(["pin", str(wheel), "--kernel-source", "/build/fakevendor/csrc/"]) == 0
    assert vendor_libraries.pinned("fake_vendor") == LIBRARY
    vendor_libraries.use(["fake-vendor"])  # what the running backend names, before its setup
    site = tmp_path / "site"
    install(site, {"fakevendor/__init__.py": SOURCE})
    monkeypatch.syspath_prepend(str(site))
    vendor_libraries.installed.cache_clear()
    module = importlib.import_module("fakevendor")
    yield site, module
    sys.modules.pop("fakevendor", None)
    vendor_libraries.use(())
    vendor_libraries.installed.cache_clear()


def test_pin_records_each_file_of_the_package_and_the_wheels_own_hash(library, tmp_path):
    (pins,) = (tmp_path / "pins").glob("*.json")
    data = json.loads(pins.read_text())
    assert pins.name == "fake-vendor-1.0.json" and data["schema"] == vendor_libraries.RELEASE_PINS_SCHEMA
    assert (data["module"], data["kernel_sources"]) == ("fakevendor", ["/build/fakevendor/csrc/"])
    (wheel,) = data["wheels"].values()
    assert wheel["files"] == {"fakevendor/__init__.py": hashlib.sha256(SOURCE.encode()).hexdigest()}
    whl = tmp_path / "fake_vendor-1.0-py3-none-any.whl"
    assert wheel["sha256"] == hashlib.sha256(whl.read_bytes()).hexdigest()  # the dist-info is not pinned


def test_pin_of_a_wheel_with_several_packages_and_no_module_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(vendor_libraries, "RELEASES_DIR", tmp_path / "pins")
    wheel = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("other/__init__.py", "")
        archive.writestr("second/__init__.py", "")
    assert vendor_libraries.main(["pin", str(wheel)]) == 1
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "give --module" in error
    assert vendor_libraries.main(["pin", str(wheel), "--module", "other"]) == 0
    assert vendor_libraries.pinned("other").module == "other"


def test_the_shipped_pins_read_as_libraries_and_cover_what_first_party_plugins_name():
    """Every pins file is a library llmb knows (module, kernel sources, its wheels' files); every library a
    first-party plugin names has a pinned release, so naming it is not naming nothing."""
    import llmb_xpu

    shipped = sorted(vendor_libraries.RELEASES_DIR.glob("*.json"))
    assert shipped
    for path in shipped:
        data = json.loads(path.read_text())
        library = vendor_libraries.pinned(data["distribution"])
        assert library is not None and data["version"] in library.versions and library.kernel_sources
        assert vendor_libraries.pins_path(library, data["version"]) == path
        assert data["wheels"] and all(wheel["files"] for wheel in data["wheels"].values())
        assert all(name.startswith(f"{library.module}/") for w in data["wheels"].values() for name in w["files"])
    for name in llmb_xpu.XpuBackend().vendor_libraries():
        assert vendor_libraries.pinned(name) is not None, name


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
    # Edited after install, with a RECORD that matches the edit: the wheel's own word is not what llmb checks.
    install(site, {"fakevendor/__init__.py": SOURCE + "# edited after install\n"})
    vendor_libraries.installed.cache_clear()
    found = vendor_libraries.installed(LIBRARY)
    assert not found.intact and "fakevendor/__init__.py differs from the official wheel's" in found.detail
    assert vendor_libraries.owner_of_object(module.replacement) is None
    install(site, {"fakevendor/__init__.py": SOURCE})
    vendor_libraries.installed.cache_clear()
    assert vendor_libraries.installed(LIBRARY).intact
    # A file added beside the official ones (importable code the guard would then call the library's) is refused.
    install(site, {"fakevendor/__init__.py": SOURCE, "fakevendor/extra.py": SOURCE})
    vendor_libraries.installed.cache_clear()
    found = vendor_libraries.installed(LIBRARY)
    assert not found.intact and "fakevendor/extra.py is in no official wheel" in found.detail
    (site / "fakevendor" / "extra.py").unlink()
    # Byte code the interpreter writes after install is not a wheel's file and does not count as added.
    (site / "fakevendor" / "__pycache__").mkdir(exist_ok=True)
    (site / "fakevendor" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"cache")
    vendor_libraries.installed.cache_clear()
    assert vendor_libraries.installed(LIBRARY).intact
    # Installed as a release llmb holds no pins for: not trusted.
    other = VendorLibrary("fake-vendor", "fakevendor", ("2.0",), ())
    monkeypatch.setattr(vendor_libraries, "pinned", lambda name: other)
    vendor_libraries.installed.cache_clear()
    assert vendor_libraries.owner_of_object(module.replacement) is None


def test_an_intact_release_the_running_backend_does_not_name_is_nobodys(library):
    """What an intact, pinned library replaces is accepted only in a run whose backend names it: another plugin
    cannot borrow a vendor library's acceptance for changes made by calling it."""
    _, module = library
    vendor_libraries.use(["some-other-library"])
    assert vendor_libraries.owner_of_object(module.replacement) is None
    assert vendor_libraries.owner_of_kernels(["/build/fakevendor/csrc/Sum.cpp:83"]) is None
    vendor_libraries.use(["Fake_Vendor"])  # named as the registry compares names
    assert vendor_libraries.owner_of_object(module.replacement) == "fake-vendor 1.0"


def test_the_guard_accepts_the_librarys_replacement_and_names_any_other(library):
    import torch

    from llmb.audit import guard

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
