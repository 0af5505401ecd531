"""The vendor contract: a hardware plugin registers `Backend` instances, and llmb asks them about the device.

Every question the harness asks of a device is a method here, with the harness's default as its body: a subclass
overrides only what its hardware does differently. The harness keeps what makes a result a result (the model, the
AdamW construction, the loop, the timer and the precision audit); a backend never sees them except through the
arguments given here. This module imports no torch, so `import llmb` stays cheap.
"""

from __future__ import annotations

import ast
import inspect
import platform
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from llmb.api.errors import UsageError

if TYPE_CHECKING:  # for annotations only: importing torch here would make `llmb --help` pay for it
    # Lazy: the plugin API imports no torch until a worker calls a device service.
    import torch

    from llmb.api.settings import PluginSettings, Setting


@dataclass(frozen=True)
class PrecisionFact:
    """One fact about backend state; ``implies`` is the numeric format it lets run, or None if it says nothing."""

    name: str
    value: Any
    implies: str | None = None


@dataclass(frozen=True)
class Peak:
    """A device's dense peak FLOP/s for one precision, and where it is published (a datasheet URL, a page)."""

    flops: float
    source: str

    def __post_init__(self) -> None:
        if not self.flops > 0:
            raise ValueError(f"a peak must be a positive FLOP/s figure, got {self.flops!r}")
        if not self.source.strip():
            raise ValueError("a peak needs its public source: llmb never reports an MFU nobody can check")


@dataclass(frozen=True)
class EnergyCounter:
    """A device's energy counter as a backend offers it (Backend.energy_counter): ``read()`` gives joules from any
    origin, never decreasing (a hardware counter's wraparound already undone); ``scope`` says what it covers (one GPU,
    a CPU socket with every process on it); ``limit_watts`` is the device's power limit where known, against which the
    judge checks the window's average power."""

    read: Callable[[], float]
    scope: str
    limit_watts: float | None = None


