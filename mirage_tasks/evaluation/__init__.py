"""Evaluation: online decisions in the simulator (``validate``), interruption metrics
(``metrics``) and the results report (``report``)."""
