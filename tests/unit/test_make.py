"""The Makefile's recipes, as a shell that runs them meets them."""

from __future__ import annotations

import os
import subprocess
import sys


def test_recipes_run_python_with_its_bytecode_caches_whatever_the_shell_says(tmp_path, repo):
    """A shell that sets PYTHONDONTWRITEBYTECODE would make every Python process of a run or a
    test session compile the modules it imports again: make's recipes do not inherit it."""
    probe = tmp_path / "probe.mk"
    probe.write_text(f"include {repo / 'Makefile'}\n"
                     f"probe:\n\t@{sys.executable} -c 'import sys; print(sys.dont_write_bytecode)'\n")
    done = subprocess.run(["make", "-s", "-f", str(probe), "probe"], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
