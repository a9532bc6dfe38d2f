"""Monte-Carlo verification on real torch networks (needs the ``verify`` extra).

Importing this subpackage imports torch; ``import meanfield`` does not.
"""
from .estimators import APJNEstimate, exact_apjn, hutchinson_apjn, mean_se

__all__ = ["APJNEstimate", "exact_apjn", "hutchinson_apjn", "mean_se"]
