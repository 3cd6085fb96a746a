"""examples/train_*.py need PyTorch and a GPU to run; here they must at least compile."""

import py_compile
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("train_*.py"))


def test_there_are_training_examples():
    assert EXAMPLES, "no examples/train_*.py found"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_compiles(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / (path.name + "c")), doraise=True)


def test_train_transformer_arguments_parse_without_torch(monkeypatch):
    import importlib.util

    path = next(p for p in EXAMPLES if p.name == "train_transformer.py")
    spec = importlib.util.spec_from_file_location("train_transformer_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports no torch at module level
    args = mod.parse_args(["--allocator", "stitch-expandable", "--steps", "3"])
    assert args.allocator == "stitch-expandable" and args.steps == 3
    with pytest.raises(SystemExit):
        mod.parse_args(["--min-len", "9", "--max-len", "8"])
