"""The harness's DeviceMesh: pipeline x data x tensor parallelism, all torch's own, put on after the plugin.

`--pp`, `--tp` and `--parallel ddp|fsdp|hsdp` compose into one mesh (pp, dp, tp), tensor parallel innermost (the
ranks of one node, on the fastest links), pipeline outermost. HSDP splits dp into (replicate, shard): shards within a
node, replicas across nodes (on one node, two replicas). What each axis does to the plugin's post-processed model:

- pp: `torch.distributed.pipelining`. The model is cut into contiguous blocks of decoder layers (the first stage
  also holds the embedding, the last the final norm, lm_head and the loss); the schedule is GPipe or 1F1B over
  `--microbatches` slices of each rank's batch. The stage runs the fixed model's own submodules in the order
  LlamaModel.forward runs them, and the loss is the model's own `causal_lm_loss` (checked equal to one process by
  the tests).
- tp: torch's tensor-parallel plans, Colwise on q/k/v and gate/up, Rowwise on o and down, each attention instance's
  `num_heads` divided by tp (its heads are split across ranks). With sequence parallel the norms and the residual
  stream are sharded along the sequence between the blocks.
- dp: DDP over the data group (not with tp: DDP refuses DTensor parameters), or FSDP2 with each decoder layer a unit
  then the root, on the dp mesh (with tp: 2-D; HSDP: replicate x shard).

Batches are seeded by the data-parallel rank: the ranks of one tensor or pipeline group see the same batch.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from llmb.api.errors import UsageError
from llmb.model import DecoderLayer, LlamaModel, ModelConfig, causal_lm_loss
from llmb.spec.vocab import SCHEDULES
from llmb.training.loop import Trainer

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

STRATEGIES = ("ddp", "fsdp", "hsdp")


@dataclass(frozen=True)
class Layout:
    """How the job's ranks divide the work."""

    world_size: int = 1
    tp: int = 1
    pp: int = 1
    strategy: str = "none"  # none (one process), ddp, fsdp or hsdp
    nodes: int = 1
    microbatches: int = 1
    schedule: str = "gpipe"
    grad_accum: int = 1
    sequence_parallel: bool = False

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp)

    @property
    def dp_shard(self) -> int:
        """The data ranks that shard the model: HSDP's are those of one node (or half of them on a single node);
        FSDP's all of them; DDP's (and one process's) none, every data rank a replica."""
        if self.strategy in ("ddp", "none"):
            return 1
        if self.strategy == "fsdp":
            return self.dp
        if self.nodes > 1 and self.dp % self.nodes == 0:
            return self.dp // self.nodes
        return self.dp // 2

    @property
    def dp_replicate(self) -> int:
        return self.dp // self.dp_shard

    def to_dict(self) -> dict:
        return {**asdict(self), "dp": self.dp, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard}


