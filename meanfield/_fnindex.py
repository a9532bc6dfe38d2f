"""Names and indices of the compiled expression functions (no numba import here).

:mod:`meanfield.numeric` compiles one function per name, in this order, and
the solver kernels of :mod:`meanfield._kernels` index the tuple with these
constants.
"""
FUNCTIONS = (
    "kernel", "kernel12", "chi_J", "chi_K", "chi_Delta", "dkernel_dK12", "dkernel12_dK",
    "dkernel12_dK12", "dkernel_dW", "dkernel_dT", "dchiJ_dK", "dchiJ_dW", "dchiJ_dT",
    "dchiK_dK", "dchiK_dW", "dchiK_dT")

KERNEL, KERNEL12, CHI_J, CHI_K, CHI_DELTA, DK_DQ, DQ_DK, DQ_DQ, DK_DW, DK_DT, DX_DK, DX_DW, DX_DT, \
    DC_DK, DC_DW, DC_DT = range(len(FUNCTIONS))

#: factors "at K = inf" are evaluated this far along the growth (the kernels and the
#: Python-level solvers share it; here because importing meanfield._kernels imports numba)
KINF = 1e100
