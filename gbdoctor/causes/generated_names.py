"""Dynamo's generated names, said as the user wrote the code.

Dynamo names what it makes itself, and those names leak into its messages (guards, frame
names, graph inputs):

- ``torch_dynamo_resume_in_forward_at_257``: the continuation of ``forward`` after the graph
  break at line 257 (``convert_frame``'s resume functions; a resume's resume nests the pattern);
- ``___stack0``: a value that was on the interpreter stack at a break, handed to the resume
  function as its argument;
- ``l_self_modules_feed_forward_modules_w3_parameters_weight_``: a graph input's placeholder,
  mangled from the path Dynamo read it from (``self.feed_forward.w3.weight``).

:func:`user_names` rewrites all three in any text; ``capture/locate.py`` maps frame names with
:func:`user_function`. Text only: no torch.
"""

from __future__ import annotations

import re

__all__ = [
    "RESUME_FUNCTION",
    "has_generated_name",
    "resume_names",
    "user_function",
    "user_names",
]

RESUME_FUNCTION = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")
"""A whole name that is a resume function."""
_RESUME_IN_TEXT = re.compile(r"\btorch_dynamo_resume_in_(\w+?)_at_\d+\b")
_STACK = re.compile(r"\b___stack(\d+)\b")
_PLACEHOLDER = re.compile(r"\bl_(self|args|kwargs)_(\w*?)_?(?=\W|$)")
_MANGLED_ITEM = re.compile(r"_(?:dict_)?(?:modules|parameters|buffers)_")
_TORCH_WRAPPERS = ("checkpoint_wrapped_module", "orig_mod", "fsdp_wrapped_module")
"""Wrapper attributes torch inserts in a module path (their leading ``_`` is mangled away)."""


def user_function(name: str) -> str:
    """The user's function behind a Dynamo-generated name
    (``torch_dynamo_resume_in_forward_at_165`` -> ``forward``); other names unchanged."""
    while (match := RESUME_FUNCTION.match(name)) is not None:
        name = match.group(1)
    return name


def _placeholder_path(match: re.Match[str]) -> str:
    """``l_self_modules_w3_parameters_weight_`` -> ``self.w3.weight``; ``l_args_0_`` ->
    ``args[0]``."""
    local, rest = match.group(1), match.group(2)
    if local == "args" and rest.isdigit():
        return f"args[{rest}]"
    parts = [local, *(p for p in _MANGLED_ITEM.split("_" + rest if rest else "") if p)]
    parts = [p.strip("_") for p in parts if p.strip("_") not in _TORCH_WRAPPERS]
    return ".".join(p for p in parts if p)


def resume_names(text: str) -> str:
    """``text`` with every resume function named by the user's function it continues."""
    while _RESUME_IN_TEXT.search(text):
        text = _RESUME_IN_TEXT.sub(r"\1", text)
    return text


def user_names(text: str) -> str:
    """``text`` with Dynamo's generated names said in the user's terms: a resume function by
    the user's function it continues, a stack slot as the value carried across the break, a
    mangled placeholder by the attribute path it was read from."""
    if "torch_dynamo_resume_in_" in text:
        text = resume_names(text)
    if "___stack" in text:
        text = _STACK.sub(r"value \1 carried across the break", text)
    if "l_" in text:
        text = _PLACEHOLDER.sub(_placeholder_path, text)
    return text


def has_generated_name(text: str) -> bool:
    """Whether ``text`` still holds a name only Dynamo would write."""
    return bool("torch_dynamo_resume" in text or "___stack" in text or _PLACEHOLDER.search(text))