class Backend:
    """One device kind as llmb drives it. Subclass it, override what your hardware needs, register an instance.

    ``device`` is a ``torch.device``; ``precision`` one of FP32, TF32, FP16, BF16; ``settings`` the backend's
    validated settings, every declared setting present, given or default: an instance of the backend's ``Settings``
    class where it declares one (``settings.compile``), else a dict. ``state``, in a method that names it, is what
    this run's ``setup`` returned (pluggy's rule: a method gets only the arguments it names). ``settings`` is typed
    ``Any`` here so that a subclass may name its own class (``settings: AcmeSettings``) and a type checker still
    holds the rest of its signatures to these.
    """

    #: The name `llmb run --plugin` takes; a plugin's backends are named after its entry point
    #: (docs/vendors/writing-a-plugin.md).
    name: str = ""
    #: The backend's typed settings (a `llmb.PluginSettings` dataclass), each declared once with its default; None:
    #: the backend has none, or lists them itself in `settings()`.
    Settings: ClassVar[type[PluginSettings] | None] = None

    # Identity and capability

    def device_types(self) -> list[str]:
        """The torch device types this backend serves, the default first."""
        return ["cpu"]

    def precisions(self) -> list[str]:
        """The precisions this backend can run, a subset of FP32, TF32, FP16, BF16."""
        return ["FP32"]

    def available(self) -> bool:
        """True when this backend's hardware is present (used when no --plugin is given)."""
        return False

    def settings(self) -> list[Setting]:
        """The settings this backend accepts through -O key=value: its ``Settings`` class's fields by default."""
        return self.Settings.declared() if self.Settings is not None else []

    def vendor_libraries(self) -> list[str]:
        """The distributions of the vendor libraries this backend sets up that replace torch's functions or aten
        kernels for the whole process (IPEX's ``optimize``, say). The integrity guard accepts such a replacement only
        from a library named here, installed as one of its official releases llmb holds pins for
        (llmb/audit/vendor_libraries.py); any other replacement makes the run invalid."""
        return []

    # Backend setup and model post-processing

    def setup(self, device: torch.device, precision: str, settings: Any) -> Any:
        """Configure the framework before the model exists: backend flags, environment, vendor libraries. What it
        returns is this run's state: the later methods that name a ``state`` parameter get it (None: no state), so
        nothing of one run lives on in module globals or on the registered instance."""

    def process_model(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str,
        settings: Any,
    ) -> torch.nn.Module:
        """Return the post-processed model (compile, fused kernels, wrappers); never build a new model."""
        return model

    def optimizer_options(self, device: torch.device, precision: str, settings: Any) -> dict:
        """AdamW implementation options only: any of foreach, fused, capturable."""
        return {}

    def step_end(self, device: torch.device) -> None:
        """Finish one training step where the device needs it (e.g. cut a lazy graph); runs inside the timed window."""

    # Device services for the timer and the records

    def synchronize(self, device: torch.device) -> None:
        """Block until all work queued on the device is done. The timer calls it at both edges of the window."""
        if device.type == "cpu":
            return  # eager CPU kernels have finished when they return
        # Lazy: the plugin API imports no torch until a worker calls a device service.
        import torch

        accelerator = getattr(torch, "accelerator", None)
        current = accelerator.current_accelerator() if accelerator and accelerator.is_available() else None
        if current is not None and current.type == device.type:
            accelerator.synchronize(device)
            return

        raise UsageError(
            f"backend {self.name!r} cannot synchronise device {str(device)!r}; llmb will not time an asynchronous "
            "device without it"
        )

    def new_event(self, device: torch.device) -> Any:
        """A new timing event (record(), synchronize(), elapsed_time(other) in ms), or None: host timing."""
        return None

    def reset_peak_memory(self, device: torch.device) -> None:
        """Reset the device's peak-memory counter before the measured steps."""

    def peak_memory_bytes(self, device: torch.device) -> int | None:
        """The device's peak allocated memory in bytes since the last reset, or None when unknown (anything but an
        integer of 0 or more or None is recorded as unknown, and the run is invalid for it)."""
        return None

    def energy_counter(self, device: torch.device) -> EnergyCounter | str:
        """The device's energy counter, read at both edges of each measured window, or a sentence saying why there is
        none (the record keeps it). An average power over the measured windows below 1 W or above the device's limit
        (1.5x ``limit_watts``, at most 3 kW) gives no figure and makes the run invalid."""
        return f"backend {self.name!r} offers no energy counter"

    def device_name(self, device: torch.device) -> str:
        """The device's marketing name (e.g. "NVIDIA H100 80GB HBM3"): text, kept on one line to 200 characters
        (anything but non-empty text is recorded as "unknown", and the run is invalid for it)."""
        return platform.processor() or device.type

    def device_count(self, device: torch.device) -> int:
        """How many devices of this type the host has (anything but an integer of 1 or more is recorded as unknown, and
        the run is invalid for it)."""
        return 1

    def device_memory_bytes(self, device: torch.device) -> int | None:
        """The device's total memory in bytes, or None (the host CPU: its memory is the system's, not a device's);
        anything but an integer of 0 or more or None is recorded as unknown, and the run is invalid for it."""
        return None

    def peak_flops(self, device: torch.device, precision: str) -> Peak | None:
        """The device's dense peak FLOP/s for the precision with its public source, or None (never a guess)."""
        return None

    def peak_sources(self) -> dict[str, str]:
        """Every device this backend knows a peak for, with the figure's public source (listed by `llmb plugins`)."""
        return {}

    def precision_facts(self, device: torch.device, precision: str, settings: Any) -> list[PrecisionFact]:
        """Facts about backend state that decide the numeric format that runs (read by the precision audit)."""
        return []

    def run_facts(self, device: torch.device) -> dict:
        """Facts to record with the run: vendor library versions, driver, runtime. Read once the last window and its
        audit are done, before llmb measures the roofline beside the run. Kept as a record can hold them
        (llmb.records.files.as_record_value: text capped at 4096 characters, 16 levels, 1000 items per list or
        object; NaN, infinities and integers past 1023 bits as text); anything but an object (or None) is recorded
        as none, and the run is invalid for it."""
        return {}

    def distributed_backend(self, device: torch.device) -> str | None:
        """The torch.distributed process-group backend for the device; None: torch's default for its type."""
        return None


def public_methods() -> list[str]:
    """The contract: every public method of Backend, in definition order."""
    return [name for name, value in vars(Backend).items() if callable(value) and not name.startswith("_")]


def overridden(backend: Backend) -> list[str]:
    """The contract methods this backend's class (or a base between it and Backend) defines itself, leaving out
    those whose body only hands its arguments to the base class's (a `new-plugin` stub): they change nothing."""
    cls = type(backend)
    return [
        name
        for name in public_methods()
        if getattr(cls, name) is not getattr(Backend, name) and not _only_calls_super(getattr(cls, name))
    ]


def _only_calls_super(method) -> bool:
    """Whether a method's body (past its docstring) is `[return] super().<its name>(<its parameters, in order>)`."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    except (OSError, TypeError, SyntaxError):  # no source (a C function, an interactive definition): an override
        return False
    function = tree.body[0] if tree.body else None
    if not isinstance(function, ast.FunctionDef):
        return False
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], (ast.Expr, ast.Return)):
        return False
    call = body[0].value
    params = [a.arg for a in function.args.args[1:]]
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == function.name
        and isinstance(call.func.value, ast.Call)
        and isinstance(call.func.value.func, ast.Name)
        and call.func.value.func.id == "super"
        and not call.keywords
        and [a.id if isinstance(a, ast.Name) else None for a in call.args] == params
    )
