"""The cpu plugin keeps the memory a step frees (llmb.toolkit.host_memory): what glibc does then, measured by the page
faults of a later allocation, in a fresh process each (mallopt is process-wide and would outlive the test)."""

from __future__ import annotations

import ctypes.util
import json
import os
import platform
import subprocess
import sys

import pytest

from llmb.registry.plugins import get_backend
from llmb.toolkit import host_memory

GLIBC = platform.libc_ver()[0] == "glibc"

# Faults of touching a 128 MiB tensor after a 256 MiB one was freed: with the C library's defaults each block above
# 32 MiB is mmapped afresh (32,768 pages of 4 KiB faulted in); kept, the freed block serves it, already resident. (A
# block of exactly the freed one's size may not fit in it: torch asks for aligned blocks, posix_memalign, which need a
# little more; a training loop's blocks of many sizes settle within a few steps, benchmarks/RESULTS.md section 18.)
LATER_ALLOCATION = """
import json, resource, sys
import torch
from llmb.toolkit import host_memory
said = host_memory.keep_freed_memory(sys.argv[1] == "keep") if sys.argv[1] != "untouched" else None
def faults_of_one_touch(mib):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(mib * 1024 * 1024 // 4)  # every page written
    del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
first = faults_of_one_touch(256)
print(json.dumps({"said": said, "first": first, "again": faults_of_one_touch(128)}))
"""

PAGES = 128 * 1024 * 1024 // 4096  # of the later block


def later_allocation(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", LATER_ALLOCATION, mode], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout)


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's; elsewhere the plugin states that it kept nothing")
def test_kept_memory_is_reused_without_faults():
    untouched, kept = later_allocation("untouched"), later_allocation("keep")
    # The C library's defaults: the 128 MiB block is faulted in, page by page (4 KiB pages; fewer with transparent
    # huge pages, so only "most of them" is asserted).
    assert untouched["again"] > PAGES // 2, untouched
    assert kept["said"] == host_memory.KEPT
    assert kept["first"] > PAGES // 2, kept  # the first touch always faults: the memory is new to the process
    assert kept["again"] < PAGES // 20, kept


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_false_after_true_goes_back_to_the_defaults():
    script = LATER_ALLOCATION.replace(
        'said = host_memory.keep_freed_memory(sys.argv[1] == "keep") if sys.argv[1] != "untouched" else None',
        "host_memory.keep_freed_memory(True); said = host_memory.keep_freed_memory(False)",
    )
    done = subprocess.run([sys.executable, "-c", script, "x"], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout)
    assert result["said"] == host_memory.DEFAULT
    assert result["again"] > PAGES // 2, result


def test_false_in_a_process_that_never_kept_calls_nothing(monkeypatch):
    monkeypatch.setattr(host_memory, "_kept_in_this_process", False)  # an earlier test's run may have kept
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: pytest.fail("the C library was consulted"))
    assert host_memory.keep_freed_memory(False) == host_memory.DEFAULT


def test_another_c_library_is_stated_not_touched(monkeypatch):
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
    said = host_memory.keep_freed_memory(True)
    assert said.startswith(host_memory.DEFAULT) and "not glibc" in said


def test_the_cpu_plugin_keeps_only_when_asked_and_says_so_in_its_facts(monkeypatch):
    backend = get_backend("cpu").backend
    setting = {s.name: s for s in backend.settings()}["keep_freed_memory"]
    assert setting.default is False  # opt-in: in llmb's own loop the kept heap went on growing (RESULTS.md 18)
    asked = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda keep: asked.append(keep) or f"kept={keep}")
    monkeypatch.setattr(backend, "host_allocator", host_memory.DEFAULT, raising=False)
    import torch

    threads = torch.get_num_threads()
    try:
        backend.setup(torch.device("cpu"), "FP32", {"keep_freed_memory": True, "threads": threads})
        assert backend.run_facts(torch.device("cpu"))["host_allocator"] == "kept=True"
        backend.setup(torch.device("cpu"), "FP32", {"keep_freed_memory": False, "threads": threads})
        assert backend.run_facts(torch.device("cpu"))["host_allocator"] == "kept=False"
    finally:
        torch.set_num_threads(threads)
    assert asked == [True, False]


