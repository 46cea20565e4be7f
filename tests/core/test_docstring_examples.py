"""Every example in the public docstrings runs and prints what it says (CPU path)."""

import doctest

import pytest

import rl_triton_core._report as report
import rl_triton_core.estimators as estimators
import rl_triton_core.groups as groups
import rl_triton_core.tokens as tokens

PUBLIC = [(m, name) for m in (estimators, tokens, groups, report) for name in m.__all__]


@pytest.mark.parametrize("module,name", PUBLIC, ids=[n for _, n in PUBLIC])
def test_docstring_example(module, name, monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    fn = getattr(module, name)
    assert ">>>" in (fn.__doc__ or ""), f"{name} has no runnable example"
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(fn, name, globs={}):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0
