import pytest

from llmb.bundle.codediff import file_status, full_diff, parse_diffs

CASES = [
    ("plain change", "a\nb\nc\n", "a\nB\nc\n"),
    ("no newline at the end of the old side", "a\nb", "a\nb\n"),
    ("no newline at the end of either side", "a\nb", "a\nc"),
    ("carriage returns and form feeds belong to the lines", "a\r\nb\x0c\n", "a\r\nb\n"),
    ("a line that looks like a header", "--- a/x\n+++ b/x\n", "--- a/x\n@@ -1 +1 @@\n"),
    ("added", None, "new\nfile\n"),
    ("removed", "old\n", None),
    ("emptied", "x\n", ""),
]


@pytest.mark.parametrize("what, old, new", CASES, ids=[c[0] for c in CASES])
def test_whole_file_diffs_give_back_both_sides(what, old, new):
    text = full_diff("llmb/x.py", old, new)
    assert parse_diffs(text) == {"llmb/x.py": (old, new)}


def test_several_files_in_one_diff():
    text = full_diff("llmb/a.py", "1\n", "2\n") + full_diff("llmb/b.py", None, "b")
    assert parse_diffs(text) == {"llmb/a.py": ("1\n", "2\n"), "llmb/b.py": (None, "b")}


@pytest.mark.parametrize(
    "text",
    [
        "not a diff\n",
        "--- a/x\n+++ b/x\n@@ -1,2 +1,1 @@\n-a\n",  # the hunk ends before its counts
        "--- a/x\n+++ b/y\n@@ -1,1 +1,1 @@\n-a\n+b\n",  # two names
        "--- a/x\n+++ b/x\n@@ -1,1 +1,1 @@\n-a\n+b\n--- a/x\n+++ b/x\n@@ -1,1 +1,1 @@\n-a\n+b\n",  # twice
    ],
)
def test_malformed_diffs_raise_value_error(text):
    with pytest.raises(ValueError):
        parse_diffs(text)


def test_file_status():
    status = file_status({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "9", "d": "4"})
    assert [(e["path"], e["status"]) for e in status] == [
        ("a", "unchanged"),
        ("b", "changed"),
        ("c", "removed"),
        ("d", "added"),
    ]
