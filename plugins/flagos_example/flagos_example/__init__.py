"""flagos-example: the template flagos plugin.

Nothing to import by hand: flagos-core finds the plugin through its
`flagos.plugins` entry point (flagos_example.plugin) when it is imported.
It contributes two kernel providers, `example_cpp` (C++: add.Tensor,
mul.Tensor) and `example_py` (Python: neg, relu), and a routing conf.
"""

__version__ = "0.3.1"
