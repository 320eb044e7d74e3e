"""Untrusted input, parsed and validated before anything is written: request bodies' bounds,
specs, array index expressions."""
