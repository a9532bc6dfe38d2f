"""The scaling calculus (meanfield.scaling, meanfield.torch.scaling).

The formula tests re-derive the paper's statements by hand; the Monte-Carlo
tests measure forward/backward second moments on real torch layers.
"""
import math

import numpy as np
import pytest

import meanfield.scaling as SC


# ---------------------------------------------------------------------------
# Formulas.
# ---------------------------------------------------------------------------
def test_geometric_initialisation_gives_gamma_varsigma_over_c_squared():
    c, varsigma = 0.7, 3.0
    layers = [(3, 64, 3), (64, 128, 1), (128, 32, 5), (32, 10, 1)]  # (n_in, n_out, k)
    gammas = []
    for n_in, n_out, k in layers:
        w2 = SC.geometric_variance(n_in, n_out, k, c)
        assert w2 == pytest.approx(c / (k * math.sqrt(n_in * n_out)))
        gammas.append(SC.layer_scaling_factor(varsigma, n_in, n_out, k, w2))
    assert np.allclose(gammas, varsigma / c**2, rtol=1e-14)
    fan_in = [SC.layer_scaling_factor(varsigma, n, m, k, SC.fan_in_variance(n, k)) for n, m, k in layers]
    # fan-in: gamma = varsigma n_in k^2 / (4 n_out), unequal across these layers
    assert np.allclose(fan_in, [varsigma * n * k * k / (4 * m) for n, m, k in layers])
    assert max(fan_in) / min(fan_in) > 10


def test_intrinsic_and_extrinsic_forms_agree_under_the_moment_rules():
    """SC appendix C: with E[y^2] = n k^2 E[W^2] E[x^2] and the backward rule (eq. 10) both forms coincide."""
    n_in, n_out, k, rho_in, rho_out, w2, x2, dy2 = 16, 48, 3, 12, 4, 0.013, 0.7, 2.1
    y2 = n_in * k * k * w2 * x2                                     # SC eq. 9
    dx2 = rho_out**2 * n_out * k * k * w2 * dy2 / rho_in**2        # SC eq. 10, solved for E[Delta x^2]
    varsigma = SC.activation_scaling_factor(n_in, rho_in, dx2, x2)
    intrinsic = SC.layer_scaling_factor(varsigma, n_in, n_out, k, w2)
    extrinsic = SC.layer_scaling_factor_extrinsic(n_in, k, rho_out, x2, y2, dy2)
    assert intrinsic == pytest.approx(extrinsic, rel=1e-13)
    # the weight-to-gradient ratio with E[Delta W^2] = rho_out^2 E[x^2] E[Delta y^2] (appendix D)
    assert rho_out**2 * x2 * dy2 / w2 == pytest.approx(intrinsic, rel=1e-13)
    # Definition 2 as printed (rho_in^2) differs when the layer is strided
    printed = n_in * k * k * rho_in**2 * x2**2 * dy2 / y2
    assert printed != pytest.approx(intrinsic, rel=1e-2)


def test_practical_advice_and_input_scaling():
    assert SC.recommended_c(3) == pytest.approx(2 / 3)
    assert SC.kernel_multiplier(3, 1) == pytest.approx(math.sqrt(1 / 3))      # SC section 6.2 example
    # the multiplier makes a k x k layer's forward gain (after ReLU) equal to eq. 6
    for k, k_typ in [(3, 1), (1, 3), (5, 3)]:
        n_in, n_out = 20, 45
        gain = 0.5 * n_in * k * k * SC.geometric_variance(n_in, n_out, k, SC.recommended_c(k_typ)) \
            * SC.kernel_multiplier(k, k_typ) ** 2
        assert gain == pytest.approx(math.sqrt(n_in / n_out))
    widths = np.array([3, 64, 128, 10])
    assert np.allclose(SC.geometric_output_second_moment(widths, 2.0), 2.0 * np.sqrt(3 / widths))
    assert SC.input_scale(3, 3) ** 2 == pytest.approx(1 / math.sqrt(27))      # E[x_0^2] = 1/sqrt(n0 k0^2)
    assert SC.kernel_area((3, 5)) == 15 and SC.kernel_area(4) == 16