def check(layout: Layout, config: ModelConfig, batch_size: int) -> None:
    """Refuse, in one line each, a layout the job or the model cannot take."""
    if layout.strategy not in (*STRATEGIES, "none"):
        raise UsageError(f"unknown --parallel {layout.strategy!r} (choose from {', '.join(STRATEGIES)})")
    if layout.schedule not in SCHEDULES:
        raise UsageError(f"unknown --pp-schedule {layout.schedule!r} (choose from {', '.join(SCHEDULES)})")
    for name in ("tp", "pp", "microbatches", "grad_accum"):
        if getattr(layout, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(layout, name)}")
    if layout.world_size % (layout.tp * layout.pp):
        raise UsageError(f"{layout.world_size} processes do not divide into --tp {layout.tp} x --pp {layout.pp} groups")
    if layout.strategy == "hsdp" and layout.dp < 2:
        raise UsageError(f"--parallel hsdp needs at least 2 data-parallel ranks, got {layout.dp}")
    if layout.strategy == "hsdp" and layout.dp % 2 and layout.nodes == 1:
        raise UsageError(f"--parallel hsdp on one node splits the data ranks in two; {layout.dp} is odd")
    if layout.strategy == "ddp" and layout.tp > 1 and layout.dp > 1:
        raise UsageError("--tp with data parallelism needs --parallel fsdp or hsdp (DDP refuses DTensor parameters)")
    if layout.tp > 1:
        for what, value in (
            ("attention heads", config.num_attention_heads),
            ("intermediate size", config.intermediate_size),
        ):
            if value % layout.tp:
                raise UsageError(f"--tp {layout.tp} does not divide the model's {what} ({value})")
        if layout.sequence_parallel and config.sequence_length % layout.tp:
            raise UsageError(f"--sequence-parallel: --tp {layout.tp} does not divide the sequence length")
    if layout.pp > 1:
        if config.num_hidden_layers < layout.pp:
            raise UsageError(f"--pp {layout.pp} is more stages than the model's {config.num_hidden_layers} layers")
        if batch_size % layout.microbatches:
            raise UsageError(f"--batch-size {batch_size} does not split into --microbatches {layout.microbatches}")
        if layout.grad_accum > 1:
            raise UsageError("--grad-accum with --pp: raise --microbatches instead (the pipeline accumulates them)")
    elif layout.microbatches != 1:
        raise UsageError("--microbatches needs --pp 2 or more")
    elif layout.schedule != SCHEDULES[0]:  # an option that would change nothing is refused, never ignored
        raise UsageError(f"--pp-schedule {layout.schedule} needs --pp 2 or more")
    if layout.sequence_parallel and layout.tp < 2:
        raise UsageError("--sequence-parallel needs --tp 2 or more")


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The job's DeviceMesh, pipeline outermost, tensor innermost."""
    # Lazy: torch.distributed's device mesh loads only in the jobs that use it (one process never does).
    from torch.distributed.device_mesh import init_device_mesh

    if layout.strategy == "hsdp":
        shape = (layout.pp, layout.dp_replicate, layout.dp_shard, layout.tp)
        names = ("pp", "dp_replicate", "dp_shard", "tp")
    else:
        shape, names = (layout.pp, layout.dp, layout.tp), ("pp", "dp", "tp")
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


@dataclass(frozen=True)
class Coordinates:
    pp: int
    dp: int
    tp: int


def coordinates(layout: Layout, rank: int) -> Coordinates:
    """This rank's place on the mesh (row-major over (pp, dp, tp), as init_device_mesh lays ranks out)."""
    return Coordinates(pp=rank // (layout.dp * layout.tp), dp=(rank // layout.tp) % layout.dp, tp=rank % layout.tp)


def data_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    return mesh["dp_replicate", "dp_shard"] if layout.strategy == "hsdp" else mesh["dp"]


# Pipeline stages


class Stage(nn.Module):
    """One pipeline stage of the fixed model: its own submodules, called in LlamaModel.forward's order. Layers keep
    their indices as names (a ModuleDict), so a parameter is named as in the whole model."""

    def __init__(self, model: LlamaModel, first: bool, last: bool, layers: range) -> None:
        super().__init__()
        self.config = model.config
        self.embed_tokens = model.embed_tokens if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layers})
        self.norm = model.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.rotary = model.rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        cos, sin = self.rotary(x, x.shape[1])
        for layer in self.layers.values():
            x = layer(x, cos, sin)
        if self.lm_head is not None:
            x = self.lm_head(self.norm(x)).float()
        return x


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """Contiguous blocks of decoder layers, the first stages one longer when they do not divide evenly."""
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def find_model(module: nn.Module) -> LlamaModel:
    """The LlamaModel inside a plugin's wrapper (torch.compile's, for one)."""
    for candidate in module.modules():
        if isinstance(candidate, LlamaModel):
            return candidate
    raise UsageError("--pp needs the plugin to leave a LlamaModel in the processed model")


def pipeline_stage(model: nn.Module, layout: Layout, stage: int) -> Stage:
    base = find_model(model)
    layers = stage_layers(base.config.num_hidden_layers, layout.pp, stage)
    return Stage(base, first=stage == 0, last=stage == layout.pp - 1, layers=layers)


