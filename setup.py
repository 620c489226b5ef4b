"""Builds Detectron's compiled box kernels; package metadata lives in pyproject.toml.

lib/cython_nms.pyx and lib/cython_bbox.pyx become detectron.utils.cython_nms and
detectron.utils.cython_bbox, the module names Detectron code imports.
"""
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

extensions = [
    Extension(name, [source], include_dirs=[np.get_include()], extra_compile_args=COMPILE_ARGS)
    for name, source in CYTHON_MODULES.items()
]

setup(ext_modules=cythonize(extensions, compiler_directives={'language_level': 3}))
