"""Custom model factories: the happy paths and every failure as a one-line SpecError with a hint."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from gbdoctor.errors import SpecError
from gbdoctor.models import block_container, build_model, vocab_size
from gbdoctor.models.custom import load_factory
from gbdoctor.records import ModelSpec

GOOD = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.relu(self.lin(x))

class Tiny(nn.Module):
    def __init__(self, n_layers, dim=16, vocab=97):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(n_layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)

def build(flavor):
    return Tiny({"small": 2, "big": 4}[flavor])
"""


def _write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _spec_error(ref, flavor="small") -> SpecError:
    with pytest.raises(SpecError) as exc:
        load_factory(ref, flavor)
    err = exc.value
    assert "\n" not in err.message and err.hint, err.message
    return err


def test_file_factory(tmp_path):
    path = _write(tmp_path, "tiny_model.py", GOOD)
    model = build_model(ModelSpec(name="custom", flavor="big", factory=f"{path}:build"))
    assert vocab_size(model) == 97
    assert [fqn for fqn, _ in block_container(model)] == [f"layers.{i}" for i in range(4)]
    assert model(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, 97)


def test_file_factory_relative_to_cwd_and_on_meta(tmp_path, monkeypatch):
    _write(tmp_path, "tiny_model.py", GOOD)
    monkeypatch.chdir(tmp_path)
    model = build_model(
        ModelSpec(name="custom", flavor="small", factory="tiny_model.py:build"), device="meta"
    )
    assert all(p.is_meta for p in model.parameters())


def test_module_factory(tmp_path, monkeypatch):
    _write(tmp_path, "gbd_test_custom_pkg_mod.py", GOOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        model = load_factory("gbd_test_custom_pkg_mod:build", "small")
        assert len(model.layers) == 2
        err = _spec_error("gbd_test_custom_pkg_mod:make")
        assert "no attribute 'make'" in err.message and "build" in err.hint
    finally:
        sys.modules.pop("gbd_test_custom_pkg_mod", None)


def test_missing_file(tmp_path):
    err = _spec_error(f"{tmp_path}/absent.py:build")
    assert "absent.py" in err.message and "does not exist" in err.message


def test_missing_module():
    err = _spec_error("gbd_no_such_module_xyz.models:build")
    assert "not found" in err.message and "gbd_no_such_module_xyz" in err.message


def test_bad_format():
    err = _spec_error("model.py")
    assert "target:function" in err.message


def test_file_that_fails_to_import(tmp_path):
    path = _write(tmp_path, "broken.py", "import torch\nraise RuntimeError('boom\\nsecond line')\n")
    err = _spec_error(f"{path}:build")
    assert "broken.py" in err.message and "RuntimeError: boom" in err.message
    path = _write(tmp_path, "syntax.py", "def build(:\n")
    assert "SyntaxError" in _spec_error(f"{path}:build").message


def test_bad_attribute(tmp_path):
    path = _write(tmp_path, "tiny_model.py", GOOD)
    err = _spec_error(f"{path}:buidl")
    assert "no attribute 'buidl'" in err.message and "build" in err.hint
    err = _spec_error(f"{_write(tmp_path, 'const.py', 'build = 3')}:build")
    assert "not a function" in err.message


def test_factory_raising(tmp_path):
    path = _write(tmp_path, "tiny_model.py", GOOD)
    err = _spec_error(f"{path}:build", flavor="huge")
    assert "raised KeyError" in err.message and "'huge'" in err.message and str(path) in err.message


@pytest.mark.parametrize(
    "body, phrase",
    [
        ("def build(flavor):\n    return {'layers': []}\n", "not a torch.nn.Module"),
        (
            "from torch import nn\ndef build(flavor):\n    return nn.Sequential(nn.Embedding(3, 2))\n",
            "no non-empty ModuleList",
        ),
        (
            "from torch import nn\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.layers = [nn.Linear(2, 2)]\n        self.e = nn.Embedding(3, 2)\n"
            "def build(flavor):\n    return M()\n",
            "layers is a plain Python list",
        ),
        (
            "from torch import nn\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.layers = nn.ModuleList([nn.Linear(2, 2)])\n"
            "def build(flavor):\n    return M()\n",
            "no nn.Embedding",
        ),
        (
            "from torch import nn\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.layers = nn.ModuleDict()\n        self.e = nn.Embedding(3, 2)\n"
            "def build(flavor):\n    return M()\n",
            "no non-empty ModuleList",
        ),
    ],
)
def test_wrong_return(tmp_path, body, phrase):
    path = _write(tmp_path, "wrong.py", body)
    err = _spec_error(f"{path}:build")
    assert phrase in err.message and "wrong.py" in err.message
