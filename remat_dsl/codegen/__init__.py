"""Stage codegen: a VerifiedPlan rendered into a standalone PyTorch module, and its comparison with eager."""
