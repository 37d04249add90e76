"""The launch-cost fit: T(K) = fixed + per_launch * K by weighted least squares, with standard errors."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from gpuspeed.errors import UserError


@dataclass
class Fit:
    fixed_s: float
    per_s: float
    fixed_err_s: float
    per_err_s: float
    r2: float
    n: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d |= {"fixed_us": self.fixed_s * 1e6, "per_us": self.per_s * 1e6, "fixed_err_us": self.fixed_err_s * 1e6,
              "per_err_us": self.per_err_s * 1e6}
        return d


def fit_linear(ks, times, relative: bool = True) -> Fit:
    """Weighted least squares of times = fixed + per * ks, with standard errors of both.

    relative=True weighs each point by 1/time^2 (its noise grows with its size), so K = 1 counts as
    much as K = 4096. Errors: sqrt(diag(s^2 (X^T W X)^-1)), s^2 = weighted RSS / (n - 2).
    """
    k = np.asarray(ks, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if k.shape != t.shape or k.ndim != 1:
        raise UserError("fit_linear needs two 1-D sequences of the same length")
    ok = np.isfinite(t) & np.isfinite(k)
    k, t = k[ok], t[ok]
    if k.size < 2 or np.unique(k).size < 2:
        raise UserError("fit_linear needs at least two distinct K values")
    if relative and np.any(t <= 0):
        raise UserError("fit_linear(relative=True) needs positive times")
    w = 1.0 / t**2 if relative else np.ones_like(t)
    x = np.stack([np.ones_like(k), k], axis=1)
    xtw = x.T * w
    cov_unscaled = np.linalg.inv(xtw @ x)
    beta = cov_unscaled @ (xtw @ t)
    resid = t - x @ beta
    dof = k.size - 2
    s2 = float(np.sum(w * resid**2) / dof) if dof > 0 else float("nan")
    err = np.sqrt(np.diag(cov_unscaled) * s2) if dof > 0 else np.array([math.nan, math.nan])
    tw_mean = np.sum(w * t) / np.sum(w)
    ss_tot = float(np.sum(w * (t - tw_mean) ** 2))
    r2 = 1.0 - float(np.sum(w * resid**2)) / ss_tot if ss_tot > 0 else float("nan")
    return Fit(fixed_s=float(beta[0]), per_s=float(beta[1]), fixed_err_s=float(err[0]), per_err_s=float(err[1]),
               r2=r2, n=int(k.size))
