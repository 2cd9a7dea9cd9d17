"""Workload profiles fitted on real traces (numbers only), used by ``synth --profile NAME``."""
