"""Simulator calibration: replay a trace window and compare it with the real waits
(``fidelity``), fit a simulator configuration to a window (``calibrate``), the step's verdict
and report (``summary``), and the calibration results page's tables (``tables``). Above
:mod:`mirage_tasks.sim`, which it drives."""
