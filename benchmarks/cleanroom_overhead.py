"""What the clean room and the run evidence cost an honest run, and what the replay costs.

Inside a measured window the clean room adds: two messages with the judging process (the window's open and close),
drawing the window's batch from the challenge, the parameter digest on the device (read back to the host), the
losses read back once, and one progress message per step. Each is timed directly here (medians of many repetitions,
immune to the minutes-long load drift of whole runs) at the preset's model and divided by the window they sit in
(`--steps` harness steps, each timed with the harness's own Trainer.step). Then, as a cross-check, whole `llmb run`s
alternate with and without the clean room (LLMB_IN_PROCESS=1 runs in one process and skips the replay).
Outside the window: the replay, timed here at the preset (its peak memory measured in a fresh process) and scaled to
the official shape by FLOPs and parameter bytes.

    python benchmarks/cleanroom_overhead.py --preset small --steps 50 --rounds 4
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import torch
from common import command_line, console, fmt_bytes, load, machine, print_machine, write_raw

from llmb.audit import evidence
from llmb.judge import cleanroom
from llmb.model import LlamaModel
from llmb.run import clean_worker
from llmb.spec import flops
from llmb.spec.presets import PRESETS
from llmb.spec.shape import OFFICIAL_CONFIG
from llmb.training.loop import build_optimizer

GOAL = 0.02


def _echo_worker(address, key, rounds: int, steps: int) -> None:
    link = clean_worker.Link(address, key)
    for _ in range(rounds):
        link.open([])
        for _ in range(steps):
            link.send("advance")
        link.close({"losses": [0.0], "worker_start": 0.0, "worker_end": 0.0})
    link.send("done")


def link_round_trip(steps: int, rounds: int = 200) -> dict:
    """Seconds the judge's window spends on its own messages (open -> challenge, a progress message per step, and
    close), measured on its own clock."""
    judge = cleanroom.Judge().start()
    args = (judge.address, judge.key, rounds, steps)
    worker = multiprocessing.get_context("spawn").Process(target=_echo_worker, args=args)
    worker.start()
    worker.join()
    judge.finished.wait(30)
    judge.close()
    # Each window here holds only the protocol: its judged length is what the protocol adds to a real window.
    seconds = [w.seconds for w in judge.results[0][1]] if judge.results else [w.seconds for w in judge.windows]
    return {"median_seconds": statistics.median(seconds), "windows": len(seconds)}


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def in_window_costs(preset: str, batch_size: int, repeats: int) -> dict:
    config = PRESETS[preset]
    torch.manual_seed(0)
    model = LlamaModel(config)
    optimizer = build_optimizer(model, None)
    batch = evidence.window_batch(config, batch_size, 1, 0, torch.device("cpu"))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss, _ = model(batch, labels=batch)
        loss.backward()
        optimizer.step()
        return loss.detach()

    step()
    params = list(model.parameters())
    losses = [step() for _ in range(3)]
    return {
        "step_seconds": median_time(step, max(3, repeats // 10)),
        "digest_seconds": median_time(lambda: evidence.as_list(evidence.digest(params)), repeats),
        "batch_seconds": median_time(
            lambda: evidence.window_batch(config, batch_size, 7, 0, torch.device("cpu")), repeats
        ),
        "losses_seconds": median_time(lambda: torch.stack(losses).float().cpu().tolist(), repeats),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
    }


def replay_cost(preset: str, batch_size: int, steps: int) -> dict:
    """The replay of `steps` steps in a fresh process: its time and its peak memory above an idle interpreter's."""
    code = f"""
import json
from llmb.judge import replay
from llmb.spec.presets import PRESETS
base = replay._peak_rss()
r = replay.replay(PRESETS[{preset!r}], 0, {batch_size}, 1, 12345, {steps}, 50)
print(json.dumps({{"seconds": r.seconds, "peak_above_idle_bytes": r.peak_rss_bytes - base}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def whole_runs(preset: str, steps: int, rounds: int) -> dict:
    """`llmb run` with the clean room and in one process, alternating, tokens/s of each."""
    arms: dict[str, list[float]] = {"clean room": [], "in process": []}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(rounds):
            for arm in arms:
                out = Path(tmp) / f"{arm.replace(' ', '-')}-{index}"
                env = dict(os.environ)
                env.pop("LLMB_IN_PROCESS", None)
                if arm == "in process":
                    env["LLMB_IN_PROCESS"] = "1"
                args = ["run", "--plugin", "cpu", "--device", "cpu", "--preset", preset, "--steps", str(steps)]
                args += ["--warmup-steps", "2", "--out", str(out)]
                subprocess.run([sys.executable, "-m", "llmb", *args], env=env, check=True, capture_output=True)
                record = json.loads(next(out.glob("*.json")).read_text())
                arms[arm].append(record["tokens_per_second"])
    medians = {arm: statistics.median(values) for arm, values in arms.items()}
    return {
        "tokens_per_second": arms,
        "medians": medians,
        "clean_over_in_process": medians["clean room"] / medians["in process"],
    }


@click.command()
@click.option("--preset", default="small", show_default=True, type=click.Choice(["tiny", "small"]))
@click.option("--batch-size", default=1, show_default=True, type=int)
@click.option("--steps", default=50, show_default=True, type=int, help="Steps per window (the official default).")
@click.option("--repeats", default=200, show_default=True, type=int, help="Repetitions of each timed piece.")
@click.option("--rounds", default=3, show_default=True, type=int, help="Whole-run rounds per arm (0: skip).")
@click.option("--run-steps", default=10, show_default=True, type=int, help="Steps per whole run.")
def main(preset: str, batch_size: int, steps: int, repeats: int, rounds: int, run_steps: int) -> None:
    info = machine()
    print_machine(info)
    costs = in_window_costs(preset, batch_size, repeats)
    link = link_round_trip(steps)
    added = link["median_seconds"] + costs["digest_seconds"] + costs["batch_seconds"] + costs["losses_seconds"]
    window = steps * costs["step_seconds"]
    share = added / window
    console.print(
        f"{preset}, batch {batch_size}, CPU: step {costs['step_seconds'] * 1e3:.1f} ms; in the window the clean room "
        f"adds "
        f"link {link['median_seconds'] * 1e6:.0f} us (open, close, a progress message per step), digest "
        f"{costs['digest_seconds'] * 1e3:.2f} ms over {fmt_bytes(costs['parameter_bytes'])}, batch "
        f"{costs['batch_seconds'] * 1e6:.0f} us, losses {costs['losses_seconds'] * 1e6:.0f} us = {added * 1e3:.2f} ms, "
        f"{share:.3%} of a {steps}-step window ({'within' if share <= GOAL else 'over'} the {GOAL:.0%} goal)",
        highlight=False,
    )
    digest_rate = costs["parameter_bytes"] / costs["digest_seconds"]
    replay = replay_cost(preset, batch_size, evidence.DEFAULT_REPLAY_STEPS)
    official_params = flops.parameter_count(OFFICIAL_CONFIG)
    preset_params = flops.parameter_count(PRESETS[preset])
    # The replay's work: one forward+backward (6 N T) and one forward (2 N T), plus attention's share, per token.
    work = {
        name: flops.model_flops_per_token(config, flops.parameter_count(config)) * config.sequence_length
        for name, config in (("preset", PRESETS[preset]), ("official", OFFICIAL_CONFIG))
    }
    official_seconds = replay["seconds"] * work["official"] / work["preset"]
    official_bytes = 4 * 4 * official_params  # FP32 weights, gradients and AdamW's two moments
    console.print(
        f"replay of {evidence.DEFAULT_REPLAY_STEPS} steps at {preset}, batch {batch_size}: {replay['seconds']:.2f} s, "
        f"peak {fmt_bytes(replay['peak_above_idle_bytes'])} above an idle interpreter; at the official shape "
        f"(scaled by FLOPs per sequence and by parameters): ~{official_seconds:.0f} s per sequence in the batch "
        f"on this CPU, ~{fmt_bytes(official_bytes)} of weights, gradients and AdamW moments",
        highlight=False,
    )
    whole = whole_runs(preset, run_steps, rounds) if rounds else None
    if whole:
        console.print(
            f"whole runs, {rounds} rounds of {run_steps} steps: clean room {whole['medians']['clean room']:,.1f} "
            f"tokens/s, in process {whole['medians']['in process']:,.1f}: ratio {whole['clean_over_in_process']:.3f}",
            highlight=False,
        )
    write_raw(
        "cleanroom_overhead",
        {
            "benchmark": "cleanroom_overhead",
            "command": command_line(),
            "machine": info,
            "load_at_end": load(),
            "preset": preset,
            "batch_size": batch_size,
            "steps": steps,
            "in_window": costs,
            "link": link,
            "added_seconds": added,
            "window_seconds": window,
            "added_share_of_window": share,
            "digest_bytes_per_second": digest_rate,
            "replay": replay,
            "replay_official_estimate": {
                "seconds_per_sequence": official_seconds,
                "state_bytes": official_bytes,
                "parameters": official_params,
                "preset_parameters": preset_params,
            },
            "whole_runs": whole,
            "goal": GOAL,
        },
    )


if __name__ == "__main__":
    main()