def stage_input(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """What one forward of this rank's model takes outside the schedule (the audit's operator census): the token
    ids, or for a pipeline stage after the first, hidden states of the batch's shape in the parameters' dtype."""
    stages = [m for m in model.modules() if isinstance(m, Stage)]
    if not stages or stages[0].embed_tokens is not None:
        return batch
    dtype = next(stages[0].parameters()).dtype
    return torch.zeros(*batch.shape, stages[0].config.hidden_size, dtype=dtype, device=batch.device)


# Tensor parallel


def tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """torch's plans on every decoder layer; each attention instance computes its share of the heads."""
    # Lazy: torch.distributed's tensor parallelism loads only in the jobs that use it (one process never does).
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    out = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=out),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=out),
    }
    if sequence_parallel:
        # Between the blocks the residual stream is each rank's slice of the sequence; the norms work on slices,
        # and each block gathers the whole sequence at its input.
        plan |= {
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(
                input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
            ),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        }
    layers = [m for m in model.modules() if isinstance(m, DecoderLayer)]
    for layer in layers:
        parallelize_module(layer, tp_mesh, plan)
        layer.self_attn.num_heads //= tp
    if sequence_parallel:
        _sequence_edges(model, tp_mesh)


def _sequence_edges(model: nn.Module, tp_mesh) -> None:
    """Sequence parallel's edges: the first layer takes this rank's slice of the sequence, and the stream is
    gathered whole again before the final norm (or at the end of a pipeline stage)."""
    # Lazy: torch.distributed's DTensor loads only in the jobs that use it (one process never does).
    from torch.distributed.tensor import DTensor, Replicate, Shard

    layers = [m for m in model.modules() if isinstance(m, DecoderLayer)]

    def scatter(module, args):
        # Through DTensor, so that the backward gathers each rank's slice of the gradient into the whole again.
        whole = DTensor.from_local(args[0], tp_mesh, [Replicate()], run_check=False)
        return (whole.redistribute(tp_mesh, [Shard(1)]).to_local(), *args[1:])

    def gather(module, args, output):
        whole = DTensor.from_local(output, tp_mesh, [Shard(1)], run_check=False)
        return whole.redistribute(tp_mesh, [Replicate()]).to_local()

    layers[0].register_forward_pre_hook(scatter)
    layers[-1].register_forward_hook(gather)


# Data parallel


def data_parallel(model: nn.Module, layout: Layout, mesh: DeviceMesh) -> nn.Module:
    """DDP over the data group, or FSDP2 (each decoder layer a unit, then the root) on the data mesh."""
    if layout.dp == 1 and layout.strategy == "ddp":
        return model  # nothing to replicate: tensor/pipeline groups only
    group_mesh = data_mesh(mesh, layout)
    if layout.strategy == "ddp":
        # Lazy: torch.distributed's DDP loads only in the jobs that use it (one process never does).
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=None, process_group=group_mesh.get_group())
    try:
        # Lazy: torch.distributed's FSDP loads only in the jobs that use it (one process never does).
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        raise UsageError(f"--parallel {layout.strategy} needs FSDP2, which torch {torch.__version__} lacks") from None
    for module in model.modules():
        if isinstance(module, DecoderLayer):
            fully_shard(module, mesh=group_mesh)
    roots = [m for m in model.modules() if isinstance(m, (LlamaModel, Stage))]
    fully_shard(roots[0] if roots else model, mesh=group_mesh)
    return model


def parallelize(model: nn.Module, layout: Layout, mesh: DeviceMesh, coords: Coordinates) -> nn.Module:
    """The whole layout on the plugin's post-processed model: pipeline cut, tensor plans, data wrapper."""
    if layout.pp > 1:
        model = pipeline_stage(model, layout, coords.pp)
    if layout.tp > 1:
        tensor_parallel(model, mesh["tp"], layout.sequence_parallel)
    return data_parallel(model, layout, mesh)


def optimizer_options(model: nn.Module, options: dict) -> tuple[dict, str | None]:
    """AdamW's implementation options that work on what the mesh made of the parameters: foreach and fused refuse a
    group mixing DTensor and plain tensors (tensor parallel leaves the embedding and norms plain), and fused takes no
    DTensor. Returns the options to use and, when any was dropped, why (recorded)."""
    # Lazy: torch.distributed's DTensor loads only in the jobs that use it (one process never does).
    from torch.distributed.tensor import DTensor

    kinds = {isinstance(p, DTensor) for p in model.parameters()}
    dropped = []
    for key in ("foreach", "fused"):
        if options.get(key) and (len(kinds) > 1 or (key == "fused" and True in kinds)):
            dropped.append(key)
    if not dropped:
        return options, None
    options = {k: v for k, v in options.items() if k not in dropped}
    return options, f"{' and '.join(dropped)} AdamW refused for DTensor parameters: fell back to the for-loop"


