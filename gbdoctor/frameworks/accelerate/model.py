"""The model of an Accelerate run, given one of three ways and never downloaded:

- a local directory with a ``config.json``: built with ``AutoModelForCausalLM.from_config``
  (random weights; breaks do not depend on weight values);
- a Hugging Face Hub id whose ``config.json`` is in the local cache (``local_files_only``);
- a factory, as for custom models (``path/to/file.py:build`` or ``package.module:build``).

``model_ref`` checks the reference when the spec is made (exit 2 with the fix), ``build_model``
builds it on a rank.
"""

from __future__ import annotations

import os
from typing import Any

from gbdoctor.errors import SpecError

DIRECTORY = "dir"
HUB = "hub"
FACTORY = "factory"


def model_ref(text: str, base_dir: str) -> tuple[str, str]:
    """(kind, reference): a directory or factory file made absolute against ``base_dir``."""
    if ":" in text and not os.path.isdir(os.path.join(base_dir, text)):
        target, _, attr = text.rpartition(":")
        if target.endswith(".py"):
            path = os.path.normpath(os.path.join(base_dir, os.path.expanduser(target)))
            if not os.path.isfile(path):
                raise SpecError(
                    f"model factory file {target} does not exist",
                    hint="give --model path/to/file.py:FUNCTION, a directory with config.json or a cached Hub id",
                )
            return FACTORY, f"{path}:{attr}"
        return FACTORY, text
    local = os.path.normpath(os.path.join(base_dir, os.path.expanduser(text)))
    if os.path.isdir(local):
        if not os.path.isfile(os.path.join(local, "config.json")):
            raise SpecError(
                f"model directory {text} has no config.json",
                hint="give a directory holding a transformers config.json (weights are not read)",
            )
        return DIRECTORY, local
    if os.path.exists(local) or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise SpecError(
            f"model {text!r} is neither a directory with config.json nor a Hub id (org/name)",
            hint="give a directory with config.json, a Hub id in the local cache, or FILE.py:FUNCTION",
        )
    _cached_config(text)
    return HUB, text


def _cached_config(hub_id: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(hub_id, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise SpecError(
            f"Hub model {hub_id} is not in the local Hugging Face cache ({type(exc).__name__}); "
            "gbdoctor never downloads",
            hint=f"run `hf download {hub_id} config.json` first, or give a local directory with config.json",
        ) from None


def model_label(kind: str, ref: str) -> str:
    """How the reference is written in the spec's label (a directory by its base name)."""
    return os.path.basename(ref) if kind == DIRECTORY else ref


def build_model(kind: str, ref: str, seed: int) -> Any:
    """The model on CPU, in float32 (FSDP2's mixed precision casts what the config asks for)."""
    import torch

    torch.manual_seed(seed)
    if kind == FACTORY:
        from gbdoctor.models import build_model as build_custom
        from gbdoctor.records import ModelSpec

        return build_custom(ModelSpec(name="custom", flavor="", factory=ref), device="cpu")
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(ref, local_files_only=True)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
