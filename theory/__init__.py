"""sparsescale.theory"""
