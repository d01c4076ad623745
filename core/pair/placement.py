"""Where a model's weights go: the device ("auto": CUDA when present), the dtype ("auto": bfloat16 on CUDA,
float32 on a CPU), and a device map that spreads one model over several GPUs (`spread_plan`); and how results
come back from the device (`to_host`: one copy, one wait, per device and dtype)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from core import settings
from core.errors import InvalidInputError, ModelLoadError


def resolve_device(device: str = settings.DEVICE) -> torch.device:
    """'auto' -> CUDA when present, else CPU; anything else is passed to torch.device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise InvalidInputError(f"Unknown device {device!r}; use auto, cpu, cuda or cuda:N") from err
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index or 0) >= count:
            raise InvalidInputError(
                f"Device {device!r} is not available ({count} CUDA devices visible to torch "
                f"{torch.__version__}); use auto or cpu"
            )
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 on CUDA, float32 on CPU (bf16 matmuls are very slow on these CPUs)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in choices:
        raise InvalidInputError(f"Unknown dtype {dtype!r}; choose one of: auto, {', '.join(choices)}")
    return choices[dtype]


def spread_plan(config: Any, gpus: int, dtype: torch.dtype, trust_remote_code: bool = False) -> dict[str, int]:
    """A device map putting one model over GPUs 0..gpus-1: its decoder layers in equal, contiguous shares,
    what runs before them (embeddings) on GPU 0, what runs after (final norm, head) on the last GPU, and a
    head tied to the embeddings with them. Built on an empty, meta-device copy: no weights are read."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    if gpus < 1:
        raise InvalidInputError(f"spreading a model needs at least one GPU, got {gpus}")
    with init_empty_weights():
        meta = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    lists = [(name, m) for name, m in meta.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        raise ModelLoadError(f"cannot spread {type(meta).__name__} over GPUs: no list of decoder layers found")
    layers_name, layers = max(lists, key=lambda item: sum(p.numel() for p in item[1].parameters()))
    head = meta.get_output_embeddings()
    tied = bool(getattr(config, "tie_word_embeddings", False)) and head is not None
    plan: dict[str, int] = {}
    seen_layers = False

    def place(prefix: str, module: torch.nn.Module) -> None:
        nonlocal seen_layers
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if full == layers_name:
                for i in range(len(layers)):
                    plan[f"{full}.{i}"] = i * gpus // len(layers)
                seen_layers = True
            elif layers_name.startswith(full + "."):
                place(full + ".", child)
            elif child is head and tied:
                plan[full] = 0  # with the embeddings it shares its weight
            else:
                plan[full] = gpus - 1 if seen_layers else 0

    place("", meta)
    return plan


def to_host(tensors: Mapping[str, torch.Tensor], group: bool | None = None) -> dict[str, np.ndarray]:
    """numpy arrays of `tensors`, in their order. From an accelerator they come in one copy per device and dtype
    (each copy waits for the device: one wait, not one per tensor); `group` (default: off a CPU) forces that path
    or not."""
    out: dict[str, np.ndarray] = {}
    groups: dict[tuple[torch.device, torch.dtype], list[str]] = {}
    for name, x in tensors.items():
        if group or (group is None and x.device.type != "cpu"):
            groups.setdefault((x.device, x.dtype), []).append(name)
        else:
            out[name] = x.cpu().numpy()
    for names in groups.values():
        flat = torch.cat([tensors[n].reshape(-1) for n in names]).cpu().numpy()
        start = 0
        for n in names:
            size = tensors[n].numel()
            out[n] = flat[start : start + size].reshape(tuple(tensors[n].shape))
            start += size
    return {name: out[name] for name in tensors}
