"""flagos-cuda: the flagos device on NVIDIA GPUs.

Nothing to import by hand: flagos-core finds this plugin through the
`flagos.plugins` entry point and activates it where a CUDA GPU is present.
"""

__version__ = "0.1.5"
