"""Stage check: the one replay of a plan's instructions and the one verification (VerifiedPlan)."""
