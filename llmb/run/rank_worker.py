"""One rank of a clean-room job: `python -m llmb.run.rank_worker JOBS HOST PORT`, started by torch's launcher
for the judging process (cleanroom.serve). JOBS is the file the judge wrote (the task and its jobs, pickled: the judge's
own data); the judge's key comes in the environment (clean_link.KEY_ENV), never on the command line, which other users
can read. A failure goes to the rank's JSON error file (torch's error handler, what its `record` writes): the launcher's
only news of it, and the traceback stays there."""

from __future__ import annotations

import os
import pickle
import sys

from torch.distributed.elastic.multiprocessing.errors import get_error_handler

from llmb.judge import link as clean_link
from llmb.run import clean_worker


def main(argv: list[str] | None = None) -> None:
    handler = get_error_handler()
    handler.initialize()
    try:
        jobs_file, host, port = argv if argv is not None else sys.argv[1:]
        key = bytes.fromhex(os.environ.pop(clean_link.KEY_ENV))
        with open(jobs_file, "rb") as file:
            task, jobs = pickle.load(file)
        clean_worker.worker_main(task, jobs, (host, int(port)), key, False)
    except Exception as exc:  # the rank's own error, as torch's `record` would write it, without its traceback here
        handler.record_exception(exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
