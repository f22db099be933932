# The compiled core (src/cpp/module.cpp, nanobind). Its functions take the launchers'
# operands and return plain Python values; to the type checker every name is Any.
from typing import Any

def __getattr__(name: str) -> Any: ...
