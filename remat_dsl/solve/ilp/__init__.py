"""solve/ilp"""
