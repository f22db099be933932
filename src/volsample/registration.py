"""``volsample.registration``: 3-D registration in physical space, whose home is the
applications' wing (``volsample.apps.registration``). This name is that module itself,
not a copy: what is set on either name, the registration reads.
"""
import sys

from .apps import registration
from .apps.registration import *  # noqa: F403  (its names, as type checkers read them)

sys.modules[__name__] = registration
