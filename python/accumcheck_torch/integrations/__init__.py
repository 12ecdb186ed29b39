"""Framework integrations (Transformers, Accelerate, Lightning) for the
contract tier.  Each submodule imports its framework when it is imported;
importing accumcheck_torch or this package imports no framework."""
