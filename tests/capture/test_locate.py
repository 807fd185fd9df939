"""Where a break is reported (``capture.locate.innermost_user_location``) when the stack holds
no model code: gbdoctor's own scan, run or timeline called the compiled region, and that call is
never the place; the library hook the break's component names is."""

from __future__ import annotations

from repo_paths import REPO

from gbdoctor.capture import innermost_user_location
from gbdoctor.causes.gb_registry import _torch_dir
from gbdoctor.records import Component, Location


def _stack(*frames: tuple[str, int]) -> tuple[Location, ...]:
    return tuple(Location(file=f, line=n, function="f") for f, n in frames)


TORCH = (_torch_dir() or "").rstrip("/")
HARNESS = (str(REPO / "gbdoctor/scan/rank.py"), 459)
CHECKPOINT = (f"{TORCH}/distributed/algorithms/_checkpoint/checkpoint_wrapper.py", 169)
MODULE_CALL = (f"{TORCH}/nn/modules/module.py", 1881)
FSDP_HOOK = (f"{TORCH}/distributed/fsdp/_fully_shard/_fsdp_common.py", 30)


def test_an_fsdp_hook_inside_a_compiled_region_is_located_at_the_hook() -> None:
    """The stack a real capture recorded for Accelerate's regional compile with AC (FSDP2's
    pre-forward runs inside the checkpointed region): the scan's call, torch, FSDP2."""
    stack = _stack(HARNESS, CHECKPOINT, MODULE_CALL, FSDP_HOOK)
    where = innermost_user_location(stack, root=str(REPO), component=Component.FSDP)
    assert where is not None
    assert (where.file, where.line) == ("torch/distributed/fsdp/_fully_shard/_fsdp_common.py", 30)
    # With no component, the innermost frame outside torch is still not the harness's.
    plain = innermost_user_location(stack, root=str(REPO))
    assert plain is not None and not plain.file.startswith("gbdoctor/"), plain


def test_model_and_setup_code_below_the_harness_stay_the_place() -> None:
    """The bundled models and the training setup's code (EP dispatch) are where breaks are."""
    model = (str(REPO / "gbdoctor/models/decoder.py"), 49)
    where = innermost_user_location(
        _stack(HARNESS, MODULE_CALL, model, FSDP_HOOK), root=str(REPO), component=Component.FSDP
    )
    assert where is not None and (where.file, where.line) == ("gbdoctor/models/decoder.py", 49)
    ep = (str(REPO / "gbdoctor/setup/ep.py"), 35)
    where = innermost_user_location(_stack(ep, MODULE_CALL), root=str(REPO))
    assert where is not None and (where.file, where.line) == ("gbdoctor/setup/ep.py", 35)
