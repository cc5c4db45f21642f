"""Stage review: plans for people (canonical text, semantic diff, memory timeline)."""
