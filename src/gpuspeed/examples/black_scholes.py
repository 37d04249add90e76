"""European option prices with Black-Scholes, as a quant writes it in NumPy: float64, one formula.

An elementwise workload: every option is independent, the arithmetic (log, sqrt, exp, a polynomial for
the normal CDF) is per element. The default example of `make run`.
"""

import numpy as np

TOLERANCE = dict(rtol=1e-5, atol=1e-4)  # prices to a hundredth of a cent: float32 can meet it
BATCH_AXIS = {0: 0, 1: 0, 2: 0}


def norm_cdf(x):
    # Abramowitz-Stegun 26.2.17: a polynomial in t = 1/(1 + p|x|), error < 7.5e-8
    t = 1.0 / (1.0 + 0.2316419 * np.abs(x))
    poly = t * (0.319381530 + t * (-0.356563782 + t * (1.781477937 + t * (-1.821255978 + t * 1.330274429))))
    pdf = np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)
    cdf = 1.0 - pdf * poly
    return np.where(x >= 0, cdf, 1.0 - cdf)


def original(spot, strike, years, rate, vol):
    sqrt_t = np.sqrt(years)
    d1 = (np.log(spot / strike) + (rate + 0.5 * vol * vol) * years) / (vol * sqrt_t)
    d2 = d1 - vol * sqrt_t
    discount = np.exp(-rate * years)
    call = spot * norm_cdf(d1) - strike * discount * norm_cdf(d2)
    put = strike * discount * norm_cdf(-d2) - spot * norm_cdf(-d1)
    return call, put


def inputs(rng, scale=1.0):
    n = max(1000, int(10_000_000 * scale))
    spot = rng.uniform(50.0, 150.0, n)
    strike = rng.uniform(50.0, 150.0, n)
    years = rng.uniform(0.1, 3.0, n)
    return spot, strike, years, 0.03, 0.25