# A malloc replacement this machine has (Debian's libtcmalloc-minimal4 or libjemalloc2; .ci/run installs the first).
PRELOADABLE = next(
    (path for name in ("tcmalloc_minimal", "tcmalloc", "jemalloc") if (path := ctypes.util.find_library(name))), None
)
STATES = "import json; from llmb.toolkit import host_memory as h; " + (
    "print(json.dumps([h.malloc_library(), h.keep_freed_memory(False), h.keep_freed_memory(True)]))"
)


def allocator_states(preload: str | None) -> list:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run(
        [sys.executable, "-c", STATES], capture_output=True, text=True, timeout=120, check=True, env=env
    )
    return json.loads(done.stdout)


@pytest.mark.skipif(not GLIBC, reason="the C library's own malloc is read from glibc")
def test_the_c_librarys_own_malloc_is_no_preloaded_allocator():
    library, default, kept = allocator_states(None)
    assert library is None and default == host_memory.DEFAULT and kept == host_memory.KEPT


@pytest.mark.skipif(
    not (GLIBC and PRELOADABLE), reason="no tcmalloc or jemalloc installed to preload (apt: libtcmalloc-minimal4)"
)
def test_a_preloaded_allocator_is_named_by_the_address_malloc_resolves_to():
    library, default, kept = allocator_states(PRELOADABLE)
    # find_library gives a soname; the dynamic linker's mapping is the file it resolved to.
    assert library is not None and os.path.basename(library).startswith(PRELOADABLE.split(".so")[0])
    assert os.path.exists(library)
    assert default.startswith(os.path.basename(library)) and "preloaded" in default
    # glibc's mallopt does not reach another allocator: the record says so rather than claiming kept memory.
    assert kept != host_memory.KEPT and "not applied" in kept


def test_a_name_in_ld_preload_that_does_not_replace_malloc_is_not_taken_at_its_word():
    # libm exports no malloc: preloaded, it leaves the C library's malloc in place, and llmb says so.
    libm = ctypes.util.find_library("m")
    if not (GLIBC and libm):
        pytest.skip("needs glibc's libm")
    library, default, _ = allocator_states(libm)
    assert library is None and default == host_memory.DEFAULT


def test_the_hosts_out_of_memory_kill_count_is_read_where_linux_keeps_it(tmp_path):
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1234\noom_kill 7\nnr_zone_active_anon 5\n")
    assert host_memory.oom_kills(str(vmstat)) == 7
    vmstat.write_text("nr_free_pages 1234\n")  # a kernel before 4.13: no count
    assert host_memory.oom_kills(str(vmstat)) is None
    assert host_memory.oom_kills(str(tmp_path / "absent")) is None
    try:  # this host's own, where it has one: a count, never negative
        has_count = any(line.startswith("oom_kill ") for line in open("/proc/vmstat"))
    except OSError:
        has_count = False
    if has_count:
        assert host_memory.oom_kills() >= 0
    else:
        assert host_memory.oom_kills() is None


def test_a_worker_ended_by_sigkill_while_the_oom_count_rose_is_said_to_be_out_of_memory():
    """The counts are given, not produced: summoning the kernel's out-of-memory killer would endanger the host that
    runs the tests. What the judge says of each way a worker can end without a word."""
    from llmb.judge.cleanroom import worker_death

    assert str(worker_death(-9, 3, 4)).startswith("out of memory: the kernel's out-of-memory killer ended the worker")
    assert "killed by SIGKILL" in str(worker_death(-9, 3, 3))  # the count did not move: another SIGKILL
    assert "killed by SIGKILL" in str(worker_death(-9, None, None))  # a host that keeps no count
    assert "killed by SIGSEGV" in str(worker_death(-11, 3, 4))  # only SIGKILL is the OOM killer's
    assert "exited with code 0" in str(worker_death(0, 3, 3))
