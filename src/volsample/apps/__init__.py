"""The applications built on volsample's operators: 3-D registration (``registration``,
public as ``volsample.registration``), the ``volsample register`` / ``demo`` and
``volsample bench`` commands (``register``, ``bench``, ``bench_register``) and the
ahead-of-time compilation of the Triton kernels (``triton_aot``, ``python -m
volsample.apps.triton_aot``).

The wing stands above the library: its modules import the operators, the backends and the
op layer, and nothing outside the wing imports them but the command line (``cli``) and
the public name ``volsample.registration``. Importing ``volsample`` imports none of them.
"""
