"""The probe-replay evaluation protocol (docs/results/protocol.md) and its stopping policy."""
