import os
import sys

# Make ``tests/helpers.py`` importable as ``helpers`` from every test module.
sys.path.insert(0, os.path.dirname(__file__))
