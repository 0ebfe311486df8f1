"""Dispute panels and calibration (seed 003): drawn verifiers decide disputes."""
