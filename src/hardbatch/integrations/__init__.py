"""Adapters between hardbatch and other libraries (each imports its library lazily)."""