def test_bad_input():
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="fan_in"):
            SC.geometric_variance(bad, 10)
    with pytest.raises(ValueError, match="kernel_size"):
        SC.geometric_variance(4, 10, kernel_size=0)
    with pytest.raises(ValueError, match="c"):
        SC.geometric_variance(4, 10, c=-1)
    assert len(SC.TABLE1) == 9 and {r.maintains for r in SC.TABLE1} == {True, False}


# ---------------------------------------------------------------------------
# Monte Carlo (torch).
# ---------------------------------------------------------------------------
try:
    import torch
    from torch import nn
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs the verify extra (torch)")



@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_table1_by_monte_carlo():
    from meanfield.torch.scaling import check_table1

    rows = check_table1(n_samples=16, seed=0)
    by_name = {r.operation: r for r in rows}
    for r in rows:
        assert r.se < 0.01 * max(1.0, r.ratio), r
        if r.claimed is not None:
            assert r.maintains == r.claimed, r
    # cases the table does not list
    assert by_name["Convolution, stride 1 (k = 3, no padding)"].maintains        # stride = k is not needed
    assert not by_name["Average pooling after ReLU"].maintains                    # needs centred inputs
    # the ratios that change, computed independently (z ~ N(0, 1), i.i.d. entries, i.i.d. gradients):
    from scipy.integrate import quad
    from scipy.stats import norm

    E = lambda f: quad(lambda z: f(z) * norm.pdf(z), -np.inf, np.inf, epsabs=1e-13)[0]  # noqa: E731
    from scipy.special import expit as sig
    expected = {
        # avg of 4 ReLU outputs: 8 E[y^2] = 8 (Var/4 + mean^2) = 1 + 3/pi
        "Average pooling after ReLU": 1 + 3 / math.pi,
        # max of 4: forward E[max^2], backward 1/4 of the positions get the gradient
        "Max pooling": quad(lambda m: m * m * 4 * norm.pdf(m) * norm.cdf(m) ** 3, -np.inf, np.inf)[0],
        "Tanh": E(lambda z: math.tanh(z) ** 2) / E(lambda z: (1 - math.tanh(z) ** 2) ** 2),
        "Sigmoid": E(lambda z: sig(z) ** 2) / E(lambda z: (sig(z) * (1 - sig(z))) ** 2),
    }
    for name, value in expected.items():
        r = by_name[name]
        assert abs(r.ratio - value) < 4 * r.se + 2e-3, (name, r.ratio, r.se, value)


def _convnet():
    # widths and kernel sizes differ from layer to layer; stride = kernel size (SC table 1)
    return nn.Sequential(
        nn.Conv2d(8, 64, 2, stride=2), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=3), nn.ReLU(),
        nn.Conv2d(128, 96, 1), nn.ReLU(),
        nn.Conv2d(96, 128, 2, stride=2), nn.ReLU(), nn.Flatten(),
        nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 256)).double()


