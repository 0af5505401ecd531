"""The benchmark scripts' moving parts (benchmarks/) and the cpu plugin's AdamW default they measured."""

import time
from pathlib import Path

import pytest
import torch

from llmb import Backend
from llmb.api.errors import UsageError
from llmb.registry.plugins import get_backend
from llmb.run import runner
from llmb.spec.presets import build_config

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """The benchmarks folder importable as the scripts see it (they import `common` and `arms` by name)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import arms
    import common
    import compile_modes

    return arms, common, compile_modes


def test_vs_peers_pairs_step_times_into_tokens_per_second_ratios(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import vs_peers

    # Our steps 1 s each; theirs 1.0, 1.2, 1.1, 2.0 s: tokens/s ratios 1.0, 1.2, 1.1, 2.0, pair by pair.
    r = vs_peers.pair_ratios([1.0, 1.0, 1.0, 1.0], [1.0, 1.2, 1.1, 2.0])
    assert r["median"] == pytest.approx(1.15) and (r["min"], r["max"]) == (1.0, 2.0)
    assert r["q1"] <= r["median"] <= r["q3"]
    rounds = [
        {"round": 0, "label": "a", "tokens_per_second": 2.0},
        {"round": 0, "label": "b", "tokens_per_second": 1.0},
        {"round": 1, "label": "a", "tokens_per_second": 3.0},
        {"round": 1, "label": "b", "error": "x"},
    ]
    assert vs_peers.same_round_ratios(rounds, "a", "b") == [2.0]


def _prepared_optimizer(settings: dict) -> torch.optim.Optimizer:
    options = runner.RunOptions(config=build_config("tiny"), preset="tiny", plugin="cpu", settings=settings)
    session = runner.prepare(options, *runner.resolve(options))
    return session.optimizer


def test_cpu_plugin_fuses_adamw_by_default_and_the_setting_turns_it_off():
    assert _prepared_optimizer({}).defaults["fused"] is True
    assert not _prepared_optimizer({"fused_adamw": "false"}).defaults["fused"]


SPEC = {"preset": "tiny", "batch_size": 2, "precision": "FP32", "mode": "pure", "device": "cpu", "plugin": "cpu"}


@pytest.mark.parametrize(
    "arm, extra",
    [("llmb", {"settings": {}}), ("bare", {"optimizer_options": {"fused": True}}), ("hf", {"optimizer_options": {}})],
)
def test_each_arm_measures_tokens_memory_and_a_moving_loss(bench, arm, extra):
    if arm == "hf":
        pytest.importorskip("transformers", reason="transformers is not installed (pip install -e .[test])")
    arms, _, _ = bench
    result = arms.main({**SPEC, **extra, "arm": arm, "steps": 2, "warmup_steps": 1})
    assert result["tokens_per_second"] == pytest.approx(2 * 32 * 2 / result["window_seconds"])
    assert len(result["step_seconds"]) == 2 and sum(result["step_seconds"]) <= result["window_seconds"] * 1.001
    assert result["peak_memory_bytes"] >= result["baseline_memory_bytes"] > 0
    assert result["loss_first"] != result["loss_last"]
    if arm != "llmb":
        assert bool(result["optimizer"]["fused"]) == bool(extra["optimizer_options"])


def test_torchtitan_arm_is_llmbs_shape_and_trains(bench):
    pytest.importorskip("triton", reason="torchtitan imports only with triton (pip install -e .[bench])")
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e .[bench])")
    arms, _, _ = bench
    from llmb.model import LlamaModel, count_parameters

    config = build_config("tiny")
    assert count_parameters(arms.titan_model(config)) == count_parameters(LlamaModel(config))
    result = arms.main(
        {**SPEC, "arm": "torchtitan", "optimizer_options": {"fused": True}, "steps": 2, "warmup_steps": 1}
    )
    assert result["loss_first"] != result["loss_last"] and result["optimizer"]["fused"]
    assert abs(result["loss_first"] - 10.37) < 1.0  # near ln(32000): torchtitan's init, llmb's vocabulary


def test_a_by_hand_model_is_cast_without_touching_complex_tensors(bench):
    arms, _, _ = bench
    model = torch.nn.Linear(4, 4)
    model.register_buffer("freqs_cis", torch.polar(torch.ones(3), torch.arange(3.0)))  # torchtitan's RoPE table
    model.register_buffer("table", torch.ones(3))
    arms.cast_floating(model, torch.bfloat16)
    assert model.weight.dtype == model.table.dtype == torch.bfloat16
    assert model.freqs_cis.dtype == torch.complex64 and model.freqs_cis.imag.abs().sum() > 0
    # Module.to(dtype), which this replaces, drops the imaginary part (the sines) of such a table.
    plain = torch.nn.Module()
    plain.register_buffer("freqs_cis", torch.polar(torch.ones(3), torch.arange(3.0)))
    with pytest.warns(UserWarning, match="discards the imaginary part"):
        assert plain.to(torch.float32).freqs_cis.dtype == torch.float32


def test_step_memory_arm_counts_tensor_peaks_from_allocation_events(bench):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e .[test])")
    arms, _, _ = bench
    by_hand = {"ours": {"model": "llmb", "optimizer_options": {"fused": True}}, "hf": {"model": "hf"}}
    result = arms.main({**SPEC, "arm": "step_memory", "by_hand": by_hand, "steps": 1, "warmup_steps": 1})
    config = build_config("tiny")
    from llmb.spec.flops import parameter_count

    logits = SPEC["batch_size"] * config.sequence_length * config.vocab_size * 4
    weights_and_moments = 3 * 4 * parameter_count(config)
    for label in by_hand:
        # At its peak a step holds the weights, AdamW's two moments, the logits and their log-softmax at least.
        assert result["step_peak_bytes"][label] + result["held_bytes"][label] > weights_and_moments + 2 * logits
    # Between steps: weights, gradients, two moments (and AdamW's step counts), the same for both models, plus each
    # model's buffers: none in llmb's (its rotary tables are made each forward), HF's inverse frequencies.
    hf_buffers = sum(b.numel() * b.element_size() for b in arms.hf_model(config).buffers())
    assert hf_buffers > 0
    assert result["held_bytes"]["ours"] == result["held_bytes"]["hf"] - hf_buffers >= 4 * 4 * parameter_count(config)


def test_interleaved_arm_times_the_harness_step_and_hf_pair_by_pair(bench):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e .[test])")
    arms, _, _ = bench
    hf_arms = {"hf": {"model": "hf"}, "hf+fused": {"model": "hf", "optimizer_options": {"fused": True}}}
    hf_arms["same"] = {"model": "same"}  # the harness's own model stepped by hand
    spec = {**SPEC, "arm": "interleaved", "settings": {}, "by_hand": hf_arms, "steps": 2, "warmup_steps": 1}
    result = arms.main(spec)
    counts = {label: len(v) for label, v in result["step_seconds_by_arm"].items()}
    assert counts == {"llmb": 2, "hf": 2, "hf+fused": 2, "same": 2}
    for label in hf_arms:
        pairs = zip(result["step_seconds_by_arm"]["llmb"], result["step_seconds_by_arm"][label], strict=True)
        ratios = sorted(theirs / ours for ours, theirs in pairs)
        assert result["llmb_over_arm_paired"][label] == pytest.approx(sum(ratios) / 2)


def test_a_failing_arm_is_recorded_not_raised(bench):
    _, common, _ = bench
    out = common.run_arm({**SPEC, "preset": "no-such-preset", "arm": "bare", "steps": 1, "warmup_steps": 1})
    assert out["error"].startswith("exit 1") and "no-such-preset" in out["error"]
    assert len(out["load_before"]) == len(out["load_after"]) == 3


def test_an_arm_that_times_out_takes_every_process_it_started_with_it(bench, tmp_path, monkeypatch):
    """`llmb run` in an arm starts a judge and a worker: on a GPU they kept its memory after their arm timed out."""
    _, common, _ = bench
    pid_file = tmp_path / "grandchild.pid"
    script = tmp_path / "arm.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    monkeypatch.setattr(common, "ARMS_SCRIPT", script)
    out = common.run_arm({}, timeout=5)
    assert out["error"] == "timed out after 5 s"
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # reaped by init once killed: gone (or a zombie) within moments
        try:
            if Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"process {grandchild}, started by the arm, outlived its timeout")


def _m(label, rnd, tps, steps=2):
    return {
        "label": label,
        "round": rnd,
        "spec": {"steps": steps},
        "tokens_per_second": tps,
        "window_seconds": 64 / tps,
        "median_step_tokens_per_second": tps,
        "peak_memory_bytes": 100,
        "training_memory_bytes": 10,
        "load_before": [1.0, 1.0, 1.0],
        "load_after": [2.0, 1.0, 1.0],
    }


def test_medians_and_same_round_ratios(bench):
    _, common, _ = bench
    measurements = [_m("a", 0, 10), _m("b", 0, 5), _m("a", 1, 30), _m("b", 1, 20), _m("a", 2, 20), _m("b", 2, 40)]
    measurements.append({"label": "b", "round": 3, "error": "exit 1: boom", "load_before": [0] * 3})
    summary = common.summarise(measurements)
    assert summary["a"]["tokens_per_second"] == 20 and summary["b"]["tokens_per_second"] == 20
    assert summary["b"]["runs"] == 3 and summary["b"]["errors"] == ["exit 1: boom"]
    assert summary["a"]["load_1min_range"] == [1.0, 2.0]
    assert common.ratio(summary, "a", "b") == 1.0
    assert common.paired_ratio(measurements, "a", "b") == 1.5  # median of 2.0, 1.5, 0.5


def test_the_arms_table_shows_each_arms_medians_its_own_columns_and_a_failed_arm_in_one_row(bench):
    _, common, _ = bench
    measurements = [_m("a", 0, 10), _m("a", 1, 30), {"label": "b", "round": 0, "error": "exit 1: boom"}]
    extra = {"training memory": lambda label, s: common.fmt_bytes(s["training_memory_bytes"])}
    table = common.arms_table("t", common.summarise(measurements), extra)
    columns = {c.header: list(c.cells) for c in table.columns}
    assert list(columns) == ["arm", "tokens/s", "tokens/s (median step)", "step", "peak memory", "training memory"]
    assert columns["arm"] == ["a", "b"] and columns["tokens/s"] == ["20.0", "failed: exit 1: boom"]
    assert columns["training memory"] == [common.fmt_bytes(10), ""]


def test_compile_modes_lists_what_the_plugin_does_not_offer(bench):
    _, _, compile_modes = bench
    cpu = get_backend("cpu").backend
    fused = compile_modes.method_settings(cpu, compile_modes.METHODS["fused AdamW"])
    assert fused == {
        "compile": "none",
        "fused_adamw": "true",
        "activation_checkpointing": "none",
        "keep_freed_memory": "false",
    }
    eager = compile_modes.method_settings(cpu, {})
    # eager is the reference: unfused, and the C library's malloc as it comes
    assert eager["fused_adamw"] == "false" and eager["keep_freed_memory"] == "false"
    assert compile_modes.method_settings(cpu, compile_modes.METHODS["freed memory kept"])["keep_freed_memory"] == "true"
    full = compile_modes.method_settings(cpu, compile_modes.METHODS["checkpointing full"])
    assert full["activation_checkpointing"] == "full"

    class NoCheckpointing(Backend):  # a backend that declares only the compile setting
        name = "nockpt"

        def settings(self):
            return [s for s in cpu.settings() if s.name == "compile"]

    with pytest.raises(UsageError, match="no activation_checkpointing setting"):
        compile_modes.method_settings(NoCheckpointing(), compile_modes.METHODS["checkpointing full"])
    with pytest.raises(UsageError, match="reduce-overhead"):
        compile_modes.method_settings(cpu, compile_modes.METHODS["compile reduce-overhead"])


def test_cpu_paths_runs_compile_modes_methods(bench):
    # One table of methods and their settings: cpu_paths.py names a selection of compile_modes.py's.
    _, _, compile_modes = bench
    import cpu_paths

    assert cpu_paths.METHODS is compile_modes.METHODS
    assert set(cpu_paths.PATHS) <= set(compile_modes.METHODS) and "eager" in cpu_paths.PATHS
    cpu = get_backend("cpu").backend
    best = compile_modes.method_settings(cpu, compile_modes.METHODS[cpu_paths.PATHS[-1]])
    assert best == {
        "compile": "default",
        "fused_adamw": "true",
        "activation_checkpointing": "selective-ops",
        "keep_freed_memory": "false",
    }


def test_fidelity_pairs_llmb_run_with_the_same_path_by_hand_and_ratios_per_round(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import fidelity

    base = {"preset": "tiny", "batch_size": 2, "precision": "FP32", "mode": "pure", "device": "cpu", "steps": 2,
            "warmup_steps": 1, "seed": 0, "threads": 1, "plugin": "cpu"}  # fmt: skip
    arms = fidelity.arm_specs(base, "compiled", threads=1)
    llmb_arm, hand = arms["llmb run"], arms["hand"]
    assert (llmb_arm["arm"], hand["arm"]) == ("llmb_cli", "hand_path")
    assert llmb_arm["settings"] == hand["settings"] and hand["settings"]["compile"] == "default"
    assert hand["optimizer_options"] == {"fused": True}  # what the plugin's fused_adamw=true gives llmb run
    measured = [
        {"round": 0, "label": "llmb run", "tokens_per_second": 99.0},
        {"round": 0, "label": "hand", "tokens_per_second": 100.0},
        {"round": 1, "label": "hand", "tokens_per_second": 100.0},
        {"round": 1, "label": "llmb run", "tokens_per_second": 103.0},
        {"round": 2, "label": "hand", "error": "exit 1: boom"},
        {"round": 2, "label": "llmb run", "tokens_per_second": 50.0},  # no peer in its round: not a ratio
    ]
    measured[3]["invalid_reasons"] = ["replay: step 8: recorded loss ..."]  # the judge's checks failed this one
    row = fidelity.summary_row("compiled", 2, measured)
    assert row["ratio"] == pytest.approx(1.01) and row["ratio_range"] == pytest.approx([0.99, 1.03])
    assert row["rounds"] == 2 and row["errors"] == ["exit 1: boom"]
    # The table says how many of llmb's records passed the judge's checks: a failed one's ratio is no fidelity figure.
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(fidelity.table([row]))
    text = console.export_text()
    assert "checks passed" in text and "2/3" in text


def test_fidelity_warms_the_compile_cache_before_a_compiled_point_and_never_compares_it(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import fidelity

    ran = []

    def fake_run_arm(spec, timeout=None, env=None):  # records the order; no process is started
        ran.append((spec["arm"], spec["steps"], spec["warmup_steps"]))
        return {"tokens_per_second": 1.0 if spec["steps"] == 1 else 100.0}

    monkeypatch.setattr(fidelity, "run_arm", fake_run_arm)
    base = {"preset": "tiny", "batch_size": 2, "precision": "FP32", "mode": "pure", "device": "cpu", "steps": 3,
            "warmup_steps": 2, "seed": 0, "threads": 1, "plugin": "cpu"}  # fmt: skip
    measured = fidelity.point_rounds(fidelity.arm_specs(base, "compiled", threads=1), rounds=2, timeout=1.0)
    # The warm-up is the hand loop's shapes, one step, before round 0's first arm (llmb's).
    assert ran[0] == ("hand_path", 1, 1) and ran[1] == ("llmb_cli", 3, 2)
    assert [m["label"] for m in measured] == ["warm compile", "llmb run", "hand", "hand", "llmb run"]
    row = fidelity.summary_row("compiled", 2, measured)
    assert row["ratio"] == pytest.approx(1.0) and row["hand_tokens_per_second"] == pytest.approx(100.0)
    ran.clear()
    fidelity.point_rounds(fidelity.arm_specs(base, "eager", threads=1), rounds=1, timeout=1.0)
    assert [arm for arm, _, _ in ran] == ["llmb_cli", "hand_path"]  # nothing compiles: no warm-up


def test_fidelity_lengthens_short_windows_to_the_token_floor_and_never_shortens(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import fidelity

    options = {"preset": "small", "steps": 4}  # small: 256 tokens per sequence
    assert [fidelity.window_steps(options, batch, 24576) for batch in (1, 4, 16, 64)] == [96, 24, 6, 4]
    assert fidelity.window_steps(options, 1, 0) == 4  # no floor: --steps as given
    assert fidelity.window_steps({**options, "steps": 200}, 1, 24576) == 200


def test_the_hand_loop_stamps_its_warmup_steps_on_the_cpu(bench):
    """Each warmup step's time, as llmb run's record has them, so that the two arms' settling can be compared."""
    arms, _, _ = bench
    pauses = iter([0.03, 0.01, 0.0, 0.0, 0.0])

    def step():
        time.sleep(next(pauses))
        return torch.zeros(())

    result = arms.plain_loop(step, torch.device("cpu"), warmup_steps=2, steps=3)
    warmup = result["warmup_step_seconds"]
    assert len(warmup) == 2 and len(result["step_seconds"]) == 3
    assert warmup[0] >= 0.03 and warmup[1] >= 0.01  # in order, one per step


