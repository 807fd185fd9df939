"""The training setup: process groups, EP, AC, compile, FSDP2, load balancing.

``apply_setup`` (in ``apply.py``) owns the one order every command uses.
"""

from gbdoctor.setup.apply import Setup, apply_setup, recipe_context

__all__ = ["Setup", "apply_setup", "recipe_context"]
