r"""The scaling calculus of Defazio & Bottou, *Beyond folklore* (**SC**): pure maths, no torch.

Model (SC section 3): at initialisation every activation tensor x_l (n_l
channels, rho_l x rho_l positions) has i.i.d. entries, its back-propagated
gradient Delta x_l is uncorrelated with it, weights are i.i.d. symmetric and
biases zero. E[.] is the element-wise *uncentred* second moment.

- activation scaling factor (Definition 1, eq. 1):
  ``varsigma_l = n_l rho_l^2 E[Delta x_l^2] E[x_l^2]``;
- layer (weight) scaling factor of a k x k convolution or a linear layer
  (k = 1) (Definition 2, eq. 2):
  ``gamma_l = varsigma_l / (n_{l+1} n_l k^2 E[W^2]^2)``, equal to the
  weight-to-gradient ratio ``nu_l = E[Delta W^2] / E[W^2]`` (SC Prop. 3/6)
  and, extrinsically, to ``n_l k^2 rho_{l+1}^2 E[x_l^2]^2 E[Delta y^2] / E[y^2]``;
- geometric initialisation (eq. 3): ``E[W^2] = c / (k sqrt(n_l n_{l+1}))``
  gives gamma_l = varsigma / c^2 for every layer, so when the operations in
  between maintain varsigma (SC table 1: ReLU, linear/conv, skip, average
  pooling, dropout, scalar multipliers) all layers are equally scaled;
- practical advice (section 6.2): c = 2 / k with k the network's typical
  kernel size, and a fixed multiplier ``sqrt(k_typical / k)`` in front of
  every layer whose kernel size k differs (so the forward second moment
  follows eq. 6, E[x_{l+1}^2] = sqrt(n_l / n_{l+1}) E[x_l^2], after ReLU).

Departures from the printed text (recorded in docs/errata.md):

* Definition 2's extrinsic form prints rho_l^2; the weight-gradient ratio
  (appendix D: E[Delta W^2] = rho^2 E[x^2] E[Delta y^2] sums over *output*
  positions) and appendix C give rho_{l+1}^2. The two agree for stride 1 and
  for linear layers; :func:`layer_scaling_factor_extrinsic` uses rho_{l+1}.
* Table 1's "average pooling maintains scaling" needs centred inputs: after
  a ReLU (non-zero mean) the forward second moment of a k x k average is not
  E[x^2] / k^2 and varsigma changes (measured by
  :func:`meanfield.torch.scaling.check_table1`).
* Appendix B.7 says the backward second moment of a residual block is
  "multiplied by s"; the formula (and the conclusion) use (1 + s^2).

Kernel sizes may be given as an int k or a tuple (kernel area k^2 = prod),
spatial sizes likewise (rho^2 = prod).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._validate import check_positive

__all__ = [
    "TABLE1",
    "Table1Row",
    "kernel_area",
    "geometric_variance",
    "fan_in_variance",
    "fan_out_variance",
    "xavier_variance",
    "recommended_c",
    "kernel_multiplier",
    "activation_scaling_factor",
    "layer_scaling_factor",
    "layer_scaling_factor_extrinsic",
    "bias_scaling_factor",
    "geometric_output_second_moment",
    "input_scale",
]


class Table1Row(NamedTuple):
    operation: str
    maintains: bool
    note: str


#: SC table 1, "Scaling of common layers", as printed.
TABLE1 = (
    Table1Row("Linear layer", True, "Layer scaling requires geometric initialization"),
    Table1Row("(Strided) convolution", True, "Requires stride equal to the kernel size"),
    Table1Row("Skip connections", True, "Operations within residual blocks are scaled correctly against "
                                        "other residual blocks, but not against outside operations"),
    Table1Row("Average pooling", True, "Requires stride equal to the kernel size"),
    Table1Row("Max pooling", False, ""),
    Table1Row("Dropout", True, ""),
    Table1Row("ReLU/LeakyReLU", True, "Any positively-homogenous function with degree 1"),
    Table1Row("Sigmoid", False, ""),
    Table1Row("Tanh", False, "Maintains scaling if entirely within the linear regime"),
)


def kernel_area(kernel_size) -> float:
    """k^2 for an int k, prod(kernel_size) for a tuple (rectangular kernels)."""
    if np.ndim(kernel_size) == 0:
        k = float(check_positive("kernel_size", kernel_size))
        return k * k
    ks = [float(check_positive("kernel_size", v)) for v in kernel_size]
    return float(np.prod(ks))


def _k(kernel_size) -> float:
    """The paper's k (sqrt of the kernel area)."""
    return math.sqrt(kernel_area(kernel_size))


