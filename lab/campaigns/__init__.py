"""Campaign drivers: one command per results page or research campaign (``python -m lab.campaigns.<name>``)."""
