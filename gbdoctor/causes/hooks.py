"""Where the framework that set the model up keeps its own hooks (:class:`FrameworkHooks`): a
location signal of the ``zero-hook`` cause that the framework contributes, so that the cause
rules name no framework."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrameworkHooks:
    """The hook library of the framework that set the model up (DeepSpeed's ZeRO): a break in
    its files, or attributed to its components, is the ``zero-hook`` cause. The framework
    contributes it (``frameworks.interface.OwnHookLibrary``); this package names none."""

    files: tuple[str, ...] = ()
    """Path fragments of the library's hook code, ``/``-separated (``pkg/runtime/zero/``)."""
    components: tuple[str, ...] = ()
    """The locator's ``Component`` values for frames in that library."""

    def owns(self, path: str) -> bool:
        return any(fragment in path for fragment in self.files)


NO_FRAMEWORK_HOOKS = FrameworkHooks()
