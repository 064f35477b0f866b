"""The `composite` provider: flagos's own kernels, written with other ATen
ops, for overloads that PyTorch's composite code calls on PrivateUse1 tensors
but that a native device may lack.

PyTorch's code calls, for a PrivateUse1 tensor as for a CUDA one, kernels
that only CUDA (and XPU) implement: the fused LSTM and GRU cells
(recurrent.py), `rms_norm`'s fused backward and SyncBatchNorm's statistics
kernels (norms.py). Model code written for CUDA calls `histc` on integers,
which CPU's kernel refuses (histc.py). The router sends an overload here only
where the runtime's own provider has no kernel for it, or declines it (the
host runtime declines `histc`); on CUDA the native kernels run. Each kernel
computes what CUDA's does, in the same order of operations where it can. The
ops they call are flagos calls, routed as usual.
"""

import flagos_core

from . import histc, norms, recurrent

NAME = "composite"

# Keys are overload names as `python -m flagos_core routes` lists them.
KERNELS = {
    "_thnn_fused_lstm_cell": recurrent.fused_lstm_cell,
    "_thnn_fused_lstm_cell_backward_impl": recurrent.fused_lstm_cell_backward_impl,
    "_thnn_fused_gru_cell": recurrent.fused_gru_cell,
    "_thnn_fused_gru_cell_backward": recurrent.fused_gru_cell_backward,
    "_fused_rms_norm_backward": norms.fused_rms_norm_backward,
    "batch_norm_stats": norms.batch_norm_stats,
    "batch_norm_gather_stats": norms.batch_norm_gather_stats,
    "batch_norm_gather_stats_with_counts": norms.batch_norm_gather_stats_with_counts,
    "batch_norm_elemt": norms.batch_norm_elemt,
    "batch_norm_backward_reduce": norms.batch_norm_backward_reduce,
    "batch_norm_backward_elemt": norms.batch_norm_backward_elemt,
    "histc": histc.histc,
}


def register():
    flagos_core.register_python_provider(NAME, KERNELS)