def _relative_gammas(init, n_init, seed=0):
    """gamma_l / (geometric mean over layers), per initialisation; shape (n_init, n_layers)."""
    from meanfield.torch import scaling as VS

    out = []
    for s in range(n_init):
        g = torch.Generator().manual_seed(1000 * seed + s)
        model = _convnet()
        init(model, generator=g)
        res = VS.measure_scaling(model, lambda gen: torch.randn(32, 8, 24, 24, generator=gen, dtype=torch.float64),
                                 generator=g, weight_gradients=False)
        gam = np.array([r.gamma for r in res])
        out.append(gam / np.exp(np.log(gam).mean()))
    return np.array(out)


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_geometric_init_equalises_gamma_across_layers():
    from meanfield.torch import scaling as VS

    rel = _relative_gammas(VS.geometric_init_, n_init=80)
    mean, se = rel.mean(0), rel.std(0, ddof=1) / math.sqrt(len(rel))
    assert np.all(se < 0.015), se
    assert np.all(np.abs(mean - 1) < 0.05), (mean, se)            # equal within 5%
    for init in (VS.fan_in_init_, VS.fan_out_init_):
        rel = _relative_gammas(init, n_init=6, seed=1)
        mean = rel.mean(0)
        assert mean.max() / mean.min() > 3, (init.__name__, mean)  # far from equal


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_weight_gradient_ratio_equals_gamma_and_forward_moments_follow_eq6():
    """SC Prop. 3 (nu = gamma) and eq. 6 for a ReLU MLP of varying widths with geometric init."""
    from meanfield.torch import scaling as VS

    widths = [32, 256, 64, 512, 128]
    nus, gammas, ext, x2 = [], [], [], []
    for s in range(6):
        layers = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        model = nn.Sequential(*layers[:-1]).double()
        g = torch.Generator().manual_seed(s)
        info = VS.geometric_init_(model, generator=g)
        assert info.c == 2.0 and not info.multipliers                  # all k = 1: c = 2/k, no multipliers
        assert all(m.bias.abs().max() == 0 for m in model if isinstance(m, nn.Linear))
        res = VS.measure_scaling(model, lambda gen: torch.randn(64, widths[0], generator=gen, dtype=torch.float64),
                                 generator=g, n_repeats=2)
        nus.append([r.nu for r in res])
        gammas.append([r.gamma for r in res])
        ext.append([r.gamma_extrinsic for r in res])
        x2.append([r.x2 for r in res] + [res[-1].y2])
    nus, gammas, ext = (np.mean(v, 0) for v in (nus, gammas, ext))
    assert np.allclose(nus, gammas, rtol=0.05) and np.allclose(ext, gammas, rtol=0.05)
    # eq. 6: E[x_l^2] ~ sqrt(n_0 / n_l) E[x_0^2] after each Linear + ReLU (pre-activations: twice that)
    x2 = np.mean(x2, 0)
    n = np.array(widths, dtype=float)
    hidden = x2[1:-1] / x2[0]
    assert np.allclose(hidden, np.sqrt(n[0] / n[1:-1]), rtol=0.1)


@pytest.mark.torch
@needs_torch
def test_geometric_init_kernel_multipliers():
    from meanfield.torch import scaling as VS

    model = _convnet()
    info = VS.geometric_init_(model, generator=torch.Generator().manual_seed(0))
    assert info.typical_kernel_size == 1.0 and info.c == 2.0       # three k = 1 layers vs two k = 2, one k = 3
    assert info.multipliers == pytest.approx({"0": math.sqrt(1 / 2), "2": math.sqrt(1 / 3), "6": math.sqrt(1 / 2)})
    for name, m in VS.scaled_layers(model):
        fan_in, fan_out = m.weight.shape[1], m.weight.shape[0]
        k = math.sqrt(np.prod(m.kernel_size)) if hasattr(m, "kernel_size") else 1.0
        assert info.variances[name] == pytest.approx(2.0 / (k * math.sqrt(fan_in * fan_out)))
    x = torch.randn(4, 8, 24, 24, dtype=torch.float64)
    y_hooked = model(x)
    info.remove_multipliers()
    assert not torch.allclose(model(x), y_hooked)
    with pytest.raises(ValueError, match="no nn.Linear"):
        VS.geometric_init_(nn.Sequential(nn.ReLU()))


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_strided_conv_extrinsic_form_uses_output_positions():
    """SC Definition 2 prints rho_l^2 (input positions); nu = E[dW^2]/E[W^2] needs rho_{l+1}^2 (appendix C)."""
    from meanfield.torch import scaling as VS

    nus, ext, printed = [], [], []
    for s in range(4):
        model = nn.Sequential(nn.Conv2d(8, 32, 3, stride=3), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 16, 64)).double()
        g = torch.Generator().manual_seed(s)
        VS.geometric_init_(model, generator=g, multipliers=False)
        conv = VS.measure_scaling(model, lambda gen: torch.randn(16, 8, 12, 12, generator=gen, dtype=torch.float64),
                                  generator=g, layers=[model[0]])[0]
        assert (conv.rho2_in, conv.rho2_out, conv.kernel_area) == (144.0, 16.0, 9.0)
        nus.append(conv.nu)
        ext.append(conv.gamma_extrinsic)
        printed.append(conv.gamma_extrinsic * conv.rho2_in / conv.rho2_out)
    assert np.mean(ext) == pytest.approx(np.mean(nus), rel=0.05)
    assert np.mean(printed) / np.mean(nus) == pytest.approx(9.0, rel=0.05)   # off by the stride^2
