"""The torch side of meanfield (needs the ``verify`` extra): the spec realised as torch modules,
and the tools a user applies to a real model.

Each module here is the torch twin of the theory module of the same name:

=====================  ==============================================  =========================
module                 what it is for                                  theory twin
=====================  ==============================================  =========================
``activations``        the one table of torch activations (phi, phi',   ``meanfield.activations``
                       the modules and functionals that mean them)
``networks``           a primitive tree realised as torch layers,       ``meanfield.calculus``
                       stacked over initialisations (``realise``)
``from_torch``         a user's ``nn.Module`` read into a tree          ``meanfield.calculus``
                       (``from_torch``); weights drawn at a chosen
                       (sigma_w, sigma_b) (``initialise_``)
``autoinit``           tune a real model to criticality (AutoInit)      ``meanfield.autoinit``
``shaping``            shaped activations and MLPs (TReLU, TAT, DKS)    ``meanfield.shaping``
``scaling``            geometric-mean initialisation, measured          ``meanfield.scaling``
``estimators``         APJN of any torch function (Hutchinson, exact)
``models``             the examples' models in plain torch (ResMLP,
                       MLP-Mixer, VGG)
=====================  ==============================================  =========================

The Monte-Carlo measurements that check the theory on these networks (K^l,
APJN, the verification suite) are in :mod:`meanfield.verification`.
"""
from .activations import TORCH_ACTIVATIONS, torch_activation, torch_module
from .autoinit import (AutoInitError, AutoInitReport, apjn_vs_batch_size, apply_scales, autoinit, find_blocks,
                       load_scales, save_scales)
from .estimators import exact_apjn, hutchinson_apjn
from .from_torch import from_torch, initialise_
from .models import VGG, MLPMixer, PreActResNet, ResMLP, mixer_s16, resmlp_s12, resnet110, vgg19_bn
from .networks import realise

__all__ = [
    "AutoInitError",
    "AutoInitReport",
    "MLPMixer",
    "PreActResNet",
    "ResMLP",
    "TORCH_ACTIVATIONS",
    "VGG",
    "apjn_vs_batch_size",
    "apply_scales",
    "exact_apjn",
    "hutchinson_apjn",
    "autoinit",
    "find_blocks",
    "from_torch",
    "initialise_",
    "load_scales",
    "mixer_s16",
    "realise",
    "resmlp_s12",
    "resnet110",
    "save_scales",
    "torch_activation",
    "torch_module",
    "vgg19_bn",
]
