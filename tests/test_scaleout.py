"""Scale-out as centres run it: the job's environment (torchrun, Slurm, MPI), ranks that must agree, the mesh's
layouts equal to one process, stragglers, faults that end fast. Multi-process tests run real processes on gloo."""

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch
from conftest import install_plugin

from llmb.api.errors import UsageError
from llmb.audit.evidence import synthetic_batch
from llmb.distributed import cluster, mesh, ranks
from llmb.distributed import job as distributed
from llmb.run import jobs as run_jobs
from llmb.run import runner
from llmb.spec.presets import PRESETS

TINY = ["--device", "cpu", "--preset", "tiny", "--steps", "2", "--warmup-steps", "1"]
JOB_TIMEOUT = 300
STEPS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llmb(args, env=None, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "llmb", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        **kwargs,
    )


def finish(process, timeout=JOB_TIMEOUT):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def node_args(node, port, timeout=60):
    return ["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--dist-timeout", str(timeout)]  # fmt: skip


def plugin_env(tmp_path, name, source):
    """An installed plugin for one test (conftest's install_plugin), as the environment a job's processes need."""
    return {"PYTHONPATH": str(install_plugin(tmp_path, name, source))}


# The job's environment


SLURM_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_NODELIST": "gpu[017-018]",
    "SLURM_NTASKS": "8",
}


def test_slurm_variables_give_rank_world_local_rank_nodes_and_master():
    job = cluster.detect(SLURM_TASK)
    assert (job.launcher, job.rank, job.world_size, job.local_rank, job.local_world_size, job.nodes) == (
        "slurm", 5, 8, 1, 4, 2,
    )  # fmt: skip
    assert job.master_addr == "gpu017" and job.master_port == 29500 + 4242
    env = dict(SLURM_TASK)
    cluster.export(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"]) == ("5", "8", "1", "gpu017")
    # Exported once, torch's names win afterwards, and the launcher is remembered.
    assert cluster.detect(env).launcher == "slurm" and cluster.detect(env).rank == 5


def test_a_batch_script_outside_srun_is_a_plain_run():
    """In the batch script SLURM_PROCID is 0 and SLURM_NTASKS the allocation's: without srun's step variables it
    must not wait for seven ranks that will never come."""
    script = {k: v for k, v in SLURM_TASK.items() if not k.startswith("SLURM_STEP")} | {"SLURM_PROCID": "0"}
    assert cluster.detect(script) is None


@pytest.mark.parametrize(
    "nodelist, host", [("node1", "node1"), ("gpu[003-005,9],cpu1", "gpu003"), ("a-b[10,12]", "a-b10")]
)
def test_slurm_node_lists(nodelist, host):
    assert cluster.first_host(nodelist) == host


def test_open_mpi_and_pmi_variables():
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "n0"}  # fmt: skip
    job = cluster.detect(ompi)
    assert (job.launcher, job.rank, job.world_size, job.local_rank, job.nodes, job.master_addr) == (
        "openmpi", 3, 4, 1, 2, "n0",
    )  # fmt: skip
    pmi = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    job = cluster.detect(pmi)
    assert (job.launcher, job.rank, job.world_size, job.master_addr) == ("pmi", 1, 2, "127.0.0.1")
    # Over several nodes an MPI job must say where rank 0 is.
    with pytest.raises(UsageError, match="MASTER_ADDR"):
        cluster.export({k: v for k, v in ompi.items() if k != "MASTER_ADDR"})


