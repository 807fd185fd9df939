"""The installed torchtitan (>= 0.3), set up by its own code from its config registry
(``scan --torchtitan MODULE:CONFIG``; ``setup``: :class:`InstalledTorchtitanRecipe`).

Not yet registered as a spec framework: its input is a ``TitanRun`` (torchtitan >= 0.3 has no
TOML), not a ``Spec``, so it implements the seam's build / set up / step part only and is driven
by ``scan.torchtitan``. Registering it means reading a ``TitanRun`` from a spec section.
"""