# The step


def dp_batch(
    config: ModelConfig,
    batch_size: int,
    seed: int,
    dp_rank: int,
    device: torch.device,
    synthetic: Callable[[ModelConfig, int, int, torch.device], torch.Tensor],
) -> torch.Tensor:
    """This data-parallel rank's batch: seeded by the dp rank, so the ranks of a tensor/pipeline group agree."""
    return synthetic(config, batch_size, seed + dp_rank, device)


def no_gradient_sync(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """DDP's no_sync, or FSDP2's set_requires_gradient_sync(False) for the duration."""
    if hasattr(model, "no_sync"):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):

        @contextlib.contextmanager
        def fsdp():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return fsdp()
    return contextlib.nullcontext()


def pipeline_schedule(
    stage_module: nn.Module, layout: Layout, coords: Coordinates, device: torch.device, mesh: DeviceMesh
) -> PipelineScheduleSingle:
    # Lazy: torch.distributed's pipelining loads only in the jobs that use it (one process never does).
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage = PipelineStage(stage_module, coords.pp, layout.pp, device, group=mesh["pp"].get_group())
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[layout.schedule]
    return kind(stage, n_microbatches=layout.microbatches, loss_fn=causal_lm_loss)


def copy_model(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


class AccumulatingTrainer(Trainer):
    """K forward/backward passes on K slices of the rank's batch, then one AdamW step: the gradients are reduced
    across data-parallel ranks on the last pass only (no_sync / set_requires_gradient_sync(False) before it)."""

    def __init__(self, *args: Any, accumulation: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accumulation = accumulation

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        total = None
        slices = self.batch.chunk(self.accumulation)
        for index, micro in enumerate(slices):
            last = index == len(slices) - 1
            with contextlib.nullcontext() if last else no_gradient_sync(self.model):
                with self._autocast():
                    loss = self.loss_of(micro)
                scaled = loss / self.accumulation  # the mean over the slices, as one pass over the whole batch
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.step_end(self.device)
        self.harness_steps += 1
        return total / self.accumulation


def _schedule_owns_ddp_sync(model: nn.Module):
    """DDP's no_sync around a whole pipeline step: the stage arms DDP's reducer itself for the last microbatch's
    backward (PipelineStage.backward_maybe_with_nosync calls reducer.prepare_for_backward), and every forward the
    schedule makes must leave it unarmed. torch's first-step metadata inference runs the DDP module once outside
    no_sync with grad enabled and no backward, which leaves the reducer armed: the first microbatch's backward then
    reduced too and each parameter registered twice (the reducer's `rebuilt_param_indices_` assert on the next
    step). FSDP's stage is handled by the schedule itself."""
    # Lazy: torch.distributed's DDP loads only in the jobs that use it (one process never does).
    from torch.nn.parallel import DistributedDataParallel

    return model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()


class PipelineTrainer(Trainer):
    """One step is the pipeline schedule over the microbatches (forward and backward on this stage, activations and
    their gradients sent between stages), then AdamW on this stage's parameters. The last stage's loss (the mean over
    microbatches) is shared with the pipeline group, so every rank reports the step's loss."""

    def __init__(
        self,
        *args: Any,
        schedule: PipelineScheduleSingle,
        first: bool,
        last: bool,
        pp_group: ProcessGroup,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            raise UsageError("--pp with FP16 loss scaling is not supported: use BF16 or FP32")
        self.schedule, self.first, self.last, self.pp_group = schedule, first, last, pp_group

    def step(self) -> torch.Tensor:
        # Lazy: torch.distributed's process group loads only in the jobs that use it (one process never does).
        import torch.distributed as dist

        self.optimizer.zero_grad(set_to_none=True)
        losses: list = []
        with self._autocast(), _schedule_owns_ddp_sync(self.model):
            if self.first:
                self.schedule.step(self.batch)
            else:
                self.schedule.step(target=self.batch if self.last else None, losses=losses if self.last else None)
        loss = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=self.batch.device)
        loss = loss.float()
        dist.all_reduce(loss, group=self.pp_group)  # only the last stage's is non-zero
        self.optimizer.step()
        self.step_end(self.device)
        self.harness_steps += 1
        return loss
