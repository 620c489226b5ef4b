"""Builds Detectron's compiled box kernels; package metadata lives in pyproject.toml.

lib/cython_nms.pyx and lib/cython_bbox.pyx become detectron.utils.cython_nms and
detectron.utils.cython_bbox, the module names Detectron code imports.
"""
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

CYTHON_MODULES = {
    'detectron.utils.cython_nms': 'lib/cython_nms.pyx',
    'detectron.utils.cython_bbox': 'lib/cython_bbox.pyx',
}

# Neither flag changes a result: without FP traps the compiler may vectorize branch-free min/max
# and select loops (the variance-voting IoU pass); no contraction into FMA keeps every float32
# product and sum rounded on its own, as the torch and numpy code these kernels must match.
COMPILE_ARGS = ['-fno-trapping-math', '-ffp-contract=off']

# Linked to libm, `exp` binds to glibc's current entry point; unlinked it resolved to the 2.2.5
# compat symbol, an older wrapper around the same routine (identical results), a few percent slower.
LIBRARIES = [] if sys.platform == 'win32' else ['m']


def openmp_flags():
    """-fopenmp where the C compiler builds an OpenMP program, else none (the NMS kernels then run
    on one thread). With it cython_nms shares torch's OpenMP runtime (libgomp.so.1) and threads,
    which stay awake between torch's parallel regions."""
    compiler = shlex.split(os.environ.get('CC') or sysconfig.get_config_var('CC') or 'cc')
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, 'probe.c')
        with open(source, 'w') as f:
            f.write('#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n')
        try:
            built = subprocess.run(compiler + ['-fopenmp', source, '-o', os.path.join(tmp, 'probe')],
                                   capture_output=True).returncode == 0
        except OSError:
            built = False
    return ['-fopenmp'] if built else []


OPENMP = {'detectron.utils.cython_nms': openmp_flags()}
extensions = [
    Extension(name, [source], include_dirs=[np.get_include()], libraries=LIBRARIES,
              extra_compile_args=COMPILE_ARGS + OPENMP.get(name, []), extra_link_args=OPENMP.get(name, []))
    for name, source in CYTHON_MODULES.items()
]

setup(ext_modules=cythonize(extensions, compiler_directives={'language_level': 3}))
