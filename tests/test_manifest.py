import json

from llmb.bundle import manifest
from llmb.spec.fingerprint import RELEASED_MODEL_FINGERPRINT


def test_shipped_release_manifest_is_up_to_date():
    stale = manifest.stale_files()
    assert not stale, f"llmb/release_manifest.json is stale for {stale}: run `{manifest.REGENERATE}`"


def test_manifest_pins_the_released_model():
    assert manifest.load()["files"][manifest.MODEL_PATH] == RELEASED_MODEL_FINGERPRINT
    assert manifest.problems(manifest.load()) == []


def test_manifest_covers_package_files_but_not_byte_code_or_itself(tmp_path):
    package = tmp_path / "llmb"
    (package / "__pycache__").mkdir(parents=True)
    (package / "model.py").write_text("model\n")
    (package / "data.json").write_text("{}\n")
    (package / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (package / ".hidden").write_text("x")
    (package / manifest.MANIFEST_NAME).write_text("{}")
    files = manifest.compute(package)["files"]
    assert sorted(files) == ["llmb/data.json", "llmb/model.py"]
    assert files["llmb/model.py"] == manifest.sha256_bytes(b"model\n")


def test_a_manifest_without_the_released_model_is_refused(tmp_path):
    package = tmp_path / "llmb"
    package.mkdir()
    (package / "model.py").write_text("not the model\n")
    assert "not the released model" in manifest.problems(manifest.compute(package))[0]
    try:
        manifest.write(package)
    except SystemExit as exc:
        assert "refusing" in str(exc)
    else:
        raise AssertionError("write() accepted a changed model")
    assert not (package / manifest.MANIFEST_NAME).exists()


def test_stale_files_names_the_changed_file(tmp_path):
    package = tmp_path / "llmb"
    package.mkdir()
    (package / "a.py").write_text("a\n")
    (package / manifest.MANIFEST_NAME).write_text(json.dumps(manifest.compute(package)))
    assert manifest.stale_files(package) == []
    (package / "a.py").write_text("b\n")
    (package / "new.py").write_text("n\n")
    assert manifest.stale_files(package) == ["llmb/a.py", "llmb/new.py"]


def test_the_shipped_manifest_is_a_known_release():
    assert manifest.known_release(manifest.load()) is not None


def test_writing_the_manifest_records_a_release_and_the_nearest_release_names_changes(tmp_path):
    package = tmp_path / "llmb"
    package.mkdir()
    (package / "model.py").write_bytes(manifest.PACKAGE_DIR.joinpath("model.py").read_bytes())
    (package / "train.py").write_text("the loop\n")
    manifest.write(package)
    released = manifest.load(package)
    assert manifest.known_release(released, package)["digest"] == manifest.digest(released)
    assert manifest.record_release(released, package) is False  # once
    (package / "releases.json").read_text()
    edited = dict(released["files"], **{"llmb/training/loop.py": manifest.sha256_bytes(b"a faster loop\n")})
    assert manifest.known_release({"files": edited}, package) is None
    nearest, changed = manifest.nearest_release(edited, package)
    assert nearest["digest"] == manifest.digest(released) and changed == ["llmb/training/loop.py"]
    assert "llmb/releases.json" not in manifest.compute(package)["files"]
