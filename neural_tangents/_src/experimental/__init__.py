"""Experimental features of Neural Tangents (implementation modules)."""
