"""Training frameworks as plug-ins behind one seam (``interface.Framework``).

Each package here reproduces one framework's training setup and owns everything that differs
between frameworks: its ``[gbdoctor] framework`` name, its compile strategies, how a spec of it is
checked, how the model is built and set up, its training step, how a scan captures a step (per
block, or whole engine steps), its run modes, its planner and the plan it applies.

- ``torchtitan_v02/``: the built-in mirror of torchtitan v0.2.x (EP, AC/SAC, per-block compile,
  FSDP2 from ``setup/``'s framework-neutral building blocks);
- ``deepspeed/``: DeepSpeed ZeRO 0-3 (``deepspeed.initialize`` + the compile call users write);
- ``torchtitan/``: the installed torchtitan >= 0.3, set up by its own code from its config
  registry (``scan --torchtitan MODULE:CONFIG``);
- ``common/``: what several frameworks share.

Stages above (``scan``, ``plan``, ``run``, ``spec``, ``cli``) ask ``registry.framework_for(spec)``
once per command, at its entry (the CLI command, or the library function a caller calls), and
pass the framework down (the rank jobs carry it); they never name a framework (``tests/test_layering.py`` keeps it so); this package sits above
``setup``, ``capture``, ``causes``, ``models`` and ``records``.
"""

from gbdoctor.frameworks.interface import CaptureStyle, Framework
from gbdoctor.frameworks.registry import framework_for, framework_named, framework_names

__all__ = ["CaptureStyle", "Framework", "framework_for", "framework_named", "framework_names"]
