"""The loss path alone: ways to compute llmb's next-token loss from FP32 logits, forward and backward, timed
alternately in one process (the order flips every round), at several batch sizes of the small preset's logits.

- slice: model release 1, `cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:])`: copies the logits, and
  its backward writes a zero-filled copy of their gradient;
- label_shift: release 2 (as HF 5.x): labels shifted and padded with the ignore index, logits read as a view;
- class_dim_view: `cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:])`, no copy but strided reads;
- per_row: a sum of per-sequence losses on contiguous row views, over the count (a chunked loss).

Every alternative's loss and logits gradient are checked against slice's first. Each timed step starts from a fresh
copy of the logits (as a model's step does); that copy is outside the timed call.

    python benchmarks/loss_path.py --batch-sizes 1,4,8 --rounds 6
"""

from __future__ import annotations

import statistics
import time

import click
import torch
import torch.nn.functional as F
from common import command_line, console, load, machine, print_machine, write_raw

from llmb.model import causal_lm_loss


def slice_loss(logits, labels):
    return F.cross_entropy(logits[:, :-1, :].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def class_dim_view(logits, labels):
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:])


def per_row(logits, labels):
    rows = [F.cross_entropy(logits[b, :-1], labels[b, 1:], reduction="sum") for b in range(logits.shape[0])]
    return sum(rows) / (labels.shape[0] * (labels.shape[1] - 1))


ALTERNATIVES = {
    "slice": slice_loss,
    "label_shift": causal_lm_loss,
    "class_dim_view": class_dim_view,
    "per_row": per_row,
}


@click.command()
@click.option("--batch-sizes", default="1,4,8", show_default=True)
@click.option("--sequence-length", default=256, show_default=True)
@click.option("--vocab-size", default=32000, show_default=True)
@click.option("--rounds", default=6, show_default=True)
@click.option("--threads", default=1, show_default=True)
def main(batch_sizes: str, sequence_length: int, vocab_size: int, rounds: int, threads: int) -> None:
    torch.set_num_threads(threads)
    info = machine()
    print_machine(info)
    results = {}
    for batch in (int(b) for b in batch_sizes.split(",")):
        torch.manual_seed(0)
        base = torch.randn(batch, sequence_length, vocab_size)
        labels = torch.randint(0, vocab_size, (batch, sequence_length))
        checks, seconds = {}, {name: [] for name in ALTERNATIVES}
        reference = None
        for name, loss_of in ALTERNATIVES.items():
            logits = base.clone().requires_grad_()
            loss = loss_of(logits, labels)
            loss.backward()
            if reference is None:
                reference = (loss.detach(), logits.grad)
            checks[name] = {
                "loss_abs_diff": abs(loss.item() - reference[0].item()),
                "grad_max_abs_diff": (logits.grad - reference[1]).abs().max().item(),
            }
        load_before = load()
        for index in range(rounds):
            order = list(ALTERNATIVES.items())
            for name, loss_of in order if index % 2 == 0 else reversed(order):
                logits = base.clone().requires_grad_()
                start = time.perf_counter()
                loss_of(logits, labels).backward()
                seconds[name].append(time.perf_counter() - start)
                del logits
        medians = {name: statistics.median(v) for name, v in seconds.items()}
        results[batch] = {
            "seconds": seconds,
            "median_seconds": medians,
            "checks": checks,
            "load_before": load_before,
            "load_after": load(),
        }
        line = ", ".join(
            f"{name} {medians[name] * 1e3:.0f} ms ({min(v) * 1e3:.0f}-{max(v) * 1e3:.0f})"
            for name, v in seconds.items()
        )
        console.print(f"batch {batch} (load {load_before[0]} -> {load()[0]}): {line}", highlight=False)
        console.print(f"  vs slice: {checks}", highlight=False)
    write_raw("loss_path", {"benchmark": "loss_path", "command": command_line(), "machine": info, "results": results})


if __name__ == "__main__":
    main()
