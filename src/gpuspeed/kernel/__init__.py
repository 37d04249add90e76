"""`gpuspeed kernel`: tuning notes for Triton and Numba CUDA kernel launchers, measured, not guessed.

    from gpuspeed import kernel_report
    rep = kernel_report(launcher, *args)     # launches, registers, occupancy, roof position, verdict
    rep.to_dict()

Modules: capture (intercept launches), triton_info / numba_info (what each launch ran with), occupancy
(the CUDA occupancy calculator), verdict (the ordered rules), report (kernel_report), cli (load a
launcher and its inputs for the command line).
"""

from gpuspeed.kernel.report import KernelReport, kernel_report

__all__ = ["KernelReport", "kernel_report"]
