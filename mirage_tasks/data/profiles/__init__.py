"""Workload profiles fitted on real traces (numbers only), used by ``synth --profile NAME``.

:data:`PACKAGED` maps each packaged profile's name to its JSON file in this package.
"""

from importlib import resources

PACKAGED: dict[str, str] = {
    p.name.removesuffix(".json"): p.name
    for p in sorted(resources.files(__name__).iterdir(), key=lambda p: p.name)
    if p.name.endswith(".json")
}
