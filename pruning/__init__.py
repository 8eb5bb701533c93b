"""sparsescale.pruning"""
