"""The time limit's last resort, run as its own tiny process: `python -S -I last_resort.py SECONDS LINE`.

A command whose main thread is inside a call into C that does not return and holds Python's GIL (a driver's
device query, a collective, a ctypes call) runs no Python at all: neither the limit's signal handler nor the
watchdog thread of llmb.api.errors.time_limit can act. This process can: it waits SECONDS on its stdin, which the
command keeps open; if the command ended first (it closes the pipe, or its exit does), it goes too. Else it says
LINE on stderr (the command's), kills the command's own child processes (Linux's /proc), then the command (SIGKILL:
nothing in a process whose interpreter is held can exit more cleanly; a shell reports 137).

Only the standard library, and no llmb: it is started by path with site and the environment ignored, so it starts in
milliseconds and a plugin's path or settings do not reach it.
"""

from __future__ import annotations

import os
import select
import signal
import sys


def children_of(parent: int) -> list[int]:
    """The process ids whose parent is ``parent`` (Linux's /proc; elsewhere none are known)."""
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                # pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after its last ')'.
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile, or not readable
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(name))
    return found


def main(argv: list[str]) -> int:
    seconds, line = float(argv[1]), argv[2]
    parent = os.getppid()
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    if ready or os.getppid() != parent:  # the command closed the pipe, or ended (this process was handed on)
        return 0
    os.write(2, (line + "\n").encode("utf-8", "replace"))
    for child in children_of(parent):
        if child != os.getpid():
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
    os.kill(parent, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