def test_torchrun_variables_win_over_the_allocation():
    env = {**SLURM_TASK, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    job = cluster.detect(env)
    assert (job.launcher, job.rank, job.world_size, job.nodes) == ("torchrun", 1, 2, 1)


@pytest.mark.slow
def test_a_slurm_variable_launch_forms_one_job(tmp_path):
    """Two local processes with only srun's variables (no torchrun, no RANK): one job of two, one record."""
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    tasks = []
    for rank in (0, 1):
        env = {**base, "SLURM_JOB_ID": "7", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
               "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "2",
               "SLURM_STEP_NODELIST": "localhost", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}  # fmt: skip
        tasks.append(
            subprocess.Popen(
                [sys.executable, "-m", "llmb", "run", *TINY, "--out", str(tmp_path)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    results = [finish(task) for task in tasks]
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-2000:] + results[1][2][-2000:]
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1, "one job, one record (rank 0's)"
    record = json.loads(files[0].read_text())
    assert (record["world_size"], record["launcher"], record["global_batch_size"]) == (2, "slurm", 2)


# Ranks that must agree


def test_disagreements_name_the_rank_and_the_field():
    facts = [{"option batch_size": 1, "option seed": 0}, {"option batch_size": 1, "option seed": 0},
             {"option batch_size": 3, "option seed": 1}]  # fmt: skip
    assert ranks.disagreements(facts) == [(2, "option batch_size", 3, 1), (2, "option seed", 1, 0)]
    assert ranks.disagreements(facts[:2]) == []


def test_a_disagreement_is_one_line_for_the_whole_job():
    class Failure:
        def __init__(self, message):
            self.message, self.timestamp, self.exitcode = message, 1, 1

    line = "ranks disagree: rank 1 has option batch_size = 3, rank 0 has 1"
    error = distributed.failure_error(
        {0: Failure(f"UsageError: rank 0: {line}"), 1: Failure(f"UsageError: rank 1: {line}")}
    )
    assert isinstance(error, UsageError) and str(error) == line


@pytest.mark.slow
@pytest.mark.parametrize("field, values", [("--batch-size", ("1", "3")), ("--seed", ("0", "1"))])
def test_two_nodes_that_disagree_stop_within_seconds_naming_rank_and_field(tmp_path, field, values):
    port = free_port()
    started = time.monotonic()
    nodes = [llmb(["run", *TINY, field, value, *node_args(node, port), "--out", str(tmp_path)])
             for node, value in enumerate(values)]  # fmt: skip
    results = [finish(node) for node in nodes]
    assert time.monotonic() - started < 120  # two interpreters starting on a busy 2-core machine; no 600 s wait
    name = field.removeprefix("--").replace("-", "_")
    for code, _, err in results:
        last = err.strip().splitlines()[-1]
        assert code == 2, err[-2000:]
        assert f"rank 1 has option {name} = " in last and "rank 0 has" in last, err[-2000:]
        assert "Traceback" not in err
    assert not list(tmp_path.glob("*.json"))


# Faults that end fast


@pytest.fixture
def default_logging(monkeypatch):
    """llmb's own defaults for what a failure prints: no LLMB_DEBUG, no TORCH_CPP_LOG_LEVEL of the caller's."""
    monkeypatch.delenv("LLMB_DEBUG", raising=False)
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)


@pytest.mark.slow
@pytest.mark.parametrize("node", [0, 1])
def test_a_lone_node_exits_within_the_timeout_with_one_line(tmp_path, default_logging, node):
    """Node 0 serves the rendezvous and waits; node 1 tries to reach it (c10d's store logs each failed try, with C++
    frames): either way one line on stderr, naming the node and where it waited."""
    timeout = 5
    started = time.monotonic()
    code, _, err = finish(llmb(["run", *TINY, *node_args(node, free_port(), timeout), "--out", str(tmp_path)]), 120)
    elapsed = time.monotonic() - started
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    assert f"node {node}: the job's 2 nodes did not all join within 5 s" in lines[0]
    # The timeout, plus starting Python and torch (about 5-15 s on this shared 2-core machine).
    assert elapsed < timeout + 30


@pytest.mark.slow
def test_llmb_debug_shows_what_torch_logged_on_the_way(tmp_path, default_logging, monkeypatch):
    monkeypatch.setenv("LLMB_DEBUG", "1")
    code, _, err = finish(llmb(["run", *TINY, *node_args(1, free_port(), 2), "--out", str(tmp_path)]), 120)
    assert code == 1
    assert "[c10d]" in err  # the store's own log of each failed try, C++ frames and all
    assert "did not all join within 2 s" in err.strip().splitlines()[-1]


def test_torch_native_logs_are_quiet_unless_asked_for():
    env = {}
    cluster.quiet_native_logs(env)
    assert env == {"TORCH_CPP_LOG_LEVEL": "FATAL"}
    for asked in ({"LLMB_DEBUG": "1"}, {"TORCH_CPP_LOG_LEVEL": "INFO"}):
        env = dict(asked)
        cluster.quiet_native_logs(env)
        assert env == asked


NOWHERE = "no-such-host.invalid"  # RFC 2606: .invalid never resolves


def test_an_unresolvable_rendezvous_host_is_named_with_where_it_came_from(monkeypatch):
    with pytest.raises(UsageError, match=rf"'{NOWHERE}' \(from --master-addr\) does not resolve"):
        distributed.LaunchSpec(1, nnodes=2, node_rank=1, master_addr=NOWHERE).check()
    distributed.LaunchSpec(1, nnodes=2, node_rank=1, master_addr="127.0.0.1").check()
    # Slurm's first host, or MASTER_ADDR when the job sets it: the exported job remembers which.
    for extra, source in (({}, "the first host of SLURM_STEP_NODELIST"), ({"MASTER_ADDR": NOWHERE}, "MASTER_ADDR")):
        nodelist = f"{NOWHERE},gpu2" if not extra else "localhost"
        env = {**SLURM_TASK, "SLURM_STEP_NODELIST": nodelist, **extra}
        cluster.export(env)
        job = cluster.detect(env)
        assert (job.master_addr, job.master_from) == (NOWHERE, source)
        with pytest.raises(UsageError, match=rf"'{NOWHERE}' \(from {source}\)"):
            cluster.check_rendezvous_host(job.master_addr, job.master_from)
        # The job's first look at itself checks, before c10d's store would retry the name until the timeout.
        monkeypatch.setattr(os, "environ", env)
        with pytest.raises(UsageError, match=rf"'{NOWHERE}' \(from {source}\)"):
            distributed.current_world()


def test_a_slurm_job_whose_first_host_does_not_resolve_says_so_in_one_line(tmp_path, default_logging, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    task = {**SLURM_TASK, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NODELIST": f"{NOWHERE},gpu2"}  # fmt: skip
    code, _, err = finish(llmb(["run", *TINY, "--out", str(tmp_path / "out")], env=task), 120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert f"the rendezvous host '{NOWHERE}' (from the first host of SLURM_STEP_NODELIST) does not" in lines[0]


DYING_PLUGIN = """
import os, signal
from llmb import Backend, hookimpl

class Dying(Backend):
    name = "dying"
    steps = 0

    def step_end(self, device):
        self.steps += 1
        if os.environ.get("RANK") == "1" and self.steps == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # a node lost in the middle of the run

@hookimpl
def register_backends(register):
    register(Dying())
"""


@pytest.mark.slow
def test_a_dead_peer_is_named_not_the_survivor(tmp_path, default_logging):
    env = plugin_env(tmp_path, "dying", DYING_PLUGIN)
    port = free_port()
    args = ["run", *TINY, "--plugin", "dying", "--steps", "5", "--out", str(tmp_path)]
    nodes = [llmb([*args, *node_args(node, port)], env=env) for node in (0, 1)]
    (code0, _, err0), (code1, _, err1) = [finish(node) for node in nodes]
    assert code0 == 1 and code1 == 1
    last = err0.strip().splitlines()[-1]
    assert "rank 1 on node 1 stopped answering" in last, err0[-3000:]
    assert "rank 0 failed" not in last and "Traceback" not in err0
    # One line on each node, the C++ side's logs of the broken connection left out.
    assert [len([line for line in err.splitlines() if line.strip()]) for err in (err0, err1)] == [1, 1], err0 + err1


# Stragglers, losses, threads

PAUSING_PLUGIN = """
import os, time
from llmb import Backend, hookimpl

class Pausing(Backend):
    name = "pausing"
    steps = 0

    def step_end(self, device):
        self.steps += 1
        if os.environ.get("RANK") == "1" and self.steps == 4:  # the third measured step (after one warmup step)
            time.sleep(4)  # a rank held up inside the window: preempted, throttled, swapping

@hookimpl
def register_backends(register):
    register(Pausing())
"""


@pytest.mark.slow
def test_a_rank_paused_inside_the_window_is_flagged_in_record_and_console(tmp_path):
    env = plugin_env(tmp_path, "pausing", PAUSING_PLUGIN)
    args = ["run", *TINY, "--steps", "6", "--plugin", "pausing", "--nproc-per-node", "2", "--out", str(tmp_path)]
    code, out, err = finish(llmb(args, env=env))
    assert code == 0, err[-3000:]
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert any("rank 1" in note and "step 3" in note for note in record["stragglers"]), record["stragglers"]
    assert "STRAGGLER" in out
    assert len(record["per_rank_step_seconds"]) == 2 and len(record["per_rank_step_seconds"][1]) == 6
    assert record["threads_per_rank"] == [1, 1]


def report(steps, busy, rows=1, loss=1.0, stage=0):
    return ranks.RankReport(
        effective="FP32", invalid=[], windows=[sum(steps)], own=[sum(steps)], steps=[steps], busy=[busy],
        losses={"initial": loss, "first:0": loss, "last:0": loss}, rows=rows, threads=1, node=0, stage=stage,
    )  # fmt: skip


def test_a_paused_step_and_a_busy_spread_are_flagged():
    even = [report([0.1] * 5, 0.5), report([0.1] * 5, 0.5)]
    assert ranks.stragglers(even, 0) == []
    paused = [report([0.1, 0.1, 10.1, 0.1, 0.1], 0.5), report([0.1, 0.1, 10.1, 0.1, 0.1], 0.5)]
    notes = ranks.stragglers(paused, 0)
    assert len(notes) == 2 and "step 3, 10.1 s" in notes[0]
    shared = [report([0.4] * 5, 0.5), report([0.4] * 5, 2.0)]
    (note,) = ranks.stragglers(shared, 0)
    assert "busy time differs by 75%" in note and "rank 1" in note
    # Pipeline stages do different work: only a stage's ranks compare busy times.
    assert ranks.stragglers([report([0.4] * 5, 0.5, stage=0), report([0.4] * 5, 2.0, stage=1)], 0) == []


def test_the_loss_is_the_global_mean_over_data_parallel_rows():
    reports = [
        report([0.1], 1, rows=2, loss=10.0),
        report([0.1], 1, rows=2, loss=11.0),
        report([0.1], 1, rows=0, loss=99.0),
    ]
    assert ranks.global_losses(reports)["last:0"] == pytest.approx(10.5)


# The layout


def test_layouts_are_checked_before_anything_runs():
    tiny = PRESETS["tiny"]
    with pytest.raises(UsageError, match="do not divide"):
        mesh.check(mesh.Layout(world_size=4, tp=3, strategy="fsdp"), tiny, 1)
    with pytest.raises(UsageError, match="fsdp or hsdp"):
        mesh.check(mesh.Layout(world_size=4, tp=2, strategy="ddp"), tiny, 1)
    with pytest.raises(UsageError, match="attention heads"):
        mesh.check(mesh.Layout(world_size=8, tp=8, strategy="fsdp"), tiny, 1)
    with pytest.raises(UsageError, match="more stages"):
        mesh.check(mesh.Layout(world_size=4, pp=4, strategy="ddp"), tiny, 1)
    with pytest.raises(UsageError, match="microbatches"):
        mesh.check(mesh.Layout(world_size=2, pp=2, microbatches=2, strategy="ddp"), tiny, 1)
    layout = mesh.Layout(world_size=8, tp=2, pp=2, strategy="hsdp")
    assert (layout.dp, layout.dp_replicate, layout.dp_shard) == (2, 2, 1)
    assert mesh.coordinates(layout, 5) == mesh.Coordinates(pp=1, dp=0, tp=1)
    assert [list(mesh.stage_layers(5, 2, s)) for s in (0, 1)] == [[0, 1, 2], [3, 4]]


def test_tp_without_several_processes_is_a_usage_error(tmp_path):
    from click.testing import CliRunner

    from llmb.cli import cli

    result = CliRunner().invoke(cli, ["run", *TINY, "--tp", "2", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "need several processes" in result.output


def reference_updates(base, rows_per_dp, dp, steps):
    """One process on the same global batch: the dp ranks' batches (seed + dp rank) concatenated."""
    batch = torch.cat([synthetic_batch(base.config, rows_per_dp, base.seed + r, "cpu") for r in range(dp)])
    single = replace(base, batch_size=batch.shape[0])
    session = runner.prepare(single, *runner.resolve(single))
    session.trainer.batch = batch
    before = distributed.full_parameters(session.model)
    for _ in range(steps):
        session.trainer.step()
    after = distributed.full_parameters(session.model)
    return {name: after[name] - before[name] for name in after}


# After 3 AdamW steps each parameter's update (after - before) must match one process's, relative to the largest
# update of that tensor. Both sides are FP32 and differ only in the order of float sums (TP's partial sums, the
# pipeline's microbatch means, sharded reductions); AdamW divides by sqrt(v) + 1e-6, which magnifies those rounding
# differences where a gradient is tiny: measured here up to 1.1e-3. 1e-2 leaves a margin, while a wrong batch, a
# missing reduction or a lost slice moves an update by order one (sequence parallel without the gradient's
# all-gather measured 0.999). AdamW is invariant to a gradient's scale, so a missing average is caught by the
# gradient checks instead (test_distributed's one-step gradients, and the accumulation tests below).
UPDATE_TOLERANCE = 1e-2


def assert_updates_equal(got, expected, what):
    assert sorted(got) == sorted(expected), what
    for name, value in expected.items():
        scale = value.abs().max().item()
        error = (got[name] - value).abs().max().item()
        assert error <= UPDATE_TOLERANCE * scale, f"{what} {name}: {error / scale:.3g} of the largest update"


BASE = runner.RunOptions(config=PRESETS["tiny"], preset="tiny", device="cpu", batch_size=2, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "nproc, layouts",
    [
        (2, [dict(tp=2), dict(pp=2), dict(pp=2, pp_schedule="1f1b"), dict(tp=2, sequence_parallel=True),
             dict(parallel="fsdp", grad_accum=2)]),
        (4, [dict(parallel="hsdp"), dict(tp=2, parallel="fsdp"), dict(tp=2, pp=2)]),
        # Pipeline x DDP (2 stages x 2 replicas) with several microbatches: each stage's DDP reduces once per step,
        # with 2 and with 4 microbatches under either schedule.
        (4, [dict(pp=2, parallel="ddp", microbatches=2),
             dict(pp=2, parallel="ddp", microbatches=4, batch_size=4),
             dict(pp=2, parallel="ddp", microbatches=2, pp_schedule="1f1b"),
             dict(pp=2, parallel="ddp", microbatches=4, batch_size=4, pp_schedule="1f1b")]),
    ],
    ids=["2-processes", "4-processes", "4-processes-pp-ddp"],
)  # fmt: skip
def test_each_layout_equals_one_process_on_the_same_global_batch(nproc, layouts):
    runs = [replace(BASE, **layout) for layout in layouts]
    per_layout = distributed.launch(distributed.LaunchSpec(nproc), run_jobs.updates_after_steps, runs, STEPS)[0]
    assert len(per_layout) == len(runs)
    for options, got in zip(runs, per_layout, strict=True):
        plan = replace(runner.layout(options), world_size=nproc)
        expected = reference_updates(BASE, options.batch_size * options.grad_accum, plan.dp, STEPS)
        assert_updates_equal(got, expected, str(plan.to_dict()))


def test_the_scaling_table_keeps_layouts_apart_and_flags_a_baseline_on_other_threads():
    from records_factory import make_result

    from llmb.distributed.mesh import Layout
    from llmb.records import JobLayout
    from llmb.report import point_from_record, scaling_tables

    def record(world, parallel, threads, tp=1, per_device=100.0):
        result = make_result(world_size=world, parallel=parallel, tokens_per_second=per_device * world)
        plan = Layout(world_size=world, tp=tp, strategy=parallel)
        return replace(
            result,
            layout=JobLayout.of(plan.to_dict()),
            threads_per_rank=[threads] * world,
            global_batch_size=plan.dp,
        )

    records = [record(1, "none", 2), record(2, "fsdp", 1), record(2, "fsdp", 1, tp=2, per_device=50.0)]
    (table,) = scaling_tables([point_from_record(r, None, "test") for r in records])
    labels = {row["parallel"]: row for row in table.rows}
    assert sorted(labels) == ["fsdp", "fsdp tp2 pp1 dp1", "single"]
    assert labels["fsdp tp2 pp1 dp1"]["global_batch_size"] == 1 and labels["fsdp"]["threads"] == "1,1"
    assert "WARNING: the baseline ran 2 thread(s) per rank" in table.note and "2 (fsdp tp2 pp1 dp1)" in table.note
    same = [record(1, "none", 1), record(2, "fsdp", 1)]
    (table,) = scaling_tables([point_from_record(r, None, "test") for r in same])
    assert "WARNING" not in table.note


def test_gradient_accumulation_in_one_process_equals_one_step_on_the_whole_batch():
    """The fast member of the equivalence class: K micro-steps on K slices of the batch, one AdamW step, against one
    pass over the whole batch (the same tolerance as the multi-process layouts)."""
    options = replace(BASE, grad_accum=2)
    session = runner.prepare(options, *runner.resolve(options))
    assert isinstance(session.trainer, mesh.AccumulatingTrainer) and session.trainer.batch.shape[0] == 4
    before = distributed.full_parameters(session.model)
    for _ in range(STEPS):
        session.trainer.step()
    after = distributed.full_parameters(session.model)
    got = {name: after[name] - before[name] for name in after}
    assert_updates_equal(got, reference_updates(BASE, 4, 1, STEPS), "grad_accum 2")


def test_accumulated_gradients_are_the_whole_batch_mean_not_a_sum():
    """AdamW hides a gradient's scale (the updates above would match a sum too): the gradients themselves, after one
    accumulated step, must equal one pass over the whole batch (FP32 rounding only: 1e-5 of the largest value)."""
    options = replace(BASE, grad_accum=2)
    session = runner.prepare(options, *runner.resolve(options))
    session.trainer.step()
    got = distributed.full_gradients(session.model)
    single = replace(BASE, batch_size=4)
    reference = runner.prepare(single, *runner.resolve(single))
    reference.trainer.batch = synthetic_batch(BASE.config, 4, BASE.seed, "cpu")
    reference.trainer.step()
    for name, expected in distributed.full_gradients(reference.model).items():
        scale = expected.abs().max().item()
        torch.testing.assert_close(got[name], expected, rtol=0, atol=1e-5 * scale, msg=name)
