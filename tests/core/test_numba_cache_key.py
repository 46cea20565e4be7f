"""numba's disk cache must hit in a fresh process: its key hashes each function's closure
contents, pickled. A jitted function in a closure pickles differently per process (the
CPU scan held one: every process compiled its variants again, ~2.5 s each, and added
cache files, 1.8 GB of them on the development machine)."""

import subprocess
import sys

import pytest

pytest.importorskip("numba")

CODE = r"""
import hashlib
from numba.core.serialize import dumps
from rl_triton_core.scan import _cpu
from rl_triton_core.token import _token_cpu
fns = [_cpu._build(m, r, True, True, False, True, False, False, False, False, False, False, False)
       for m in (0, 1) for r in (True, False)]
fns += list(_token_cpu.SCANS.values()) + list(_token_cpu.WHITENS.values())
for f in fns:
    cells = f.py_func.__closure__ or ()
    print(hashlib.sha256(dumps(tuple(c.cell_contents for c in cells))).hexdigest())
"""


def test_cache_keys_repeat_across_processes():
    runs = [subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(2)]
    assert len(runs[0]) >= 8
    assert runs[0] == runs[1]
