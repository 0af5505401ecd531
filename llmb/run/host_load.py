"""The busy-host heuristic: whether a run's host looked oversubscribed while it measured, from its record."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the records import the model, and so torch
    from llmb.records import Result


def oversubscribed(record: Result) -> str | None:
    """Why the host looks oversubscribed (its 1-minute load average above the threads torch was given), or None.

    The load counts the run's own threads, so a load above them means other work competed for the cores: a quick
    start on a busy machine measured 23 tokens/s where an idle one gives 524.
    """
    host = record.host
    if host is None or not host.load_average_end:
        return None
    threads = (record.threads_per_rank or [0])[0] or torch_threads()
    cpus = len(host.cpu_affinity) if host.cpu_affinity else host.cpu_count
    load = max(host.load_average_start[:1] + host.load_average_end[:1])
    if threads and load > max(threads, 1) + 0.5 and load > (cpus or 0) * 0.9:
        from llmb.run import sysinfo  # lazy: sysinfo imports torch, needed only for a busy host's advice

        return (
            f"load average {load:.1f} with torch on {threads} thread(s) and {cpus} CPUs: other processes competed "
            f"for the cores, so this figure is low; {sysinfo.threads_advice(record.plugin.settings, threads)}"
        )
    return None


def torch_threads() -> int:
    """The threads torch computes with in this process (a record that names none ran here)."""
    import torch  # lazy: only a record without threads_per_rank needs it

    return torch.get_num_threads()
