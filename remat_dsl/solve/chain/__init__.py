"""solve/chain"""
