"""Verifier agents and judges: the model client, rubrics, the executor directory, private briefs."""
