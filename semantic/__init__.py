"""Semantic verification (WISV): a CSI-aware decision head that lets the verifier accept
harmless mismatches, trained on task outcomes."""
