"""Tests of the settlement relayer (issue 7)."""
