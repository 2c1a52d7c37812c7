"""Tiny wheels the requirements tests build here, with no network: a pure-Python package and one with a C extension,
each from a source directory the test writes, by `pip wheel --no-build-isolation` (the venv's own setuptools)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PURE_SETUP = """from setuptools import setup
setup(name="tinypure", version="1.0", py_modules=["tinypure"])
"""
EXT_SETUP = """from setuptools import Extension, setup
setup(name="tinyext", version="2.0", ext_modules=[Extension("tinyext", ["tinyext.c"])])
"""
EXT_C = r"""#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *arg) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(2 * v);
}
static PyMethodDef methods[] = {{"twice", twice, METH_O, "2 * n, in C"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tinyext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_tinyext(void) { return PyModule_Create(&module); }
"""


def offline_env() -> dict[str, str]:
    """pip with no index at all: what is not in a --find-links directory does not exist."""
    return {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def build(root: Path, name: str, files: dict[str, str], out: Path) -> Path:
    src = root / f"src-{name}"
    src.mkdir(parents=True)
    for rel, text in files.items():
        (src / rel).write_text(text)
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, env=offline_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return next(out.glob(f"{name}-*.whl"))


def tiny_wheels(root: Path) -> Path:
    """root/wheels with tinypure-1.0 (py3-none-any) and tinyext-2.0 (this CPython, linux_x86_64)."""
    out = root / "wheels"
    build(root, "tinypure", {"setup.py": PURE_SETUP, "tinypure.py": "VALUE = 42\n"}, out)
    build(root, "tinyext", {"setup.py": EXT_SETUP, "tinyext.c": EXT_C}, out)
    return out
