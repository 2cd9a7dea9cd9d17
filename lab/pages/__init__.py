"""Page writers: each renders a docs/results/ page from a campaign's outputs (see README.md here)."""
