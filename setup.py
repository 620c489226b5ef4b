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

extensions = [
    Extension(name, [source], include_dirs=[np.get_include()])
    for name, source in CYTHON_MODULES.items()
]

setup(ext_modules=cythonize(extensions, compiler_directives={'language_level': 3}))
