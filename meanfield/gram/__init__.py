r"""NNGP and NTK Gram matrices on a set of inputs of any norms (issue 12).

:func:`kernels` returns the infinite-width NNGP kernel K(x, x') and neural
tangent kernel Theta(x, x') of the network's output, for every pair of rows
of ``x1`` (and ``x2``), at any depth.

Where the maths comes from
--------------------------
The primitive tree is the one source of truth. Every primitive has a
:meth:`~meanfield.calculus.Primitive.gram` method mapping the state of a
pair of inputs x, x' of any norms (:class:`~meanfield.calculus.GramSignal`:
K1 = E[z(x)^2], K2 = E[z(x')^2], K12 = E[z(x) z(x')], the means m1, m2 of a
post-activation signal and the NTK T12 = Theta(x, x')). Pushing symbols
(K1, K2, K12, T12) through the block gives one sympy expression per output
(activations contribute their closed-form two-point moments
``Activation.kernel`` / ``Activation.derivative_kernel``: the arc-cosine
kernels for ReLU-like phi, Williams' erf kernel, the GELU kernel; any other
activation the Hermite series of :mod:`meanfield._gram_quadrature`, with its
truncation bound, over the whole array); it is compiled once to numpy and applied
to whole (n1, n2) arrays, layer after layer. The diagonal K(x, x) is the same
map at K1 = K2 = K12.

Per primitive (i = 1, 2 the two inputs; sqrt(v1 v2) the normalising divisors):

=====================  ===========================================  ==================================
primitive              (K1, K2, K12)                                 Theta12
=====================  ===========================================  ==================================
Dense(sw, sb)          sw^2 K + sb^2                                'ntk': K12' + sw^2 Theta;
                                                                    'standard': n K12 + 1 + sw^2 Theta
act(phi)               E[phi(u)^2], E[phi(v)^2], E[phi(u) phi(v)]   E[phi'(u) phi'(v)] Theta
layer_norm (pre/post)  1, 1, (K12 - m1 m2) / sqrt(v1 v2),           Theta / sqrt(v1 v2)
                       v_i = K_i - m_i^2
rms_norm               1, 1, K12 / sqrt(K1 K2)                      Theta / sqrt(K1 K2)
batch_norm (batch)     K -> n P K P / tr(P K P) over the batch       Theta -> n P Theta P / tr(P K P)
scale(eps)             eps^2 K                                      eps^2 Theta
residual(branch, mu)   branch(K) + mu^2 K                           branch(Theta) + mu^2 Theta
=====================  ===========================================  ==================================

with (u, v) zero-mean Gaussian, Var u = K1, Var v = K2, Cov = K12;
P = I - 1 1^T / n centres over the n inputs of the batch (BatchNorm's row
is a map of the batch's whole (n, n) matrices: ``BatchNorm.gram_batch``,
see below). The NTK
rules are Theta^{l+1} = (the layer's own parameters) + J Theta^l J^T per
unit: a Dense layer's fresh weights make Theta diagonal over units at
infinite width (Jacot et al. 2018, Thm. 1; Arora et al. 2019, eq. 9-10), an
element-wise phi multiplies by phi'(u) phi'(v), a normalisation's Jacobian
is I/sqrt(v) up to rank-one terms that are O(1/N) per unit (the same
argument as for its APJN factor, partial-Jacobian D.4), a residual's cross
terms vanish because the branch ends in zero-mean weights.

Conventions: the two parameterisations side by side
----------------------------------------------------
Both give the same network function at initialisation, hence the same NNGP;
they differ in which variables gradient descent trains, hence in the NTK.

===============  ==================================  ===================================
                 ``parameterization="ntk"``           ``parameterization="standard"``
===============  ==================================  ===================================
layer            h' = sigma_w w z / sqrt(n) +         h' = W z + b,
                 sigma_b beta                         W ~ N(0, sigma_w^2 / n), b ~ N(0, sigma_b^2)
trained          w, beta ~ N(0, 1)                    W, b
Dense's own      sigma_w^2 E[z z'] + sigma_b^2        n E[z z'] + 1
NTK term
first layer      Theta^1 = K^1                        Theta^1 = x.x' + 1
===============  ==================================  ===================================

with n the fan-in (the input dimension d for the first layer, ``width``
for hidden layers; E[z z'] = x.x'/d at the input) and
K^1(x, x') = sigma_w^2 x.x'/d + sigma_b^2 in both. These are
neural-tangents' conventions (``stax.Dense(parameterization=...)`` with
``s=(1, 1)``): in the standard parameterisation the NTK grows linearly with
the width, so ``width`` must be given; the bias is trained (its term, 1, is
there even when sigma_b = 0).

What is exact, and what is refused
----------------------------------
* MLPs with any activation, LayerNorm before or after the activation,
  RMSNorm, residual strength mu, LayerScale (``scale``): exact
  infinite-width limits (sequential limit, width -> infinity layer by
  layer), any input norms.
* BatchNorm (per unit over the batch, biased variance, no epsilon, no
  affine: the torch realisation's convention) couples the inputs of a
  batch, so the kernel of two inputs depends on the whole batch. The batch
  is the rows of ``x1`` (``x2`` is refused); between BatchNorms the tree's
  pair maps act entry by entry on the batch's (n, n) matrices, and at each
  BatchNorm ``BatchNorm.gram_batch`` applies the large-batch limit
  K -> n PKP / tr(PKP), Theta -> n P Theta P / tr(PKP). It is exact as the
  batch's effective size n_eff = tr(PKP)^2 / tr((PKP)^2) -> infinity (the
  divisor self-averages; the Jacobian's cross-sample terms y y^T / n and the
  divisor's fluctuations are O(1 / n_eff)), which needs many inputs with
  small correlations after centring. ``Kernels.batch_n_eff`` reports it per
  block. With ReLU-like phi (E[phi] != 0) and inputs of different norms,
  the per-input scales sqrt(K(x, x)) enter the next kernel as a rank-one
  term that centring does not remove, and n_eff falls with depth (79 -> 14
  over 20 blocks for a batch of 128): the limit is not reached there.
* ResMLP and MLP-Mixer (any tree with token mixing): inputs are images
  (n, T, d), the readout is the mean over the tokens, and the state is the
  (nT) x (nT) one-channel and two-channel matrices of
  :mod:`meanfield.gram.tokens`. It is the limit of infinitely many channels
  and tokens together (the single-input Mixer theory's limit), exact for
  sigma_b = 0, odd phi and tokens orthogonal across positions, an
  approximation elsewhere. At depth the same-image entries converge slowly:
  the NTK needs many tokens, the NNGP many more channels than tokens
  (docs/gram.md has the Monte-Carlo numbers).

Numerics
--------
Correlations are clipped to [-1, 1] before arccos/arcsin and the square roots
of variances that vanish at correlation 1 (sqrt(K1 K2 - K12^2)) to >= 0, so
nothing is NaN at or near correlation 1. Near rho = +-1 the rounded K's know
rho only to ~1e-16 absolute, while the arc-cosine kernels depend on
theta ~ sqrt(2 (1 - rho)); so the pairs with 1 - rho^2 < 1e-3 go through the
block map that also carries their gap 1 - rho^2 exactly
(:class:`~meanfield.calculus.GramSignal` ``gap``: from the input rows by
projection, then every rule's cancellation-free update, ``gap.sum_gap``
for Dense and residual, ``Activation.kernel_gap`` for the ReLU family, erf and
GELU, the centred gap for LayerNorm), with K12 taken from the gap. Blocks with an
activation that has no gap map (the quadrature activations) use (K1, K2,
K12) alone; there and in the Mixer, a correlation within 1e-15 of
+-1 is taken as +-1 where an arccos sees it (exactly parallel pairs, the
diagonal after a LayerNorm). Against a 50-digit recursion from the float64
inputs, pairs with 1 - rho (or 1 + rho) from 1e-6 to 1e-15 keep ~1e-14 at
depth 32 for the ReLU family, erf and GELU, up to 4e-13 where correlation 1 is
unstable (docs/gram.md, Numerics, has the table). ResMLP's token walk
(:mod:`meanfield.gram.tokens`) and the BatchNorm walk carry the gap too (BatchNorm
through the squared distance E(h_a - h_b)^2, which its centring only rescales:
``_BatchWalk._batch_norm_gap``); the Mixer does not, and its NTK of an equal-norm
ReLU pair is right to ~1e-13 / sqrt(1 - rho) (measured at depth 20). LayerNorm after an activation
with phi(0) != 0 centres with the activation's covariances of phi - phi(0)
(``Activation.centred_kernel``), not K - m^2: at small K those differences of
numbers ~phi(0)^2 lost ~1e-16/K. Two-point forms that divide
by a Gram determinant (erf, GELU: (1 + c K1)(1 + c K2) - c^2 K12^2) evaluate
it as one node (``activations.pair_det``, or with the carried gap) that is
exact for identical inputs, and arcsin as an arctangent of the exact gap, so
large K loses nothing at correlation 1. A result that breaks Cauchy-Schwarz is
refused (ValueError) rather than returned. A non-finite result (a kernel beyond
float64, a zero signal normalised) is a ValueError too. Identical inputs
(the diagonal, repeated rows) are pinned to the diagonal map at every layer
(with BatchNorm, to the diagonal entry of the batch's matrix):
in the chaotic phase correlation 1 is an unstable fixed point, and a
rounding difference of 1e-16 would otherwise grow by chi_c per layer to an
O(1) error.

Code
----
:mod:`~meanfield.gram.dispatch` (``kernels``: the arguments, the walk that fits the tree, the result checked)
uses three walks: :mod:`~meanfield.gram.pair_walk` (the pair map over (n1, n2) arrays, near pairs through the
gap map), :mod:`~meanfield.gram.batch` (BatchNorm over the batch's (n, n) matrices) and
:mod:`~meanfield.gram.tokens` (token blocks over images); they share the input layer
(:mod:`~meanfield.gram.input_layer`) and the compiled pair maps (:mod:`~meanfield.gram.pair_maps`).
"""
from __future__ import annotations

from .dispatch import kernels
from .pair_maps import PARAMETERIZATIONS, gram_map
from .result import Kernels

__all__ = ["Kernels", "kernels", "gram_map"]

# The public names carry their public path, wherever in the subpackage they are defined: a saved result names
# its class by module.qualname (meanfield._serialize) and is loaded by importing that module, so files written
# before meanfield/gram/ was split ("meanfield.gram.Kernels") and after it name the same, and the API
# reference (docs/api.rst) documents them here
for _public in (Kernels, kernels, gram_map):
    _public.__module__ = __name__
del _public