def test_the_initial_copy_benchmarks_direct_copy_is_the_model_and_it_refuses_a_cpu(monkeypatch):
    """benchmarks/initial_copy.py's direct copy (the replay's route before pinned staging, its peer) gives the host
    model bit for bit in tensors of its own; its command needs an accelerator and says so in one line (llmb's staged
    route is tests/test_replay_prebuild.py's)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import initial_copy
    from click.testing import CliRunner

    from llmb.judge import initial
    from llmb.spec.presets import build_config

    model = initial.build(build_config("tiny"), seed=0)
    copy = initial_copy.direct_copy(model, torch.device("cpu"))
    assert initial_copy._equal(copy, model)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(copy.parameters(), model.parameters(), strict=True))
    result = CliRunner().invoke(initial_copy.main, ["--device", "cpu", "--preset", "tiny"])
    assert result.exit_code == 1 and "needs an accelerator" in result.output and "Traceback" not in result.output


def test_digest_columns_splits_a_digests_error_by_column_and_skips_what_is_no_result(monkeypatch, tmp_path):
    """benchmarks/digest_columns.py: a digest whose signed sums moved and whose sums of squares did not reads 0 on the
    squares; a file that is no llmb result is skipped in one line, and with nothing left the command says so."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import digest_columns
    from click.testing import CliRunner

    reference = [[0.5, 4.0], [-0.25, 9.0]]
    moved = [[-0.5, 4.0], [0.25, 9.0]]  # the sums' signs flipped: squares unchanged
    errors = digest_columns.columns(moved, reference)
    assert errors["squares"] == 0.0 and errors["sums"] == pytest.approx(2.0) and 0 < errors["both"] < errors["sums"]
    garbage = tmp_path / "not-a-result.json"
    garbage.write_bytes(b"\xff[bold]x")
    result = CliRunner().invoke(digest_columns.main, [str(garbage)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "skipped:" in result.output and "no pure 16-bit whole window" in result.output


def test_moment_directions_reads_stale_gradients_by_their_directions_not_their_size(monkeypatch):
    """benchmarks/moment_directions.py: the eager twin replays at 0 on every statistic; the stale arm's moments, as
    large as the honest ones, part further in their projection onto random directions than the honest compiled
    arm's would (tiny preset, BF16, 4 steps; the compiled arm is left to the script: Inductor's compile is slow)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import moment_directions

    from llmb.spec.presets import PRESETS

    reference = moment_directions.train(PRESETS["tiny"], torch.bfloat16, "eager", 1, 4)
    twin = moment_directions.errors(
        moment_directions.train(PRESETS["tiny"], torch.bfloat16, "eager", 1, 4), reference, 5
    )
    stale = moment_directions.errors(
        moment_directions.train(PRESETS["tiny"], torch.bfloat16, "stale", 1, 4), reference, 5
    )
    assert twin == {"digest": 0.0, "squares": 0.0, "whole": 0.0, "directions": 0.0}
    assert stale["directions"] > 0 and stale["whole"] > 0
    # The projection estimates the whole tensors' error (within a factor of a few, four directions per parameter).
    assert stale["whole"] / 4 < stale["directions"] < 4 * stale["whole"], stale
    # --mode amp: FP32 weights under autocast against the FP32 replay. Rounding alone moves the eager arm's moments
    # (the judge's yardstick, llmb.judge.replay_checks.autocast_checks); the stale arm's part several times further.
    fp32 = moment_directions.train(PRESETS["tiny"], torch.bfloat16, "reference", 1, 4, amp=True)
    eager = moment_directions.errors(
        moment_directions.train(PRESETS["tiny"], torch.bfloat16, "eager", 1, 4, amp=True), fp32, 5
    )
    stale = moment_directions.errors(
        moment_directions.train(PRESETS["tiny"], torch.bfloat16, "stale", 1, 4, amp=True), fp32, 5
    )
    assert 0 < eager["directions"] and 2 * eager["directions"] < stale["directions"], (eager, stale)


def test_roofline_cost_times_this_trees_roofline_against_a_revisions(bench, monkeypatch):
    import subprocess

    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCHMARKS, capture_output=True).returncode:
        pytest.skip("not a git checkout: no revision to load the peer from")
    import roofline_cost

    written = {}
    monkeypatch.setattr(roofline_cost, "write_raw", lambda name, payload: written.setdefault(name, payload))
    monkeypatch.setattr(roofline_cost.roofline, "MAX_SQUARE", 2 * roofline_cost.roofline.MIN_SQUARE)  # quick
    peer = roofline_cost._at_revision("HEAD")
    assert peer is not roofline_cost.roofline and callable(peer.for_run)
    monkeypatch.setattr(peer, "MAX_SQUARE", peer.MIN_SQUARE * 2)
    monkeypatch.setattr(roofline_cost, "_at_revision", lambda revision: peer)
    roofline_cost.main.main(["--against", "HEAD", "--presets", "tiny", "--rounds", "2"], standalone_mode=False)
    timed = written["roofline_cost"]["presets"]["tiny"]
    assert set(timed["median_seconds"]) == {"tree", "HEAD"} and all(len(v) == 2 for v in timed["seconds"].values())
    assert all(side <= 512 and flops > 0 for arm in timed["square_side_and_flops"].values() for side, flops in arm)


def test_host_noise_compares_copies_window_by_window_over_the_interval_they_share(monkeypatch):
    """benchmarks/host_noise.py's arithmetic on made-up step stamps: two copies at one steady rate are 1.000 in every
    window; a slowdown that hits both at once leaves their ratio alone and correlates them; one that hits a copy
    alone moves the ratio by what it cost that copy."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import host_noise
    import numpy as np

    steady = list(np.arange(0.0, 100.0, 0.5))  # 2 steps a second for 100 s
    late = list(np.arange(0.25, 100.25, 0.5))  # the same rate, started a quarter step later
    (row,) = host_noise.summary([steady, late], [10.0])
    assert row["windows"] == 9 and row["ratio_range"] == pytest.approx([1.0, 1.0])  # 99.25 s shared: 9 windows
    assert row["correlation"] is None  # rates that never move have no correlation to state

    def slowed(stamps, start, end, factor):
        """Step times inside [start, end) stretched by `factor`, every later stamp shifted by what that cost."""
        out, shift, last = [], 0.0, stamps[0]
        for t in stamps:
            step = t - last
            shift += step * (factor - 1) if start <= last < end else 0.0
            out.append(t + shift)
            last = t
        return out

    together = [slowed(steady, 20, 40, 1.5), slowed(late, 20, 40, 1.5)]
    (both,) = host_noise.summary(together, [10.0])
    assert both["ratio_range"] == pytest.approx([1.0, 1.0], abs=0.06) and both["correlation"] > 0.9, both
    assert both["copy_spread"][0] > 0.1  # each copy's own rate moved
    (alone,) = host_noise.summary([steady, slowed(late, 20, 40, 1.5)], [10.0])
    assert alone["ratio_range"][0] == pytest.approx(1 / 1.5, abs=0.02), alone  # one window entirely slowed
    assert host_noise.summary([steady, late], [500.0]) == []  # a window longer than the interval: nothing to say
