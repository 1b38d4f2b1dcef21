"""Only the compiled part of edgekit; everything else is in pyproject.toml.

edgekit.runtime._logitstats is the logit-statistics kernel of the drafting loop (GCC or
Clang vector extensions). It is optional: without such a compiler edgekit
installs without it and computes the same statistics with numpy, several times
slower (edgekit.runtime._logits).
"""

import sys

from setuptools import Extension, setup

args = [] if sys.platform == "win32" else ["-O3", "-fno-math-errno", "-fno-trapping-math"]

setup(
    ext_modules=[
        Extension(
            "edgekit.runtime._logitstats",
            ["edgekit/runtime/_logitstats.c"],
            depends=["edgekit/runtime/_logitstats_kernel.h", "edgekit/runtime/_logitstats_kernels.h"],
            extra_compile_args=args,
            optional=True,
        )
    ]
)