def geometric_variance(fan_in, fan_out, kernel_size=1, c=2.0):
    """E[W^2] = c / (k sqrt(n_in n_out)) (SC eq. 3)."""
    n_in, n_out = check_positive("fan_in", fan_in), check_positive("fan_out", fan_out)
    c = check_positive("c", c)
    return c / (_k(kernel_size) * np.sqrt(n_in * n_out))


def fan_in_variance(fan_in, kernel_size=1, gain=2.0):
    """Kaiming fan-in: gain / (n_in k^2) (SC eq. 4)."""
    return check_positive("gain", gain) / (check_positive("fan_in", fan_in) * kernel_area(kernel_size))


def fan_out_variance(fan_out, kernel_size=1, gain=2.0):
    """Kaiming fan-out: gain / (n_out k^2) (SC eq. 4)."""
    return check_positive("gain", gain) / (check_positive("fan_out", fan_out) * kernel_area(kernel_size))


def xavier_variance(fan_in, fan_out, kernel_size=1, gain=2.0):
    """Arithmetic mean (Glorot, with the ReLU gain of SC eq. 5): gain / ((n_in + n_out)/2 k^2)."""
    n_in, n_out = check_positive("fan_in", fan_in), check_positive("fan_out", fan_out)
    return check_positive("gain", gain) / ((n_in + n_out) / 2 * kernel_area(kernel_size))


def recommended_c(typical_kernel_size=1):
    """c = 2 / k for a ReLU network whose typical kernel size is k (SC section 6.2)."""
    return 2.0 / _k(typical_kernel_size)


def kernel_multiplier(kernel_size, typical_kernel_size=1):
    """Fixed multiplier sqrt(k_typical / k) before a layer of kernel size k (SC section 6.2).

    With c = 2 / k_typical the geometric layer multiplies the forward second
    moment by c k sqrt(n_in / n_out); the multiplier's square cancels k / k_typical.
    """
    return math.sqrt(_k(typical_kernel_size) / _k(kernel_size))


def activation_scaling_factor(channels, spatial, grad_second_moment, second_moment):
    """varsigma = n rho^2 E[Delta x^2] E[x^2] (SC Definition 1); ``spatial`` is rho (int) or a shape."""
    rho2 = kernel_area(spatial) if np.ndim(spatial) else float(spatial) ** 2
    return channels * rho2 * np.asarray(grad_second_moment) * np.asarray(second_moment)


def layer_scaling_factor(varsigma, fan_in, fan_out, kernel_size, weight_second_moment):
    """gamma = varsigma / (n_out n_in k^2 E[W^2]^2) (SC Definition 2, eq. 2)."""
    w2 = np.asarray(weight_second_moment, dtype=np.float64)
    return np.asarray(varsigma) / (fan_out * fan_in * kernel_area(kernel_size) * w2 * w2)


def layer_scaling_factor_extrinsic(fan_in, kernel_size, out_spatial, x2, y2, dy2):
    """gamma = n_in k^2 rho_out^2 E[x^2]^2 E[Delta y^2] / E[y^2] (SC appendix C; see the module note)."""
    rho2 = kernel_area(out_spatial) if np.ndim(out_spatial) else float(out_spatial) ** 2
    x2 = np.asarray(x2, dtype=np.float64)
    return fan_in * kernel_area(kernel_size) * rho2 * x2 * x2 * np.asarray(dy2) / np.asarray(y2)


def bias_scaling_factor(spatial, grad_second_moment, second_moment):
    """gamma^b = rho^2 E[Delta x^2] / E[x^2] (SC Definition 5, eq. 7)."""
    rho2 = kernel_area(spatial) if np.ndim(spatial) else float(spatial) ** 2
    return rho2 * np.asarray(grad_second_moment) / np.asarray(second_moment)


def geometric_output_second_moment(widths, input_second_moment=1.0):
    """E[x_l^2] through a ReLU network with geometric init, c = 2/k (SC eqs. 6-7).

    Returns the array E[x_0^2] sqrt(n_0 / n_l) for the given widths n_0..n_L.
    """
    n = check_positive("widths", widths)
    return float(input_second_moment) * np.sqrt(n[0] / n)


def input_scale(in_channels, kernel_size=1):
    """Input multiplier (n_0 k_0^2)^{-1/4} that balances first-layer weights and biases (SC 8.1).

    It makes E[x_0^2] = 1 / sqrt(n_0 k_0^2) for unit-variance data.
    """
    return float((check_positive("in_channels", in_channels) * kernel_area(kernel_size)) ** -0.25)
