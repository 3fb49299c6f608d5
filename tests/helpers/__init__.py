"""Builders, reference forwards and workers shared by the tests (imported as ``helpers.<module>``)."""
